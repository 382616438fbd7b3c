"""Chat templates (dlmspec.data.chat): the rendered text equals transformers' apply_chat_template
with our jinja text, and each token's response flag is exact, checked by decoding the tokens.

The GPT-2 tokenizer of the shared data kit is used on both sides (dlmspec's GPT2BPETokenizer for
our ids, transformers' GPT2TokenizerFast for the reference rendering and encoding).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dlmspec.data import chat
from dlmspec.tokenizers import build_tokenizer
from shared_kit import SHARED_DATA  # noqa: E402

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)

SHARED = SHARED_DATA
GPT2 = SHARED / "tokenizers" / "gpt2"
VOCAB, MERGES = str(GPT2 / "vocab.json"), str(GPT2 / "merges.txt")
BUILTIN = ("chatml", "llama3", "plain")

SYSTEM = {"role": "system", "content": "You answer in one sentence."}
CONVERSATIONS = {
    "single": [
        {"role": "user", "content": "What does os.path.join do?"},
        {"role": "assistant", "content": "It joins path parts with the separator."},
    ],
    "single+system": [
        SYSTEM,
        {"role": "user", "content": "Name a sequence type."},
        {"role": "assistant", "content": " A list, \n"},  # spaces kept (llama3 strips them)
    ],
    "multi": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Say <|im_end|> literally."},
        {"role": "assistant", "content": "<|im_end|> and <|eot_id|> are text here."},
    ],
    "multi+system": [
        SYSTEM,
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6."},
    ],
}
END_OF_TURN = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", "plain": ""}


@pytest.fixture(scope="module")
def hf():
    from transformers import GPT2TokenizerFast

    return GPT2TokenizerFast(VOCAB, MERGES)


@pytest.fixture(scope="module")
def gpt2():
    return build_tokenizer("GPT2BPETokenizer", vocab_file=VOCAB, merge_file=MERGES)


def _ids(template: str) -> dict[str, int]:
    """New ids as prepare gives them for GPT-2 (vocab 50257: from 50258 up)."""
    return {token: 50258 + i for i, token in enumerate(chat.SPECIAL_TOKENS[template])}


def _decode(gpt2, ids: list[int], special_ids: dict[str, int]) -> str:
    """Text of ids: GPT-2 BPE for vocabulary ids, the token string for a chat special id."""
    names = {i: t for t, i in special_ids.items()}
    out, run = [], []
    for i in ids:
        if i in names:
            out.append(gpt2.detokenize(run) if run else "")
            out.append(names[i])
            run = []
        else:
            run.append(i)
    out.append(gpt2.detokenize(run) if run else "")
    return "".join(out)


def _expected_response(template: str, messages: list[dict[str, str]]) -> str:
    text = ""
    for m in messages:
        if m["role"] == "assistant":
            text += (m["content"].strip() if template == "llama3" else m["content"]) + END_OF_TURN[template]
    return text


@pytest.mark.parametrize("generation", [False, True], ids=["plain", "generation-prompt"])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("template", BUILTIN)
def test_rendering_equals_transformers(hf, template, conversation, generation):
    messages = CONVERSATIONS[conversation]
    reference = hf.apply_chat_template(
        messages, chat_template=chat.JINJA[template], tokenize=False, add_generation_prompt=generation
    )
    assert chat.text_of(chat.render(template, messages, add_generation_prompt=generation)) == reference


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("template", BUILTIN)
def test_response_flags_are_exact(gpt2, template, conversation):
    messages = CONVERSATIONS[conversation]
    special = _ids(template)
    segments = chat.render(template, messages)
    ids, flags = chat.tokenize_segments(segments, gpt2.tokenize, special)
    assert len(ids) == len(flags) and set(flags) == {0, 1}
    response = [i for i, f in zip(ids, flags) if f]
    assert _decode(gpt2, response, special) == _expected_response(template, messages)
    # every token is in one place: the whole decodes to the rendered text
    assert _decode(gpt2, ids, special) == chat.text_of(segments)
    # each assistant turn is one contiguous run of flags, as many runs as assistant turns
    runs = sum(1 for a, b in zip([0] + flags, flags) if b and not a)
    assert runs == sum(m["role"] == "assistant" for m in messages)
    # the content's "<|im_end|>" text is BPE text, never the special id
    if conversation == "multi" and template == "chatml":
        assert ids.count(special["<|im_end|>"]) == 4


@pytest.mark.parametrize("template", BUILTIN)
def test_prompt_tokens_are_the_generation_prompt_tokens(gpt2, template):
    """What inference feeds the model (the prompt with add_generation_prompt) is tokenized exactly
    as the prompt part of a training sample."""
    messages = CONVERSATIONS["single+system"]
    special = _ids(template)
    ids, flags = chat.tokenize_segments(chat.render(template, messages), gpt2.tokenize, special)
    first = flags.index(1)
    prompt, _ = chat.tokenize_segments(
        chat.render(template, messages[:-1], add_generation_prompt=True), gpt2.tokenize, special
    )
    assert ids[:first] == prompt


def test_chatml_ids_equal_transformers_encoding(gpt2):
    """For ChatML the segment-wise ids are what a GPT-2 tokenizer with the chat tokens added gives
    for the whole text."""
    from transformers import GPT2TokenizerFast

    hf = GPT2TokenizerFast(VOCAB, MERGES)
    hf.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    special = {t: hf.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>")}
    assert special == {"<|im_start|>": 50257, "<|im_end|>": 50258}
    for name in ("single", "single+system", "multi+system"):
        text = hf.apply_chat_template(CONVERSATIONS[name], chat_template=chat.CHATML_JINJA, tokenize=False)
        ids, _ = chat.tokenize_segments(chat.render("chatml", CONVERSATIONS[name]), gpt2.tokenize, special)
        assert ids == hf.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("template", ["chatml", "llama3"])
def test_tokenizer_template_splits_as_the_builtin_one(gpt2, template):
    """--chat-template tokenizer on a tokenizer whose chat_template is ours gives the same text and
    the same flags as the built-in renderer."""
    from transformers import GPT2TokenizerFast

    hf = GPT2TokenizerFast(VOCAB, MERGES)
    hf.add_special_tokens({"additional_special_tokens": list(chat.SPECIAL_TOKENS[template])})
    hf.chat_template = chat.JINJA[template]
    own = chat.TokenizerTemplate(hf, "gpt2+" + template)
    special = {t: hf.convert_tokens_to_ids(t) for t in chat.SPECIAL_TOKENS[template]}
    for name in CONVERSATIONS:  # "multi": a user's "<|im_end|>" is text in both
        messages = CONVERSATIONS[name]
        ours = chat.render(template, messages)
        theirs = own.render(messages)
        assert chat.text_of(theirs) == chat.text_of(ours)
        assert chat.tokenize_segments(theirs, gpt2.tokenize, special) == chat.tokenize_segments(
            ours, gpt2.tokenize, special
        )


def test_tokenizer_template_refusals(hf):
    with pytest.raises(chat.ChatTemplateError, match="has no chat_template"):
        chat.TokenizerTemplate(hf, "gpt2")
    from transformers import GPT2TokenizerFast

    rewriting = GPT2TokenizerFast(VOCAB, MERGES)
    rewriting.chat_template = "{{ messages[-1]['role'] + ': ' + messages[-1]['content'] }}"
    with pytest.raises(chat.ChatTemplateError, match="not a prefix of the next"):
        chat.TokenizerTemplate(rewriting, "last-only").render(CONVERSATIONS["single"])


def test_split_specials_longest_first():
    assert chat.split_specials("a<|x|><|xy|>b", ["<|x|>", "<|xy|>"]) == [
        ("a", False), ("<|x|>", True), ("<|xy|>", True), ("b", False)
    ]
    assert chat.split_specials("plain", []) == [("plain", False)]
