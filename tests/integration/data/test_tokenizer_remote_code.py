"""A tokenizer folder whose config names its own code (``auto_map``) is refused by `data prepare`
(exit 2): no "run custom code? [y/N]" question, and the code never runs, even with "y" on stdin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared_kit import SHARED_DATA  # noqa: E402

pytestmark = pytest.mark.shared_data

GPT2 = SHARED_DATA / "tokenizers" / "gpt2"
DLMSPEC = Path(sys.executable).with_name("dlmspec")


@pytest.fixture()
def custom_code_folder(tmp_path) -> tuple[Path, Path]:
    """A GPT-2 tokenizer folder whose tokenizer_config.json names CustomTokenizer in custom_tok.py,
    which writes a canary file when imported."""
    from transformers import GPT2TokenizerFast

    folder = tmp_path / "tok"
    hf = GPT2TokenizerFast(str(GPT2 / "vocab.json"), str(GPT2 / "merges.txt"))
    hf.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    hf.save_pretrained(folder)
    canary = tmp_path / "canary"
    (folder / "custom_tok.py").write_text(
        "from pathlib import Path\n"
        f"Path({str(canary)!r}).write_text('custom code ran')\n"
        "from transformers import GPT2TokenizerFast\n"
        "class CustomTokenizer(GPT2TokenizerFast):\n    pass\n"
    )
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "CustomTokenizer"
    config["auto_map"] = {"AutoTokenizer": [None, "custom_tok.CustomTokenizer"]}
    config_path.write_text(json.dumps(config))
    (folder / "config.json").write_text(json.dumps({"model_type": "custom-never-known",
                                                    "auto_map": {"AutoTokenizer": [None, "custom_tok.CustomTokenizer"]}}))
    return folder, canary


@pytest.mark.parametrize("mode", ["pretraining", "multimodal", "sft_tokenizer_template"])
def test_a_tokenizer_with_its_own_code_is_refused_without_asking(custom_code_folder, tmp_path, mode):
    folder, canary = custom_code_folder
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"text": "hello", "messages": [{"role": "user", "content": "a"},
                                                              {"role": "assistant", "content": "b"}]}) + "\n")
    kind = "MultimodalTokenizer" if mode == "multimodal" else "HuggingFaceTokenizer"
    args = [str(DLMSPEC), "data", "prepare", "--no-progress", "--input", str(data), "--output-prefix",
            str(tmp_path / "out"), "--tokenizer-type", kind, "--tokenizer-model", str(folder)]
    if mode == "sft_tokenizer_template":
        args += ["--sft", "--chat-template", "tokenizer"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run(args, input="y\ny\n", capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "[y/N]" not in output and "Do you wish to run" not in output, output
    assert "which dlmspec never runs" in " ".join(output.split()), output
    assert "Traceback" not in output, output
    assert not canary.exists(), "the tokenizer folder's own code ran"
    assert str(folder) in " ".join(output.split()), output
