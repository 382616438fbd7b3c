"""Scoring a completion against a reference answer: :func:`final_answer` and :func:`exact_match`.

Plain Python (no torch), used by the generation-accuracy evaluation, ``dlmspec eval --task``
and the RL stage's exact-match reward.

The final answer of a text is, in this order:

1. GSM8K's answer line: the text after the last ``####`` up to the end of that line
   (GSM8K, Cobbe et al. 2021, arXiv:2110.14168, section 2: every reference solution ends with
   ``#### <number>``; lm-evaluation-harness ``lm_eval/tasks/gsm8k/gsm8k.yaml`` scores the
   "strict-match" filter on the same ``#### `` marker);
2. the contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced
   (MATH, Hendrycks et al. 2021, arXiv:2103.03874: ``last_boxed_only_string`` and
   ``remove_boxed`` of github:hendrycks/math ``modeling/math_equivalence.py`` / ``dataset/util.py``);
   an unclosed box gives ``None``;
3. otherwise the text up to its first newline or end-of-sequence marker (``<|endoftext|>``,
   ``</s>``, ``<|eot_id|>``, ``<|im_end|>``, ``<|end_of_text|>``, ``<eos>``), leading
   whitespace skipped: the answer format of dlmspec's generated tasks (``dlmspec task make``),
   which end each answer with a newline or EOS.

An empty result is ``None``.

:func:`exact_match` compares the two final answers after :func:`normalise`: surrounding
whitespace stripped, runs of whitespace made one space, thousands commas inside numbers removed
(``1,234`` -> ``1234``), a leading ``$`` and a trailing ``.`` removed (lm-evaluation-harness
gsm8k.yaml ``regexes_to_ignore``: ``","``, ``"\\$"``, ``"\\.$"``). Nothing else is forgiven:
``72`` and ``72.0`` differ, ``1 2 3`` and ``123`` differ.
"""

from __future__ import annotations

import re
from typing import Optional

__all__ = ["EOS_MARKERS", "final_answer", "normalise", "exact_match"]

#: End-of-sequence texts the first-line rule stops at (GPT-2/Llama-2/Llama-3/Qwen/Gemma).
EOS_MARKERS = ("<|endoftext|>", "</s>", "<|eot_id|>", "<|im_end|>", "<|end_of_text|>", "<eos>")

_GSM8K_MARK = "####"
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")
_SPACES = re.compile(r"\s+")


def _last_boxed(text: str) -> Optional[str]:
    """Contents of the last ``\\boxed{...}``/``\\fbox{...}`` of ``text``; ``""`` for an unclosed
    box; ``None`` when there is no box. Also ``\\boxed 5`` (MATH's ``\\boxed `` form: up to the
    next ``$`` or end of text)."""
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = text[start + len(cmd):]
    if rest.startswith(" "):
        return rest[1:].split("$", 1)[0]
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return ""


def final_answer(text: str) -> Optional[str]:
    """The final answer of ``text`` (a completion or a reference answer), or ``None``.

    Rules and their sources: the module docstring (``####`` line, then last ``\\boxed{}``, then
    the first line up to an end-of-sequence marker). The result is stripped, not normalised
    (:func:`normalise` does that).

    Raises:
        TypeError: ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"final_answer takes a str, got {type(text).__name__}")
    found: Optional[str]
    mark = text.rfind(_GSM8K_MARK)
    if mark >= 0:
        found = text[mark + len(_GSM8K_MARK):].split("\n", 1)[0]
        for eos in EOS_MARKERS:
            found = found.split(eos, 1)[0]
    else:
        found = _last_boxed(text)
        if found is None:
            found = text.lstrip()
            for eos in EOS_MARKERS:
                found = found.split(eos, 1)[0]
            found = found.split("\n", 1)[0]
    found = found.strip()
    return found or None


def normalise(answer: str) -> str:
    """``answer`` stripped, whitespace runs made one space, thousands commas in numbers removed,
    a leading ``$`` and trailing ``.`` removed (module docstring: lm-evaluation-harness gsm8k)."""
    out = _SPACES.sub(" ", answer.strip())
    out = _THOUSANDS.sub("", out)
    if out.startswith("$"):
        out = out[1:].lstrip()
    if out.endswith("."):
        out = out[:-1].rstrip()
    return out


def exact_match(completion: str, answer: str) -> bool:
    """Whether ``completion``'s final answer equals ``answer``'s, both :func:`normalise` d.

    ``answer`` goes through :func:`final_answer` too, so a GSM8K reference solution (ending
    ``#### 72``) and a bare ``72`` both work. A completion without a final answer never matches.

    Raises:
        TypeError: either argument is not a ``str``.
    """
    got = final_answer(completion)
    want = final_answer(answer)
    if got is None or want is None:
        return False
    return normalise(got) == normalise(want)
