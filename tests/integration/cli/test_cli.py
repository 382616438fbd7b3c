"""Tests of the CLI core (dlmspec.cli): validate (exit codes, every issue with file, line, key,
value, fix; memory; paths; --json; no torch), the hidden `check` alias, show round trips and
catalogs, and `new` (every preset's starter spec validates, plans and compiles as written)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.check import RULES
from dlmspec.cli import main
from dlmspec.cli.commands import app
from dlmspec.cli.validate import spec_issues
from dlmspec.render.compile import check_spec, render
from dlmspec.errors import EXIT_USAGE
from dlmspec.gpus import GPUS
from dlmspec.spec.load import load
from dlmspec.spec.presets import MASK_TOKEN_IDS, PRESETS
from dlmspec.resolve import resolve

ROOT = Path(__file__).resolve().parents[3]
DEMO = str(ROOT / "specs" / "demo-dlm.toml")
LLADA = str(ROOT / "specs" / "llada-8b-pretrain.toml")


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def _demo_inputs(root: Path) -> Path:
    """A working directory where the demo spec's relative data and tokenizer paths exist (empty
    placeholders), as in a checkout whose data was prepared (README): the demo then validates
    with no path warnings whether or not this checkout has run `dlmspec data prepare`."""
    work = root / "work"
    for prefix in ("demo-train_text_document", "demo-valid_text_document"):
        for suffix in (".bin", ".idx"):
            (work / ".data").mkdir(parents=True, exist_ok=True)
            (work / ".data" / f"{prefix}{suffix}").write_bytes(b"")
    tokenizer = work / ".data" / "gpt2"
    tokenizer.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.json", "merges.txt"):
        (tokenizer / name).write_text("")
    return work


@pytest.fixture(autouse=True)
def _run_where_the_demo_inputs_exist(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(_demo_inputs(tmp_path_factory.mktemp("cwd")))


def no_traceback(result) -> None:
    assert "Traceback" not in result.stdout + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception


def test_validate_ok() -> None:
    r = resolve(load(DEMO).spec)
    result = run("validate", DEMO)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("ok: demo-dlm: 152.7M parameters, 1 GPU as TP 1 x PP 1 x CP 1 x DP 1")
    assert f"{r.train_iters:,} steps of 16,384 tokens; planned peak " in result.stdout
    assert "GiB per GPU" in result.stdout
    assert result.stderr == ""


def test_validate_reports_every_finding_with_location_and_remedy() -> None:
    result = run("validate", DEMO, "--set", "train.global_batch_size=30", "--set", "parallel.sequence_parallel=true")
    assert result.exit_code == EXIT_USAGE
    no_traceback(result)
    err = result.stderr
    for text in ("train.global_batch_size", "30", "not a multiple of micro_batch_size", "fix:", "use global_batch_size = 32",
                 "parallel.sequence_parallel", "[batch-divisible]", "[sequence-parallel-needs-tp]", "2 errors, 0 warnings"):
        assert text in err, text


def test_validate_points_at_the_line(tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text(Path(DEMO).read_text().replace("global_batch_size = 32", "global_batch_size = 30"))
    result = run("validate", str(spec), "--json")
    assert result.exit_code == EXIT_USAGE
    report = json.loads(result.stdout)
    assert report["ok"] is False
    # The demo's data and tokenizer paths are relative to the checkout, not to tmp_path.
    errors = [i for i in report["issues"] if i["severity"] == "error"]
    (issue,) = errors
    lines = spec.read_text().splitlines()
    assert issue["file"].endswith("bad.toml")
    assert lines[issue["line"] - 1].startswith("global_batch_size = 30")
    assert (issue["rule"], issue["key"], issue["value"]) == ("batch-divisible", "train.global_batch_size", 30)


def test_validate_json_ok() -> None:
    result = run("validate", DEMO, "--json")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["warnings"] == [] and report["command"] == "validate"
    assert report["result"]["derived"]["padded_vocab_size"] == 50304
    assert report["result"]["derived"]["mask_token_id"] == 50257
    memory = report["result"]["memory"]
    assert 0 < memory["peak_bytes"] < memory["capacity_bytes"] == GPUS["h200"].memory_bytes


def test_validate_warnings_and_strict() -> None:
    result = run("validate", DEMO, "--set", "train.eval_interval=100000")
    assert result.exit_code == 0
    assert "[eval-interval]" in result.stderr and "1 warning" in result.stderr
    assert result.stdout.startswith("ok:")
    strict = run("validate", DEMO, "--set", "train.eval_interval=100000", "--strict")
    assert strict.exit_code == EXIT_USAGE
    assert "0 errors, 1 warning" in strict.stderr
    assert "--strict fails on warnings" in strict.stderr  # says why a spec without errors failed


def test_validate_fails_a_spec_that_does_not_fit_the_gpu() -> None:
    result = run("validate", LLADA, "--set", "cluster.gpu=a100-40gb", "--json")
    assert result.exit_code == EXIT_USAGE
    issues = json.loads(result.stdout)["issues"]
    (memory,) = [i for i in issues if i["severity"] == "error"]
    assert (memory["rule"], memory["key"], memory["value"]) == ("memory-fits", "cluster.gpu", "a100-40gb")
    assert "exceeds" in memory["message"] and memory["hint"]
    assert memory["file"] == "--set"


def test_validate_warns_about_paths_not_on_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's relative paths exist from the checkout; from elsewhere they are warnings
    (exit 0), naming each missing input."""
    monkeypatch.chdir(tmp_path)
    result = run("validate", DEMO, "--json")
    assert result.exit_code == 0, result.stdout
    warned = {(i["rule"], i["key"]) for i in json.loads(result.stdout)["warnings"]}
    assert warned == {("path-not-found", k) for k in ("data.train", "data.valid", "data.tokenizer.vocab_file",
                                                      "data.tokenizer.merge_file")}
    (tmp_path / ".data").mkdir()
    for suffix in (".bin", ".idx"):
        (tmp_path / ".data" / f"demo-train_text_document{suffix}").write_bytes(b"")
    warned = {i["key"] for i in json.loads(run("validate", DEMO, "--json").stdout)["warnings"]}
    assert "data.train" not in warned and "data.valid" in warned


