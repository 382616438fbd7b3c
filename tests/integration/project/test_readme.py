"""README.md, as a new user follows it: its spec validates, and every command it shows runs.

Every line of README's ```bash blocks is one command (a trailing ``\\`` continues it). Each has a
runner below: `dlmspec` commands run in a scratch folder holding the bundled specs, in README's
order; `bash out/.../launch.sh` (a GPU command) runs with no GPU visible and must stop at its own
pre-flight check with exit code 2; SLURM commands appear only in their `--dry-run` form; the two
set-up commands are the ones `.ci/run` (the CI entry point) runs. A README command with no runner
fails the test, so a command added to README gets one.
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

import pytest

from dlmspec.check import find
from dlmspec.resolve import resolve
from dlmspec.spec.load import load_text
from shared_kit import SHARED_DATA

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"

#: README's size limit: a front page, with the details in docs/.
MAX_LINES = 160


def _bash_commands(text: str) -> list[str]:
    """The commands of every ```bash block, in order: continuation lines joined, comments and
    blank lines dropped (a ``#`` starts a comment only after whitespace, as bash reads it)."""
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        pending = ""
        for line in block.splitlines():
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            line = pending + line
            pending = ""
            line = re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()
            if line:
                commands.append(line)
    return commands


def _setup_commands() -> tuple[str, str]:
    """README's two set-up commands: the install (and demo) line and the test line."""
    section = README.read_text().split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = _bash_commands(section)
    assert len(commands) == 2, f"README's set-up gives {len(commands)} commands, not 2: {commands}"
    return commands[0], commands[1]


def _ci_commands() -> list[str]:
    lines = [ln.strip() for ln in CI_RUN.read_text().splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


# --- the page ----------------------------------------------------------------------------------


def test_readme_is_a_front_page_of_at_most_160_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; move details to docs/ (limit {MAX_LINES})"


def test_readme_links_only_to_files_that_exist() -> None:
    for target in re.findall(r"\]\(([^)#\s]+)\)", README.read_text()):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_readme_results_link_to_the_performance_page_and_it_holds_them() -> None:
    """README gives one line per headline result and a link; docs/performance.md holds each figure
    with its date, hardware and command."""
    section = README.read_text().split("## Results", 1)[1].split("\n## ", 1)[0]
    assert "docs/performance.md" in section
    performance = (ROOT / "docs" / "performance.md").read_text()
    for figure in re.findall(r"\d[\d.,]*(?:k|%|x)", section):
        assert figure in performance, f"README's result {figure} is not in docs/performance.md"


def test_readme_spec_validates() -> None:
    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md shows no TOML spec"
    loaded = load_text(blocks[0], "README.toml")
    errors = [i for i in find(("spec",), loaded, resolve(loaded.spec)) if i.severity == "error"]
    assert errors == [], [str(e) for e in errors]


def _readme_spec_issues() -> list:
    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(), flags=re.S)
    loaded = load_text(blocks[0], "README.toml")
    return find(("spec",), loaded, resolve(loaded.spec))


def test_readme_spec_saves_checkpoints() -> None:
    """The example spec plans a multi-day run: it saves checkpoints, so it draws no
    `no-checkpoint-save` warning."""
    rules = {i.rule for i in _readme_spec_issues()}
    assert "no-checkpoint-save" not in rules


def test_performance_page_states_the_scale_of_its_measurements() -> None:
    """Where the docs describe the plans' accuracy they say on how many GPUs and how large a model
    they were measured."""
    for page in ("performance.md", "planner.md"):
        text = " ".join((ROOT / "docs" / page).read_text().split())
        assert "one or two GPUs" in text and "2B parameters" in text, page


def test_readme_offline_data_needs_nothing_outside_the_repository() -> None:
    """README's data preparation names a local JSONL file, not a folder outside the checkout."""
    text = README.read_text()
    assert "../shared/data" not in text
    assert "--input my-corpus.jsonl" in text


# --- the two set-up commands -------------------------------------------------------------------


def test_ci_runs_readme_install_and_test_commands() -> None:
    """`.ci/run` installs as README's set-up command 1 does (its pip parts, in order) and then runs
    README's set-up command 2 as its last command."""
    install, tests = _setup_commands()
    ci = _ci_commands()
    assert ci[-1] == tests, f".ci/run ends with {ci[-1]!r}, README's test command is {tests!r}"
    pip_parts = [p.strip() for p in install.split("&&") if "pip install" in p or "-m venv" in p]
    assert pip_parts, install
    ci_text = "\n".join(ci)
    for part in pip_parts:
        words = shlex.split(part)
        if "-m" in words and "venv" in words:
            assert "python3 -m venv .venv" in ci_text
            continue
        packages = [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
        assert any("pip install" in ln and all(p in shlex.split(ln) for p in packages) for ln in ci), (
            f".ci/run does not install {packages} as README's set-up command does")


def test_setup_command_two_is_pytest_from_the_venv() -> None:
    _, tests = _setup_commands()
    assert tests == '.venv/bin/python -m pytest -n auto --dist loadgroup -m "not harness"'


# --- every command, in README's order ----------------------------------------------------------


#: Documents for the workspace's JSONL files when the offline data kit is absent.
SYNTHETIC = [f"Section {i}. The function parse_{i} reads a file of {i * 7} lines and returns a list of "
             f"records; each record holds a name, a size and the line it came from." for i in range(120)]


#: The addition task's text and chat template, for the stand-in BPE (a digit, " +", " =" one token each).
TASK_TEXT = [" 0 1 2 3 4 5 6 7 8 9 + =", "User:\n x\n\nAssistant:\n y"] * 20


def _corpus_and_tokenizer(gpt2: Path) -> list[str]:
    """GPT-2's tokenizer files into ``gpt2`` and the documents to write: the offline data kit's
    (a real GPT-2 tokenizer and English text) when present, else a small byte-level BPE trained
    here, in GPT-2's file format, and synthetic documents."""
    kit = SHARED_DATA / "tokenizers" / "gpt2"
    if (kit / "vocab.json").is_file():
        for name in ("vocab.json", "merges.txt"):
            shutil.copy(kit / name, gpt2 / name)
        lines = (SHARED_DATA / "corpus" / "pydocs-train.jsonl").read_text(encoding="utf-8").splitlines()[:120]
        return [json.loads(line)["text"] for line in lines]
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    # with the addition task's text too, so that a digit is one token as in GPT-2's BPE (README's task make)
    bpe.train_from_iterator(SYNTHETIC * 3 + TASK_TEXT, vocab_size=400, min_frequency=2, special_tokens=["<|endoftext|>"])
    bpe.save_model(str(gpt2))
    return list(SYNTHETIC)


def _workspace(tmp_path: Path) -> Path:
    """A scratch folder that looks like a checkout after set-up command 1's install: the bundled
    specs, `.venv` (this interpreter's environment), GPT-2's tokenizer files in `.data/gpt2`, and
    the user's own JSONL files that README names."""
    work = tmp_path / "checkout"
    work.mkdir()
    shutil.copytree(ROOT / "specs", work / "specs")
    (work / ".venv").symlink_to(Path(sys.prefix))
    gpt2 = work / ".data" / "gpt2"
    gpt2.mkdir(parents=True)
    corpus = _corpus_and_tokenizer(gpt2)
    (work / "my-corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus[:80]))
    (work / "my-heldout.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus[80:100]))
    chats = [{"prompt": t.split("\n", 1)[0][:200], "response": t[:400]} for t in corpus[100:120]]
    (work / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats[:15]))
    (work / "chats-heldout.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats[15:]))
    return work


def _run(args: list[str], work: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=work, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def _reads_a_trained_run(words: list[str], work: Path) -> bool:
    """A command that reads a run only a GPU trains (`dlmspec eval runs/NAME ...`), absent from the workspace."""
    return words[1:2] == ["eval"] and len(words) > 2 and words[2].startswith("runs/") and not (work / words[2]).exists()


def _expected_exit(command: str) -> int:
    """README shows one command meant to fail: the bad-input example."""
    return 2 if "tensor_model_parallel_size=5" in command else 0


def test_every_readme_command_runs_as_written(tmp_path: Path) -> None:
    install, tests = _setup_commands()
    work = _workspace(tmp_path)
    ran: list[str] = []
    for command in _bash_commands(README.read_text()):
        if command == tests:
            continue  # .ci/run runs it (test_ci_runs_readme_install_and_test_commands)
        parts = [p.strip() for p in command.split("&&")]
        for part in parts:
            words = shlex.split(part)
            if command == install and ("pip" in words[0] or words[:3] == ["python3", "-m", "venv"]):
                continue  # the install: .ci/run runs it; the workspace's .venv is this environment
            if words[0] == ".venv/bin/dlmspec":
                if "submit" in words:
                    assert "--dry-run" in words, f"README's SLURM command must show --dry-run: {part}"
                result = _run(words, work)
                out = result.stdout + result.stderr
                if _reads_a_trained_run(words, work):  # every flag accepted; it stops at the run the GPU trains
                    assert result.returncode == 2 and "RUN_OR_CHECKPOINT" in out and "does not exist" in out, out[-3000:]
                    assert "Traceback" not in out, f"{part}\n{out[-3000:]}"
                    ran.append(part)
                    continue
                assert result.returncode == _expected_exit(part), f"{part}\nexit {result.returncode}\n{out[-3000:]}"
                assert "Traceback" not in out, f"{part}\n{out[-3000:]}"
                if "submit" in words:
                    assert "sbatch" in result.stdout, result.stdout
                if "prepare" in words:
                    prefix = words[words.index("--output-prefix") + 1]
                    assert (work / f"{prefix}_text_document.bin").is_file(), out
            elif words[0] == "bash" and words[1].endswith("/launch.sh"):
                # a GPU command: with no GPU visible it must stop at its pre-flight check
                result = _run(words, work, env={"CUDA_VISIBLE_DEVICES": ""})
                out = result.stdout + result.stderr
                assert result.returncode == 2, f"{part}\nexit {result.returncode}\n{out[-3000:]}"
                assert "Traceback" not in out and "CUDA" in out, out[-3000:]
            else:
                pytest.fail(f"README command with no runner in tests/integration/project/test_readme.py: {part}")
            ran.append(part)
    assert any("launch.sh" in c for c in ran) and any("--sft" in c for c in ran), ran


def test_readme_sft_chain_submits_pretraining_then_sft(monkeypatch, capsys) -> None:
    """README's SFT section: its `dlmspec submit ... --dry-run` line runs as written and chains
    the SFT job after the pre-training job."""
    from dlmspec.cli import main

    line = next(c for c in _bash_commands(README.read_text()) if "demo-dlm-sft.toml" in c and "submit" in c)
    args = shlex.split(line)[1:]  # drop .venv/bin/dlmspec
    monkeypatch.chdir(ROOT)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "specs/demo-dlm-sft.toml" in out and "--dependency=afterok:$job1" in out


def test_readme_bad_input_example_exits_2_naming_the_key(monkeypatch, capsys) -> None:
    """README's bad-input example gets exit code 2 and a table naming the key, not a traceback."""
    from dlmspec.cli import main

    line = next(c for c in _bash_commands(README.read_text()) if _expected_exit(c) == 2)
    monkeypatch.chdir(ROOT)
    assert main(shlex.split(line)[1:]) == 2
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "tensor_model_parallel_size" in out and "Traceback" not in out
