"""`dlmspec data prepare --sft`: the contract's three files (read back with megatron-core's
IndexedDataset), the response flags by decoding, every bad-row kind, --on-bad fail, --overlong,
the special-token ids and their collisions, --force.

The contract: /work/wt/tasks/sft-interface.md (docs/sft-data.md has it for users).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dlmspec.data import chat, sft
from dlmspec.data.cli import app
from dlmspec.data.record import read_record
from shared_kit import SHARED_DATA  # noqa: E402

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)

SHARED = SHARED_DATA
GPT2 = SHARED / "tokenizers" / "gpt2"
VOCAB, MERGES = str(GPT2 / "vocab.json"), str(GPT2 / "merges.txt")
GPT2_CLI = ["--tokenizer-type", "gpt2bpe", "--vocab-file", VOCAB, "--merge-file", MERGES]
EOD = 50256

GOOD = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
                  {"role": "assistant", "content": "4."}]},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                  {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Goodbye."}]},
]
#: One line per bad-row kind (the kind, the JSON line).
BAD = {
    "not_json": "{not json",
    "wrong_type": json.dumps({"messages": "hello"}),
    "missing_key": json.dumps({"conversation": []}),
    "missing_role": json.dumps({"messages": [{"content": "x"}, {"role": "assistant", "content": "y"}]}),
    "unknown_role": json.dumps({"messages": [{"role": "bot", "content": "x"}, {"role": "assistant", "content": "y"}]}),
    "empty_response": json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": " "}]}),
    "no_response": json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
                                            {"role": "user", "content": "z"}]}),
    "over_long": json.dumps({"messages": [{"role": "user", "content": "word " * 80},
                                          {"role": "assistant", "content": "ok"}]}),
}


def _invoke(args: list[str]):
    return CliRunner().invoke(app, ["prepare", "--sft", "--no-progress", *args])


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _dataset(prefix: str):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    return IndexedDataset(prefix, mmap=True)


@pytest.fixture(scope="module")
def gpt2():
    from dlmspec.tokenizers import build_tokenizer

    return build_tokenizer("GPT2BPETokenizer", vocab_file=VOCAB, merge_file=MERGES)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A file with the good rows first and last, one bad row of each kind and a blank line between,
    prepared with --seq-length 64 (the CLI's --json envelope, the output prefix)."""
    folder = tmp_path_factory.mktemp("sft")
    lines = [json.dumps(GOOD[0]), *BAD.values(), "", json.dumps(GOOD[1])]
    path = _write(folder / "chats.jsonl", lines)
    out = folder / "out" / "chat"
    result = _invoke(["--input", str(path), "--output-prefix", str(out), *GPT2_CLI, "--seq-length", "64", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), str(out) + "_text_document"


def test_three_files_of_the_contract(mixed, gpt2):
    envelope, prefix = mixed
    assert envelope["ok"] and envelope["command"] == "data prepare"
    tokens, flags = _dataset(prefix), _dataset(prefix + "_response")
    assert len(tokens) == len(flags) == 2
    assert tokens.index.dtype == np.uint16 and flags.index.dtype == np.uint8
    assert np.array_equal(tokens.sequence_lengths, flags.sequence_lengths)
    assert np.array_equal(tokens.document_indices, flags.document_indices)
    assert list(tokens.document_indices) == [0, 1, 2]  # one sequence per conversation
    record = read_record(prefix)
    section = record["sft"]
    assert section["format"] == "messages" and section["chat_template"] == "chatml"
    assert section["chat_template_sha256"] == chat.template_sha256(chat.CHATML_JINJA)
    assert section["response_prefix"] == prefix + "_response"
    assert section["special_tokens"] == {"<|im_start|>": 50258, "<|im_end|>": 50259}
    assert section["special_tokens_in_vocab"] == {"<|endoftext|>": EOD}
    assert section["eod_id"] == EOD and section["max_length"] == 64
    assert section["rows"] == {"read": 10, "written": 2, "skipped": 8, "truncated": 0}
    total = int(tokens.sequence_lengths.sum())
    response = sum(int(flags[i].sum()) for i in range(2))
    assert (section["response_tokens"], section["prompt_tokens"]) == (response, total - response)
    assert record["documents"] == 2 and record["tokens"] == total
    assert record["tokenizer"]["type"] == "GPT2BPETokenizer" and record["tokenizer"]["vocab_size"] == 50257


def test_response_flags_decode_to_the_assistant_turns(mixed, gpt2):
    _, prefix = mixed
    tokens, flags = _dataset(prefix), _dataset(prefix + "_response")
    names = {50258: "<|im_start|>", 50259: "<|im_end|>", EOD: "<EOD>"}

    def decode(ids):
        out, run = "", []
        for i in ids:
            if i in names:
                out += (gpt2.detokenize(run) if run else "") + names[i]
                run = []
            else:
                run.append(int(i))
        return out + (gpt2.detokenize(run) if run else "")

    expected = ["4.<|im_end|><EOD>", "Hello!<|im_end|>Goodbye.<|im_end|><EOD>"]
    for i in range(2):
        ids, mask = tokens[i], flags[i].astype(bool)
        assert ids[-1] == EOD and mask[-1]  # one EOD at the end, supervised
        assert decode(ids[mask]) == expected[i]
        assert decode(ids[:-1]) == chat.text_of(chat.render("chatml", GOOD[i]["messages"]))


def test_every_bad_row_kind_is_counted_with_its_line(mixed):
    envelope, _ = mixed
    result = envelope["result"]
    # line 1 good, lines 2..9 one of each kind (BAD's order), line 10 blank, line 11 good
    expected_lines = {kind: [2 + i] for i, kind in enumerate(BAD)}
    assert result["bad_rows"] == {kind: 1 for kind in BAD}
    assert result["bad_row_lines"] == expected_lines
    assert set(BAD) <= set(sft.BAD_KINDS)


def test_table_summary_names_kinds_and_lines(tmp_path):
    path = _write(tmp_path / "c.jsonl", [json.dumps(GOOD[0]), BAD["unknown_role"]])
    result = _invoke(["--input", str(path), "--output-prefix", str(tmp_path / "o"), *GPT2_CLI])
    assert result.exit_code == 0, result.output
    assert "bad: unknown_role" in result.stdout and "1 (lines 2)" in result.stdout
    assert "<|im_start|> 50258, <|im_end|> 50259" in result.stdout


@pytest.mark.parametrize("kind", list(BAD))
def test_on_bad_fail_exits_2_naming_the_line(kind, tmp_path):
    path = _write(tmp_path / "c.jsonl", [json.dumps(GOOD[0]), BAD[kind]])
    out = tmp_path / "out"
    result = _invoke(["--input", str(path), "--output-prefix", str(out / "o"), *GPT2_CLI,
                      "--seq-length", "64", "--on-bad", "fail"])
    assert result.exit_code == 2, result.output
    assert f"c.jsonl:2: bad row ({kind})" in result.stderr and "--on-bad skip" in result.stderr
    assert "Traceback" not in result.output
    assert not out.exists() or list(out.iterdir()) == []


def test_truncate_is_counted_and_said(tmp_path, gpt2):
    long_reply = {"messages": [{"role": "user", "content": "Tell me"},
                               {"role": "assistant", "content": "word " * 60}]}
    long_prompt = json.loads(BAD["over_long"])
    path = _write(tmp_path / "c.jsonl", [json.dumps(long_reply), json.dumps(long_prompt), json.dumps(GOOD[0])])
    out = tmp_path / "o"
    result = _invoke(["--input", str(path), "--output-prefix", str(out), *GPT2_CLI,
                      "--seq-length", "32", "--overlong", "truncate", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["result"]
    assert summary["rows"]["truncated"] == 1 and summary["truncated_lines"] == [1]
    assert summary["bad_rows"] == {"over_long": 1}  # the prompt alone is longer: skipped
    assert "1 rows cut to --seq-length 32" in result.stderr
    tokens, flags = _dataset(str(out) + "_text_document"), _dataset(str(out) + "_text_document_response")
    assert list(tokens.sequence_lengths) == [32, len(tokens[1])] and tokens[0][-1] != EOD
    assert flags[0][-1] == 1
    assert read_record(str(out) + "_text_document")["sft"]["rows"]["truncated"] == 1


def test_prompt_response_rows_and_keys(tmp_path):
    path = _write(tmp_path / "c.jsonl", [json.dumps({"q": "Hi", "a": "Hello"}), json.dumps({"q": "x", "a": ""})])
    out = tmp_path / "o"
    result = _invoke(["--input", str(path), "--output-prefix", str(out), *GPT2_CLI,
                      "--prompt-key", "q", "--response-key", "a", "--chat-template", "llama3", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["result"]
    assert summary["format"] == "prompt_response" and summary["bad_rows"] == {"empty_response": 1}
    assert summary["special_tokens"] == {t: 50258 + i for i, t in enumerate(chat.SPECIAL_TOKENS["llama3"])}


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--mask-token-id", "50258"], "--mask-token-id 50258: the chat token <|im_start|> would get id 50258"),
        (["--pad-token-id", "50259"], "--pad-token-id 50259: the chat token <|im_end|> would get id 50259"),
        (["--first-new-token-id", "100"], "--first-new-token-id 100: below the vocabulary size 50257"),
        (["--first-new-token-id", "4294967296"], "--first-new-token-id 4294967296: the new chat tokens' ids"),
        (["--mask-token-id", "50256"], "--mask-token-id 50256: is the EOD id"),
        (["--chat-template", "vicuna"], "--chat-template vicuna: not a template; pick one of chatml"),
        (["--chat-template", "tokenizer"], "--chat-template tokenizer: uses the Hugging Face tokenizer's own"),
        (["--overlong", "truncate"], "--overlong truncate: applies to rows longer than --seq-length"),
        (["--on-bad", "warn"], "--on-bad warn: pick skip or fail"),
        (["--seq-length", "1"], "--seq-length 1: a sample needs at least 2 tokens"),
        (["--json-keys", "body"], "--json-keys body: not used with --sft"),
    ],
)
def test_bad_flags_exit_2_with_flag_value_and_remedy(flags, message, tmp_path):
    path = _write(tmp_path / "c.jsonl", [json.dumps(GOOD[0])])
    out = tmp_path / "out"
    result = _invoke(["--input", str(path), "--output-prefix", str(out / "o"), *GPT2_CLI, *flags])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split()), result.stderr
    assert not out.exists() or list(out.iterdir()) == []


def test_new_ids_move_past_mask_and_pad(tmp_path):
    path = _write(tmp_path / "c.jsonl", [json.dumps(GOOD[0])])
    result = _invoke(["--input", str(path), "--output-prefix", str(tmp_path / "o"), *GPT2_CLI, "--json",
                      "--first-new-token-id", "50300", "--mask-token-id", "50257", "--pad-token-id", "50256"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["result"]
    assert summary["special_tokens"] == {"<|im_start|>": 50300, "<|im_end|>": 50301}
    ids = set(summary["special_tokens"].values()) | set(summary["special_tokens_in_vocab"].values())
    assert 50257 not in ids


def test_sft_flag_without_sft_is_refused(tmp_path):
    path = _write(tmp_path / "c.jsonl", [json.dumps({"text": "x"})])
    result = CliRunner().invoke(app, ["prepare", "--no-progress", "--input", str(path), "--output-prefix",
                                      str(tmp_path / "o"), *GPT2_CLI, "--chat-template", "chatml"])
    assert result.exit_code == 2 and "--chat-template is an SFT flag; add --sft" in result.stderr


def test_nothing_is_overwritten_without_force(tmp_path):
    path = _write(tmp_path / "c.jsonl", [json.dumps(GOOD[0])])
    args = ["--input", str(path), "--output-prefix", str(tmp_path / "o"), *GPT2_CLI]
    assert _invoke(args).exit_code == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("o_")}
    assert sorted(before) == ["o_text_document.bin", "o_text_document.dlmspec.json", "o_text_document.idx",
                              "o_text_document_response.bin", "o_text_document_response.idx"]
    again = _invoke(args)
    assert again.exit_code == 2 and "Pass --force" in " ".join(again.stderr.split())
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("o_")} == before
    assert _invoke([*args, "--force"]).exit_code == 0


def test_all_rows_bad_writes_nothing(tmp_path):
    path = _write(tmp_path / "c.jsonl", [BAD["unknown_role"], BAD["not_json"]])
    out = tmp_path / "out"
    result = _invoke(["--input", str(path), "--output-prefix", str(out / "o"), *GPT2_CLI])
    assert result.exit_code == 2
    assert "no conversation was written; every row is bad: not_json 1 (lines 2), unknown_role 1 (lines 1)" in \
        " ".join(result.stderr.split())
    assert not out.exists() or list(out.iterdir()) == []


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """Hugging Face GPT-2 folders: ``bare`` (as GPT-2 ships, no chat_template) and ``own`` (the
    ChatML tokens added and our ChatML jinja as its chat_template)."""
    from transformers import GPT2TokenizerFast

    folder = tmp_path_factory.mktemp("hf")
    hf = GPT2TokenizerFast(VOCAB, MERGES)
    hf.save_pretrained(folder / "bare")
    hf.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    hf.chat_template = chat.CHATML_JINJA
    hf.save_pretrained(folder / "own")
    return folder / "bare", folder / "own"


def test_tokenizer_template_through_transformers(tmp_path, hf_dirs):
    """--chat-template tokenizer with a Hugging Face GPT-2 whose chat_template is ChatML: the same
    response flags as --chat-template chatml, the tokenizer's own ids for the chat tokens; one
    without a chat_template is refused."""
    bare, own = hf_dirs
    path = _write(tmp_path / "c.jsonl", [json.dumps(g) for g in GOOD])
    refused = _invoke(["--input", str(path), "--output-prefix", str(tmp_path / "x"), "--tokenizer-type",
                       "HuggingFaceTokenizer", "--tokenizer-model", str(bare), "--chat-template", "tokenizer"])
    assert refused.exit_code == 2 and "has no chat_template" in refused.stderr
    got = {}
    for name, args in (("tokenizer", ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(own)]),
                       ("chatml", GPT2_CLI)):
        result = _invoke(["--input", str(path), "--output-prefix", str(tmp_path / name), *args,
                          "--chat-template", name, "--json"])
        assert result.exit_code == 0, result.output
        prefix = str(tmp_path / name) + "_text_document"
        got[name] = (_dataset(prefix), _dataset(prefix + "_response"), json.loads(result.stdout)["result"])
    (t_ids, t_flags, t_sum), (c_ids, c_flags, c_sum) = got["tokenizer"], got["chatml"]
    assert t_sum["special_tokens"] == {}
    assert t_sum["special_tokens_in_vocab"] == {"<|endoftext|>": EOD, "<|im_start|>": 50257, "<|im_end|>": 50258}
    assert t_sum["chat_template_sha256"] == c_sum["chat_template_sha256"]
    remap = {50257: 50258, 50258: 50259}
    for i in range(len(GOOD)):
        assert np.array_equal(t_flags[i], c_flags[i])
        assert [remap.get(int(x), int(x)) for x in t_ids[i]] == [int(x) for x in c_ids[i]]


def test_special_token_text_in_content_stays_text_with_a_hugging_face_tokenizer(tmp_path, hf_dirs):
    """A user's "<|endoftext|>" is text, never the EOD id (megatron-core's HF tokenizer maps it):
    the HF GPT-2 gives the bytes GPT2BPETokenizer gives."""
    bare, _ = hf_dirs
    row = {"messages": [{"role": "user", "content": "Say <|endoftext|> twice"},
                        {"role": "assistant", "content": "<|endoftext|> <|endoftext|>"}]}
    path = _write(tmp_path / "c.jsonl", [json.dumps(row), json.dumps(GOOD[1])])
    for name, args in (("hf", ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(bare)]),
                       ("bpe", GPT2_CLI)):
        result = _invoke(["--input", str(path), "--output-prefix", str(tmp_path / name), *args])
        assert result.exit_code == 0, result.output
    hf, bpe = (str(tmp_path / name) + "_text_document" for name in ("hf", "bpe"))
    dataset = _dataset(hf)  # kept: its mmap is closed when it is collected
    assert list(dataset[0]).count(EOD) == 1
    for suffix in (".bin", ".idx", "_response.bin"):
        assert Path(hf + suffix).read_bytes() == Path(bpe + suffix).read_bytes()