def test_check_is_a_hidden_alias() -> None:
    assert run("check", DEMO).stdout == run("validate", DEMO).stdout
    assert run("check", DEMO, "--set", "train.global_batch_size=30").exit_code == EXIT_USAGE
    commands = [line.split()[1] for line in run("--help").stdout.splitlines()
                if line.startswith("│ ") and len(line.split()) > 1 and line.split()[1].isalpha()]
    assert {"validate", "show", "new", "schema"} <= set(commands) and "check" not in commands


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["validate", "no/such/spec.toml"], "file not found"),
        (["validate", "no/such/spec.py"], "file not found"),
        (["validate", str(ROOT / "specs")], "is a directory"),
        (["validate", DEMO, "--set", "nonsense"], "expected section.key=value"),
        (["validate", DEMO, "--set", "model.num_layerz=3"], "did you mean 'num_layers'?"),
        (["validate", DEMO, "--set", "cluster.gpu=h1000"], "unknown GPU"),
        (["validate", DEMO, "--set", "train.lr=nan"], "train.lr"),
        (["validate", "a\x00b.toml"], "not a usable file name"),
        (["show"], "give exactly one of SPEC"),
        (["show", DEMO, "--gpus"], "give exactly one of SPEC"),
    ],
)
def test_bad_input_exits_2_without_traceback(args: list[str], text: str) -> None:
    result = run(*args)
    assert result.exit_code == EXIT_USAGE
    assert text in result.stderr
    no_traceback(result)


