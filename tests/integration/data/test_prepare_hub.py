"""`dlmspec data prepare --hf-dataset`: a Hugging Face dataset in, the same bytes as the JSONL path.

Offline: the datasets are local folders (a ``.jsonl`` or ``.parquet`` file per split, read by the
``datasets`` library as it reads a hub repository of such files); the hub's offline, unknown-name
and missing-library cases are the library's own errors (offline mode) or monkeypatched ones.
Non-streaming loads write their Arrow cache into a temporary folder.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import datasets  # the dev extra installs it (dlmspec[hf]): no skip, a missing library fails here
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dlmspec.cli.commands import app as main_app
from dlmspec.data.cli import app
from dlmspec.data.errors import DataPrepareError
from dlmspec.data.hub import HubSource, source_from_flags
from dlmspec.data.outputs import dataset_prefix
from dlmspec.data.prepare import prepare
from shared_kit import SHARED_DATA  # noqa: E402

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)

ROOT = Path(__file__).resolve().parents[3]
SHARED = SHARED_DATA
CORPUS = SHARED / "corpus" / "pydocs-valid.jsonl"
GPT2 = SHARED / "tokenizers" / "gpt2"
VOCAB, MERGES = str(GPT2 / "vocab.json"), str(GPT2 / "merges.txt")
GPT2_ARGS = dict(tokenizer_type="GPT2BPETokenizer", vocab_file=VOCAB, merge_file=MERGES)
GPT2_CLI = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", VOCAB, "--merge-file", MERGES]
#: WikiText-2's shape (Salesforce/wikitext, wikitext-2-raw-v1): one ``text`` column, a row per
#: line of an article: empty rows, `` = Heading = `` rows and paragraphs, each ending in a newline.
WIKITEXT_ROWS = [
    "",
    " = Valkyria Chronicles III = \n",
    "",
    " Senjō no Valkyria 3 : Unrecorded Chronicles is a tactical role @-@ playing video game . \n",
    "",
    " = = Gameplay = = \n",
    "",
    " As with previous Valkyira Chronicles games , the game is a tactical role @-@ playing game . \n",
]


def _texts(n: int = 10) -> list[str]:
    with CORPUS.open(encoding="utf-8") as handle:
        return [json.loads(next(handle))["text"] for _ in range(n)] + ["", "  ", " = Heading = \n"]


def _write_jsonl(path: Path, texts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for i, text in enumerate(texts):
            out.write(json.dumps({"id": f"doc-{i}", "text": text}) + "\n")
    return path


def _write_parquet(path: Path, columns: dict[str, list]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def _bytes(prefix: str | Path, key: str = "text") -> tuple[bytes, bytes]:
    base = dataset_prefix(str(prefix), key)
    return Path(base + ".bin").read_bytes(), Path(base + ".idx").read_bytes()


@pytest.fixture(autouse=True)
def _hf_cache_in_tmp(tmp_path_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Non-streaming loads write Arrow files into a temporary folder, never ~/.cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf-cache")))


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return _texts()


@pytest.fixture(scope="module")
def jsonl_reference(tmp_path_factory, texts) -> tuple[Path, tuple[bytes, bytes]]:
    """The documents as a JSONL file, prepared through ``--input``: the bytes to match."""
    root = tmp_path_factory.mktemp("jsonl")
    path = _write_jsonl(root / "docs.jsonl", texts)
    prepare(path, root / "ref", append_eod=True, **GPT2_ARGS)
    return path, _bytes(root / "ref")


def _invoke(args: list[str]):
    return CliRunner().invoke(app, ["prepare", "--no-progress", *args])


def _error(result) -> str:
    """The one-paragraph message of a refused run (exit 2, no traceback)."""
    text = result.output
    assert result.exit_code == 2, text
    assert "Traceback" not in text and isinstance(result.exception, SystemExit), text
    return " ".join(text.split())


# ----------------------------------------------------------------- same bytes as --input


@pytest.mark.parametrize("streaming", [True, False])
def test_hf_dataset_gives_the_bytes_of_the_jsonl_path(tmp_path, texts, jsonl_reference, streaming):
    """A local dataset folder holding the same documents (as JSONL or Parquet, streamed or
    loaded; 1 worker or 2 with small chunks) gives byte-identical .bin/.idx to ``--input`` on the
    JSONL file."""
    jsonl, reference = jsonl_reference
    folders = {"jsonl": tmp_path / "as-jsonl", "parquet": tmp_path / "as-parquet"}
    folders["jsonl"].mkdir()
    shutil.copy(jsonl, folders["jsonl"] / "train.jsonl")
    _write_parquet(folders["parquet"] / "train.parquet",
                   {"id": [f"doc-{i}" for i in range(len(texts))], "text": texts})
    for (kind, folder), (workers, chunk_docs) in zip(folders.items(), ((1, 32), (2, 3))):
        out = tmp_path / kind
        result = prepare(None, out, hub=HubSource(str(folder), streaming=streaming), append_eod=True,
                         workers=workers, chunk_docs=chunk_docs, **GPT2_ARGS)
        assert _bytes(out) == reference, (kind, workers)
        assert result.documents == len(texts) and result.datasets[0].empty_documents == 1
        assert result.hf_dataset == {"dataset": str(folder), "config": None, "split": "train",
                                     "revision": None, "streaming": streaming}


def test_wikitext_shape_empty_rows_are_empty_documents(tmp_path):
    """WikiText-2's rows (one ``text`` column, empty rows between paragraphs): an empty row is an
    empty document (a boundary, no tokens, no EOD), as ``{"text": ""}`` is on the JSONL path."""
    folder = tmp_path / "wikitext"
    _write_parquet(folder / "train.parquet", {"text": WIKITEXT_ROWS})
    _write_parquet(folder / "validation.parquet", {"text": WIKITEXT_ROWS[:3]})
    result = prepare(None, tmp_path / "hub", hub=HubSource(str(folder)), append_eod=True, **GPT2_ARGS)
    assert result.documents == len(WIKITEXT_ROWS)
    assert result.datasets[0].empty_documents == WIKITEXT_ROWS.count("")
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in WIKITEXT_ROWS), encoding="utf-8")
    prepare(jsonl, tmp_path / "file", append_eod=True, **GPT2_ARGS)
    assert _bytes(tmp_path / "hub") == _bytes(tmp_path / "file")
    valid = prepare(None, tmp_path / "v", hub=HubSource(str(folder), split="validation"), **GPT2_ARGS)
    assert valid.documents == 3


def test_cli_hf_dataset_json_summary(tmp_path, texts, jsonl_reference):
    jsonl, reference = jsonl_reference
    folder = tmp_path / "ds"
    folder.mkdir()
    shutil.copy(jsonl, folder / "train.jsonl")
    result = _invoke(["--hf-dataset", str(folder), "--hf-split", "train", "--json-keys", "text",
                      "--output-prefix", str(tmp_path / "out"), *GPT2_CLI, "--append-eod", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["result"]
    assert summary["input"] == f"--hf-dataset {folder} --hf-split train"
    assert summary["hf_dataset"]["split"] == "train" and summary["documents"] == len(texts)
    assert _bytes(tmp_path / "out") == reference


# ----------------------------------------------------------------- refusals: exit 2, no traceback


def _hub_args(tmp_path: Path, *extra: str) -> list[str]:
    return [*extra, "--output-prefix", str(tmp_path / "out"), *GPT2_CLI]


def test_input_and_hf_dataset_are_one_or_the_other(tmp_path, jsonl_reference):
    jsonl, _ = jsonl_reference
    message = _error(_invoke(_hub_args(tmp_path, "--input", str(jsonl), "--hf-dataset", "Salesforce/wikitext")))
    assert "--input" in message and "--hf-dataset Salesforce/wikitext" in message and "not both" in message
    message = _error(_invoke(_hub_args(tmp_path)))
    assert "--input FILE.jsonl" in message and "--hf-dataset NAME" in message
    for flag, value in (("--hf-config", "wikitext-2-raw-v1"), ("--hf-split", "validation"),
                        ("--hf-revision", "main")):
        message = _error(_invoke(_hub_args(tmp_path, "--input", str(jsonl), flag, value)))
        assert f"{flag} {value}" in message and "--hf-dataset" in message
    message = _error(_invoke(_hub_args(tmp_path, "--input", str(jsonl), "--no-hf-streaming")))
    assert "--no-hf-streaming" in message and "--hf-dataset" in message
    assert not list(tmp_path.glob("out*"))


@pytest.fixture()
def local_dataset(tmp_path) -> Path:
    folder = tmp_path / "local"
    _write_parquet(folder / "train.parquet",
                   {"id": [1, 2], "title": ["a", "b"], "text": ["one row", "another row"]})
    return folder


@pytest.mark.parametrize("streaming", [[], ["--no-hf-streaming"]], ids=["streamed", "downloaded"])
def test_missing_split_names_the_flag_and_the_splits(tmp_path, local_dataset, streaming):
    message = _error(_invoke(_hub_args(tmp_path, "--hf-dataset", str(local_dataset), "--hf-split",
                                       "validation", *streaming)))
    assert "--hf-split validation" in message and f"--hf-dataset {local_dataset}" in message
    assert "--hf-split train" in message  # the fix: a split it has


def test_missing_config_names_the_flag_and_the_configs(tmp_path, local_dataset):
    message = _error(_invoke(_hub_args(tmp_path, "--hf-dataset", str(local_dataset), "--hf-config", "en")))
    assert "--hf-config en" in message and "default" in message


def test_missing_or_non_text_column_names_the_key_and_the_columns(tmp_path, local_dataset):
    message = _error(_invoke(_hub_args(tmp_path, "--hf-dataset", str(local_dataset), "--json-keys", "body")))
    assert "--json-keys body" in message and "'title'" in message and "'text'" in message
    assert "--json-keys text" in message
    message = _error(_invoke(_hub_args(tmp_path, "--hf-dataset", str(local_dataset), "--json-keys", "id")))
    assert "--json-keys id" in message and "int64" in message and "--json-keys text" in message
    assert not list(tmp_path.glob("out*"))


def test_a_null_row_names_the_row(tmp_path):
    folder = tmp_path / "nulls"
    _write_parquet(folder / "train.parquet", {"text": ["fine", "also fine", None]})
    message = _error(_invoke(_hub_args(tmp_path, "--hf-dataset", str(folder))))
    assert f"--hf-dataset {folder} --hf-split train, row 2" in message and "null" in message
    assert not list(tmp_path.glob("out*"))


def test_missing_local_folder_and_unknown_hub_name(tmp_path, monkeypatch):
    message = _error(_invoke(_hub_args(tmp_path, "--hf-dataset", str(tmp_path / "nope"))))
    assert f"--hf-dataset {tmp_path / 'nope'}" in message and "not found" in message

    def not_found(path, *args, **kwargs):
        raise datasets.exceptions.DatasetNotFoundError(
            f"Dataset '{path}' doesn't exist on the Hub or cannot be accessed.")

    monkeypatch.setattr(datasets, "load_dataset", not_found)
    message = _error(_invoke(_hub_args(tmp_path, "--hf-dataset", "nosuch-user/nosuch-set")))
    assert "--hf-dataset nosuch-user/nosuch-set" in message and "not found" in message
    assert "https://huggingface.co/datasets/nosuch-user/nosuch-set" in message  # where to check
    assert "HF_TOKEN" in message  # gated or private: log in


def test_network_unreachable_is_a_usage_error(tmp_path, monkeypatch):
    def unreachable(path, *args, **kwargs):
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    message = _error(_invoke(_hub_args(tmp_path, "--hf-dataset", "Salesforce/wikitext",
                                       "--hf-config", "wikitext-2-raw-v1")))
    assert "--hf-dataset Salesforce/wikitext" in message and "cannot reach the Hugging Face Hub" in message
    assert "--no-hf-streaming" in message and "--input" in message  # the fixes


def test_offline_mode_is_a_usage_error(tmp_path):
    """The library's own offline mode (HF_HUB_OFFLINE=1), in a process of its own."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    run = subprocess.run([sys.executable, "-m", "dlmspec.cli", "data", "prepare", "--no-progress",
                          *_hub_args(tmp_path, "--hf-dataset", "Salesforce/wikitext", "--hf-config",
                                     "wikitext-2-raw-v1")],
                         capture_output=True, text=True, env=env, timeout=120)
    message = " ".join(run.stderr.split())
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "--hf-dataset Salesforce/wikitext" in message and "offline" in message
    assert "HF_HUB_OFFLINE" in message


