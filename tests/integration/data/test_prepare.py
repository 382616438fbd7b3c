"""`dlmspec data prepare` on real data: the pydocs corpus and the GPT-2 BPE files.

Datasets are read back with megatron-core's IndexedDataset and fed to a real GPTDataset;
token ids are checked against an independent pure-Python GPT-2 BPE written below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import regex
from typer.testing import CliRunner

from dlmspec.data import encode, outputs, read
from dlmspec.data import prepare as prepare_module
from dlmspec.data.cli import app
from dlmspec.data.errors import DataPrepareError
from dlmspec.data.outputs import dataset_prefix
from dlmspec.data.prepare import prepare
from dlmspec.tokenizers import (
    TOKENIZER_ALIASES,
    TOKENIZER_TYPES,
    Tokenizer,
    TokenizerError,
    build_tokenizer,
)
from shared_kit import SHARED_DATA  # noqa: E402

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)

#: The shared data kit lies beside the checkout (``../shared``), here and in CI.
SHARED = SHARED_DATA
CORPUS = SHARED / "corpus" / "pydocs-train.jsonl"
GPT2 = SHARED / "tokenizers" / "gpt2"
VOCAB, MERGES = str(GPT2 / "vocab.json"), str(GPT2 / "merges.txt")
GPT2_ARGS = dict(tokenizer_type="GPT2BPETokenizer", vocab_file=VOCAB, merge_file=MERGES)
GPT2_CLI = ["--tokenizer-type", "gpt2bpe", "--vocab-file", VOCAB, "--merge-file", MERGES]
N_DOCS = 40
EOD = 50256


# ----------------------------------------------------------------- independent GPT-2 reference


def _bytes_to_unicode() -> dict[int, str]:
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, codes)))


class ReferenceGPT2:
    """OpenAI's GPT-2 encoder algorithm (encoder.py), pure Python."""

    PATTERN = regex.compile(
        r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    )

    def __init__(self) -> None:
        self.encoder = json.loads(Path(VOCAB).read_text(encoding="utf-8"))
        merges = Path(MERGES).read_text(encoding="utf-8").split("\n")[1:]
        self.ranks = {tuple(m.split()): i for i, m in enumerate(merges) if m.strip()}
        self.byte_map = _bytes_to_unicode()

    @lru_cache(maxsize=None)
    def _bpe(self, token: str) -> tuple[str, ...]:
        word = list(token)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            first, second = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if (first, second) not in self.ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        return tuple(word)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in self.PATTERN.findall(text):
            mapped = "".join(self.byte_map[b] for b in piece.encode("utf-8"))
            ids.extend(self.encoder[p] for p in self._bpe(mapped))
        return ids


# ----------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def texts() -> list[str]:
    with CORPUS.open(encoding="utf-8") as handle:
        return [json.loads(next(handle))["text"] for _ in range(N_DOCS)]


@pytest.fixture(scope="module")
def slice_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "slice.jsonl"
    with CORPUS.open("rb") as src, path.open("wb") as dst:
        for _ in range(N_DOCS):
            dst.write(next(src))
    return path


@pytest.fixture(scope="module")
def gpt2():
    return build_tokenizer(**GPT2_ARGS)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, slice_path):
    out = tmp_path_factory.mktemp("prepared") / "pydocs"
    result = prepare(slice_path, out, workers=2, append_eod=True, **GPT2_ARGS)
    return result, dataset_prefix(str(out), "text")


def _read_dataset(prefix: str):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    return IndexedDataset(prefix, mmap=True)


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _invoke(args: list[str]):
    return CliRunner().invoke(app, ["prepare", "--no-progress", *args])


# ----------------------------------------------------------------- tokenizer factory


def test_gpt2_factory_contract_and_reference_encoding(gpt2, texts):
    assert isinstance(gpt2, Tokenizer)
    assert gpt2.tokenize("Hello world") == [15496, 995]
    assert (gpt2.eod, gpt2.vocab_size) == (EOD, 50257)
    # The literal string is BPE-split, as by Megatron's GPT-2 tokenizer; only EOD inserts 50256.
    assert EOD not in gpt2.tokenize("a<|endoftext|>b")
    reference = ReferenceGPT2()
    for text in texts:
        assert gpt2.tokenize(text) == reference.encode(text)