def test_ctrl_c_leaves_no_files_and_exits_130(tmp_path, monkeypatch):
    path = _write(tmp_path / "c.jsonl", [json.dumps(g) for g in GOOD])
    real, calls = chat.tokenize_segments, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(chat, "tokenize_segments", interrupted)
    out = tmp_path / "out"
    result = _invoke(["--input", str(path), "--output-prefix", str(out / "o"), *GPT2_CLI])
    assert result.exit_code == 130 and "temporary files removed" in result.stderr
    assert len(calls) == 2 and list(out.iterdir()) == []


def test_record_name_that_is_the_input_is_refused_even_with_force(tmp_path):
    path = _write(tmp_path / "o_text_document.dlmspec.json", [json.dumps(GOOD[0])])
    before = path.read_bytes()
    result = _invoke(["--input", str(path), "--output-prefix", str(tmp_path / "o"), *GPT2_CLI, "--force"])
    assert result.exit_code == 2 and "the dataset record, is an input file" in " ".join(result.stderr.split())
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_json_envelope_of_a_failure(tmp_path):
    path = _write(tmp_path / "c.jsonl", [json.dumps(GOOD[0]), BAD["unknown_role"]])
    result = _invoke(["--input", str(path), "--output-prefix", str(tmp_path / "o"), *GPT2_CLI,
                      "--on-bad", "fail", "--json"])
    assert result.exit_code == 2
    envelope = json.loads(result.stdout)
    assert envelope["ok"] is False and envelope["command"] == "data prepare"
    (issue,) = envelope["issues"]
    assert "c.jsonl:2: bad row (unknown_role): messages[0].role 'bot' is not one of" in issue["message"]