def test_missing_datasets_library_says_what_to_install(tmp_path, local_dataset, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    message = _error(_invoke(_hub_args(tmp_path, "--hf-dataset", str(local_dataset))))
    assert f"--hf-dataset {local_dataset}" in message and "dlmspec[hf]" in message
    assert "--input" in message


def test_source_from_flags_defaults():
    assert source_from_flags("x.jsonl", None, None, None, None, None) is None
    source = source_from_flags(None, "Salesforce/wikitext", "wikitext-2-raw-v1", None, None, None)
    assert source == HubSource("Salesforce/wikitext", "wikitext-2-raw-v1", "train", None, True)
    assert source.describe() == "--hf-dataset Salesforce/wikitext --hf-config wikitext-2-raw-v1 --hf-split train"
    with pytest.raises(DataPrepareError, match="--hf-split ''"):
        source_from_flags(None, "Salesforce/wikitext", None, "", None, None)


# ----------------------------------------------------------------- the demo's public sources


def _header_commands(spec: Path) -> list[list[str]]:
    """The commands in the demo spec's header comment (lines ``#   cmd``, ``\\`` continued)."""
    lines = []
    for line in spec.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:])
    commands, current = [], ""
    for line in lines:
        if not line.startswith("   ") and not current:
            continue
        current += " " + line.strip()
        if current.endswith("\\"):
            current = current[:-1]
            continue
        if current.split()[0] in ("hf", "dlmspec"):
            commands.append(shlex.split(current))
        current = ""
    return commands


