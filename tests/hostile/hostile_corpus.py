"""The hostile-file corpus: every file dlmspec reads besides the spec loader, made hostile.

A :class:`Case` is one hostile input planted in a folder of its own (the commands' working
directory) and the commands that read it. :func:`build_base` writes, once per corpus run, the
benign material the cases copy or point at (a real tokenized dataset and its record, a sharded
dataset with its manifest and progress file, a Hugging Face tokenizer folder, a run folder,
tiny checkpoints); :func:`all_cases` lists every case, deterministically from a seed (the seed
draws the secrets, the garbage bytes and which variant the subset takes); :func:`subset` picks
at least one case per surface and per hostile class.

Surfaces (:data:`SURFACES`): ``dataset-record`` and ``manifest`` (named in a spec's
``data.train``: ``validate``, ``compile``, ``data inspect``), ``indexed-dataset`` (``.bin``/``.idx``:
``data inspect``, ``train.py --check``), ``run-folder`` (``metrics.jsonl``: ``show RUN``,
``plot RUN``), ``prepare-input`` (``data prepare`` JSONL, ``.gz``, ``.zst``, ``--sft`` rows,
``--resume`` progress files, planted outputs), ``tokenizer-folder`` (``tokenizer.json``,
``tokenizer_config.json``: chat templates, ``auto_map`` code), ``checkpoint`` (``.metadata``,
``.distcp``, ``common.pt``, ``latest``, ``dlmspec.json``, ``spec.lock.toml`` for ``generate``,
``eval``, ``convert mcore-to-hf``, ``convert verify``), ``prompts-choices`` (``--prompts``,
``--choices``), ``python-spec`` (Python specs and sweeps), ``hf-config`` (``config.json`` of
``convert hf-to-mcore``), ``submit`` (``submit --dry-run``, secrets in ``cluster.slurm.env``).

Command words: ``{dlmspec}`` is the venv's console script, ``{python}`` its interpreter,
``{lm_eval}`` the ``dlmspec-lm-eval`` script, ``{base}`` the base folder.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path[:0] = [p for p in (str(HERE), str(HERE.parent / "kits")) if p not in sys.path]

from hostile_data import (  # noqa: E402
    CANARY, CLASSES, ESCAPE, ESCAPE_NAME, HUGE_INT, LONE_SURROGATE_JSON, NESTED_ARRAY, NESTED_OBJECT, NON_UTF8, RAW_SURROGATE,
    VICTIM, github_token, gzip_bomb, hostile_pickle, plant_device, plant_fifo, plant_link, plant_sparse,
    plant_victim, secret_token, zstd_bomb,
)

SURFACES = ("dataset-record", "manifest", "indexed-dataset", "run-folder", "prepare-input", "tokenizer-folder",
            "checkpoint", "prompts-choices", "python-spec", "hf-config", "submit")

#: Files every command may write in its working directory whatever it reads: caches of the
#: libraries it imports (HOME, TMPDIR and the cache variables point here, see ``driver.case_env``).
ALWAYS_WRITABLE = ("home/**", "tmp/**")

DATASET = "ds_text_document"
SHARDED = "sh_text_document.manifest.json"


@dataclass
class Case:
    """One hostile input and the commands that read it.

    Attributes:
        id: ``surface/class/variant`` (unique).
        surface: one of :data:`SURFACES`.
        hostile: one of :data:`hostile_data.CLASSES`, or ``"control"`` (benign: must exit 0).
        commands: argv lists with the placeholders of the module docstring.
        build: writes the case's files into its folder (the commands' working directory).
        outputs: glob patterns (relative to the folder, ``**`` for any depth) of the files the
            commands may create, change or remove; everything else must stay as it was.
        secret: a secret planted in the input, which no output or written file may hold.
        forbidden_output: strings that must not appear in the commands' output (raw escapes).
        needs_checkpoints: the case copies the tiny checkpoints (torch; slower).
        expect_rc: exit codes allowed (controls: only 0).
        timeout_s: this case's timeout per command (default: the driver's).
        accept_refusal: a control whose last check refuses on this machine (``train.py --check``
            without a GPU): exit code 2 counts as passing when the output holds this text.
    """

    id: str
    surface: str
    hostile: str
    commands: list[list[str]]
    build: Callable[[Path], None]
    outputs: tuple[str, ...] = ()
    secret: str | None = None
    forbidden_output: tuple[str, ...] = ()
    needs_checkpoints: bool = False
    expect_rc: tuple[int, ...] = (0, 2)
    timeout_s: float | None = None
    accept_refusal: str | None = None

    @property
    def variant(self) -> str:
        return self.id.rsplit("/", 1)[-1]


# ---------------------------------------------------------------------------------------- base
def _corpus_lines(rng: random.Random, n: int = 40) -> list[str]:
    words = ("the quick brown fox jumps over lazy dog python module function returns value list "
             "string number file path data model token train step loss").split()
    return [json.dumps({"text": " ".join(rng.choice(words) for _ in range(rng.randint(8, 30)))}) for _ in range(n)]


def _run(argv: list[str], cwd: Path) -> None:
    """Run a step of the base build; its output goes to a log file (not a pipe: megatron-core's
    writer processes outlive a checkpoint save), and its session is killed after it exits."""
    log = cwd / f".build-{Path(argv[1]).name if len(argv) > 1 else 'step'}.log"
    with open(log, "wb") as out:
        child = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        code = child.wait()
    try:
        os.killpg(child.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    if code != 0:
        raise RuntimeError(f"building the corpus base: {argv} exited {code}:\n{log.read_text(errors='replace')[-4000:]}")
    log.unlink()


def tools(python: str | None = None) -> dict[str, str]:
    """The placeholders' values: the venv's interpreter and console scripts."""
    python = python or sys.executable
    bin_dir = Path(python).parent
    return {"python": python, "dlmspec": str(bin_dir / "dlmspec"), "lm_eval": str(bin_dir / "dlmspec-lm-eval")}


def build_base(base: Path, *, checkpoints: bool = True, seed: int = 0, python: str | None = None) -> Path:
    """Write the benign material the cases copy into ``base`` (kept when already complete).

    Needs the offline data kit's GPT-2 tokenizer (tests/kits/shared_kit.py). ``checkpoints``: also
    build the tiny checkpoints (:mod:`build_checkpoints`, a process of its own: ~20-60 s).
    """
    from shared_kit import SHARED_DATA

    tool = tools(python)
    base.mkdir(parents=True, exist_ok=True)
    if not (base / "BASE_DONE").exists():
        for stale in base.iterdir():  # an interrupted build: start again
            shutil.rmtree(stale) if stale.is_dir() and not stale.is_symlink() else stale.unlink()
        gpt2 = base / "gpt2"
        gpt2.mkdir(exist_ok=True)
        for name in ("vocab.json", "merges.txt"):
            shutil.copy2(SHARED_DATA / "tokenizers" / "gpt2" / name, gpt2 / name)
        rng = random.Random(f"base:{seed}")
        (base / "corpus.jsonl").write_text("\n".join(_corpus_lines(rng)) + "\n")
        gpt = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "gpt2/vocab.json", "--merge-file",
               "gpt2/merges.txt", "--append-eod", "--no-progress"]
        _run([tool["dlmspec"], "data", "prepare", "--input", "corpus.jsonl", "--output-prefix", "ds", *gpt], base)
        _run([tool["dlmspec"], "data", "prepare", "--input", "corpus.jsonl", "--output-prefix", "sh",
              "--shard-size", "300", *gpt], base)
        rows = [{"messages": [{"role": "user", "content": "what is a list"},
                              {"role": "assistant", "content": "a sequence of values"}]},
                {"prompt": "name a module", "response": "the os module"}]
        (base / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows * 4))
        # a Hugging Face tokenizer folder (GPT-2's BPE as tokenizer.json)
        code = ("from tokenizers import Tokenizer, decoders, models, pre_tokenizers; "
                "t = Tokenizer(models.BPE.from_file('gpt2/vocab.json', 'gpt2/merges.txt')); "
                "t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False); t.decoder = decoders.ByteLevel(); "
                "t.add_special_tokens(['<|endoftext|>']); import os; os.makedirs('tok', exist_ok=True); t.save('tok/tokenizer.json')")
        _run([tool["python"], "-c", code], base)
        (base / "tok" / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>",
            "unk_token": "<|endoftext|>", "model_max_length": 1024,
            "chat_template": "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"}, indent=1))
        run = base / "runs" / "r"
        run.mkdir(parents=True, exist_ok=True)
        records = [{"event": "start", "time": 1.0e9, "name": "r", "spec": "spec.toml", "world_size": 1}]
        records += [{"event": "train", "time": 1.0e9 + i, "step": i, "iteration": i, "loss": 10.0 / i, "lr": 1e-3,
                     "tokens_per_s": 1000.0} for i in range(1, 11)]
        records += [{"event": "valid", "time": 1.0e9 + 11, "step": 10, "iteration": 10, "loss": 1.5},
                    {"event": "exit", "time": 1.0e9 + 12, "reason": "done", "step": 10}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (base / "BASE_DONE").write_text("ok\n")
    if checkpoints and not (base / "ckpt" / "DONE").exists():
        if (base / "ckpt").exists():
            shutil.rmtree(base / "ckpt")
        _run([tool["python"], str(HERE / "build_checkpoints.py"), str(base / "ckpt")], base)
    return base


# -------------------------------------------------------------------------------- case helpers
def spec_text(base: Path, *, train: str = DATASET, extra: str = "", name: str = "hostile") -> str:
    """A small valid spec whose ``data.train`` names ``train`` (relative to the case folder)."""
    return f"""name = {json.dumps(name)}

