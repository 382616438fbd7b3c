"""final_answer's three rules (GSM8K ####, last \\boxed{}, first line) and exact_match's
normalisation (dlmspec/tasks/check.py)."""

import pytest

from dlmspec.tasks.check import exact_match, final_answer, normalise


@pytest.mark.parametrize("text, expected", [
    ("Natalia sold 48/2 = 24 clips.\n48+24 = 72\n#### 72", "72"),
    ("#### 1,234\nmore text", "1,234"),
    ("first #### 1\nthen #### 2<|endoftext|>junk", "2"),
    ("The answer is $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
    ("\\boxed{3} then \\boxed{4}", "4"),
    ("\\fbox{7}", "7"),
    ("so \\boxed 5$ done", "5"),
    (" 1 2 3\n 4 5 6", "1 2 3"),
    ("\n\n  9 9<|endoftext|> 1 1", "9 9"),
    (" 4 2</s>", "4 2"),
])
def test_final_answer_takes_gsm8k_then_boxed_then_first_line(text, expected):
    assert final_answer(text) == expected


@pytest.mark.parametrize("text", ["", "   \n ", "#### \nanswer", "\\boxed{1 + {2}", "<|endoftext|> 5"])
def test_final_answer_is_none_when_nothing_is_answered(text):
    assert final_answer(text) is None


def test_final_answer_refuses_non_text():
    with pytest.raises(TypeError, match="takes a str"):
        final_answer(b"#### 1")  # type: ignore[arg-type]


@pytest.mark.parametrize("raw, expected", [
    ("  1,234,567 ", "1234567"),
    ("$ 18", "18"),
    ("72.", "72"),
    ("1  2\t3", "1 2 3"),
    ("3,1,2", "3,1,2"),
    ("0.5", "0.5"),
])
def test_normalise_strips_spaces_thousands_commas_dollar_and_final_period(raw, expected):
    assert normalise(raw) == expected


@pytest.mark.parametrize("completion, answer, same", [
    (" 1 2 3<|endoftext|>", " 1 2 3", True),
    (" 1 2 3\n 1 2 4", "1 2 3", True),
    (" 1 2 4", "1 2 3", False),
    ("She pays 1,200 dollars.\n#### 1,200", "work\n#### 1200", True),
    ("\\boxed{72}", "72", True),
    ("72.0", "72", False),
    ("123", "1 2 3", False),
    ("", "5", False),
    ("5", "", False),
])
def test_exact_match_compares_normalised_final_answers(completion, answer, same):
    assert exact_match(completion, answer) is same
