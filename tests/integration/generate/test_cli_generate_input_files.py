"""`dlmspec generate` / `dlmspec eval` (dlmspec/cli/generate.py) on hostile prompts and input files:
``--prompts`` / ``--choices`` files nested 100,000 deep, FIFOs, with a line over 16 MiB or a lone
surrogate, a lone surrogate in ``--prompt``, a mask id of 10**30, ``--choices`` contexts longer than
the model's positions: exit code 2 naming the flag, the value, why and a fix, in seconds. What
reaches the terminal is escaped: control characters of a prompt, a generated text or a path are
shown, never sent raw; ``[bold]`` prints literally; prompt ids and generated ids never run together."""

from __future__ import annotations

import io
import json
import os
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest

from dlmspec.cli import main
from tiny_ckpt import tiny_runs  # noqa: F401 (a fixture)

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)


class Hung(BaseException):
    """The command ran past its deadline (not an ``OSError``, so no handler of the code under
    test takes it for a read error)."""


@contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging the suite) when the block runs longer than ``seconds``."""
    def stop(signum, frame):
        raise Hung(f"still running after {seconds} s (a hang)")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_json(capsys, command: str, *args: str):
    capsys.readouterr()
    with deadline(120):
        code = main([command, *args, "--device", "cpu", "--json"])
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err[-3000:]
    return code, json.loads(out.out)


def _files(tmp_path: Path) -> dict[str, Path]:
    nested = tmp_path / "nested.jsonl"
    nested.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.jsonl"
    with open(huge, "wb") as f:
        f.write(b'{"prompt": "' + b"a" * (17 << 20) + b'"}\n')
    surrogate_prompt = tmp_path / "surrogate_prompt.jsonl"
    surrogate_prompt.write_text('{"prompt": "ok \\ud800 then"}\n')
    surrogate_choice = tmp_path / "surrogate_choice.jsonl"
    surrogate_choice.write_text('{"context": "The sky \\udfff is", "choices": [" blue", " green"], "label": 0}\n')
    not_utf8 = tmp_path / "latin1.jsonl"
    not_utf8.write_bytes('{"prompt": "caf\u00e9"}\n'.encode("latin-1"))
    return {"nested": nested, "fifo": fifo, "huge": huge, "surrogate_prompt": surrogate_prompt,
            "surrogate_choice": surrogate_choice, "not_utf8": not_utf8}


def test_hostile_prompts_and_choices_files_exit_2_naming_the_flag_why_and_a_remedy(tiny_runs, capsys, tmp_path):
    f = _files(tmp_path)
    run = str(tiny_runs["mdm"][0])
    cases = [
        ("generate", ["--prompts", str(f["nested"])], "--prompts", "nests arrays and objects more than"),
        ("generate", ["--prompts", str(f["fifo"])], "--prompts", "FIFO"),
        ("generate", ["--prompts", str(f["huge"])], "--prompts", "longer than 16.0 MiB"),
        ("generate", ["--prompts", str(f["surrogate_prompt"])], "--prompts", "lone surrogate"),
        ("generate", ["--prompts", str(f["not_utf8"])], "--prompts", "not UTF-8"),
        ("generate", ["--prompt", "ok \udcff then"], "--prompt", "lone surrogate"),
        ("eval", ["--choices", str(f["nested"])], "--choices", "nests arrays and objects more than"),
        ("eval", ["--choices", str(f["fifo"])], "--choices", "FIFO"),
        ("eval", ["--choices", str(f["huge"])], "--choices", "longer than 16.0 MiB"),
        ("eval", ["--choices", str(f["surrogate_choice"])], "--choices", "lone surrogate"),
    ]
    for command, args, key, why in cases:
        code, env = run_json(capsys, command, run, *args)
        assert code == 2 and env["ok"] is False, (args, env)
        (issue,) = env["issues"]
        assert issue["key"] == key and why in issue["message"] and issue["hint"], (args, issue)
        assert issue["value"] is not None and len(json.dumps(issue)) < 2000, (args, issue)


def test_a_mask_id_of_ten_to_the_thirty_is_refused_naming_the_flag(tiny_runs, capsys):
    code, env = run_json(capsys, "generate", str(tiny_runs["mdm"][0]), "--prompt", "a",
                         "--mask-token-id", str(10**30))
    (issue,) = env["issues"]
    assert code == 2 and issue["key"] == "--mask-token-id" and issue["value"] == 10**30 and issue["hint"], issue
    # an id below int64's range that the model has no embedding for: named with the model's own id
    code, env = run_json(capsys, "generate", str(tiny_runs["mdm"][0]), "--prompt", "a", "--mask-token-id", "60000")
    (issue,) = env["issues"]
    assert code == 2 and issue["key"] == "--mask-token-id" and "0..50303" in issue["message"], issue
    assert issue["hint"] == "use --mask-token-id 50257 (the model's own)", issue
    code, env = run_json(capsys, "generate", str(tiny_runs["mdm"][0]), "--prompt", "a", "--seed", str(10**30))
    (issue,) = env["issues"]
    assert code == 2 and issue["key"] == "--seed", issue


def test_eval_refuses_choices_longer_than_the_models_positions_as_generate_does(tiny_runs, capsys, tmp_path):
    """A 5,000-token context on a 128-position model: refused before any forward pass (it was
    scored anyway, 4.4 GB of activations), naming the line, the lengths and the limit."""
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"context": " the" * 5000, "choices": [" blue", " green"], "label": 0}) + "\n")
    code, env = run_json(capsys, "eval", str(tiny_runs["mdm"][0]), "--choices", str(path))
    assert code == 2, env
    (issue,) = env["issues"]
    assert issue["key"] == "--choices" and issue["line"] == 1 and issue["file"] == str(path), issue
    assert "5000 tokens" in issue["message"] and "max_position_embeddings = 128" in issue["message"], issue
    assert issue["hint"], issue
    # a context that fits is scored (exit 0)
    path.write_text(json.dumps({"context": " the" * 100, "choices": [" blue", " green"], "label": 0}) + "\n")
    code, env = run_json(capsys, "eval", str(tiny_runs["mdm"][0]), "--choices", str(path), "--num-samples", "2")
    assert code == 0 and env["result"]["choices"]["n"] == 1, env


def _terminal(monkeypatch) -> io.StringIO:
    """stdout as a terminal writing into a buffer (what a user's terminal receives)."""
    from rich.console import Console

    from dlmspec.cli import generate as cli

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120, highlight=False, emoji=False)
    monkeypatch.setattr(cli, "stdout", lambda: console)
    return buf