[model]
num_layers = 2
hidden_size = 64
ffn_hidden_size = 128
num_attention_heads = 4
num_query_groups = 2
vocab_size = 50257
max_position_embeddings = 256

[train]
micro_batch_size = 1
global_batch_size = 1
seq_length = 64
train_iters = 10
lr_warmup_iters = 1
eval_interval = 5
eval_iters = 1

[data]
train = [{{ prefix = {json.dumps(train)}, weight = 1.0 }}]

[data.tokenizer]
type = "GPT2BPETokenizer"
vocab_file = {json.dumps(str(base / "gpt2" / "vocab.json"))}
merge_file = {json.dumps(str(base / "gpt2" / "merges.txt"))}

[cluster]
gpu = "h100"
gpus_per_node = 1
nodes = 1
{extra}"""


def _copy_dataset(base: Path, case: Path, prefix: str = "ds", key_prefix: str = DATASET) -> None:
    for suffix in (".bin", ".idx", ".dlmspec.json"):
        shutil.copy2(base / f"{key_prefix}{suffix}", case / f"{key_prefix}{suffix}")


def _copy_sharded(base: Path, case: Path) -> None:
    for path in base.iterdir():
        if path.name.startswith("sh"):
            shutil.copy2(path, case / path.name)
    shutil.copy2(base / "corpus.jsonl", case / "corpus.jsonl")


def _write(case: Path, rel: str, data: str | bytes) -> None:
    path = case / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_bytes(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)


def _json_edit(case: Path, rel: str, edit: Callable[[dict], object]) -> None:
    """Load JSON at ``rel``, apply ``edit`` (it returns the new object, or None for in place), dump
    with NaN/Infinity allowed."""
    path = case / rel
    data = json.loads(path.read_text())
    new = edit(data)
    _write(case, rel, json.dumps(data if new is None else new, allow_nan=True))


def _raw_json_value(case: Path, rel: str, key: str, raw: str) -> None:
    """Replace the value of top-level ``key`` of the JSON object at ``rel`` by the raw text ``raw``."""
    path = case / rel
    data = json.loads(path.read_text())
    data[key] = "@@RAW@@"
    _write(case, rel, json.dumps(data).replace('"@@RAW@@"', raw))


def _raw_edit(case: Path, rel: str, put: Callable[[object, str], object], raw: str) -> None:
    """Load the JSON at ``rel``, let ``put(data, marker)`` place a marker string, and write it back
    with the marker replaced by the raw text ``raw`` (a number JSON allows but Python cannot hold)."""
    data = json.loads((case / rel).read_text())
    put(data, "@@RAW@@")
    _write(case, rel, json.dumps(data).replace('"@@RAW@@"', raw))


def _steps(*funcs: Callable[[Path], None]) -> Callable[[Path], None]:
    def build(case: Path) -> None:
        for func in funcs:
            func(case)
    return build


# ------------------------------------------------------------------------------------ surfaces
def _record_and_manifest_cases(base: Path, rng: random.Random, tool: dict[str, str]) -> list[Case]:
    cases: list[Case] = []
    rec = f"{DATASET}.dlmspec.json"

    def spec(train: str = DATASET) -> Callable[[Path], None]:
        return lambda case: _write(case, "spec.toml", spec_text(base, train=train))

    commands = [["{dlmspec}", "validate", "spec.toml"], ["{dlmspec}", "compile", "spec.toml", "-o", "out"],
                ["{dlmspec}", "data", "inspect", DATASET]]
    outputs = ("out/**",)
    secret = secret_token(rng)
    variants: list[tuple[str, str, Callable[[Path], None], dict]] = [
        ("control", "copy", lambda c: None, {"expect_rc": (0,)}),
        ("nesting", "array-100k", lambda c: _write(c, rec, NESTED_ARRAY), {}),
        ("nesting", "object-100k", lambda c: _write(c, rec, NESTED_OBJECT), {}),
        ("nesting", "tokenizer-nested", lambda c: _json_edit(c, rec, lambda d: d.__setitem__("tokenizer", json.loads("[" * 500 + "]" * 500))), {}),
        ("fifo", "record-fifo", lambda c: plant_fifo(c, rec), {}),
        ("device", "record-dev-zero", lambda c: plant_device(c, rec), {}),
        ("device", "tokenizer-file-dev-zero", lambda c: _json_edit(c, rec, lambda d: d["tokenizer"].__setitem__(
            "files", {"vocab_file": {"path": "/dev/zero", "sha256": "0" * 64}})), {}),
        ("huge", "record-sparse-8g", lambda c: plant_sparse(c, rec), {}),
        ("numbers", "nan-inf-counts", lambda c: _json_edit(c, rec, lambda d: d.update(documents=float("nan"), tokens=float("inf"))), {}),
        ("numbers", "vocab-1e999", lambda c: _raw_json_value(c, rec, "tokenizer", '{"type": "GPT2BPETokenizer", "vocab_size": 1e999, "eod_id": -1e999}'), {}),
        ("numbers", "huge-int-5000-digits", lambda c: _raw_json_value(c, rec, "documents", HUGE_INT), {}),
        ("surrogate", "escaped-lone-surrogate", lambda c: _raw_json_value(c, rec, "tokenizer", '{"type": "GPT2' + LONE_SURROGATE_JSON + '", "vocab_size": 50257}'), {}),
        ("surrogate", "raw-surrogate-bytes", lambda c: _write(c, rec, b'{"schema": "dlmspec.dataset", "version": 1, "tokenizer": {"type": "' + RAW_SURROGATE + b'"}}'), {}),
        ("non-utf8", "garbage-bytes", lambda c: _write(c, rec, b'{"schema": "' + NON_UTF8 + b'"}'), {}),
        ("escape", "tokenizer-type-escapes", lambda c: _json_edit(c, rec, lambda d: d["tokenizer"].__setitem__("type", ESCAPE)),
         {"forbidden_output": ("\x1b]0;PWNED", "\x1b[2J")}),
        ("secret", "secret-in-file-path", lambda c: _json_edit(c, rec, lambda d: d["tokenizer"].__setitem__(
            "files", {"vocab_file": {"path": f"/data/{secret}/vocab.json", "sha256": "0" * 64}})), {"secret": secret}),
        ("symlink", "compile-output-link", lambda c: (plant_link(c, "out/spec.lock.toml"), plant_link(c, "out/train.py")), {}),
        ("template", "sft-chat-template", lambda c: _json_edit(c, rec, lambda d: d.__setitem__("sft", {
            "chat_template": "{{ cycler.__init__.__globals__.os.system('touch " + CANARY + "') }}", "response_mask": "../victim/victim"})), {}),
    ]
    for hostile, name, edit, extra in variants:
        cases.append(Case(f"dataset-record/{hostile}/{name}", "dataset-record", hostile, commands,
                          _steps(lambda c: _copy_dataset(base, c), spec(), lambda c: plant_victim(c), edit),
                          outputs, **extra))

    man = SHARDED
    mcommands = [["{dlmspec}", "validate", "spec.toml"], ["{dlmspec}", "compile", "spec.toml", "-o", "out"],
                 ["{dlmspec}", "data", "inspect", SHARDED]]

    def shards(edit: Callable[[list], object]) -> Callable[[Path], None]:
        return lambda c: _json_edit(c, man, lambda d: edit(d["shards"]))

    msecret = github_token(rng)
    mvariants: list[tuple[str, str, Callable[[Path], None], dict]] = [
        ("control", "copy", lambda c: None, {"expect_rc": (0,)}),
        ("nesting", "array-100k", lambda c: _write(c, man, NESTED_ARRAY), {}),
        ("nesting", "shards-nested", lambda c: _raw_edit(c, man, lambda d, raw: d.__setitem__("shards", raw), NESTED_ARRAY), {}),
        ("fifo", "manifest-fifo", lambda c: plant_fifo(c, man), {}),
        ("fifo", "shard-bin-fifo", lambda c: plant_fifo(c, "sh-00000_text_document.bin"), {}),
        ("device", "shard-path-dev-zero", shards(lambda s: s[0].__setitem__("path", "/dev/zero")), {}),
        ("device", "manifest-dev-urandom", lambda c: plant_device(c, man, "/dev/urandom"), {}),
        ("huge", "manifest-sparse-8g", lambda c: plant_sparse(c, man), {}),
        ("huge", "100k-shards", shards(lambda s: s.extend([dict(s[0])] * 100_000)), {}),
        ("numbers", "nan-tokens", shards(lambda s: [x.__setitem__("tokens", float("nan")) for x in s]), {}),
        ("numbers", "inf-and-negative", shards(lambda s: [x.update(tokens=float("-inf"), documents=-(2 ** 63)) for x in s]), {}),
        ("numbers", "huge-int", lambda c: _raw_edit(c, man, lambda d, raw: d["shards"][0].__setitem__("tokens", raw), HUGE_INT), {}),
        ("surrogate", "shard-path-surrogate", shards(lambda s: s[0].__setitem__("path", "sh\ud800")), {}),
        ("non-utf8", "garbage", lambda c: _write(c, man, b'{"kind": "dlmspec-dataset-manifest", "version": 1, "shards": [{"path": "' + NON_UTF8 + b'"}]}'), {}),
        ("symlink", "shard-path-traversal", shards(lambda s: s[0].__setitem__("path", "../" * 12 + "etc/passwd")), {}),
        ("symlink", "shard-idx-link-to-victim", lambda c: plant_link(c, "sh-00000_text_document.idx"), {}),
        ("escape", "shard-path-escapes", shards(lambda s: s[0].__setitem__("path", ESCAPE)),
         {"forbidden_output": ("\x1b]0;PWNED", "\x1b[2J")}),
        ("secret", "secret-in-shard-path", shards(lambda s: s[0].__setitem__("path", f"s3://AKIAIOSFODNN7EXAMPLE:{msecret}@bucket/x")), {"secret": msecret}),
    ]
    for hostile, name, edit, extra in mvariants:
        cases.append(Case(f"manifest/{hostile}/{name}", "manifest", hostile, mcommands,
                          _steps(lambda c: _copy_sharded(base, c), spec(SHARDED), lambda c: plant_victim(c), edit),
                          outputs, **extra))
    return cases


def _idx_with(base: Path, *, sequences: int | None = None, documents: int | None = None, dtype: int | None = None,
              version: int | None = None, cut: int | None = None) -> bytes:
    """The base dataset's ``.idx`` with its header fields replaced (Megatron's MMIDIDX layout:
    9-byte magic, <Q version, <B dtype code, <Q sequence count, <Q document count, arrays)."""
    data = bytearray((base / f"{DATASET}.idx").read_bytes())
    assert data[:9] == b"MMIDIDX\x00\x00", data[:9]
    if version is not None:
        data[9:17] = struct.pack("<Q", version)
    if dtype is not None:
        data[17:18] = struct.pack("<B", dtype)
    if sequences is not None:
        data[18:26] = struct.pack("<Q", sequences)
    if documents is not None:
        data[26:34] = struct.pack("<Q", documents)
    return bytes(data[:cut] if cut is not None else data)


def _indexed_cases(base: Path, rng: random.Random, tool: dict[str, str]) -> list[Case]:
    idx, binf = f"{DATASET}.idx", f"{DATASET}.bin"
    inspect = [["{dlmspec}", "data", "inspect", DATASET]]
    check = [["{dlmspec}", "compile", "spec.toml", "-o", "out"], ["{python}", "out/train.py", "--check"]]
    garbage = bytes(rng.randrange(256) for _ in range(4096))
    variants: list[tuple[str, str, Callable[[Path], None], list, dict]] = [
        ("control", "copy", lambda c: None, inspect + check, {"expect_rc": (0,), "accept_refusal": "no CUDA device"}),
        ("numbers", "sequence-count-2^62", lambda c: _write(c, idx, _idx_with(base, sequences=2 ** 62)), inspect + check, {}),
        ("numbers", "document-count-2^64-1", lambda c: _write(c, idx, _idx_with(base, documents=2 ** 64 - 1)), inspect, {}),
        ("numbers", "dtype-code-255", lambda c: _write(c, idx, _idx_with(base, dtype=255)), inspect, {}),
        ("numbers", "version-7", lambda c: _write(c, idx, _idx_with(base, version=7)), inspect, {}),
        ("non-utf8", "idx-garbage", lambda c: _write(c, idx, garbage), inspect + check, {}),
        ("non-utf8", "idx-truncated-header", lambda c: _write(c, idx, _idx_with(base, cut=20)), inspect, {}),
        ("non-utf8", "idx-truncated-arrays", lambda c: _write(c, idx, _idx_with(base, cut=60)), inspect, {}),
        ("fifo", "bin-fifo", lambda c: plant_fifo(c, binf), inspect + check, {}),
        ("fifo", "idx-fifo", lambda c: plant_fifo(c, idx), inspect, {}),
        ("device", "bin-dev-zero", lambda c: plant_device(c, binf), inspect + check, {}),
        ("device", "idx-dev-zero", lambda c: plant_device(c, idx), inspect, {}),
        ("huge", "bin-sparse-8g", lambda c: plant_sparse(c, binf), inspect, {}),
        ("huge", "idx-sparse-8g", lambda c: plant_sparse(c, idx), inspect, {}),
        ("symlink", "bin-link-to-victim", lambda c: plant_link(c, binf), inspect, {}),
        ("nesting", "record-nested-with-idx", lambda c: _write(c, f"{DATASET}.dlmspec.json", NESTED_ARRAY), inspect + check, {}),
        ("escape", "prefix-with-escapes", lambda c: [os.rename(c / f"{DATASET}{s}", c / f"{ESCAPE_NAME}{s}") for s in (".bin", ".idx", ".dlmspec.json")],
         [["{dlmspec}", "data", "inspect", ESCAPE_NAME]], {"forbidden_output": ("\x1b]0;PWNED", "\x1b[2J")}),
    ]
    cases = []
    for hostile, name, edit, commands, extra in variants:
        cases.append(Case(f"indexed-dataset/{hostile}/{name}", "indexed-dataset", hostile, commands,
                          _steps(lambda c: _copy_dataset(base, c), lambda c: _write(c, "spec.toml", spec_text(base)),
                                 lambda c: plant_victim(c), edit),
                          ("out/**",), **extra))
    return cases


def _run_folder_cases(base: Path, rng: random.Random, tool: dict[str, str]) -> list[Case]:
    metrics = "runs/r/metrics.jsonl"
    commands = [["{dlmspec}", "show", "runs/r"], ["{dlmspec}", "plot", "runs/r", "-o", "plot.png"]]
    outputs = ("plot.png", ".plot.png*", "plot.png.*", ".dlmspec-plot*")
    secret = secret_token(rng)

    def line(text: str | bytes) -> Callable[[Path], None]:
        def build(case: Path) -> None:
            raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
            with open(case / metrics, "ab") as handle:
                handle.write(raw + b"\n")
        return build

    def train(**values: object) -> str:
        return json.dumps({"event": "train", "time": 1.0e9 + 20, "step": 11, "iteration": 11, **values})

    variants: list[tuple[str, str, Callable[[Path], None], dict]] = [
        ("control", "copy", lambda c: None, {"expect_rc": (0,)}),
        ("nesting", "line-100k-brackets", line(NESTED_ARRAY), {}),
        ("nesting", "record-100k-objects", line('{"event": "train", "loss": ' + NESTED_OBJECT + "}"), {}),
        ("fifo", "metrics-fifo", lambda c: plant_fifo(c, metrics), {}),
        ("device", "metrics-dev-zero", lambda c: plant_device(c, metrics), {}),
        ("huge", "metrics-sparse-8g-one-line", lambda c: plant_sparse(c, metrics), {}),
        ("huge", "metrics-1m-lines", lambda c: _write(c, metrics, (train(loss=1.0) + "\n") * 1_000_000), {}),
        ("numbers", "nan-inf-loss", line(train(loss=float("nan"), lr=float("inf"), tokens_per_s=float("-inf"))), {}),
        ("numbers", "1e999-and-huge-int", line('{"event": "train", "step": ' + HUGE_INT + ', "loss": 1e999, "time": -1e999}'), {}),
        ("numbers", "step-string-time-list", line(json.dumps({"event": "train", "step": "eleven", "loss": [1], "time": {"a": 1}})), {}),
        ("surrogate", "escaped-surrogate-name", line('{"event": "start", "name": "r' + LONE_SURROGATE_JSON + '", "time": 1}'), {}),
        ("surrogate", "raw-surrogate-bytes", line(b'{"event": "start", "name": "' + RAW_SURROGATE + b'"}'), {}),
        ("non-utf8", "garbage-line", line(b'{"event": "train", "loss": 1, "x": "' + NON_UTF8 + b'"}'), {}),
        ("escape", "run-name-escapes", line(json.dumps({"event": "start", "name": ESCAPE, "time": 1e9, "spec": ESCAPE})),
         {"forbidden_output": ("\x1b]0;PWNED", "\x1b[2J")}),
        ("secret", "secret-in-start-record", line(json.dumps({"event": "start", "name": "r", "time": 1e9, "wandb_api_key": secret,
                                                              "env": {"HF_TOKEN": secret}, "argv": ["--token", secret]})), {"secret": secret}),
        ("symlink", "plot-output-link", lambda c: plant_link(c, "plot.png"), {"outputs": ()}),
        ("symlink", "metrics-link-to-victim", lambda c: plant_link(c, metrics), {}),
    ]
    cases = []
    for hostile, name, edit, extra in variants:
        case_outputs = extra.pop("outputs", outputs)
        if name == "plot-output-link":
            case_outputs = (".plot.png*", "plot.png.*", ".dlmspec-plot*")
        cases.append(Case(f"run-folder/{hostile}/{name}", "run-folder", hostile, commands,
                          _steps(lambda c: shutil.copytree(base / "runs", c / "runs"), lambda c: plant_victim(c), edit),
                          case_outputs, **extra))
    return cases


def _gpt2_flags(base: Path) -> list[str]:
    return ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(base / "gpt2" / "vocab.json"),
            "--merge-file", str(base / "gpt2" / "merges.txt"), "--no-progress"]


def _prepare_cases(base: Path, rng: random.Random, tool: dict[str, str]) -> list[Case]:
    gpt = _gpt2_flags(base)

    def prepare(inp: str, *more: str) -> list[list[str]]:
        return [["{dlmspec}", "data", "prepare", "--input", inp, "--output-prefix", "out/o", *gpt, *more]]

    def sft(inp: str, *more: str) -> list[list[str]]:
        return [["{dlmspec}", "data", "prepare", "--sft", "--input", inp, "--output-prefix", "out/o", *gpt,
                 "--seq-length", "64", *more]]

    def lines(*rows: str | bytes) -> Callable[[Path], None]:
        def build(case: Path) -> None:
            raw = b"".join((r.encode("utf-8", "surrogatepass") if isinstance(r, str) else r) + b"\n" for r in rows)
            _write(case, "in.jsonl", raw)
        return build

    ok_row = json.dumps({"text": "a benign document"})
    outputs = ("out/**",)
    resume = ["--shard-size", "300", "--resume"]
    progress = "sh.prepare-progress.json"

    def resume_case(edit: Callable[[Path], None]) -> Callable[[Path], None]:
        def build(case: Path) -> None:
            _copy_sharded(base, case)
            _json_edit(case, progress, lambda d: d.__setitem__("complete", False))
            edit(case)
        return build

    resume_cmd = [["{dlmspec}", "data", "prepare", "--input", "corpus.jsonl", "--output-prefix", "sh",
                   "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "gpt2/vocab.json", "--merge-file", "gpt2/merges.txt",
                   "--append-eod", "--no-progress", *resume]]

    def with_gpt2_copy(edit: Callable[[Path], None]) -> Callable[[Path], None]:
        def build(case: Path) -> None:
            shutil.copytree(base / "gpt2", case / "gpt2")
            os.utime(case / "gpt2", None)
            edit(case)
        return build

    secret = secret_token(rng)
    variants: list[tuple[str, str, Callable[[Path], None], list, dict]] = [
        ("control", "jsonl", lines(ok_row, ok_row), prepare("in.jsonl"), {"expect_rc": (0,)}),
        ("control", "sft-rows", lambda c: shutil.copy2(base / "sft.jsonl", c / "in.jsonl"), sft("in.jsonl"), {"expect_rc": (0,)}),
        ("nesting", "jsonl-100k-brackets", lines(NESTED_ARRAY), prepare("in.jsonl"), {}),
        ("nesting", "text-nested-object", lines('{"text": ' + NESTED_OBJECT + "}"), prepare("in.jsonl"), {}),
        ("nesting", "sft-messages-nested", lines('{"messages": ' + NESTED_ARRAY + "}"), sft("in.jsonl"), {}),
        ("nesting", "progress-100k", resume_case(lambda c: _write(c, progress, NESTED_OBJECT)), resume_cmd, {"outputs": ("sh*",)}),
        ("fifo", "input-fifo", lambda c: plant_fifo(c, "in.jsonl"), prepare("in.jsonl"), {}),
        ("fifo", "progress-fifo", resume_case(lambda c: plant_fifo(c, progress)), resume_cmd, {"outputs": ("sh*",)}),
        ("device", "input-dev-zero", lambda c: plant_device(c, "in.jsonl"), prepare("in.jsonl"), {}),
        ("device", "input-dev-urandom-gz", lambda c: plant_device(c, "in.jsonl.gz", "/dev/urandom"), prepare("in.jsonl.gz"), {}),
        ("huge", "sparse-8g-one-line", lambda c: plant_sparse(c, "in.jsonl"), prepare("in.jsonl"), {}),
        ("huge", "gz-bomb-4g-one-line", lambda c: _write(c, "in.jsonl.gz", gzip_bomb()), prepare("in.jsonl.gz"), {}),
        ("huge", "zst-bomb-4g-one-line", lambda c: _write(c, "in.jsonl.zst", zstd_bomb()), prepare("in.jsonl.zst"), {}),
        ("huge", "gz-bomb-sft", lambda c: _write(c, "in.jsonl.gz", gzip_bomb(b"x")), sft("in.jsonl.gz"), {}),
        ("huge", "gz-truncated", lambda c: _write(c, "in.jsonl.gz", gzip.compress((ok_row + "\n").encode() * 100)[:-20]), prepare("in.jsonl.gz"), {}),
        ("huge", "zst-garbage", lambda c: _write(c, "in.jsonl.zst", b"\x28\xb5\x2f\xfd" + bytes(rng.randrange(256) for _ in range(512))), prepare("in.jsonl.zst"), {}),
        ("numbers", "text-nan-and-huge", lines('{"text": NaN}', '{"text": ' + HUGE_INT + "}", '{"text": 1e999}'), prepare("in.jsonl"), {}),
        ("numbers", "sft-content-numbers", lines('{"messages": [{"role": "user", "content": NaN}, {"role": "assistant", "content": ' + HUGE_INT + "}]}"), sft("in.jsonl", "--on-bad", "fail"), {}),
        ("numbers", "progress-nan-counts", resume_case(lambda c: _json_edit(c, progress, lambda d: [s.update(tokens=float("nan"), documents=10 ** 30) for s in d.get("shards", [])])), resume_cmd, {"outputs": ("sh*",)}),
        ("surrogate", "text-escaped-surrogate", lines('{"text": "a' + LONE_SURROGATE_JSON + 'b"}'), prepare("in.jsonl"), {}),
        ("surrogate", "sft-role-surrogate", lines('{"messages": [{"role": "' + LONE_SURROGATE_JSON + '", "content": "x"}, {"role": "assistant", "content": "y"}]}'), sft("in.jsonl"), {}),
        ("surrogate", "raw-surrogate-bytes", lines(b'{"text": "' + RAW_SURROGATE + b'"}'), prepare("in.jsonl"), {}),
        ("non-utf8", "garbage-line", lines(ok_row, b'{"text": "' + NON_UTF8 + b'"}'), prepare("in.jsonl"), {}),
        ("non-utf8", "gz-of-garbage", lambda c: _write(c, "in.jsonl.gz", gzip.compress(NON_UTF8 * 100)), prepare("in.jsonl.gz"), {}),
        ("non-utf8", "progress-garbage", resume_case(lambda c: _write(c, progress, NON_UTF8)), resume_cmd, {"outputs": ("sh*",)}),
        ("escape", "sft-role-escapes", lines(json.dumps({"messages": [{"role": ESCAPE, "content": "x"}, {"role": "assistant", "content": "y"}]})),
         sft("in.jsonl", "--on-bad", "fail"), {"forbidden_output": ("\x1b]0;PWNED", "\x1b[2J")}),
        ("escape", "json-key-escapes", lines(ok_row), prepare("in.jsonl", "--json-keys", ESCAPE), {"forbidden_output": ("\x1b]0;PWNED", "\x1b[2J")}),
        ("symlink", "bin-output-link", _steps(lines(ok_row), lambda c: plant_link(c, "out/o_text_document.bin")), prepare("in.jsonl"), {}),
        ("symlink", "idx-output-link", _steps(lines(ok_row), lambda c: plant_link(c, "out/o_text_document.idx")), prepare("in.jsonl", "--force"), {}),
        ("symlink", "record-output-link", _steps(lines(ok_row), lambda c: plant_link(c, "out/o_text_document.dlmspec.json")), prepare("in.jsonl", "--force"), {}),
        ("symlink", "sft-mask-output-link", _steps(lambda c: shutil.copy2(base / "sft.jsonl", c / "in.jsonl"),
                                                  lambda c: [plant_link(c, f"out/o_{k}_document.{s}") for k in ("text", "messages", "response_mask", "mask", "loss_mask") for s in ("bin", "idx")]),
         sft("in.jsonl", "--force"), {}),
        ("symlink", "progress-link-to-victim", resume_case(lambda c: (plant_victim(c), plant_link(c, progress))), resume_cmd, {"outputs": ("sh*",)}),
        ("symlink", "progress-shard-traversal", resume_case(lambda c: _json_edit(c, progress, lambda d: [s.__setitem__("path", "../victim/victim") for s in d.get("shards", [])])),
         resume_cmd, {"outputs": ("sh*",)}),
        ("symlink", "input-named-as-output", lambda c: shutil.copy2(base / "corpus.jsonl", c / "o_text_document.dlmspec.json"),
         [["{dlmspec}", "data", "prepare", "--input", "o_text_document.dlmspec.json", "--output-prefix", "o", *gpt, "--force"]],
         {"outputs": ("o_text_document.bin", "o_text_document.idx", ".o_text_document*", "o_text_document.*.tmp*")}),
        ("secret", "sft-template-value-secret", lambda c: shutil.copy2(base / "sft.jsonl", c / "in.jsonl"), sft("in.jsonl", "--chat-template", secret), {"secret": secret}),
    ]
    cases = []
    for hostile, name, edit, commands, extra in variants:
        case_outputs = extra.pop("outputs", outputs)
        needs_gpt2 = commands is resume_cmd
        builders = [lambda c: plant_victim(c)]
        if needs_gpt2:
            builders.append(lambda c: shutil.copytree(base / "gpt2", c / "gpt2"))
        builders.append(edit)
        cases.append(Case(f"prepare-input/{hostile}/{name}", "prepare-input", hostile, commands, _steps(*builders),
                          case_outputs, **extra))
    return cases


def _tokenizer_cases(base: Path, rng: random.Random, tool: dict[str, str]) -> list[Case]:
    def prepare(*more: str, sft: bool = False) -> list[list[str]]:
        source = ["--sft", "--input", "sft.jsonl", "--seq-length", "64"] if sft else ["--input", "corpus.jsonl"]
        return [["{dlmspec}", "data", "prepare", *source, "--output-prefix", "out/o", "--tokenizer-type",
                 "HuggingFaceTokenizer", "--tokenizer-model", "tok", "--no-progress", *more]]

    template = prepare("--chat-template", "tokenizer", sft=True)
    config = "tok/tokenizer_config.json"

    def set_template(text: str) -> Callable[[Path], None]:
        return lambda c: _json_edit(c, config, lambda d: d.__setitem__("chat_template", text))

    evil_module = f"import os\nopen(os.path.join(os.getcwd(), {CANARY!r}), 'w').write('code ran')\n"

    def auto_map(case: Path) -> None:
        _json_edit(case, config, lambda d: d.update(auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]},
                                                    tokenizer_class="EvilTokenizer"))
        _write(case, "tok/tokenization_evil.py", evil_module + "class EvilTokenizer:\n    pass\n")

    def tokenizer_json_auto_map(case: Path) -> None:
        auto_map(case)
        _write(case, "tok/config.json", json.dumps({"model_type": "evil", "auto_map": {"AutoConfig": "configuration_evil.EvilConfig",
                                                                                      "AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}}))
        _write(case, "tok/configuration_evil.py", evil_module + "class EvilConfig:\n    pass\n")

    secret = secret_token(rng)
    escape_out = {"forbidden_output": ("\x1b]0;PWNED", "\x1b[2J")}
    variants: list[tuple[str, str, Callable[[Path], None], list, dict]] = [
        ("control", "copy", lambda c: None, prepare(), {"expect_rc": (0,)}),
        ("control", "sft-template", lambda c: None, template, {"expect_rc": (0,)}),
        ("template", "sandbox-escape-globals", set_template("{{ cycler.__init__.__globals__.os.system('touch " + CANARY + "') }}"), template, {}),
        ("template", "sandbox-escape-subclasses", set_template("{% for c in ''.__class__.__mro__[1].__subclasses__() %}{% if c.__name__ == 'Popen' %}{{ c(['touch', '" + CANARY + "']) }}{% endif %}{% endfor %}"), template, {}),
        ("template", "endless-loop", set_template("{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}"), template, {}),
        ("template", "memory-blowup", set_template("{{ 'x' * 10000000000 }}"), template, {}),
        ("template", "raise-exception", set_template("{{ raise_exception('boom') }}"), template, {}),
        ("template", "syntax-error", set_template("{% for m in messages %}{{ m['content'] }"), template, {}),
        ("template", "include-file", set_template("{% include '/etc/passwd' %}"), template, {}),
        ("template", "escapes-in-output", set_template("{% for m in messages %}" + ESCAPE + "{{ m['content'] }}{% endfor %}"), template, escape_out),
        ("code", "auto-map-tokenizer", auto_map, prepare(), {}),
        ("code", "auto-map-config", tokenizer_json_auto_map, template, {}),
        ("nesting", "tokenizer-json-100k", lambda c: _write(c, "tok/tokenizer.json", NESTED_ARRAY), prepare(), {}),
        ("nesting", "tokenizer-config-100k", lambda c: _write(c, config, NESTED_OBJECT), prepare(), {}),
        ("fifo", "tokenizer-json-fifo", lambda c: plant_fifo(c, "tok/tokenizer.json"), prepare(), {}),
        ("fifo", "tokenizer-config-fifo", lambda c: plant_fifo(c, config), prepare(), {}),
        ("device", "tokenizer-json-dev-zero", lambda c: plant_device(c, "tok/tokenizer.json"), prepare(), {}),
        ("huge", "tokenizer-json-sparse-8g", lambda c: plant_sparse(c, "tok/tokenizer.json"), prepare(), {}),
        ("numbers", "config-nan-max-length", lambda c: _raw_json_value(c, config, "model_max_length", "NaN"), prepare(), {}),
        ("numbers", "config-huge-int", lambda c: _raw_json_value(c, config, "model_max_length", HUGE_INT), prepare(), {}),
        ("surrogate", "template-surrogate", lambda c: _raw_json_value(c, config, "chat_template", '"' + LONE_SURROGATE_JSON + '{{ messages }}"'), template, {}),
        ("non-utf8", "tokenizer-json-garbage", lambda c: _write(c, "tok/tokenizer.json", b'{"version": "' + NON_UTF8 + b'"}'), prepare(), {}),
        ("escape", "eos-token-escapes", lambda c: _json_edit(c, config, lambda d: d.__setitem__("eos_token", ESCAPE)), prepare("--append-eod"), escape_out),
        ("secret", "token-in-config", lambda c: _json_edit(c, config, lambda d: d.update(token=secret, use_auth_token=secret)), prepare(), {"secret": secret}),
        ("symlink", "tokenizer-json-link-to-victim", lambda c: plant_link(c, "tok/tokenizer.json"), prepare(), {}),
    ]
    cases = []
    for hostile, name, edit, commands, extra in variants:
        cases.append(Case(f"tokenizer-folder/{hostile}/{name}", "tokenizer-folder", hostile, commands,
                          _steps(lambda c: shutil.copytree(base / "tok", c / "tok"), lambda c: shutil.copy2(base / "corpus.jsonl", c / "corpus.jsonl"),
                                 lambda c: shutil.copy2(base / "sft.jsonl", c / "sft.jsonl"), lambda c: plant_victim(c), edit),
                          ("out/**",), **extra))
    return cases


# checkpoints -------------------------------------------------------------------------------
ITER = "run/checkpoints/iter_0000010"


def _checkpoint_cases(base: Path, rng: random.Random, tool: dict[str, str]) -> list[Case]:
    ckpt = base / "ckpt"
    generate = ["{dlmspec}", "generate", "run", "--prompt", "The", "--gen-length", "4", "--steps", "2", "--block-length", "4",
                "--device", "cpu", "--no-stream", "--batch-size", "1"]
    to_hf = ["{dlmspec}", "convert", "mcore-to-hf", "run/checkpoints", "out_hf"]
    evaluate = ["{dlmspec}", "eval", "run", "--data", str(base / DATASET), "--num-sequences", "1", "--num-samples", "2",
                "--samples-per-forward", "2", "--seq-length", "16", "--device", "cpu", "--batch-size", "1"]
    verify = ["{dlmspec}", "convert", "verify", "hf", "mcore"]
    mcore_to_hf = ["{dlmspec}", "convert", "mcore-to-hf", "mcore", "out_hf"]

    def runtime(*edits: Callable[[Path], None]) -> Callable[[Path], None]:
        return _steps(lambda c: shutil.copytree(ckpt / "run", c / "run"), lambda c: plant_victim(c), *edits)

    def converted(*edits: Callable[[Path], None]) -> Callable[[Path], None]:
        return _steps(lambda c: shutil.copytree(ckpt / "hf", c / "hf"), lambda c: shutil.copytree(ckpt / "mcore", c / "mcore"),
                      lambda c: plant_victim(c), *edits)

    def distcp(folder: str) -> Callable[[Path], str]:
        def first(case: Path) -> str:
            return str(sorted((case / folder).glob("*.distcp"))[0].relative_to(case))
        return first

    def replace_distcp(folder: str, data: Callable[[], bytes] | None = None, plant: Callable[[Path, str], None] | None = None) -> Callable[[Path], None]:
        def build(case: Path) -> None:
            rel = distcp(folder)(case)
            if plant is not None:
                plant(case, rel)
            else:
                _write(case, rel, data())
        return build

    meta = f"{ITER}/dlmspec.json"
    lock = f"{ITER}/spec.lock.toml"
    latest = "run/checkpoints/latest"
    secret = secret_token(rng)
    escape_out = {"forbidden_output": ("\x1b]0;PWNED", "\x1b[2J")}
    outputs = ("out_hf/**", ".out_hf*", "out_hf.*")
    g, h, e = [generate], [to_hf], [evaluate]
    variants: list[tuple[str, str, Callable[[Path], None], list, dict]] = [
        ("control", "runtime-generate", runtime(), g, {"expect_rc": (0,)}),
        ("control", "converted-verify", converted(), [verify], {"expect_rc": (0,)}),
        ("pickle", "metadata-pickle-payload", runtime(lambda c: _write(c, f"{ITER}/.metadata", hostile_pickle())), g + h, {}),
        ("pickle", "common-pt-payload", runtime(lambda c: shutil.copy2(ckpt / "evil_common.pt", c / ITER / "common.pt")), g + h, {}),
        ("pickle", "distcp-payload", runtime(replace_distcp(ITER, lambda: (ckpt / "evil.distcp").read_bytes())), g, {}),
        ("pickle", "converted-metadata-payload", converted(lambda c: _write(c, "mcore/.metadata", hostile_pickle())), [verify, mcore_to_hf], {}),
        ("pickle", "converted-common-pt-payload", converted(lambda c: shutil.copy2(ckpt / "evil_common.pt", c / "mcore" / "common.pt")), [mcore_to_hf], {}),
        ("nesting", "dlmspec-json-100k", runtime(lambda c: _write(c, meta, NESTED_ARRAY)), g + h, {}),
        ("nesting", "spec-lock-100k", runtime(lambda c: _write(c, lock, "a = " + "[" * 100_000 + "]" * 100_000 + "\n")), g, {}),
        ("nesting", "sidecar-100k", converted(lambda c: _write(c, "mcore/dlmspec_convert.json", NESTED_OBJECT)), [mcore_to_hf], {}),
        ("fifo", "latest-fifo", runtime(lambda c: plant_fifo(c, latest)), g + h, {}),
        ("fifo", "dlmspec-json-fifo", runtime(lambda c: plant_fifo(c, meta)), g, {}),
        ("fifo", "metadata-fifo", runtime(lambda c: plant_fifo(c, f"{ITER}/.metadata")), g, {}),
        ("device", "metadata-dev-zero", runtime(lambda c: plant_device(c, f"{ITER}/.metadata")), g + h, {}),
        ("device", "common-pt-dev-urandom", runtime(lambda c: plant_device(c, f"{ITER}/common.pt", "/dev/urandom")), g, {}),
        ("device", "distcp-dev-zero", runtime(replace_distcp(ITER, plant=lambda c, rel: plant_device(c, rel))), g, {}),
        ("huge", "latest-sparse-8g", runtime(lambda c: plant_sparse(c, latest)), g + h, {}),
        ("huge", "dlmspec-json-sparse-8g", runtime(lambda c: plant_sparse(c, meta)), g, {}),
        ("huge", "spec-lock-sparse-8g", runtime(lambda c: plant_sparse(c, lock)), g, {}),
        ("numbers", "lock-generate-1e999", runtime(lambda c: _write(c, lock, "[generate]\ngen_length = 1e999\nsteps = nan\nblock_length = " + HUGE_INT + "\n")), g, {}),
        ("numbers", "lock-generate-huge", runtime(lambda c: _write(c, lock, "[generate]\ngen_length = 9223372036854775807\nsteps = 9223372036854775807\nblock_length = 9223372036854775807\n")), g, {}),
        ("numbers", "dlmspec-json-nan", runtime(lambda c: _write(c, meta, (c / meta).read_text().replace("50304", "NaN").replace("50257", "1e999"))), g + h, {}),
        ("numbers", "latest-huge-iteration", runtime(lambda c: _write(c, latest, "iter_" + HUGE_INT + "\n")), g + h, {}),
        ("numbers", "sidecar-dims-huge", converted(lambda c: _json_edit(c, "mcore/dlmspec_convert.json", lambda d: d["dims"].update(hidden_size=2 ** 62, num_layers=float("nan")))), [verify, mcore_to_hf], {}),
        ("surrogate", "dlmspec-json-surrogate", runtime(lambda c: _write(c, meta, (c / meta).read_text().replace('"mdm"', '"' + LONE_SURROGATE_JSON + '"'))), g, {}),
        ("non-utf8", "latest-garbage", runtime(lambda c: _write(c, latest, NON_UTF8)), g + h, {}),
        ("non-utf8", "lock-garbage", runtime(lambda c: _write(c, lock, b"[generate]\ngen_length = \"" + NON_UTF8 + b"\"\n")), g, {}),
        ("non-utf8", "common-pt-garbage", runtime(lambda c: _write(c, f"{ITER}/common.pt", NON_UTF8 * 100)), g + h, {}),
        ("symlink", "latest-traversal", runtime(lambda c: _write(c, latest, "../../../victim\n")), g + h, {}),
        ("symlink", "output-link-to-victim-dir", runtime(lambda c: plant_link(c, "out_hf", str(c / "victim"))), h,
         {"outputs": (".out_hf*", "out_hf.*")}),
        ("symlink", "output-file-links", runtime(lambda c: [plant_link(c, f"out_hf/{n}") for n in ("config.json", "model.safetensors", "dlmspec_convert.json")]),
         [to_hf + ["--force"]], {}),
        ("symlink", "dlmspec-json-link-to-victim", runtime(lambda c: plant_link(c, meta)), g, {}),
        ("escape", "latest-escapes", runtime(lambda c: _write(c, latest, ESCAPE)), g + h, escape_out),
        ("escape", "lock-escapes", runtime(lambda c: _write(c, lock, "[generate]\nremasking = " + json.dumps(ESCAPE) + "\n")), g, escape_out),
        ("secret", "secret-in-dlmspec-json", runtime(lambda c: _json_edit(c, meta, lambda d: d.update(hf_token=secret, env={"HF_TOKEN": secret}))), g + h, {"secret": secret}),
        ("secret", "secret-in-lock", runtime(lambda c: _write(c, lock, (c / lock).read_text() + f"[cluster.slurm.env]\nHF_TOKEN = \"{secret}\"\n")), g + e, {"secret": secret}),
    ]
    cases = []
    for hostile, name, build, commands, extra in variants:
        case_outputs = extra.pop("outputs", outputs)
        cases.append(Case(f"checkpoint/{hostile}/{name}", "checkpoint", hostile, commands, build, case_outputs,
                          needs_checkpoints=True, **extra))
    # a resume: train.py --check reads the run's latest and dlmspec.json (start_checks, check_resume)
    check = [["{dlmspec}", "compile", "spec.toml", "-o", "out"], ["{python}", "out/train.py", "--check"]]
    resume_spec = '\n[checkpoint]\nsave = "run/checkpoints"\nresume_from_run = "tiny-mdm"\n'
    resume_variants: list[tuple[str, str, Callable[[Path], None]]] = [
        ("fifo", "resume-latest-fifo", lambda c: plant_fifo(c, latest)),
        ("non-utf8", "resume-latest-garbage", lambda c: _write(c, latest, NON_UTF8)),
        ("nesting", "resume-dlmspec-json-100k", lambda c: _write(c, meta, NESTED_OBJECT)),
        ("numbers", "resume-dlmspec-json-nan", lambda c: _write(c, meta, (c / meta).read_text().replace("50304", "NaN").replace("50257", HUGE_INT))),
        ("device", "resume-dlmspec-json-dev-zero", lambda c: plant_device(c, meta)),
        ("pickle", "resume-metadata-payload", lambda c: _write(c, f"{ITER}/.metadata", hostile_pickle())),
    ]
    for hostile, name, edit in resume_variants:
        cases.append(Case(f"checkpoint/{hostile}/{name}", "checkpoint", hostile, check,
                          _steps(lambda c: _copy_dataset(base, c), lambda c: _write(c, "spec.toml", spec_text(base, extra=resume_spec)),
                                 runtime(edit)), ("out/**",), needs_checkpoints=True))
    return cases


def _prompts_cases(base: Path, rng: random.Random, tool: dict[str, str]) -> list[Case]:
    ckpt = base / "ckpt"
    generate = ["{dlmspec}", "generate", "run", "--prompts", "p.jsonl", "--gen-length", "4", "--steps", "2", "--block-length", "4",
                "--device", "cpu", "--no-stream", "--batch-size", "1"]
    choices = ["{dlmspec}", "eval", "run", "--choices", "c.jsonl", "--num-samples", "2", "--samples-per-forward", "2",
               "--device", "cpu", "--batch-size", "1"]

    def p(*rows: str | bytes) -> Callable[[Path], None]:
        return lambda c: _write(c, "p.jsonl", b"".join((r.encode("utf-8", "surrogatepass") if isinstance(r, str) else r) + b"\n" for r in rows))

    def ch(*rows: str | bytes) -> Callable[[Path], None]:
        return lambda c: _write(c, "c.jsonl", b"".join((r.encode("utf-8", "surrogatepass") if isinstance(r, str) else r) + b"\n" for r in rows))

    good_choice = json.dumps({"context": "The sky is", "choices": [" blue", " green"], "label": 0})
    secret = secret_token(rng)
    escape_out = {"forbidden_output": ("\x1b]0;PWNED", "\x1b[2J")}
    variants: list[tuple[str, str, Callable[[Path], None], list, dict]] = [
        ("control", "prompts", p('{"prompt": "The"}'), [generate], {"expect_rc": (0,)}),
        ("control", "choices", ch(good_choice), [choices], {"expect_rc": (0,)}),
        ("nesting", "prompts-100k", p(NESTED_ARRAY), [generate], {}),
        ("nesting", "choices-100k", ch('{"context": "x", "choices": ' + NESTED_ARRAY + ', "label": 0}'), [choices], {}),
        ("fifo", "prompts-fifo", lambda c: plant_fifo(c, "p.jsonl"), [generate], {}),
        ("fifo", "choices-fifo", lambda c: plant_fifo(c, "c.jsonl"), [choices], {}),
        ("device", "prompts-dev-zero", lambda c: plant_device(c, "p.jsonl"), [generate], {}),
        ("device", "choices-dev-urandom", lambda c: plant_device(c, "c.jsonl", "/dev/urandom"), [choices], {}),
        ("huge", "prompts-sparse-8g", lambda c: plant_sparse(c, "p.jsonl"), [generate], {}),
        ("huge", "prompt-100m-chars", p(json.dumps({"prompt": "the " * 25_000_000})), [generate], {}),
        ("huge", "choices-100k", ch(json.dumps({"context": "x", "choices": [" a"] * 100_000, "label": 99_999})), [choices], {}),
        ("numbers", "prompt-ids-out-of-vocab", p(json.dumps({"prompt_ids": [2 ** 62, 10 ** 18]})), [generate], {}),
        ("numbers", "prompt-ids-nan-huge", p('{"prompt_ids": [NaN, 1e999, ' + HUGE_INT + "]}"), [generate], {}),
        ("numbers", "choices-label-nan", ch('{"context": "x", "choices": [" a", " b"], "label": NaN}'), [choices], {}),
        ("numbers", "choices-label-huge", ch('{"context": "x", "choices": [" a", " b"], "label": ' + HUGE_INT + "}"), [choices], {}),
        ("surrogate", "prompt-surrogate", p('{"prompt": "The' + LONE_SURROGATE_JSON + '"}'), [generate], {}),
        ("surrogate", "choices-surrogate", ch('{"context": "' + LONE_SURROGATE_JSON + '", "choices": [" a", " b"], "label": 0}'), [choices], {}),
        ("non-utf8", "prompts-garbage", p(b'{"prompt": "' + NON_UTF8 + b'"}'), [generate], {}),
        ("non-utf8", "choices-garbage", ch(NON_UTF8), [choices], {}),
        ("escape", "prompt-escapes", p(json.dumps({"prompt": ESCAPE})), [generate], escape_out),
        ("escape", "choices-escapes", ch(json.dumps({"context": ESCAPE, "choices": [ESCAPE, " b"], "label": 0})), [choices], escape_out),
        ("symlink", "prompts-link-to-victim", lambda c: plant_link(c, "p.jsonl"), [generate], {}),
        ("secret", "secret-in-bad-prompt-line", p(json.dumps({"prompt": 1, "token": secret})), [generate], {"secret": secret}),
        ("secret", "secret-in-bad-choice-line", ch(json.dumps({"context": 1, "api_key": secret})), [choices], {"secret": secret}),
    ]
    cases = []
    for hostile, name, edit, commands, extra in variants:
        cases.append(Case(f"prompts-choices/{hostile}/{name}", "prompts-choices", hostile, commands,
                          _steps(lambda c: shutil.copytree(ckpt / "run", c / "run"), lambda c: plant_victim(c), edit),
                          (), needs_checkpoints=True, **extra))
    return cases


def _python_spec_cases(base: Path, rng: random.Random, tool: dict[str, str]) -> list[Case]:
    commands = [["{dlmspec}", "validate", "spec.py"], ["{dlmspec}", "compile", "spec.py", "-o", "out"]]
    head = "from dlmspec.dsl import Spec\nbase = Spec.load('demo-dlm')\n"
    secret = secret_token(rng)
    variants: list[tuple[str, str, str, dict]] = [
        ("control", "one-spec", head + "spec = base\n", {"expect_rc": (0,)}),
        ("control", "small-sweep", head + "spec = {f'm{i}': base.replace(name=f'm{i}', checkpoint={'save': f'ck{i}'}) for i in range(3)}\n", {"expect_rc": (0,)}),
        ("huge", "sweep-100k-members", head + "spec = {f'm{i}': base.replace(name=f'm{i}', checkpoint={'save': f'ck{i}'}) for i in range(100_000)}\n", {}),
        ("huge", "endless-generator", head + "import itertools\nspec = (base.replace(name=f'm{i}') for i in itertools.count())\n", {}),
        ("huge", "endless-iterator-object", head + "class Forever:\n    def __iter__(self):\n        return self\n    def __next__(self):\n        return base\nspec = Forever()\n", {}),
        ("code", "object-str-raises", head + "class Evil:\n    def __str__(self):\n        raise RuntimeError('no str')\n    __repr__ = __str__\nspec = Evil()\n", {}),
        ("code", "dict-getitem-raises", head + "class Evil(dict):\n    def __getitem__(self, k):\n        raise KeyError(k)\n    def items(self):\n        raise RuntimeError('no items')\nspec = Evil(a=base)\n", {}),
        ("code", "name-object-eq-raises", head + "class Name(str):\n    def __eq__(self, o):\n        raise RuntimeError('eq')\n    __hash__ = str.__hash__\nspec = {Name('a'): base}\n", {}),
        ("code", "spec-is-a-module", head + "import os as spec\n", {}),
        ("code", "replace-with-objects", head + "spec = base.replace(name=object())\n", {}),
        ("nesting", "nested-list-100k", head + "x = base\nfor _ in range(100_000):\n    x = [x]\nspec = x\n", {}),
        ("nesting", "self-referencing-list", head + "x = [base]\nx.append(x)\nspec = x\n", {}),
        ("numbers", "nan-and-huge-values", head + "spec = base.replace(train={'lr': float('nan'), 'train_iters': 10**5000})\n", {}),
        ("surrogate", "name-surrogate", head + "spec = base.replace(name='a\\ud800')\n", {}),
        ("surrogate", "member-key-surrogate", head + "spec = {'a\\ud800': base}\n", {}),
        ("non-utf8", "source-garbage", "spec = '\udcff'\n", {}),
        ("escape", "member-name-escapes", head + f"spec = {{{ESCAPE!r}: base}}\n", {"forbidden_output": ("\x1b]0;PWNED", "\x1b[2J")}),
        ("secret", "secret-in-env", head + f"spec = base.replace(cluster={{'slurm': {{'env': {{'HF_TOKEN': {secret!r}}}}}}})\n", {"secret": secret}),
        ("symlink", "out-link-to-victim", head + "spec = base\n", {}),
    ]
    cases = []
    for hostile, name, text, extra in variants:
        def build(case: Path, text: str = text, name: str = name) -> None:
            plant_victim(case)
            if name == "source-garbage":
                _write(case, "spec.py", b"spec = '" + NON_UTF8 + b"'\n")
            else:
                _write(case, "spec.py", text)
            if name == "out-link-to-victim":
                plant_link(case, "out/train.py")
                plant_link(case, "out/launch.sh")
        cases.append(Case(f"python-spec/{hostile}/{name}", "python-spec", hostile, commands, build, ("out/**",), **extra))
    return cases


def _hf_config_cases(base: Path, rng: random.Random, tool: dict[str, str]) -> list[Case]:
    ckpt = base / "ckpt"
    command = [["{dlmspec}", "convert", "hf-to-mcore", "hf", "out_mcore"]]
    cfg = "hf/config.json"
    evil_module = f"import os\nopen(os.path.join(os.getcwd(), {CANARY!r}), 'w').write('code ran')\n"

    def auto_map(case: Path) -> None:
        _json_edit(case, cfg, lambda d: d.update(model_type="evil", architectures=["EvilForCausalLM"],
                                                 auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                                                           "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}))
        _write(case, "hf/configuration_evil.py", evil_module + "class EvilConfig:\n    pass\n")
        _write(case, "hf/modeling_evil.py", evil_module + "class EvilForCausalLM:\n    pass\n")

    secret = secret_token(rng)
    escape_out = {"forbidden_output": ("\x1b]0;PWNED", "\x1b[2J")}
    variants: list[tuple[str, str, Callable[[Path], None], dict]] = [
        ("control", "copy", lambda c: None, {"expect_rc": (0,)}),
        ("code", "auto-map-remote-code", auto_map, {}),
        ("nesting", "config-100k", lambda c: _write(c, cfg, NESTED_ARRAY), {}),
        ("nesting", "rope-scaling-nested", lambda c: _raw_json_value(c, cfg, "rope_scaling", NESTED_OBJECT), {}),
        ("fifo", "config-fifo", lambda c: plant_fifo(c, cfg), {}),
        ("fifo", "safetensors-fifo", lambda c: plant_fifo(c, "hf/model.safetensors"), {}),
        ("device", "config-dev-zero", lambda c: plant_device(c, cfg), {}),
        ("device", "safetensors-dev-zero", lambda c: plant_device(c, "hf/model.safetensors"), {}),
        ("huge", "config-sparse-8g", lambda c: plant_sparse(c, cfg), {}),
        ("huge", "safetensors-header-8g", lambda c: _write(c, "hf/model.safetensors", struct.pack("<Q", 8 << 30) + b"{"), {}),
        ("numbers", "hidden-size-nan", lambda c: _raw_json_value(c, cfg, "hidden_size", "NaN"), {}),
        ("numbers", "layers-1e999", lambda c: _raw_json_value(c, cfg, "num_hidden_layers", "1e999"), {}),
        ("numbers", "vocab-huge-int", lambda c: _raw_json_value(c, cfg, "vocab_size", HUGE_INT), {}),
        ("numbers", "rope-theta-inf", lambda c: _raw_json_value(c, cfg, "rope_theta", "-Infinity"), {}),
        ("numbers", "heads-2^62", lambda c: _json_edit(c, cfg, lambda d: d.update(num_attention_heads=2 ** 62, num_key_value_heads=2 ** 62)), {}),
        ("surrogate", "model-type-surrogate", lambda c: _raw_json_value(c, cfg, "model_type", '"llama' + LONE_SURROGATE_JSON + '"'), {}),
        ("non-utf8", "config-garbage", lambda c: _write(c, cfg, b'{"model_type": "' + NON_UTF8 + b'"}'), {}),
        ("escape", "architectures-escapes", lambda c: _json_edit(c, cfg, lambda d: d.update(architectures=[ESCAPE], model_type=ESCAPE)), escape_out),
        ("secret", "secret-in-config", lambda c: _json_edit(c, cfg, lambda d: d.update(_name_or_path=f"https://user:{secret}@huggingface.co/x", token=secret)), {"secret": secret}),
        ("symlink", "output-link-to-victim-dir", lambda c: plant_link(c, "out_mcore", str(c / "victim")), {"outputs": (".out_mcore*", "out_mcore.*")}),
        ("symlink", "config-link-to-victim", lambda c: plant_link(c, cfg), {}),
    ]
    cases = []
    for hostile, name, edit, extra in variants:
        outputs = extra.pop("outputs", ("out_mcore/**", ".out_mcore*", "out_mcore.*"))
        cases.append(Case(f"hf-config/{hostile}/{name}", "hf-config", hostile, command,
                          _steps(lambda c: shutil.copytree(ckpt / "hf", c / "hf"), lambda c: plant_victim(c), edit),
                          outputs, needs_checkpoints=True, **extra))
    return cases


def _submit_cases(base: Path, rng: random.Random, tool: dict[str, str]) -> list[Case]:
    submit = ["{dlmspec}", "submit", "spec.toml", "--dry-run", "-o", "out"]
    show = ["{dlmspec}", "show", "spec.toml"]
    validate = ["{dlmspec}", "validate", "spec.toml", "--json"]
    secret, gh = secret_token(rng), github_token(rng)

    def spec(extra: str = "", name: str = "hostile") -> Callable[[Path], None]:
        return _steps(lambda c: _copy_dataset(base, c), lambda c: plant_victim(c),
                      lambda c: _write(c, "spec.toml", spec_text(base, extra=extra, name=name)))

    env = "\n[cluster.slurm]\npartition = \"gpu\"\n\n[cluster.slurm.env]\n"
    variants: list[tuple[str, str, Callable[[Path], None], list, dict]] = [
        ("control", "dry-run", spec("\n[cluster.slurm]\npartition = \"gpu\"\n"), [submit, show], {"expect_rc": (0,)}),
        ("secret", "hf-token-in-env", spec(env + f"HF_TOKEN = \"{secret}\"\n"), [submit, show, validate], {"secret": secret}),
        ("secret", "token-under-plain-name", spec(env + f"MY_SETTING = \"{gh}\"\n"), [submit, show, validate], {"secret": gh}),
        ("secret", "token-in-url", spec(env + f"DATA_URL = \"https://u:{secret}@example.com/x\"\n"), [submit, show], {"secret": secret}),
        ("escape", "job-name-escapes", spec(f"\n[cluster.slurm]\njob_name = {json.dumps(ESCAPE)}\n"), [submit, show], {"forbidden_output": ("\x1b]0;PWNED", "\x1b[2J")}),
        ("escape", "env-value-escapes", spec(env + f"X = {json.dumps(ESCAPE)}\n"), [submit], {"forbidden_output": ("\x1b]0;PWNED", "\x1b[2J")}),
        ("template", "name-jinja", spec(name="{{ cycler.__init__.__globals__.os.system('touch " + CANARY + "') }}"), [submit], {}),
        ("template", "env-value-shell", spec(env + "X = \"$(touch " + CANARY + ")`touch " + CANARY + "`\"\n"), [submit], {}),
        ("symlink", "sbatch-output-link", _steps(spec("\n[cluster.slurm]\npartition = \"gpu\"\n"), lambda c: plant_link(c, "out/launch.sbatch"), lambda c: plant_link(c, "out/spec.lock.toml")), [submit], {}),
        ("numbers", "env-value-huge", spec(env + "X = " + "9" * 5000 + "\n"), [submit], {}),
        ("surrogate", "env-value-surrogate", spec(env + 'X = "\\ud800"\n'), [submit], {}),
        ("non-utf8", "spec-env-garbage", lambda c: (spec()(c), _write(c, "spec.toml", (c / "spec.toml").read_bytes() + env.encode() + b'X = "' + NON_UTF8 + b'"\n')), [submit], {}),
    ]
    cases = []
    for hostile, name, build, commands, extra in variants:
        cases.append(Case(f"submit/{hostile}/{name}", "submit", hostile, commands, build, ("out/**",), **extra))
    return cases


def all_cases(base: Path, seed: int = 0, *, checkpoints: bool = True) -> list[Case]:
    """Every case of the corpus, deterministically from ``seed`` (same seed, same cases and bytes)."""
    tool = tools()
    cases: list[Case] = []
    for maker in (_record_and_manifest_cases, _indexed_cases, _run_folder_cases, _prepare_cases, _tokenizer_cases,
                  _checkpoint_cases, _prompts_cases, _python_spec_cases, _hf_config_cases, _submit_cases):
        cases += maker(base, random.Random(f"{seed}:{maker.__name__}"), tool)
    if not checkpoints:
        cases = [c for c in cases if not c.needs_checkpoints]
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    return cases


#: The committed run of the whole corpus (``bench/hostile/run_corpus.py``): each case's wall time
#: there ranks what a case costs (:func:`cost`).
MEASURED = HERE.parents[1] / "bench" / "results" / "hostile_corpus.json"


def measured_walls(path: Path = MEASURED) -> dict[str, float]:
    """Each case's wall time in the committed corpus run, by id (empty when unreadable)."""
    try:
        return {r["id"]: float(r["wall_s"]) for r in json.loads(path.read_text(encoding="utf-8"))["cases"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def cost(case: Case, walls: dict[str, float]) -> int:
    """What a case costs to run, in tiers from its wall time in the committed run (``walls``): 0
    under 3 s, 1 under 10 s, 2 from 10 s (a 100,000-member sweep, a million-line metrics file);
    a case not measured there: 1, 2 when it copies the torch checkpoints."""
    wall = walls.get(case.id)
    if wall is None:
        return 2 if case.needs_checkpoints else 1
    return 0 if wall < 3 else 1 if wall < 10 else 2


def subset(cases: list[Case], seed: int = 0, *, extra_controls: bool = False,
           walls: dict[str, float] | None = None) -> list[Case]:
    """At least one case per surface and per hostile class, drawn with ``seed``, cheaply
    (:func:`cost`, ``walls`` by default the committed run's): one hostile case per surface, of the
    cheapest among those as cheap as any case of their class elsewhere (so a costly surface covers
    a class only it has, as ``pickle`` on ``checkpoint``), then for each class not yet covered one
    of its cheapest cases. ``extra_controls``: also the benign control of each surface (so a
    command line the CLI rejects cannot pass by exiting 2), of the surfaces that need the torch
    checkpoints only the first."""
    walls = measured_walls() if walls is None else walls
    rng = random.Random(f"subset:{seed}")
    chosen: dict[str, Case] = {}
    by_surface: dict[str, list[Case]] = {}
    for case in cases:
        by_surface.setdefault(case.surface, []).append(case)
    #: the least cost of a case of each class
    cheapest: dict[str, int] = {}
    for case in cases:
        cheapest[case.hostile] = min(cheapest.get(case.hostile, 9), cost(case, walls))
    # one hostile case per surface
    for surface in SURFACES:
        pool = [c for c in by_surface.get(surface, []) if c.hostile != "control"]
        if pool:
            pool = [c for c in pool if cost(c, walls) <= cheapest[c.hostile]] or pool
            least = min(cost(c, walls) for c in pool)
            pick = rng.choice([c for c in pool if cost(c, walls) == least])
            chosen[pick.id] = pick
        if extra_controls:
            controls = [c for c in by_surface.get(surface, []) if c.hostile == "control"]
            heavy_done = any(c.hostile == "control" and c.needs_checkpoints for c in chosen.values())
            if controls and not (controls[0].needs_checkpoints and heavy_done):
                chosen[controls[0].id] = controls[0]
    # one case per hostile class not yet covered, of its cheapest
    for hostile in CLASSES:
        if any(c.hostile == hostile for c in chosen.values()):
            continue
        pool = [c for c in cases if c.hostile == hostile]
        if pool:
            pick = rng.choice([c for c in pool if cost(c, walls) == cheapest[hostile]])
            chosen[pick.id] = pick
    return [c for c in cases if c.id in chosen]