def test_a_tokenizer_that_cannot_tokenize_the_chat_exits_2(tmp_path):
    path = _write(tmp_path / "c.jsonl", [json.dumps(GOOD[0])])
    out = tmp_path / "out"
    result = _invoke(["--input", str(path), "--output-prefix", str(out / "o"), "--tokenizer-type", "null",
                      "--vocab-size", "100"])
    assert result.exit_code == 2, result.output
    assert "c.jsonl:1: NullTokenizer cannot tokenize the rendered conversation" in " ".join(result.stderr.split())
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.parametrize("template", ["chatml", "llama3", "plain"])
def test_new_ids_never_take_a_vocabulary_mask_or_pad_id(gpt2, template):
    specials = chat.SPECIAL_TOKENS[template]
    new, in_vocab = sft.assign_special_ids(specials, gpt2, 50257, None, None, None, EOD)
    assert in_vocab == {} and list(new) == list(specials)
    assert sorted(new.values()) == list(range(50258, 50258 + len(specials)))  # 50257 left for [MASK]
    for mask in range(50257, 50258 + len(specials)):
        for first in (None, 50257, 50258, 50300):
            try:
                got, _ = sft.assign_special_ids(specials, gpt2, 50257, first, mask, EOD, EOD)
            except sft.DataPrepareError as exc:
                assert f"--mask-token-id {mask}" in str(exc)
                continue
            assert mask not in got.values() and EOD not in got.values()
            assert all(i >= 50257 for i in got.values())