def test_tokenizer_names_and_aliases():
    for alias, name in TOKENIZER_ALIASES.items():
        assert name in TOKENIZER_TYPES
        with pytest.raises(TokenizerError, match="needs") as info:
            build_tokenizer(alias)  # known type, missing required argument
        assert "unknown" not in str(info.value)
    with pytest.raises(TokenizerError) as info:
        build_tokenizer("NoSuchTokenizer")
    assert all(name in str(info.value) for name in TOKENIZER_TYPES)


# ----------------------------------------------------------------- the written dataset


def test_prepare_writes_megatron_dataset(prepared, gpt2, texts):
    result, prefix = prepared
    assert prefix.endswith("pydocs_text_document")
    assert Path(prefix + ".bin").is_file() and Path(prefix + ".idx").is_file()
    assert not [p for p in _files(Path(prefix).parent) if ".tmp-" in p]

    dataset = _read_dataset(prefix)
    assert len(dataset) == N_DOCS
    assert dataset.document_indices.tolist() == list(range(N_DOCS + 1))
    assert dataset.index.dtype == np.uint16
    for i, text in enumerate(texts):
        assert dataset[i].tolist() == gpt2.tokenize(text) + [EOD]

    assert result.documents == N_DOCS and result.workers == 2
    assert result.tokens == int(dataset.sequence_lengths.sum())
    assert (result.vocab_size, result.eod, result.dtype) == (50257, EOD, "uint16")
    assert result.datasets[0].bin_path == prefix + ".bin"


def test_worker_count_does_not_change_bytes(prepared, slice_path, tmp_path):
    _, reference = prepared
    for workers, chunk_docs in [(1, 32), (3, 7)]:
        out = tmp_path / f"w{workers}"
        prepare(
            slice_path, out, workers=workers, append_eod=True, chunk_docs=chunk_docs, **GPT2_ARGS
        )
        prefix = dataset_prefix(str(out), "text")
        for ext in (".bin", ".idx"):
            assert Path(prefix + ext).read_bytes() == Path(reference + ext).read_bytes()


def test_gpt_dataset_reads_prepared_data(prepared, gpt2, tmp_path):
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    _, prefix = prepared
    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=128,
        blend=([prefix], None),
        split="1,0,0",
        tokenizer=gpt2,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=str(tmp_path / "cache"),
    )
    train, valid, test = BlendedMegatronDatasetBuilder(
        GPTDataset, [16, None, None], lambda: True, config
    ).build()
    assert isinstance(train, GPTDataset) and valid is None and test is None
    assert len(train) >= 16

    low_level = _read_dataset(prefix)
    stream = np.concatenate([low_level[int(d)] for d in train.document_index]).astype(np.int64)
    for index in (0, len(train) - 1):
        sample = train[index]
        tokens, labels = sample["tokens"].numpy(), sample["labels"].numpy()
        assert tokens.shape == (128,) and (labels[:-1] == tokens[1:]).all()
        window = np.append(tokens, labels[-1])
        starts = np.flatnonzero(stream[: len(stream) - 128] == window[0])
        assert any((stream[s : s + 129] == window).all() for s in starts)


