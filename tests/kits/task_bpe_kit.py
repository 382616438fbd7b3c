"""Byte-level BPE files in GPT-2's format (``vocab.json``, ``merges.txt``), trained here on CPU in a second,
for tests of ``dlmspec task make --prepare-data`` that must run without the offline data kit (CI):

- :func:`write_task_bpe`: trained on the addition task's text and its ``plain`` chat template, so a
  digit, ``" +"``, ``" ="``, ``"User"`` and ``"Assistant"`` are one token each, as with GPT-2's own
  BPE: an SFT row of 3-digit addition is 21 tokens, within ``task-addition-dlm-sft.toml``'s 24;
- :func:`write_wordy_bpe`: trained on English sentences only, so digits and the template's words
  take several tokens and every SFT row of the task is longer than 24 tokens.
"""

from __future__ import annotations

import random
from pathlib import Path

#: English sentences (no task text) for :func:`write_wordy_bpe`.
SENTENCES = [f"Section {i}. The function parse_{i} reads a file of {i * 7} lines and returns a list of records."
             for i in range(60)]


def _train(folder: Path, texts: list[str], vocab_size: int) -> Path:
    from tokenizers import ByteLevelBPETokenizer

    folder.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=["<|endoftext|>"])
    bpe.save_model(str(folder))
    return folder


def write_task_bpe(folder: Path) -> Path:
    """GPT-2-format BPE files in ``folder`` (created) that tokenize the task as GPT-2 does; returns ``folder``."""
    rng = random.Random(0)
    digits = lambda n: " ".join(str(rng.randrange(10)) for _ in range(n))  # noqa: E731
    rows = [f"User:\n {digits(3)} + {digits(3)} =\n\nAssistant:\n {digits(4)}" for _ in range(60)]
    return _train(folder, [" 0 1 2 3 4 5 6 7 8 9 + =", "User:\n x\n\nAssistant:\n y"] * 20 + rows, 300)


def write_wordy_bpe(folder: Path) -> Path:
    """GPT-2-format BPE files in ``folder`` (created) trained on English only; returns ``folder``."""
    return _train(folder, SENTENCES * 3, 300)
