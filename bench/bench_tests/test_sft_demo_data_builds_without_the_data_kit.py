"""The SFT demo's conversation set (bench/sft_conversations.py, the data of specs/demo-dlm-sft.toml)
builds without the offline data kit: from this Python's standard library docstrings; without a
GPT-2 tokenizer it exits 2 naming the command that gets one, before building anything."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("bench_sft_conversations_no_kit", ROOT / "bench" / "sft_conversations.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "KIT_CANDIDATES", (tmp_path / "no-kit",))
    return module


@pytest.mark.harness
def test_conversations_come_from_the_standard_library_without_the_kit(monkeypatch, tmp_path, capsys):
    sft = _module(monkeypatch, tmp_path)
    gpt2 = tmp_path / "data" / "gpt2"
    gpt2.mkdir(parents=True)
    (gpt2 / "vocab.json").write_text("{}")
    (gpt2 / "merges.txt").write_text("")
    assert sft.main(["--out", str(tmp_path / "sft"), "--data", str(tmp_path / "data")]) == 0
    out = capsys.readouterr()
    assert "standard library" in out.err
    rows = [json.loads(line) for line in (tmp_path / "sft" / "train.jsonl").read_text().splitlines()]
    heldout = (tmp_path / "sft" / "heldout.jsonl").read_text().splitlines()
    assert len(rows) > 100 and heldout
    user, assistant = rows[0]["messages"]
    assert user["content"].startswith(sft.INSTRUCTION) and assistant["content"] in user["content"]
    assert "--output-prefix " + str(tmp_path / "data" / "demo-sft-train") in out.out


def test_missing_tokenizer_without_the_kit_names_the_download(monkeypatch, tmp_path, capsys):
    sft = _module(monkeypatch, tmp_path)
    code = sft.main(["--out", str(tmp_path / "sft"), "--data", str(tmp_path / "data"), "--max-train", "10"])
    err = capsys.readouterr().err
    assert code == 2 and "hf download openai-community/gpt2 vocab.json merges.txt --local-dir .data/gpt2" in err
    # the tokenizer is checked first: no conversations (nor the standard library corpus) built before the error
    assert not (tmp_path / "sft").exists() and "standard library" not in err


def test_validate_names_the_sft_demo_data_command(tmp_path):
    import subprocess

    import pytest

    if (ROOT / ".data" / "demo-sft-train_text_document.bin").exists():
        pytest.skip("the SFT demo's data is prepared in this checkout")
    out = subprocess.run([sys.executable, "-m", "dlmspec.cli", "validate", "specs/demo-dlm-sft.toml", "--json"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    issues = json.loads(out.stdout)["warnings"]
    hints = [i["hint"] for i in issues if i["rule"] == "path-not-found" and i["key"] in ("data.train", "data.valid")]
    assert hints and all("python bench/sft_conversations.py --run" in h for h in hints), hints