def test_cli_json_summary(slice_path, tmp_path, prepared):
    _, reference = prepared
    out = tmp_path / "cli"
    result = _invoke(
        ["--input", str(slice_path), "--output-prefix", str(out), *GPT2_CLI,
         "--workers", "2", "--append-eod", "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["result"]
    dataset = _read_dataset(dataset_prefix(str(out), "text"))
    assert summary["documents"] == N_DOCS
    assert summary["tokens"] == int(dataset.sequence_lengths.sum())
    assert summary["tokens_per_s"] > 0 and summary["workers"] == 2
    assert summary["datasets"][0]["prefix"] == dataset_prefix(str(out), "text")
    assert Path(dataset_prefix(str(out), "text") + ".bin").read_bytes() == Path(
        reference + ".bin"
    ).read_bytes()


def test_cli_table_summary(slice_path, tmp_path):
    result = _invoke(
        ["--input", str(slice_path), "--output-prefix", str(tmp_path / "t"), *GPT2_CLI]
    )
    assert result.exit_code == 0, result.output
    for word in ("documents", "40", "tokens/s", "key text"):
        assert word in result.stdout


def test_several_keys_sentence_lists_and_empty_documents(tmp_path, gpt2):
    lines = [
        {"text": "Hello world", "title": "Greeting"},
        {"text": ["First part.", "", " Second part."], "title": "Parts"},
        {"text": "", "title": "Empty body"},
        {"text": "Last one", "title": ""},
    ]
    path = tmp_path / "multi.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n", encoding="utf-8")
    result = prepare(path, tmp_path / "m", json_keys=["text,title"], append_eod=True, **GPT2_ARGS)
    assert [d.json_key for d in result.datasets] == ["text", "title"]
    assert result.documents == 4

    text = _read_dataset(dataset_prefix(str(tmp_path / "m"), "text"))
    first, second = gpt2.tokenize("First part."), gpt2.tokenize(" Second part.")
    # Megatron's layout: one sequence per non-empty string, EOD on the last one, and an
    # empty document adds a boundary without sequences.
    assert text.document_indices.tolist() == [0, 1, 3, 3, 4]
    assert [text[i].tolist() for i in range(len(text))] == [
        gpt2.tokenize("Hello world") + [EOD],
        first,
        second + [EOD],
        gpt2.tokenize("Last one") + [EOD],
    ]
    assert result.datasets[0].empty_documents == 1

    title = _read_dataset(dataset_prefix(str(tmp_path / "m"), "title"))
    assert title.document_indices.tolist() == [0, 1, 2, 3, 3]
    assert title[2].tolist() == gpt2.tokenize("Empty body") + [EOD]


def test_null_tokenizer_uses_megatron_class(tmp_path):
    path = tmp_path / "ids.jsonl"
    path.write_text('{"text": "3 1 4"}\n{"text": "1 5"}\n', encoding="utf-8")
    result = prepare(path, tmp_path / "n", tokenizer_type="null", vocab_size=10, append_eod=True)
    dataset = _read_dataset(dataset_prefix(str(tmp_path / "n"), "text"))
    assert [dataset[i].tolist() for i in range(2)] == [[3, 1, 4, 10], [1, 5, 10]]
    assert (result.vocab_size, result.eod) == (11, 10)

    path.write_text('{"text": "3 12"}\n', encoding="utf-8")
    with pytest.raises(DataPrepareError, match=r"ids.jsonl:1: key 'text': token id 12 is outside"):
        prepare(path, tmp_path / "bad", tokenizer_type="NullTokenizer", vocab_size=10)
    with pytest.raises(DataPrepareError, match="needs --vocab-size"):
        prepare(path, tmp_path / "bad", tokenizer_type="NullTokenizer")


def test_huggingface_tokenizer_matches_gpt2(prepared, slice_path, tmp_path):
    from transformers import GPT2TokenizerFast

    hf_dir = tmp_path / "hf-gpt2"
    GPT2TokenizerFast(VOCAB, MERGES).save_pretrained(hf_dir)
    tokenizer = build_tokenizer("huggingface", tokenizer_model=str(hf_dir))
    assert tokenizer.tokenize("Hello world") == [15496, 995] and tokenizer.eod == EOD
    out = tmp_path / "hf"
    prepare(slice_path, out, tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(hf_dir),
            append_eod=True)
    _, reference = prepared
    prefix = dataset_prefix(str(out), "text")
    assert Path(prefix + ".bin").read_bytes() == Path(reference + ".bin").read_bytes()


# ----------------------------------------------------------------- errors


def _write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _error_cases(tmp_path: Path) -> dict[str, tuple[list[str], list[str]]]:
    good = [json.dumps({"text": f"document {i}"}) for i in range(45)]
    bad_json = good[:2] + ['{"text": "unterminated'] + good[3:]
    late_bad = good[:36] + ["{not json}"] + good[37:]
    no_key = [good[0], json.dumps({"id": 7, "body": "x"})] + good[2:]
    deep = '{"text": "deep", "meta": ' + "[" * 100_000 + "]" * 100_000 + "}"
    long_line = json.dumps({"text": "x" * 5000})  # 5012 bytes
    paths = {
        "missing": tmp_path / "nope.jsonl",
        "empty": _write(tmp_path, "empty.jsonl", []),
        "blank": _write(tmp_path, "blank.jsonl", ["", "   "]),
        "bad_json": _write(tmp_path, "bad.jsonl", bad_json),
        "late_bad": _write(tmp_path, "late.jsonl", late_bad),
        "no_key": _write(tmp_path, "nokey.jsonl", no_key),
        "ok": _write(tmp_path, "ok.jsonl", good),
        "deep": _write(tmp_path, "deep.jsonl", good[:2] + [deep] + good[3:]),
        "late_deep": _write(tmp_path, "latedeep.jsonl", good[:40] + [deep] + good[41:]),
        "long": _write(tmp_path, "long.jsonl", good[:1] + [long_line] + good[2:]),
    }
    ok = str(paths["ok"])
    return {
        "missing input": (["--input", str(paths["missing"]), *GPT2_CLI],
                          [f"--input {paths['missing']}: file not found", "--hf-dataset NAME"]),
        "empty input": (["--input", str(paths["empty"]), *GPT2_CLI],
                        [f"--input {paths['empty']}: the file is empty"]),
        "blank lines only": (["--input", str(paths["blank"]), *GPT2_CLI],
                             [f"no JSON lines (only blank lines): {paths['blank']}"]),
        "invalid json": (["--input", str(paths["bad_json"]), *GPT2_CLI],
                         [f"{paths['bad_json']}:3: invalid JSON"]),
        "invalid json in a worker": (
            ["--input", str(paths["late_bad"]), *GPT2_CLI, "--workers", "2"],
            [f"{paths['late_bad']}:37: invalid JSON"],
        ),
        "missing key": (["--input", str(paths["no_key"]), *GPT2_CLI],
                        [f"{paths['no_key']}:2: missing key 'text'",
                         "the line has keys: 'id', 'body'"]),
        "wrong json key": (["--input", ok, *GPT2_CLI, "--json-keys", "content"],
                           [f"{ok}:1: missing key 'content'", "keys: 'text'"]),
        "unknown tokenizer": (["--input", ok, "--tokenizer-type", "wordpiece"],
                              ["unknown tokenizer type 'wordpiece'", *TOKENIZER_TYPES,
                               *TOKENIZER_ALIASES]),
        "no vocab flag": (["--input", ok, "--tokenizer-type", "gpt2bpe", "--merge-file", MERGES],
                          ["GPT2BPETokenizer needs --vocab-file"]),
        "missing vocab file": (["--input", ok, "--tokenizer-type", "gpt2bpe", "--vocab-file",
                                str(tmp_path / "v.json"), "--merge-file", MERGES],
                               [f"vocab file not found: {tmp_path / 'v.json'}"]),
        "missing merge file": (["--input", ok, "--tokenizer-type", "gpt2bpe", "--vocab-file",
                                VOCAB, "--merge-file", str(tmp_path / "m.txt")],
                               [f"merge file not found: {tmp_path / 'm.txt'}"]),
        "workers": (["--input", ok, *GPT2_CLI, "--workers", "0"], ["--workers must be at least 1"]),
        "deeply nested json": (["--input", str(paths["deep"]), *GPT2_CLI],
                               [f"{paths['deep']}:3: invalid JSON", "nested deeper than"]),
        "deeply nested json in a worker": (
            ["--input", str(paths["late_deep"]), *GPT2_CLI, "--workers", "2"],
            [f"{paths['late_deep']}:41: invalid JSON", "nested deeper than"],
        ),
        "line over --max-line-bytes": (
            ["--input", str(paths["long"]), *GPT2_CLI, "--max-line-bytes", "1000"],
            [f"{paths['long']}:2: the line has 5,012 bytes, more than --max-line-bytes 1,000",
             "--max-line-bytes 5012"],
        ),
        "max-line-bytes": (["--input", ok, *GPT2_CLI, "--max-line-bytes", "0"],
                           ["--max-line-bytes must be at least 1, got 0"]),
    }


ERROR_NAMES = [
    "missing input", "empty input", "blank lines only", "invalid json",
    "invalid json in a worker", "missing key", "wrong json key", "unknown tokenizer",
    "no vocab flag", "missing vocab file", "missing merge file", "workers",
    "deeply nested json", "deeply nested json in a worker", "line over --max-line-bytes",
    "max-line-bytes",
]


@pytest.mark.parametrize("name", ERROR_NAMES)
def test_errors_exit_2_with_message_and_no_output(name, tmp_path):
    cases = _error_cases(tmp_path)
    assert sorted(cases) == sorted(ERROR_NAMES)
    args, messages = cases[name]
    out_dir = tmp_path / "out"
    result = _invoke([*args, "--output-prefix", str(out_dir / "ds")])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert result.stdout == ""
    for message in messages:
        assert message in result.stderr
    assert not out_dir.exists() or _files(out_dir) == []


def test_missing_sentencepiece_package_is_reported(tmp_path, monkeypatch):
    model = _write(tmp_path, "sp.model", ["not read"])
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # import raises ImportError
    with pytest.raises(TokenizerError, match="needs the 'sentencepiece' package"):
        build_tokenizer("sentencepiece", tokenizer_model=str(model))
    with pytest.raises(TokenizerError, match="SentencePiece model not found"):
        build_tokenizer("SentencePieceTokenizer", tokenizer_model=str(tmp_path / "x.model"))


# ----------------------------------------------------------------- interrupted runs


@pytest.mark.parametrize(
    ("workers", "exception"), [(1, RuntimeError), (2, KeyboardInterrupt)]
)
def test_interrupted_run_leaves_no_dataset(workers, exception, prepared, slice_path, tmp_path,
                                           monkeypatch):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    original = IndexedDatasetBuilder.add_document
    calls = {"n": 0}

    def failing_add_document(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the second chunk (one add_document a chunk), after the first was written
            raise exception("injected")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(IndexedDatasetBuilder, "add_document", failing_add_document)

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with pytest.raises(exception, match="injected"):
        prepare(slice_path, fresh / "ds", workers=workers, append_eod=True, **GPT2_ARGS)
    assert _files(fresh) == []  # neither PREFIX_text_document.idx nor temporary files

    # A dataset from an earlier run survives a failed rerun unchanged.
    _, reference = prepared
    kept = tmp_path / "kept"
    kept.mkdir()
    prefix = dataset_prefix(str(kept / "ds"), "text")
    for ext in (".bin", ".idx"):
        Path(prefix + ext).write_bytes(Path(reference + ext).read_bytes())
    calls["n"] = 0
    with pytest.raises(exception, match="injected"):
        prepare(slice_path, kept / "ds", workers=workers, append_eod=True, force=True, **GPT2_ARGS)
    assert _files(kept) == ["ds_text_document.bin", "ds_text_document.idx"]
    assert Path(prefix + ".bin").read_bytes() == Path(reference + ".bin").read_bytes()


def test_cli_ctrl_c_exits_130_without_dataset(slice_path, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_module, "_write_documents", interrupted)
    result = _invoke(["--input", str(slice_path), "--output-prefix", str(tmp_path / "ds"),
                      *GPT2_CLI, "--workers", "2"])
    assert result.exit_code == 130
    assert "interrupted" in result.stderr
    assert _files(tmp_path) == []


# ----------------------------------------------------------------- packaging


def test_modules_import_without_torch_or_megatron():
    code = (
        "import sys, dlmspec.data.cli, dlmspec.tokenizers\n"
        "heavy = [m for m in ('torch', 'megatron', 'numpy', 'tokenizers', 'transformers')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env=env)


#: Runs ``dlmspec data prepare ARGV[2:]`` with the module ARGV[1] made unimportable (None in
#: sys.modules makes ``import`` raise ModuleNotFoundError), as where the runtime extra is missing.
WITHOUT_MODULE = r"""
import sys
sys.modules[sys.argv[1]] = None
from dlmspec.cli import main
sys.exit(main(["data", "prepare", "--no-progress", *sys.argv[2:]]))
"""


@pytest.mark.parametrize("module, provider", [("megatron", "megatron-core"), ("torch", "torch"),
                                              ("tokenizers", "tokenizers"), ("numpy", "numpy")])
def test_without_the_runtime_extra_it_says_install_it(tmp_path, module, provider):
    """Without torch, megatron-core, tokenizers or numpy ``data prepare`` names the missing
    module and the extra that brings it, exit 2, instead of a ModuleNotFoundError traceback."""
    corpus = _write(tmp_path, "corpus.jsonl", [json.dumps({"text": "hello world"})])
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT_MODULE, module, "--input", str(corpus),
         "--output-prefix", str(tmp_path / "ds"), *GPT2_CLI],
        env=_env(), capture_output=True, text=True, timeout=120,
    )
    stderr = " ".join(proc.stderr.split())
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in stderr, proc.stderr[-3000:]
    assert f"needs {provider} (module {module!r}" in stderr, stderr
    assert "install dlmspec[runtime]" in stderr, stderr
    assert _files(tmp_path) == ["corpus.jsonl"]


# ----------------------------------------------------------------- never overwrite the input


def _null_cli(input_path: Path, prefix: Path, *extra: str) -> list[str]:
    return ["--input", str(input_path), "--output-prefix", str(prefix),
            "--tokenizer-type", "null", "--vocab-size", "10", *extra]


def _ids_lines(n: int) -> list[str]:
    return [json.dumps({"text": f"{i % 7} {i % 5} 3"}) for i in range(n)]


def _collision(kind: str, tmp_path: Path) -> tuple[Path, Path]:
    """(input path as given, output prefix) where an output file of the prefix is the input."""
    data = tmp_path / "data"
    data.mkdir()
    prefix = data / "ds"
    output_bin = data / "ds_text_document.bin"
    lines = _ids_lines(5)
    if kind == "input named as the .bin":
        return _write(data, output_bin.name, lines), prefix
    if kind == "input named as the .idx":
        return _write(data, "ds_text_document.idx", lines), prefix
    if kind == "input is a symlink to the .bin name":
        _write(data, output_bin.name, lines)
        link = tmp_path / "corpus.jsonl"
        link.symlink_to(output_bin)
        return link, prefix
    if kind == "output name is a symlink to the input":
        real = _write(tmp_path, "corpus.jsonl", lines)
        output_bin.symlink_to(real)
        return real, prefix
    if kind == "output name is a hard link to the input":
        real = _write(tmp_path, "corpus.jsonl", lines)
        os.link(real, output_bin)
        return real, prefix
    if kind == "output prefix through a symlinked folder":
        real = _write(data, output_bin.name, lines)
        alias = tmp_path / "alias"
        alias.symlink_to(data, target_is_directory=True)
        return real, alias / "ds"
    raise AssertionError(kind)


COLLISIONS = [
    "input named as the .bin", "input named as the .idx", "input is a symlink to the .bin name",
    "output name is a symlink to the input", "output name is a hard link to the input",
    "output prefix through a symlinked folder",
]


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
@pytest.mark.parametrize("kind", COLLISIONS)
def test_input_that_is_an_output_file_is_refused_even_with_force(kind, force, tmp_path):
    input_path, prefix = _collision(kind, tmp_path)
    before = input_path.read_bytes()
    listing = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    result = _invoke(_null_cli(input_path, prefix, *(["--force"] if force else [])))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    message = " ".join(result.stderr.split())
    assert f"--input {input_path}:" in message
    assert "--output-prefix" in message and str(prefix) in message
    assert "--force does not allow this" in message
    assert input_path.read_bytes() == before
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == listing


def test_tokenizer_file_that_is_an_output_file_is_refused(tmp_path):
    corpus = _write(tmp_path, "corpus.jsonl", [json.dumps({"text": "Hello world"})])
    vocab = tmp_path / "ds_text_document.bin"
    vocab.write_bytes(Path(VOCAB).read_bytes())
    result = _invoke(["--input", str(corpus), "--output-prefix", str(tmp_path / "ds"),
                      "--tokenizer-type", "gpt2bpe", "--vocab-file", str(vocab),
                      "--merge-file", MERGES, "--force"])
    assert result.exit_code == 2, result.output
    assert f"--vocab-file {vocab}:" in " ".join(result.stderr.split())
    assert vocab.read_bytes() == Path(VOCAB).read_bytes()


def test_existing_dataset_is_replaced_only_with_force(tmp_path):
    first = _write(tmp_path, "first.jsonl", _ids_lines(3))
    second = _write(tmp_path, "second.jsonl", _ids_lines(8))
    prefix = tmp_path / "out" / "ds"
    assert _invoke(_null_cli(first, prefix)).exit_code == 0
    written = {ext: Path(dataset_prefix(str(prefix), "text") + ext).read_bytes()
               for ext in (".bin", ".idx")}

    result = _invoke(_null_cli(second, prefix))
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert f"--output-prefix {prefix}:" in message
    assert "ds_text_document.bin" in message and "already exist" in message
    assert "--force" in message and "Traceback" not in result.output
    for ext, data in written.items():
        assert Path(dataset_prefix(str(prefix), "text") + ext).read_bytes() == data

    result = _invoke(_null_cli(second, prefix, "--force"))
    assert result.exit_code == 0, result.output
    assert len(_read_dataset(dataset_prefix(str(prefix), "text"))) == 8
    assert _files(prefix.parent) == ["ds_text_document.bin", "ds_text_document.dlmspec.json",
                                     "ds_text_document.idx"]


def test_a_lone_bin_or_a_folder_in_the_way_is_refused(tmp_path):
    corpus = _write(tmp_path, "corpus.jsonl", _ids_lines(3))
    lone = tmp_path / "a_text_document.bin"
    lone.write_bytes(b"someone's file")
    result = _invoke(_null_cli(corpus, tmp_path / "a"))
    assert result.exit_code == 2 and "--force" in result.stderr
    assert lone.read_bytes() == b"someone's file"

    (tmp_path / "b_text_document.idx").mkdir()
    result = _invoke(_null_cli(corpus, tmp_path / "b", "--force"))
    assert result.exit_code == 2, result.output
    assert "is a folder" in " ".join(result.stderr.split())
    assert "Traceback" not in result.output


# ----------------------------------------------------------------- temporary files


#: Runs the CLI with a writer that stops (sleeps) after the second chunk, once the temporary
#: files exist, and touches argv[1] to say so.
SLOW_PREPARE = r"""
import sys, time
from dlmspec.data import cli, prepare
ready, args = sys.argv[1], sys.argv[2:]
original, calls = prepare._write_documents, []
def slow_write(*a, **k):
    original(*a, **k)
    calls.append(1)
    if len(calls) == 2:
        open(ready, "w").close()
        time.sleep(120)
prepare._write_documents = slow_write
cli.app(["prepare", "--no-progress", *args], prog_name="dlmspec data")
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}


def test_sigterm_mid_run_removes_temporary_files(tmp_path):
    """A real SIGTERM to a CLI process with a worker pool (Ctrl-C, a KeyboardInterrupt, is
    covered in-process above; a subprocess here costs the megatron-core import)."""
    import signal
    import time

    corpus = _write(tmp_path, "corpus.jsonl", [json.dumps({"text": f"document {i}"})
                                                for i in range(200)])
    out = tmp_path / "out"
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_PREPARE, str(ready), "--input", str(corpus),
         "--output-prefix", str(out / "ds"), *GPT2_CLI, "--workers", "2"],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "prepare did not reach its second chunk"
            time.sleep(0.05)
        assert [p for p in _files(out) if ".tmp-" in p]  # the run is writing them
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "interrupted (SIGTERM)" in stderr and "Traceback" not in stderr
    assert _files(out) == []


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_stale_temporary_files_are_removed_and_live_ones_kept(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    dead, live = _dead_pid(), os.getppid()
    host = outputs.host_tag()
    stale = [f"ds_text_document.tmp-{dead}-0123abcd.bin",          # written before hosts were named
             f"ds_text_document.tmp-{dead}-0123abcd.idx",
             f"ds_title_document.tmp-{host}-{dead}-00ff00ff.bin"]  # another key of the same prefix
    kept = [f"ds_text_document.tmp-{live}-89abcdef.bin",            # a running prepare's
            f"ds_text_document.tmp-{host}-{live}-89abcdef.bin",
            f"ds_text_document.tmp-some-other-node-{dead}-0123abcd.bin",  # pid of another machine
            f"other_text_document.tmp-{dead}-0123abcd.bin",         # another prefix
            "ds_text_document.tmp-notes.txt"]                       # not a temporary file name
    for name in stale + kept:
        (out / name).write_bytes(b"\0" * 1000)
    corpus = _write(tmp_path, "corpus.jsonl", _ids_lines(3))
    result = _invoke(_null_cli(corpus, out / "ds"))
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if "removed" in line]
    assert len(notes) == 1, result.stderr
    assert notes[0].startswith("note: removed 3 stale temporary files") and f"pid {dead}" in notes[0]
    assert "not running" in notes[0]
    assert _files(out) == sorted(kept + ["ds_text_document.bin", "ds_text_document.dlmspec.json",
                                         "ds_text_document.idx"])
    assert f"pid {live}" in result.stderr  # the live run's files are named, and left alone


def test_input_named_like_a_stale_temporary_file_is_not_removed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    corpus = _write(out, f"ds_text_document.tmp-{_dead_pid()}-0123abcd.bin", _ids_lines(3))
    before = corpus.read_bytes()
    result = _invoke(_null_cli(corpus, out / "ds"))
    assert result.exit_code == 0, result.output
    assert corpus.read_bytes() == before


# ----------------------------------------------------------------- bounded memory, workers


def test_giant_line_is_refused_without_reading_it_whole(tmp_path):
    import tracemalloc

    size = 40 << 20
    path = tmp_path / "giant.jsonl"
    with path.open("wb") as handle:
        handle.write(b'{"text": "1 2"}\n{"text": "')
        handle.write(b"x" * size)
        handle.write(b'"}\n{"text": "3"}\n')
    warm = _write(tmp_path, "warm.jsonl", _ids_lines(1))  # imports stay out of the trace
    prepare(warm, tmp_path / "warm" / "ds", tokenizer_type="null", vocab_size=10)
    tracemalloc.start()
    try:
        with pytest.raises(DataPrepareError) as info:
            prepare(path, tmp_path / "ds", tokenizer_type="null", vocab_size=10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"giant.jsonl:2: the line has {size + 12:,} bytes" in str(info.value)
    assert f"--max-line-bytes {read.MAX_LINE_BYTES:,}" in str(info.value)
    # readline joins its buffered pieces, so reading the limit's worth costs it twice, once
    assert peak < 2 * read.MAX_LINE_BYTES + (4 << 20), peak
    assert _files(tmp_path) == ["giant.jsonl", "warm", "warm.jsonl"]


def test_max_line_bytes_boundary(tmp_path):
    line = json.dumps({"text": "1 2 3"})  # 17 bytes
    for ending in ("\n", ""):  # the newline is not counted, and the last line may lack one
        path = tmp_path / "edge.jsonl"
        path.write_text(line + "\n" + line + ending, encoding="utf-8")
        result = prepare(path, tmp_path / "ok", tokenizer_type="null", vocab_size=10,
                         max_line_bytes=len(line), force=True)
        assert result.documents == 2
        with pytest.raises(DataPrepareError, match=r"edge.jsonl:1: the line has 17 bytes"):
            prepare(path, tmp_path / "no", tokenizer_type="null", vocab_size=10,
                    max_line_bytes=len(line) - 1)


#: Imports what prepare needs, then caps the address space at what it uses now plus 512 MiB
#: (torch's mappings differ between machines, so the cap is measured, not fixed) and runs the CLI.
BOUNDED_PREPARE = r"""
import resource, sys
from dlmspec.data import cli
from dlmspec.tokenizers import TokenizerArgs
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
TokenizerArgs(tokenizer_type="GPT2BPETokenizer", vocab_file=sys.argv[1], merge_file=sys.argv[2]).build()
size = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (size + (512 << 20), resource.RLIM_INFINITY))
cli.app(["prepare", "--no-progress", *sys.argv[3:]], prog_name="dlmspec data")
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_cli_giant_line_stays_bounded_under_rlimit(tmp_path):
    path = tmp_path / "giant.jsonl"
    with path.open("wb") as handle:
        handle.write(b'{"text": "')
        handle.write(b"12 " * (14 << 20) + b"12")  # 42 MiB: 14 M GPT-2 tokens if parsed whole
        handle.write(b'"}\n')
    proc = subprocess.run(
        [sys.executable, "-c", BOUNDED_PREPARE, VOCAB, MERGES,
         "--input", str(path), "--output-prefix", str(tmp_path / "ds"), *GPT2_CLI],
        env=_env(), capture_output=True, text=True, timeout=120,
    )
    stderr = " ".join(proc.stderr.split())
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in stderr and "MemoryError" not in stderr
    assert f"giant.jsonl:1: the line has {3 * (14 << 20) + 14:,} bytes" in stderr
    assert "--max-line-bytes" in stderr
    assert _files(tmp_path) == ["giant.jsonl"]