def test_unknown_preset_names_the_key_value_and_closest_ids(tmp_path: Path) -> None:
    spec = tmp_path / "p.toml"
    spec.write_text('[model]\npreset = "Qwen3-1.7B"\n\n[train]\nglobal_batch_size = 8\nseq_length = 512\n')
    report = json.loads(run("validate", str(spec), "--json").stdout)
    (issue,) = report["issues"]  # not also "missing" for every dimension the preset fills
    assert (issue["rule"], issue["key"], issue["value"], issue["line"]) == ("unknown-preset", "model.preset",
                                                                            "Qwen3-1.7B", 2)
    assert issue["hint"].startswith("did you mean 'qwen3-1.7b'")


def test_python_spec_errors(tmp_path: Path) -> None:
    spec = tmp_path / "s.py"
    spec.write_text("x = 1\nspec = {'model': 1 / 0}\n")
    result = run("validate", str(spec))
    assert result.exit_code == EXIT_USAGE
    assert "ZeroDivisionError" in result.stderr and "s.py:2" in result.stderr
    spec.write_text("import sys\nsys.exit(3)\n")
    result = run("validate", str(spec))
    assert result.exit_code == EXIT_USAGE and "sys.exit(3)" in result.stderr
    no_traceback(result)


def test_usage_errors_exit_2() -> None:
    assert run("bogus").exit_code == 2
    assert run("validate").exit_code == 2
    assert main(["validate", "--no-such-option"]) == 2


def test_main_returns_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", DEMO]) == 0
    assert main(["validate", DEMO, "--set", "train.global_batch_size=30"]) == EXIT_USAGE
    assert main(["--version"]) == 0
    assert "dlmspec 0.2.0" in capsys.readouterr().out


HEAVY = {"torch", "megatron", "jinja2", "transformer_engine", "typer", "dlmspec.render.compile", "dlmspec.data.cli",
         "dlmspec.data.prepare", "dlmspec.cli.commands"}


