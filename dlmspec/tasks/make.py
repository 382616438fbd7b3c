"""Generated verifiable tasks: prompts with exact answers, split into train / validation / held-out
test, deterministic from a seed, and the training data the pipeline reads.

Tasks (:data:`TASKS`):

- ``addition`` (the default): ``a + b`` of two non-negative integers of at most ``digits``
  digits, each drawn uniformly from ``[0, 10**digits)``. Prompt ``" 4 0 7 + 1 9 5 ="``, answer
  ``" 6 0 2"``.
- ``addition-padded``: the same sums written at fixed width: each operand zero-padded to
  ``digits`` digits and the sum to ``digits + 1`` (prompt ``" 0 0 7 + 1 9 5 ="``, answer
  ``" 0 2 0 2"``), so every digit of a place sits at the same offset in every example. Zero
  padding is what lets small transformers learn addition from few examples (Lee et al. 2023,
  "Teaching Arithmetic to Small Transformers", arXiv:2307.03381, sec. 4: the "plain" format
  with zero-padded operands and output); with variable-width numbers the model must first
  find each digit's place from the lengths. The easier variant of ``addition``.
- ``sorting``: a list of ``length`` digits drawn uniformly from ``0 .. max_value``, sorted
  ascending. Prompt ``" sort 5 3 9 3 ="``, answer ``" 3 3 5 9"``.

Every digit is written after a space, so with GPT-2's BPE (the demo's tokenizer) every digit is one
token (``" 3"``); the same holds for ``" +"``, ``" ="`` and ``" sort"``. An answer is one line:
:func:`dlmspec.tasks.check.final_answer` takes a completion's text up to its first newline or
end-of-sequence token, and :func:`dlmspec.tasks.check.exact_match` is the checker.

Determinism: one :class:`random.Random` seeded with ``seed`` (Python's Mersenne Twister and
``randrange``, stable across CPython versions for integer arguments) draws distinct prompts, the
held-out test split first, then validation, then train: the splits are disjoint, and the test set
of a seed does not change when ``--train`` or ``--valid`` does. Files are written with sorted keys
and ``\\n`` line ends: the same arguments give byte-identical files.

Plain Python: no torch import.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Tuple

__all__ = ["TASKS", "Task", "TaskOptionError", "SPLITS", "make_splits", "task_files", "space_digits", "plain_prompt"]

#: The splits, in the order they are drawn (the held-out test first).
SPLITS = ("test", "validation", "train")


class TaskOptionError(ValueError):
    """An option of a task that cannot work: ``option`` (the flag), ``value``, ``why``, ``fix``."""

    def __init__(self, option: str, value: Any, why: str, fix: str) -> None:
        self.option, self.value, self.why, self.fix = option, value, why, fix
        super().__init__(f"{option} = {value!r}: {why}. Fix: {fix}")


def space_digits(number: int, width: int = 0) -> str:
    """``407`` -> ``" 4 0 7"``: each digit after a space (one GPT-2 token each); zero-padded on
    the left to ``width`` digits (``space_digits(7, 3)`` -> ``" 0 0 7"``)."""
    return "".join(" " + d for d in str(number).zfill(width))


@dataclass(frozen=True)
class Task:
    """A task: its ``name``, ``help``, its difficulty options (name -> (default, help, lowest,
    highest)), ``draw(rng, options) -> (key, prompt, answer)`` and ``count(options)``, the number
    of distinct prompts (an upper bound on the rows that can be drawn)."""

    name: str
    help: str
    options: Dict[str, Tuple[int, str, int, int]]
    draw: Callable[[random.Random, Dict[str, int]], Tuple[str, str, str]]
    count: Callable[[Dict[str, int]], int]


def _draw_addition(rng: random.Random, opts: Dict[str, int]) -> Tuple[str, str, str]:
    top = 10 ** opts["digits"]
    a, b = rng.randrange(top), rng.randrange(top)
    prompt = f"{space_digits(a)} +{space_digits(b)} ="
    return prompt, prompt, space_digits(a + b)


def _draw_addition_padded(rng: random.Random, opts: Dict[str, int]) -> Tuple[str, str, str]:
    width = opts["digits"]
    top = 10 ** width
    a, b = rng.randrange(top), rng.randrange(top)
    prompt = f"{space_digits(a, width)} +{space_digits(b, width)} ="
    return prompt, prompt, space_digits(a + b, width + 1)


def _draw_sorting(rng: random.Random, opts: Dict[str, int]) -> Tuple[str, str, str]:
    values = [rng.randrange(opts["max_value"] + 1) for _ in range(opts["length"])]
    prompt = " sort" + "".join(f" {v}" for v in values) + " ="
    return prompt, prompt, "".join(f" {v}" for v in sorted(values))


#: The tasks by name. Difficulty defaults: see docs/tasks.md ("Difficulty").
TASKS: Dict[str, Task] = {
    "addition": Task(
        "addition", "a + b, each of at most --digits digits",
        {"digits": (5, "digits of each operand (the sum has at most one more)", 1, 18)},
        _draw_addition, lambda o: (10 ** o["digits"]) ** 2),
    "addition-padded": Task(
        "addition-padded", "a + b at fixed width: operands zero-padded to --digits digits, the sum to --digits + 1",
        {"digits": (3, "digits of each operand, zero-padded (the sum has one more)", 1, 18)},
        _draw_addition_padded, lambda o: (10 ** o["digits"]) ** 2),
    "sorting": Task(
        "sorting", "sort a list of --length digits 0 .. --max-value ascending",
        {"length": (10, "how many numbers the list holds", 2, 64),
         "max_value": (9, "largest value (single digits: at most 9)", 1, 9)},
        _draw_sorting, lambda o: (o["max_value"] + 1) ** o["length"]),
}


def resolve_options(task: Task, given: Dict[str, Any]) -> Dict[str, int]:
    """``task``'s options: ``given`` values (``None``: the default) checked against their range.

    Raises:
        TaskOptionError: an option ``task`` does not have, or a value out of range.
    """
    out: Dict[str, int] = {}
    for key, value in given.items():
        if value is not None and key not in task.options:
            known = ", ".join("--" + k.replace("_", "-") for k in task.options)
            raise TaskOptionError("--" + key.replace("_", "-"), value, f"task {task.name!r} has no such option",
                                  f"leave it out; {task.name}'s options: {known}")
    for key, (default, _, low, high) in task.options.items():
        value = given.get(key)
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise TaskOptionError("--" + key.replace("_", "-"), value, f"out of range {low} .. {high}",
                                  f"--{key.replace('_', '-')} {default}")
        out[key] = value
    return out


def make_splits(task: Task, options: Dict[str, int], seed: int, counts: Dict[str, int]
                ) -> Dict[str, List[Dict[str, str]]]:
    """Rows ``{"id", "prompt", "answer"}`` of each split in :data:`SPLITS`, distinct prompts across
    all splits, drawn from ``random.Random(seed)`` test first (module docstring).

    Raises:
        TaskOptionError: more rows asked than ``task`` has distinct prompts (with a 2x margin, so the
            rejection sampling ends quickly), or a negative count.
    """
    for split in SPLITS:
        if counts[split] < 0:
            flag = {"validation": "--valid"}.get(split, "--" + split)
            raise TaskOptionError(flag, counts[split], "a negative count", f"{flag} 1000")
    total = sum(counts.values())
    space = task.count(options)
    if 2 * total > space:
        raise TaskOptionError("--train", counts["train"], f"{total:,} rows asked, and task {task.name!r} with "
                              f"{options} has {space:,} distinct prompts (at most half can be drawn)",
                              "fewer rows, or a harder setting (more digits / a longer list)")
    rng = random.Random(seed)
    seen: set[str] = set()
    out: Dict[str, List[Dict[str, str]]] = {}
    for split in SPLITS:
        rows: List[Dict[str, str]] = []
        while len(rows) < counts[split]:
            key, prompt, answer = task.draw(rng, options)
            if key in seen:
                continue
            seen.add(key)
            rows.append({"id": f"{task.name}-{split}-{len(rows):06d}", "prompt": prompt, "answer": answer})
        out[split] = rows
    return out


#: The chat template of the rendered prompt files (``test-plain.jsonl``): the SFT stage's.
PLAIN = "plain"


def plain_prompt(prompt: str) -> str:
    """``prompt`` as one user turn of the ``plain`` chat template with the assistant's turn opened
    (``" 1 + 2 ="`` -> ``"User:\\n 1 + 2 =\\n\\nAssistant:\\n"``): what the SFT stage trains on before
    an answer, and what the RL stage renders from ``stage.rl.chat_template = "plain"``."""
    from dlmspec.data.chat import render, text_of

    return text_of(render(PLAIN, [{"role": "user", "content": prompt}], add_generation_prompt=True))


def _jsonl(rows: Iterator[Dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows).encode()


def task_files(task: Task, options: Dict[str, int], seed: int, counts: Dict[str, int]) -> Dict[str, bytes]:
    """File name -> bytes of everything ``dlmspec task make`` writes (deterministic):

    - ``train.jsonl``, ``validation.jsonl``, ``test.jsonl``: ``{"id", "prompt", "answer"}``
      a line: the prompts of generation evaluation (``[eval.generation] prompts``,
      ``dlmspec eval --task``) and of RL;
    - ``pretrain-train.jsonl``, ``pretrain-validation.jsonl``: ``{"text": prompt + answer}`` for
      ``dlmspec data prepare --input ... --append-eod`` (the end-of-document token ends each
      answer);
    - ``sft-train.jsonl``, ``sft-validation.jsonl``: ``{"prompt", "response"}`` for
      ``dlmspec data prepare --sft`` (docs/sft-data.md);
    - ``validation-plain.jsonl``, ``test-plain.jsonl``: the rows of ``validation.jsonl`` and
      ``test.jsonl`` with each prompt rendered as one user turn of the ``plain`` chat template with
      the assistant's turn opened (``"User:\\n 4 0 7 + 1 9 5 =\\n\\nAssistant:\\n"``,
      :func:`dlmspec.data.chat.render`): the prompts of a model tuned with that template (the SFT
      stage of ``specs/task-addition-dlm-sft.toml``, and the RL stage from it), for
      ``[eval.generation] prompts`` and ``dlmspec eval --task``, which take prompts as written;
    - ``task.json``: the task, options, seed, counts and each file's SHA-256.
    """
    splits = make_splits(task, options, seed, counts)
    files: Dict[str, bytes] = {}
    for split in SPLITS:
        files[f"{split}.jsonl"] = _jsonl(iter(splits[split]))
    for split in ("train", "validation"):
        files[f"pretrain-{split}.jsonl"] = _jsonl({"text": r["prompt"] + r["answer"]} for r in splits[split])
        files[f"sft-{split}.jsonl"] = _jsonl({"prompt": r["prompt"], "response": r["answer"]} for r in splits[split])
    for split in ("validation", "test"):
        files[f"{split}-{PLAIN}.jsonl"] = _jsonl({**r, "prompt": plain_prompt(r["prompt"])} for r in splits[split])
    record = {"kind": "dlmspec-task", "version": 1, "task": task.name, "options": options, "seed": seed,
              "counts": {s: counts[s] for s in SPLITS}, "checker": "exact_match",
              "files": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())}}
    files["task.json"] = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
    return files