def test_workers_are_capped_at_the_cpu_count(tmp_path, monkeypatch):
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    real = encode.mp_context()

    class GuardedContext:  # fails the test instead of forking a million processes
        def Pool(self, processes, *args, **kwargs):
            assert processes <= cpus, f"asked for {processes} worker processes"
            return real.Pool(processes, *args, **kwargs)

    monkeypatch.setattr(encode, "mp_context", lambda: GuardedContext())
    corpus = _write(tmp_path, "corpus.jsonl", _ids_lines(40))
    result = _invoke(_null_cli(corpus, tmp_path / "ds", "--workers", "1000000", "--json"))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["result"]["workers"] == cpus
    notes = [line for line in result.stderr.splitlines() if "1000000" in line.replace(",", "")]
    assert len(notes) == 1 and f"using {cpus}" in notes[0], result.stderr


def test_disk_full_is_a_clean_error_without_temporary_files(tmp_path, monkeypatch):
    import errno

    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(IndexedDatasetBuilder, "add_document", full)
    corpus = _write(tmp_path, "corpus.jsonl", _ids_lines(3))
    out = tmp_path / "out"
    result = _invoke(_null_cli(corpus, out / "ds"))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    message = " ".join(result.stderr.split())
    assert "No space left on device" in message and str(out) in message
    assert _files(out) == []