def _modules_after(argv: list[str]) -> tuple[int, set[str]]:
    """Exit code and imported modules (top-level packages, and every dlmspec module) of
    ``dlmspec ARGV`` in a fresh interpreter."""
    code = (
        "import sys\n"
        "from dlmspec.cli import main\n"
        f"code = main({argv!r})\n"
        "print('MODULES', sorted({m.split('.')[0] for m in sys.modules} | {m for m in sys.modules if m.startswith('dlmspec')}))\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path.cwd(),
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return done.returncode, set(done.stdout.split("MODULES", 1)[1].strip().strip("[]").replace("'", "").split(", "))


def test_validate_imports_neither_torch_nor_megatron_nor_the_compiler() -> None:
    """`dlmspec validate` stays light (bench/validate/bench_validate.py times it): no torch, no
    megatron, no jinja2 (the compiler), no typer (dlmspec.cli.main runs it without the app); and
    for a spec with nothing to report, not even rich, the data tools, or pydantic and the spec
    models (dlmspec.spec.fast checks a plainly valid spec). It does plan the memory
    (dlmspec.plan)."""
    code, modules = _modules_after(["validate", DEMO])
    assert code == 0
    assert {"dlmspec.plan", "dlmspec.check", "dlmspec.spec.fast"} <= modules
    assert not modules & (HEAVY | {"rich", "pydantic_core", "dlmspec.spec.models"})


@pytest.mark.parametrize("argv", [
    ["plan", DEMO],
    ["plan", DEMO, "--json"],
    ["plan", DEMO, "--search", "--top", "2"],
    ["validate", DEMO, "--set", "train.global_batch_size=30"],  # an error: the issue table (rich)
    ["validate", DEMO, "--set", "train.global_batch_size=0"],  # a schema error: pydantic's
    ["validate", DEMO, "--set", "train.micro_batch_size=2.0"],  # pydantic's lax int: valid
    ["check", DEMO, "--json", "--strict"],
])
def test_plan_and_validate_import_no_torch(argv: list[str]) -> None:
    """`dlmspec plan` (with or without --search, --json) and validate's error report do not
    import torch, megatron or typer either; nor the compiler, except for --search
    (which asks the compiler what the runtime cannot run). pydantic only where it decides: a
    schema error, a value only its lax mode takes, and --search (which changes the spec)."""
    code, modules = _modules_after(argv)
    assert code in (0, EXIT_USAGE)
    heavy = HEAVY - {"jinja2", "dlmspec.render.compile"} if "--search" in argv else HEAVY
    assert not modules & heavy
    schema = any(a.endswith(("=0", "=2.0")) for a in argv) or "--search" in argv
    assert ("pydantic_core" in modules) is schema


def test_validate_skips_pydantic_plugin_discovery() -> None:
    """The fast path runs without pydantic plugins and never imports importlib.metadata (the
    plugin scan); a user who names plugins to disable (so uses others) gets pydantic's own
    discovery."""
    code = (
        "import sys\n"
        "from dlmspec.cli import main\n"
        # pydantic's path: an int past 2**53 for a float key is left to pydantic by dlmspec.spec.fast
        f"code = main(['validate', {DEMO!r}, '--set', 'train.clip_grad=9007199254740993'])\n"
        "print('LOADER', sys.modules['pydantic.plugin._loader'].__doc__, 'importlib.metadata' in sys.modules)\n"
        "sys.exit(code)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    for disabled, skipped in ((None, True), ("__all__", True), ("some_plugin", False)):
        run_env = {**env, "PYTHONPATH": str(ROOT), **({"PYDANTIC_DISABLE_PLUGINS": disabled} if disabled else {})}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path.cwd(), env=run_env)
        assert done.returncode == 0, done.stderr
        line = done.stdout.split("LOADER", 1)[1]
        assert ("dlmspec.cli" in line) is skipped and line.strip().endswith(str(not skipped)), (disabled, line)


def test_installed_pydantic_asks_its_plugin_loader_for_get_plugins_only() -> None:
    """dlmspec.cli.skip_pydantic_plugin_discovery stands in for pydantic.plugin._loader with a
    get_plugins that returns no plugin. That holds only while pydantic uses nothing else from
    that module, and its own get_plugins returns nothing with plugins disabled: checked here
    against the installed pydantic (a pydantic upgrade that changes either fails this test)."""
    import re

    import pydantic

    root = Path(pydantic.__file__).parent
    uses = sorted({(path.relative_to(root).as_posix(), line.strip()) for path in root.rglob("*.py")
                   for line in path.read_text(encoding="utf-8").splitlines()
                   if re.search(r"\b_loader\b", line) and path.name != "_loader.py"})
    assert uses == [("plugin/_schema_validator.py", "from ._loader import get_plugins")]
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('real_loader', {str(root / 'plugin' / '_loader.py')!r})\n"
            "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
            "print(sorted(n for n in vars(module) if not n.startswith('_') and callable(getattr(module, n))),"
            " tuple(module.get_plugins()))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYDANTIC_DISABLE_PLUGINS": "__all__"})
    assert done.returncode == 0, done.stderr
    assert "'get_plugins'" in done.stdout and done.stdout.strip().endswith("()")


# ------------------------------------------------------------------------------------------
# The fast path: dlmspec.cli.main runs validate/check/plan without typer


FAST_AND_TYPER = [
    ["validate", DEMO],
    ["check", DEMO, "--json"],
    ["validate", DEMO, "--set", "train.global_batch_size=30", "-s", "parallel.sequence_parallel=true"],
    ["validate", "--set=train.eval_interval=100000", DEMO],
    ["validate", DEMO, "-s", "train.eval_interval=100000", "--strict", "--strict"],
    ["validate", DEMO, "--json", "--set", "model.preset=qwen"],
    ["validate", "no-such-spec.toml"],
    ["validate", ""],
    ["plan", DEMO],
    ["plan", DEMO, "--json", "--set", "train.micro_batch_size=8", "--set", "train.global_batch_size=32"],
    ["plan", DEMO, "--set", "train.micro_batch_size=1024", "--set", "train.global_batch_size=1024",
     "--set", "train.seq_length=1024"],
    ["plan", DEMO, "--search", "--top", "3", "--top=1", "--set", "cluster.gpus_per_node=2"],
    ["plan", DEMO, "--top", "0"],
    ["plan", DEMO, "--json", "--set", "parallel.tensor_model_parallel_size=5"],
]