def test_demo_spec_header_commands_make_what_the_demo_reads(tmp_path, monkeypatch):
    """The demo's header shows the public sources: `hf download` of GPT-2's tokenizer files to the
    paths the spec reads, then `data prepare --hf-dataset` for the train and valid prefixes the spec
    reads. Run here with the hub faked by local WikiText-shaped files and the ../shared GPT-2
    files; the demo then validates with no missing path."""
    import tomllib

    demo = ROOT / "specs" / "demo-dlm.toml"
    spec = tomllib.loads(demo.read_text(encoding="utf-8"))
    commands = _header_commands(demo)
    downloads = [c for c in commands if c[:2] == ["hf", "download"]]
    prepares = [c for c in commands if c[:3] == ["dlmspec", "data", "prepare"]]
    assert len(downloads) == 1 and len(prepares) == 2, commands
    download = downloads[0]
    assert download[2] == "openai-community/gpt2" and download[3:5] == ["vocab.json", "merges.txt"]
    local_dir = download[download.index("--local-dir") + 1]
    tok = spec["data"]["tokenizer"]
    assert (tok["vocab_file"], tok["merge_file"]) == (f"{local_dir}/vocab.json", f"{local_dir}/merges.txt")
    assert not any("shared" in value for value in (tok["vocab_file"], tok["merge_file"]))

    work = tmp_path / "checkout"
    (work / local_dir).mkdir(parents=True)
    for name in ("vocab.json", "merges.txt"):  # what `hf download` writes: GPT-2's files
        shutil.copy(GPT2 / name, work / local_dir / name)
    fake_hub = tmp_path / "hub" / "wikitext-2-raw-v1"
    for split in ("train", "validation"):
        _write_parquet(fake_hub / f"{split}.parquet", {"text": WIKITEXT_ROWS})
    real_load = datasets.load_dataset
    calls = []

    def hub(path, name=None, **kwargs):
        calls.append((path, name, kwargs["split"]))
        assert (path, name) == ("Salesforce/wikitext", "wikitext-2-raw-v1")
        return real_load(str(fake_hub), **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", hub)
    monkeypatch.chdir(work)
    for command in prepares:
        result = _invoke(command[3:] + ["--workers", "1"])
        assert result.exit_code == 0, result.output
    assert sorted(c[2] for c in calls) == ["train", "validation"]
    for key in ("train", "valid"):
        for entry in spec["data"][key]:
            assert Path(entry["prefix"] + ".bin").is_file() and Path(entry["prefix"] + ".idx").is_file()
    validate = CliRunner().invoke(main_app, ["validate", str(demo), "--json"])
    assert validate.exit_code == 0, validate.output
    warnings = json.loads(validate.stdout)["warnings"]
    assert not [w for w in warnings if w["rule"] == "path-not-found"], warnings


def test_demo_spec_reads_nothing_from_shared():
    text = (ROOT / "specs" / "demo-dlm.toml").read_text(encoding="utf-8")
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "shared" not in body
    assert re.search(r"^#.*Salesforce/wikitext", text, flags=re.M)


def test_flags_reach_load_dataset(tmp_path, local_dataset, monkeypatch):
    """--hf-config, --hf-split, --hf-revision and --no-hf-streaming are load_dataset's name, split,
    revision and streaming; the summary records them."""
    real_load, calls = datasets.load_dataset, []

    def spy(path, name=None, **kwargs):
        calls.append((path, name, kwargs))
        return real_load(str(local_dataset), split="train", streaming=kwargs["streaming"])

    monkeypatch.setattr(datasets, "load_dataset", spy)
    result = _invoke(_hub_args(tmp_path, "--hf-dataset", "org/name", "--hf-config", "c1", "--hf-split",
                               "validation", "--hf-revision", "abc123", "--no-hf-streaming", "--json"))
    assert result.exit_code == 0, result.output
    assert calls == [("org/name", "c1", {"split": "validation", "revision": "abc123", "streaming": False})]
    summary = json.loads(result.stdout)["result"]
    assert summary["input"] == "--hf-dataset org/name --hf-config c1 --hf-revision abc123 --hf-split validation"
    assert summary["hf_dataset"] == {"dataset": "org/name", "config": "c1", "split": "validation",
                                     "revision": "abc123", "streaming": False}
    assert summary["documents"] == 2


def test_a_builder_name_is_not_taken_for_a_dataset(tmp_path, monkeypatch):
    """``--hf-dataset json`` is the library's JSON builder: with no data files it reads whatever
    lies in the working directory. Refused, pointing at --input and at a folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.json").write_text('{"text": "not a corpus"}\n')
    for name in ("json", "parquet", "text"):
        message = _error(_invoke(_hub_args(tmp_path, "--hf-dataset", name)))
        assert f"--hf-dataset {name}" in message and "builder" in message
        assert "--input FILE.jsonl" in message and "--hf-dataset FOLDER" in message
    assert not list(tmp_path.glob("out*"))


def test_an_empty_local_folder_is_named_as_a_folder(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    message = _error(_invoke(_hub_args(tmp_path, "--hf-dataset", str(folder))))
    assert f"--hf-dataset {folder}" in message and "no .jsonl" in message
    assert "huggingface.co" not in message
