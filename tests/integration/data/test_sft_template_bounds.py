"""`dlmspec data prepare --sft` against long and hostile input: a tokenizer's chat template renders a
4,000-turn conversation quickly and as the built-in template does; a template that loops without
end or grows strings without bound stops the run (exit 2, naming the template) within its time and
memory bounds; a row with a lone surrogate or a line over --max-line-bytes is a bad row."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.data import chat
from dlmspec.data.cli import app
from shared_kit import SHARED_DATA  # noqa: E402

pytestmark = pytest.mark.shared_data

GPT2 = SHARED_DATA / "tokenizers" / "gpt2"
VOCAB, MERGES = str(GPT2 / "vocab.json"), str(GPT2 / "merges.txt")
GPT2_CLI = ["--tokenizer-type", "gpt2bpe", "--vocab-file", VOCAB, "--merge-file", MERGES]
ROW = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}


def _invoke(args: list[str]):
    return CliRunner().invoke(app, ["prepare", "--sft", "--no-progress", *args])


def _long_conversation(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "Be brief."}]
    for i in range(turns // 2):
        messages += [{"role": "user", "content": f"question {i}?"}, {"role": "assistant", "content": f"answer {i}."}]
    return messages


def _hf(template: str):
    from transformers import GPT2TokenizerFast

    hf = GPT2TokenizerFast(VOCAB, MERGES)
    hf.add_special_tokens({"additional_special_tokens": list(chat.SPECIAL_TOKENS.get(template, ()))})
    hf.chat_template = chat.JINJA.get(template, template)
    return hf


@pytest.mark.parametrize("template", ["chatml", "llama3", "plain"])
def test_tokenizer_template_renders_4000_turns_quickly_as_the_builtin_one(template):
    messages = _long_conversation(4000)
    own = chat.TokenizerTemplate(_hf(template), "gpt2+" + template)
    start = time.perf_counter()
    theirs = own.render(messages)
    elapsed = time.perf_counter() - start
    ours = chat.render(template, messages)
    assert chat.text_of(theirs) == chat.text_of(ours)
    special = {t: 50257 + i for i, t in enumerate(chat.SPECIAL_TOKENS[template])}
    split = lambda segments: chat.tokenize_segments(segments, lambda text: [len(text)], special)  # noqa: E731
    assert split(theirs) == split(ours)
    assert elapsed < 10, f"{elapsed:.1f} s for 4,000 turns"


def test_a_template_that_looks_ahead_still_splits_exactly():
    """loop.last takes the next message early: the conversation is split prefix by prefix."""
    looking = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
               "{% if loop.last and add_generation_prompt %}<|im_start|>assistant\n{% endif %}{% endfor %}"
               "{% if add_generation_prompt and messages|length == 0 %}<|im_start|>assistant\n{% endif %}")
    messages = _long_conversation(40)
    hf = _hf("chatml")
    hf.chat_template = looking
    theirs = chat.TokenizerTemplate(hf, "looking").render(messages)
    assert chat.text_of(theirs) == chat.text_of(chat.render("chatml", messages))
    assert [s.response for s in theirs if s.text.strip()] == \
        [s.response for s in chat.render("chatml", messages) if s.text.strip()]


HOSTILE = {
    "nested_loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x",
    "doubling_concat": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
                       "{% endfor %}{{ ns.s }}",
    "doubling_plus": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
                     "{% endfor %}{{ ns.s }}",
    "repeat": "{{ 'a' * 10**10 }}",
    "center": "{{ 'x' | center(3000000000) }}",
    "endless_output": "{% for i in range(100000) %}{% for j in range(100000) %}{{ 'word ' * 100 }}{% endfor %}"
                      "{% endfor %}",
}


@pytest.fixture(scope="module")
def hostile_dirs(tmp_path_factory):
    folders = {}
    for name, template in HOSTILE.items():
        folder = tmp_path_factory.mktemp(name)
        hf = _hf(template)
        hf.save_pretrained(folder)
        folders[name] = folder
    return folders


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_tokenizer_template_exits_2_within_bounds(name, hostile_dirs, tmp_path, monkeypatch):
    monkeypatch.setattr(chat, "ROW_SECONDS", 2.0, raising=False)
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(ROW) + "\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    result = _invoke(["--input", str(path), "--output-prefix", str(tmp_path / "out"), "--tokenizer-type",
                      "HuggingFaceTokenizer", "--tokenizer-model", str(hostile_dirs[name]),
                      "--chat-template", "tokenizer", "--on-bad", "skip"])
    elapsed = time.perf_counter() - start
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), text
    assert str(hostile_dirs[name]) in text and "chat_template" in text and "--chat-template chatml" in text, text
    assert elapsed < 30, f"{elapsed:.1f} s"
    assert grown < 2.5 * (1 << 30), f"the process grew by {grown / (1 << 30):.1f} GiB"
    assert not list(tmp_path.glob("out*"))


def test_a_lone_surrogate_is_a_bad_row(tmp_path):
    bad = '{"messages": [{"role": "user", "content": "a\\ud800b"}, {"role": "assistant", "content": "ok"}]}'
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + bad + "\n" + json.dumps(ROW) + "\n")
    skipped = _invoke(["--input", str(path), "--output-prefix", str(tmp_path / "skip"), *GPT2_CLI,
                       "--on-bad", "skip", "--json"])
    assert skipped.exit_code == 0, skipped.output
    summary = json.loads(skipped.stdout)["result"]
    assert summary["bad_rows"] == {"bad_text": 1} and summary["bad_row_lines"] == {"bad_text": [2]}
    assert summary["documents"] == 2
    failed = _invoke(["--input", str(path), "--output-prefix", str(tmp_path / "fail"), *GPT2_CLI,
                      "--on-bad", "fail"])
    text = " ".join(failed.output.split())
    assert failed.exit_code == 2 and isinstance(failed.exception, SystemExit), text
    assert f"{path}:2: bad row (bad_text)" in text and "surrogate" in text, text


def test_a_line_over_max_line_bytes_is_a_bad_row(tmp_path):
    long_row = {"messages": [{"role": "user", "content": "x" * 5000}, {"role": "assistant", "content": "ok"}]}
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + json.dumps(long_row) + "\n" + json.dumps(ROW) + "\n")
    skipped = _invoke(["--input", str(path), "--output-prefix", str(tmp_path / "skip"), *GPT2_CLI,
                       "--max-line-bytes", "1000", "--on-bad", "skip", "--json"])
    assert skipped.exit_code == 0, skipped.output
    summary = json.loads(skipped.stdout)["result"]
    assert summary["bad_rows"] == {"line_too_long": 1} and summary["bad_row_lines"] == {"line_too_long": [2]}
    assert summary["documents"] == 2
    failed = _invoke(["--input", str(path), "--output-prefix", str(tmp_path / "fail"), *GPT2_CLI,
                      "--max-line-bytes", "1000", "--on-bad", "fail"])
    assert failed.exit_code == 2 and f"{path}:2: the line has" in " ".join(failed.output.split())
