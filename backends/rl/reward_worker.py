"""The reward worker process: loads the reward functions and scores one row at a time.

Plain Python (no torch), so that a worker starts in a fraction of a second. The parent
(:class:`dlmspec.backends.rl.rewards.RewardPool`) runs ``python -m dlmspec.backends.rl.reward_worker FD``
(a fresh interpreter, never a fork of a CUDA process) and talks to it over the socket ``FD``
(:class:`multiprocessing.connection.Connection` framing):

- the parent first sends ``("init", [function, ...], base_dir, memory_limit_mb)``; the worker
  caps its address space (``RLIMIT_AS``) when ``memory_limit_mb`` is set, loads the functions
  and answers ``("ready", {function: load error or None})``;
- then, per task ``(task_id, function_index, row)``, it sends ``(task_id, "ok", value)`` or
  ``(task_id, kind, message)`` with ``kind`` ``"raised"`` (the function raised, or could not be
  loaded) or ``"not_a_number"`` (it returned something that is not a finite real number);
- ``None`` stops it.

A function is ``"path/to/file.py:name"`` (the file executed as a module, ``name`` looked up in
it) or ``"builtin:exact_match"`` / ``"builtin:format"`` (:func:`builtin_exact_match`,
:func:`builtin_format`). It is called ``function(prompt, completion, **row)`` with the row's other
fields (``prompt_id``, ``answer``, ...) as keyword arguments.
"""

from __future__ import annotations

import importlib.util
import math
import numbers
import re
import sys
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

#: Longest failure message sent back (characters).
MAX_MESSAGE = 500

BUILTINS = ("exact_match", "format")

_GSM8K_ANSWER = re.compile(r"####[ \t]*\S")
_BOXED = re.compile(r"\\(?:boxed|fbox)\{")


def _closed_box(text: str) -> bool:
    """Whether ``text`` has a ``\\boxed{...}`` (or ``\\fbox{...}``) whose braces close, non-empty."""
    for match in _BOXED.finditer(text):
        depth = 0
        for i in range(match.end() - 1, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    if text[match.end():i].strip():
                        return True
                    break
    return False


def builtin_format(prompt: str, completion: str, **row: Any) -> float:
    """1.0 when ``completion`` states a final answer in a recognised format, else 0.0: a GSM8K
    answer line ``#### <answer>`` (Cobbe et al. 2021, arXiv:2110.14168) or a closed, non-empty
    ``\\boxed{...}`` (MATH, Hendrycks et al. 2021, arXiv:2103.03874), the two formats
    :func:`dlmspec.tasks.check.final_answer` reads first."""
    if not isinstance(completion, str):
        raise TypeError(f"completion is {type(completion).__name__}, not str")
    return 1.0 if _GSM8K_ANSWER.search(completion) or _closed_box(completion) else 0.0


def builtin_exact_match(prompt: str, completion: str, **row: Any) -> float:
    """1.0 when the completion's final answer equals the row's ``answer``
    (:func:`dlmspec.tasks.check.exact_match`), else 0.0.

    Raises:
        KeyError: the row has no ``answer``.
    """
    if "answer" not in row:
        raise KeyError("the prompt row has no 'answer' field; builtin:exact_match compares against it")
    from dlmspec.tasks.check import exact_match

    return 1.0 if exact_match(completion, str(row["answer"])) else 0.0


def load_function(spec: str, base_dir: Optional[str] = None) -> Callable[..., Any]:
    """The callable of ``spec`` (``"file.py:name"`` relative to ``base_dir`` or the working
    directory, or ``"builtin:<name>"``).

    Raises:
        ValueError: a malformed spec, a missing file or name, not callable, or any error raised
            while executing the file (its type and message kept).
    """
    import os

    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"{spec!r} is not 'path/to/file.py:function' or 'builtin:name'")
    if path == "builtin":
        if name not in BUILTINS:
            raise ValueError(f"no builtin reward {name!r}; the builtins are {', '.join(BUILTINS)}")
        return {"exact_match": builtin_exact_match, "format": builtin_format}[name]
    if not path.endswith(".py"):
        raise ValueError(f"{spec!r}: the file must be a .py file")
    if not name.isidentifier():
        raise ValueError(f"{spec!r}: {name!r} is not a Python name")
    full = path if os.path.isabs(path) or base_dir is None else os.path.join(base_dir, path)
    if not os.path.isfile(full):
        raise ValueError(f"{full}: no such file")
    module_name = f"dlmspec_reward_{abs(hash(full))}"
    module_spec = importlib.util.spec_from_file_location(module_name, full)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"{full}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - a user's module may raise anything, SystemExit included
        raise ValueError(f"{full}: executing it raised {type(exc).__name__}: {exc}") from None
    if not hasattr(module, name):
        raise ValueError(f"{full} defines no {name!r}")
    function = getattr(module, name)
    if not callable(function):
        raise ValueError(f"{full}: {name!r} is a {type(function).__name__}, not a function")
    return function


def _short(text: str) -> str:
    text = text.strip().replace("\n", " | ")
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def score_one(function: Callable[..., Any], row: Dict[str, Any]) -> Tuple[str, Any]:
    """``("ok", float)``, ``("raised", message)`` or ``("not_a_number", message)`` for one call."""
    kwargs = {k: v for k, v in row.items() if k not in ("prompt", "completion")}
    try:
        value = function(row.get("prompt"), row.get("completion"), **kwargs)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt from a reward are its failure
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        return "raised", _short(f"{type(exc).__name__}: {exc}{where}")
    if isinstance(value, bool) or (isinstance(value, numbers.Real) and not isinstance(value, complex)):
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError) as exc:
            return "not_a_number", _short(f"returned {type(value).__name__} that float() refuses: {exc}")
        if math.isfinite(number):
            return "ok", number
        return "not_a_number", f"returned {number}, not a finite number"
    try:
        shown = repr(value)
    except BaseException:  # noqa: BLE001 - a broken __repr__
        shown = "<unprintable>"
    return "not_a_number", _short(f"returned {type(value).__name__} {shown}, not a number")


def main(conn: Any) -> None:
    """The worker loop (module docstring)."""
    try:
        tag, functions, base_dir, memory_limit_mb = conn.recv()
    except (EOFError, OSError, TypeError, ValueError):
        return
    if tag != "init":
        return
    if memory_limit_mb:
        import resource

        limit = int(memory_limit_mb) << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    loaded: List[Optional[Callable[..., Any]]] = []
    errors: Dict[str, Optional[str]] = {}
    for spec in functions:
        try:
            loaded.append(load_function(spec, base_dir))
            errors[spec] = None
        except ValueError as exc:
            loaded.append(None)
            errors[spec] = _short(str(exc))
    conn.send(("ready", errors))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        task_id, index, row = task
        function = loaded[index]
        if function is None:
            conn.send((task_id, "raised", f"cannot load {functions[index]}: {errors[functions[index]]}"))
            continue
        kind, value = score_one(function, row)
        conn.send((task_id, kind, value))


if __name__ == "__main__":
    from multiprocessing.connection import Connection

    main(Connection(int(sys.argv[1])))
