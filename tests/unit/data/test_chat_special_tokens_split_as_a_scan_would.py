"""dlmspec.data.chat.split_specials cuts template text at special-token strings with one regular
expression: the pieces are those of a scan from the left that tries the longest special first at
each position, for specials that share prefixes, hold regular-expression characters, sit side by
side or at the ends, and for text with none (one piece; none for empty text)."""

from __future__ import annotations

import random

import pytest

from dlmspec.data import chat


def _scan(text: str, specials: list[str]) -> list[tuple[str, bool]]:
    """The rule, written as the scan it states: at each position the longest special that starts
    there, else one character further."""
    ordered = sorted({s for s in specials if s}, key=len, reverse=True)
    pieces, start, i = [], 0, 0
    while i < len(text):
        hit = next((s for s in ordered if text.startswith(s, i)), None)
        if hit is None:
            i += 1
            continue
        if i > start:
            pieces.append((text[start:i], False))
        pieces.append((hit, True))
        i += len(hit)
        start = i
    if start < len(text):
        pieces.append((text[start:], False))
    return pieces


SPECIALS = ["<|x|>", "<|x|><", "<|xy|>", ".*", "[a]", "a|b", "\\d", "é", ""]
CASES = [
    ("", SPECIALS), ("plain text", []), ("plain text", SPECIALS), ("", []),
    ("<|x|><|x|><|xy|>", SPECIALS), ("a.*b[a]ca|b\\d\\dé", SPECIALS), ("<|x|><", ["<|x|>", "<|x|><"]),
    ("User:\n 1 2 + 3 =\n\nAssistant:\n", chat.SPECIAL_TOKENS["plain"]),
    ("<|im_start|>user\nhi<|im_end|>\n", chat.SPECIAL_TOKENS["chatml"]),
    ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>", chat.SPECIAL_TOKENS["llama3"]),
]


@pytest.mark.parametrize(("text", "specials"), CASES)
def test_pieces_are_those_of_the_longest_first_scan(text, specials):
    assert chat.split_specials(text, specials) == _scan(text, list(specials))


def test_random_texts_of_special_fragments_split_as_the_scan_does():
    rng = random.Random(0)
    alphabet = ["<", "|", "x", "y", ">", ".", "*", "[", "a", "]", "b", "\\", "d", "é", " "]
    for _ in range(300):
        text = "".join(rng.choice(alphabet + SPECIALS) for _ in range(rng.randrange(30)))
        specials = rng.sample(SPECIALS, rng.randrange(len(SPECIALS) + 1))
        assert chat.split_specials(text, specials) == _scan(text, specials), (text, specials)


def test_text_without_specials_is_one_piece_however_long():
    text = "digits 0 1 2 3 " * 50_000
    assert chat.split_specials(text, []) == [(text, False)]
    assert chat.split_specials(text, chat.SPECIAL_TOKENS["chatml"]) == [(text, False)]