def test_control_characters_and_markup_of_a_prompt_reach_the_terminal_escaped(tiny_runs, monkeypatch):
    buf = _terminal(monkeypatch)
    prompt = "\x1b]0;owned\x07\x1b[2J[bold red]Hi\x9b31m"
    assert main(["generate", str(tiny_runs["mdm"][0]), "--prompt", prompt, "--device", "cpu", "--no-stream",
                 "--gen-length", "4", "--block-length", "4", "--steps", "2"]) == 0
    shown = buf.getvalue()
    assert "\x1b]0;" not in shown and "\x1b[2J" not in shown and "\x07" not in shown and "\x9b" not in shown, shown
    assert "\\x1b]0;owned\\x07\\x1b[2J[bold red]Hi\\x9b31m" in shown, shown  # the prompt, escaped and literal


def test_generated_text_and_paths_reach_the_terminal_escaped(monkeypatch):
    from dlmspec.cli import generate as cli

    buf = _terminal(monkeypatch)
    outputs = [{"prompt_text": "Say [i]x[/i]", "text": " \x1b[31mred\x1b[0m\r\n", "prompt_ids": [1], "ids": [2, 3],
                "finish_reason": "length"}]
    cli._print_outputs(cli.stdout(), outputs, has_tokenizer=True)
    result = {"model": {"path": "runs/\x1b]0;x\x07run", "kind": "mdm", "iteration": 1},
              "data": {"prefix": "d\x1b[2Ja", "num_sequences": 1, "seq_length": 8}}
    cli._print_eval(result)
    shown = buf.getvalue()
    assert "\x1b[31m" not in shown and "\x1b[2J" not in shown and "\x1b]0;" not in shown and "\r" not in shown
    assert "Say [i]x[/i]" in shown and "\\x1b[31mred\\x1b[0m\\x0d" in shown, shown
    assert "runs/\\x1b]0;x\\x07run" in shown and "d\\x1b[2Ja" in shown, shown


def test_prompt_ids_and_generated_ids_print_apart_without_a_tokenizer(tiny_runs, monkeypatch, tmp_path):
    """A model whose tokenizer cannot be built shows ids as numbers: the prompt's ids and the
    generated ids are on lines of their own (they printed run together: ``15496 99511999``)."""
    from checkpoint_files_kit import linked_copy, replace

    run, it = linked_copy(tiny_runs["mdm"][0], tmp_path)
    meta = json.loads((it / "dlmspec.json").read_text())
    meta["spec"]["record"]["data.tokenizer.type"] = None
    replace(it / "dlmspec.json", json.dumps(meta).encode())
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text('{"prompt_ids": [15496]}\n')
    buf = _terminal(monkeypatch)
    assert main(["generate", str(run), "--prompts", str(prompts), "--device", "cpu", "--no-stream",
                 "--gen-length", "4", "--block-length", "4", "--steps", "2"]) == 0
    lines = [line for line in buf.getvalue().splitlines() if "ids:" in line]
    import re

    plain = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in lines]
    assert plain[0] == "prompt ids: 15496", plain
    assert re.fullmatch(r"generated ids: \d+ \d+ \d+ \d+", plain[1]), plain


def test_an_item_with_more_choices_than_any_benchmark_is_refused_naming_its_line(tmp_path):
    """An item of 100,000 choices (100,000 scored passes) is refused before a model is loaded."""
    import json as _json

    from dlmspec.cli.generate_inputs import MAX_CHOICES, read_choices
    from dlmspec.errors import SpecError

    path = tmp_path / "many.jsonl"
    path.write_text(_json.dumps({"context": "x", "choices": [" a"] * 100_000, "label": 0}) + "\n")
    with pytest.raises(SpecError) as info:
        read_choices(str(path))
    (issue,) = info.value.issues
    assert issue.key == "--choices" and issue.line == 1 and f"{MAX_CHOICES:,}" in issue.message