@pytest.mark.parametrize("argv", FAST_AND_TYPER)
def test_fast_path_prints_what_typer_prints(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """The same stdout, stderr and exit code from dlmspec.cli.main (which runs these without
    typer) as from the typer app."""
    from dlmspec.cli import fast_arguments

    assert fast_arguments(argv) is not None
    code = main(argv)
    fast = capsys.readouterr()
    typed = run(*argv)
    assert (code, fast.out, fast.err) == (typed.exit_code, typed.stdout, typed.stderr)


@pytest.mark.parametrize("argv", [
    [], ["--help"], ["--version"], ["validate"], ["validate", "--help"], ["plan", "-h"],
    ["validate", DEMO, "extra"], ["validate", DEMO, "--bogus"], ["validate", DEMO, "--set"],
    ["validate", DEMO, "--set", "--json"], ["validate", DEMO, "--json=1"], ["validate", "-sx=1", DEMO],
    ["validate", "--", DEMO], ["validate", "-", DEMO], ["plan", DEMO, "--strict"], ["validate", DEMO, "--search"],
    ["plan", DEMO, "--top", "x"], ["plan", DEMO, "--top", "-1"], ["plan", DEMO, "--top", "+2"],
    ["plan", DEMO, "--top"], ["validate", DEMO, "-s=a.b=1"], ["show", DEMO], ["--version", "validate", DEMO],
])
def test_fast_path_leaves_everything_else_to_typer(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Help, version, usage errors and forms the fast parser does not take go to typer: same
    output and exit code as the app."""
    from dlmspec.cli import fast_arguments

    assert fast_arguments(argv) is None
    code = main(argv)
    out = capsys.readouterr()
    typed = run(*argv)
    assert (code, out.out, out.err) == (typed.exit_code, typed.stdout, typed.stderr)


@pytest.mark.parametrize("error, code", [(KeyboardInterrupt(), 130), (BrokenPipeError(32, "Broken pipe"), 1)])
def test_fast_path_exits_like_typer_on_interrupt_and_closed_pipe(monkeypatch: pytest.MonkeyPatch, error: BaseException,
                                                                 code: int) -> None:
    import dlmspec.cli.validate

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(dlmspec.cli.validate, "load_and_check", fail)
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # the broken-pipe handler wraps the streams
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    assert main(["validate", DEMO]) == code  # the fast path
    assert main(["validate", "--", DEMO]) == code  # typer (the fast parser leaves `--` to it)


def test_data_tools_load_on_demand() -> None:
    assert "Data tools" in run("--help").stdout
    result = run("data", "prepare", "--help")
    assert result.exit_code == 0 and "--input" in result.stdout


def test_show_round_trips(tmp_path: Path) -> None:
    result = run("show", DEMO)
    assert result.exit_code == 0
    assert "#   padded_vocab_size = 50304" in result.stdout
    full = tmp_path / "full.toml"
    full.write_text(result.stdout)
    assert load(full).spec == load(DEMO).spec
    again = run("show", str(full))
    assert again.stdout == result.stdout


def test_show_json() -> None:
    result = run("show", DEMO, "--json", "--set", "cluster.gpus_per_node=2", "--set", "train.micro_batch_size=16")
    data = json.loads(result.stdout)["result"]
    assert data["spec"]["cluster"]["gpus_per_node"] == 2
    assert data["derived"]["data_parallel_size"] == 2 and data["derived"]["num_microbatches"] == 1


def test_show_catalogs() -> None:
    gpus = json.loads(run("show", "--gpus", "--json").stdout)["result"]["gpus"]
    assert [g["id"] for g in gpus] == sorted(GPUS)
    presets = json.loads(run("show", "--presets", "--json").stdout)["result"]["presets"]
    assert [p["id"] for p in presets] == sorted(PRESETS)
    llama = next(p for p in presets if p["id"] == "llama-3-8b")
    assert llama["parameters"] == 8_030_261_248 and llama["published"] == "8,030,261,248"
    rules = json.loads(run("show", "--rules", "--json").stdout)["result"]["rules"]
    assert sorted(r["id"] for r in rules) == sorted(RULES)  # the order: tests/integration/check/test_registry.py
    table = run("show", "--presets")
    assert table.exit_code == 0 and "mixtral-8x7b" in table.stdout and "46.7B" in table.stdout


# ------------------------------------------------------------------------------------------
# dlmspec new


def _nodes_hint(stderr: str) -> int | None:
    import re

    match = re.search(r"pass --nodes (\d+)", stderr.replace("\n", " "))
    return int(match.group(1)) if match else None


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_scaffolds_a_spec_that_validates_plans_and_compiles(tmp_path: Path, preset: str) -> None:
    """`dlmspec new --preset NAME` writes a spec that validates with no issue at all, fits its
    GPUs with headroom and compiles; a preset too large for one node is refused with the node
    count that fits, and that count works."""
    out = tmp_path / f"{preset}.toml"
    result = run("new", str(out), "--preset", preset)
    no_traceback(result)
    if result.exit_code == EXIT_USAGE:
        nodes = _nodes_hint(result.stderr)
        assert "[memory-fits]" in result.stderr and nodes is not None, result.stderr
        assert not out.exists()
        result = run("new", str(out), "--preset", preset, "--nodes", str(nodes))
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    loaded = load(out)
    resolved = resolve(loaded.spec)
    assert spec_issues(loaded, resolved) == []  # validate (rules, paths, memory) + the runtime's gaps
    assert check_spec(loaded, resolved) == []
    assert "train.py" in render(resolved, str(out))
    assert loaded.spec.model.preset == preset and loaded.spec.name == preset.replace(".", "-")
    if loaded.spec.objective.kind == "mdm":
        mask, tok = resolved.mask_token_id, loaded.spec.data.tokenizer
        assert mask == MASK_TOKEN_IDS.get(preset, mask) and tok.vocab_size < mask < resolved.padded_vocab_size
        assert f"[MASK] = {mask}:" in out.read_text()


def test_new_layouts_and_masks(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "llada.toml"
    result = run("new", str(out), "--preset", "llada-8b")
    assert result.exit_code == 0, result.stderr
    loaded = load(out)
    resolved = resolve(loaded.spec)
    assert loaded.spec.model.preset == "llada-8b" and resolved.world_size == 8
    assert loaded.spec.train.global_batch_size % (resolved.dp * loaded.spec.train.micro_batch_size) == 0
    assert resolved.mask_token_id == 126336
    # Too large for data parallelism alone on H100s: the fastest layout that fits, said in the header.
    assert resolved.tp * resolved.pp > 1 and "Parallel layout: the fastest that fits" in out.read_text()
    # --set on a layout key: kept as given, no search.
    mine = tmp_path / "mine.toml"
    result = run("new", str(mine), "--preset", "llada-8b", "--set", "parallel.tensor_model_parallel_size=4",
                 "--set", "parallel.sequence_parallel=true")
    assert result.exit_code == 0, result.stderr
    assert resolve(load(mine).spec).tp == 4 and "data parallel only" in mine.read_text()
    # Small enough: data parallel only.
    small = tmp_path / "small.toml"
    assert run("new", str(small), "--preset", "qwen3-0.6b", "--objective", "ar").exit_code == 0
    r = resolve(load(small).spec)
    assert (r.tp, r.pp, r.dp, r.mask_token_id) == (1, 1, 8, None)


def test_new_never_overwrites_without_force(tmp_path: Path) -> None:
    out = tmp_path / "q.toml"
    assert run("new", str(out), "--preset", "qwen3-1.7b").exit_code == 0
    # Qwen3's 151,936 embedding rows are a multiple of 128: [MASK] takes the last one.
    r = resolve(load(out).spec)
    assert r.mask_token_id == 151935 and load(out).spec.data.tokenizer.vocab_size == 151934
    again = run("new", str(out), "--preset", "qwen3-1.7b", "--objective", "ar")
    assert again.exit_code == EXIT_USAGE and "--force" in again.stderr
    assert load(out).spec.objective.kind == "mdm"
    assert run("new", str(out), "--preset", "qwen3-1.7b", "--objective", "ar", "--force").exit_code == 0
    assert load(out).spec.objective.kind == "ar"


def test_new_force_replaces_only_a_spec_dlmspec_new_wrote(tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text('name = "mine"  # hand-written\n')
    refused = run("new", str(mine), "--preset", "qwen3-0.6b", "--force")
    assert refused.exit_code == EXIT_USAGE and "not written by `dlmspec new`" in refused.stderr.replace("\n", " ")
    assert mine.read_text() == 'name = "mine"  # hand-written\n'
    data = tmp_path / "data.json"
    data.write_text('{"mine": 1}')
    refused = run("schema", "--output", str(data), "--force")
    assert refused.exit_code == EXIT_USAGE and "not written by `dlmspec schema`" in refused.stderr.replace("\n", " ")
    assert data.read_text() == '{"mine": 1}'


@pytest.mark.parametrize("dangling", [False, True])
def test_new_force_never_writes_through_a_link(tmp_path: Path, dangling: bool) -> None:
    target = tmp_path / "target.toml"
    if not dangling:
        assert run("new", str(target), "--preset", "qwen3-0.6b").exit_code == 0
    before = target.read_bytes() if not dangling else None
    link = tmp_path / "link.toml"
    link.symlink_to(target)
    result = run("new", str(link), "--preset", "qwen3-0.6b", "--objective", "ar", "--force")
    assert result.exit_code == EXIT_USAGE and "symbolic link" in result.stderr.replace("\n", " ")
    assert link.is_symlink()
    assert (target.read_bytes() == before) if not dangling else not target.exists()


def test_schema_output_never_writes_through_a_link(tmp_path: Path) -> None:
    target = tmp_path / "precious.json"
    target.write_text("{}")
    link = tmp_path / "schema.json"
    link.symlink_to(target)
    result = run("schema", "--output", str(link), "--force")
    assert result.exit_code == EXIT_USAGE and "--output" in result.stderr and "symbolic link" in result.stderr
    assert target.read_text() == "{}" and link.is_symlink()


def test_new_json(tmp_path: Path) -> None:
    out = tmp_path / "m.toml"
    report = json.loads(run("new", str(out), "--preset", "megadlms-1.7b", "--json").stdout)
    result = report["result"]
    assert (report["ok"], result["output"], result["preset"], report["warnings"]) == (True, str(out), "megadlms-1.7b", [])
    assert result["derived"]["mask_token_id"] == 50277 and result["memory"]["peak_bytes"] > 0
    refused = json.loads(run("new", str(tmp_path / "x.toml"), "--preset", "llama-3-70b", "--json").stdout)
    assert refused["ok"] is False and refused["issues"][0]["rule"] == "memory-fits"


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--preset", "qwen3-1.7x"], "did you mean 'qwen3-1.7b'"),
        (["--preset", "llada-8b", "--objective", "gpt"], "use mdm, ar or bd3lm"),
        (["--preset", "llada-8b", "--set", "train"], "expected section.key=value"),
        # (not a global batch no layout divides: new searches the layouts, and DP 1 divides 7)
        (["--preset", "llada-8b", "--set", "train.lr_warmup_iters=10000000"], "(pass changes to `dlmspec new` as --set"),
    ],
)
def test_new_bad_arguments(tmp_path: Path, args: list[str], text: str) -> None:
    result = run("new", str(tmp_path / "x.toml"), *args)
    assert result.exit_code == EXIT_USAGE
    assert not (tmp_path / "x.toml").exists()
    # the table wraps its cells at the terminal's width (which depends on tmp_path's length):
    # read the words from the JSON envelope of the same command
    report = json.loads(run("new", str(tmp_path / "x.toml"), *args, "--json").stdout)
    assert any(text in f"{i['message']} {i['hint']}" for i in report["issues"]), report["issues"]


# ------------------------------------------------------------------------------------------
# dlmspec schema (the schema itself: tests/unit/spec/test_schema.py)


def test_schema_command(tmp_path: Path) -> None:
    printed = run("schema")
    assert printed.exit_code == 0
    schema = json.loads(printed.stdout)
    assert schema["$schema"].endswith("2020-12/schema") and "model" in schema["properties"]
    out = tmp_path / "s" / "dlmspec.schema.json"
    report = json.loads(run("schema", "--output", str(out), "--json").stdout)
    assert report["ok"] is True and report["result"] == {"output": str(out), "bytes": len(out.read_bytes())}
    assert json.loads(out.read_text()) == schema
    refused = run("schema", "--output", str(out))
    assert refused.exit_code == EXIT_USAGE and "--force" in refused.stderr
    assert run("schema", "--output", str(out), "--force").exit_code == 0


def test_new_refuses_a_file_name_that_is_not_toml(tmp_path: Path) -> None:
    """``dlmspec new x.py`` wrote TOML into a .py file, which Python then could not run (the
    new-user trial): a name that does not end in .toml is refused, with the .toml name as fix."""
    out = tmp_path / "x.py"
    result = run("new", str(out), "--from", "demo-dlm", "--json")
    assert result.exit_code == 2 and not out.exists()
    (issue,) = json.loads(result.stdout)["issues"]
    assert issue["key"] == "<output>" and issue["hint"].endswith("x.toml")


@pytest.mark.parametrize("args", [["validate", DEMO], ["new", "--preset", "llada-8b"]], ids=["validate", "new"])
def test_set_without_equals_names_the_command_line_and_the_key(args: list[str], tmp_path: Path) -> None:
    """`--set train.lr` (no `=`) is reported where it was written (the command line, not `<spec>`),
    with a fix that keeps the user's key."""
    if args[0] == "new":
        args = args + [str(tmp_path / "x.toml")]
    result = run(*args, "--set", "train.lr", "--json")
    assert result.exit_code == EXIT_USAGE
    issues = json.loads(result.stdout)["issues"]
    (issue,) = [i for i in issues if i["rule"] == "set"]
    assert issue["file"] == "command line"
    assert "--set train.lr=" in issue["hint"]


def test_new_picks_the_micro_batch_that_plans_fastest(tmp_path: Path) -> None:
    """A starter spec that fits at micro batch 1 gets the fastest layout's micro batch with the
    planner's headroom (said in the header); --set train.micro_batch_size keeps the user's."""
    from dlmspec.plan import HEADROOM_WARNING, make_plan

    out = tmp_path / "q.toml"
    assert run("new", str(out), "--preset", "qwen3-1.7b", "--gpu", "h200", "--gpus-per-node", "1").exit_code == 0
    spec = load(out).spec
    mb = spec.train.micro_batch_size
    header = " ".join(line.lstrip("# ") for line in out.read_text().splitlines() if line.startswith("#"))
    assert mb > 1 and "the fastest that fits with headroom" in header and f"micro batch {mb}," in header
    plan = make_plan(resolve(spec))
    assert plan.peak_bytes <= HEADROOM_WARNING * plan.gpu.memory_bytes
    one = make_plan(resolve(spec.replace(**{"train.micro_batch_size": 1})))
    assert plan.time.tokens_per_second > one.time.tokens_per_second
    mine = tmp_path / "mine.toml"
    assert run("new", str(mine), "--preset", "qwen3-1.7b", "--gpu", "h200", "--gpus-per-node", "1",
               "--set", "train.micro_batch_size=2").exit_code == 0
    assert load(mine).spec.train.micro_batch_size == 2 and "fastest" not in mine.read_text()
