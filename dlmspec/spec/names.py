"""The ``{name}`` placeholder of the run's paths: ``save = "runs/{name}/checkpoints"`` follows the
spec's ``name``, so a spec that ``extends`` another and renames its run gets folders of its own.

The keys of :data:`NAME_KEYS` (the run's paths and the names whose default is the run's name) may
hold ``{name}``; ``{{`` and ``}}`` stand for literal braces, as in Python's ``str.format``. Any
other brace is an error (the loader's ``name-placeholder`` rule, :func:`placeholder_problems`
with a fix that loads).

Expansion happens in one place: :func:`expand_names`, which ``Spec``'s ``mode="before"`` validator
(:mod:`dlmspec.spec.models`) and its pydantic-free twin (:mod:`dlmspec.spec.fast`) call on the
merged spec data, after ``extends`` and ``--set``. Every :class:`~dlmspec.spec.models.Spec`
therefore holds the expanded paths: the rules, the planner, the compiled train.py, launch.sh,
launch.sbatch and spec.lock.toml, and the runtime read them as if they had been written out.
spec.lock.toml records the expanded path (so a spec moved from ``runs/my-run/checkpoints`` to
``runs/{name}/checkpoints`` keeps its content hash, and the lock compiles to the same files
whatever extends it); :attr:`~dlmspec.spec.load.LoadedSpec.raw` keeps what was written. A
Python spec's ``Spec(...)`` objects are expanded when built, but each keeps the templates it was
built with (:func:`dlmspec.spec.python.templates_of`) and the loader hands the templates back
(:func:`dlmspec.spec.python.spec_data`), so ``replace(name=...)``, a sweep member's name and a
later ``--set name=...`` move its paths as they do a TOML spec's. The runtime's resume check
(``dlmspec.backends.megatron.spec_record.check_resume``) still refuses to continue another
name's checkpoints.

Imports neither pydantic nor the models (the fast loader uses it).
"""

from __future__ import annotations

import re
from typing import Any, Iterator

#: ``Spec.name``'s default (:class:`dlmspec.spec.models.Spec`).
DEFAULT_NAME = "dlmspec-run"

#: The placeholder.
PLACEHOLDER = "{name}"

#: Spec keys that may hold ``{name}``: the checkpoint folders, the run and TensorBoard
#: directories, and the names whose default is the run's name (wandb's run name, SLURM's job name).
NAME_KEYS: tuple[str, ...] = (
    "checkpoint.save",
    "checkpoint.load",
    "logging.run_dir",
    "logging.tensorboard_dir",
    "logging.wandb_exp_name",
    "logging.wandb_save_dir",
    "cluster.slurm.job_name",
)

#: What a value is read as: doubled braces, a ``{...}`` field, or a lone brace.
_TOKEN = re.compile(r"\{\{|\}\}|\{[^{}]*\}|[{}]")


class PlaceholderError(ValueError):
    """A value of :data:`NAME_KEYS` holds a brace that is neither ``{name}`` nor doubled."""


def expand(text: str, name: str) -> str:
    """``text`` with ``{name}`` replaced by ``name`` and ``{{``/``}}`` by ``{``/``}``.

    Raises:
        PlaceholderError: another ``{...}`` or a lone brace.
    """
    def one(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == PLACEHOLDER:
            return name
        if token in ("{{", "}}"):
            return token[0]
        raise PlaceholderError(token)

    return _TOKEN.sub(one, text)


def has_placeholder(text: str) -> bool:
    """Whether ``text`` holds ``{name}`` (not a literal ``{{name}}``)."""
    return PLACEHOLDER in _TOKEN.findall(text)


def bad_tokens(text: str) -> list[str]:
    """The braces of ``text`` that :func:`expand` refuses, in order."""
    return [t for t in _TOKEN.findall(text) if t not in (PLACEHOLDER, "{{", "}}")]


def suggest(text: str) -> str:
    """``text`` made valid: every other ``{...}`` becomes ``{name}`` (the one placeholder), except
    after ``$`` (a shell variable, kept as literal braces); a lone brace is doubled (a literal
    brace)."""
    def one(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in (PLACEHOLDER, "{{", "}}"):
            return token
        if len(token) == 1 or text[max(0, match.start() - 1):match.start()] == "$":
            return token.replace("{", "{{").replace("}", "}}")
        return PLACEHOLDER

    return _TOKEN.sub(one, text)


def _get(node: Any, part: str) -> Any:
    """``node[part]`` of a dict, or ``node.part`` of a model instance (a Python spec's tables)."""
    if isinstance(node, dict):
        return node.get(part)
    if hasattr(node, "model_fields_set"):
        return getattr(node, part, None)
    return None


def _values(data: Any) -> Iterator[tuple[str, str]]:
    """``(key, value)`` of each key of :data:`NAME_KEYS` that ``data`` holds as a string."""
    for key in NAME_KEYS:
        node = data
        for part in key.split("."):
            node = _get(node, part)
        if isinstance(node, str):
            yield key, node


def placeholder_problems(data: Any) -> list[tuple[str, str, str]]:
    """``(key, value, a value that loads)`` for each key of :data:`NAME_KEYS` in the spec data
    ``data`` that :func:`expand` refuses."""
    return [(key, value, suggest(value)) for key, value in _values(data) if bad_tokens(value)]


def _with(node: Any, parts: list[str], value: str) -> Any:
    """A copy of ``node`` (dicts and model instances) with ``value`` at ``parts``."""
    head, rest = parts[0], parts[1:]
    new = value if not rest else _with(_get(node, head), rest, value)
    if isinstance(node, dict):
        return {**node, head: new}
    return node.model_copy(update={head: new})


def expand_names(data: Any) -> Any:
    """The spec data ``data`` (a dict of tables: dicts, or model instances in a Python spec)
    with :data:`NAME_KEYS` expanded for its ``name`` (default :data:`DEFAULT_NAME`). ``data``
    is not changed; a copy is returned when anything expands. Data that is not a dict, or whose
    name is not a string, is returned as it is (the schema reports it).

    Raises:
        PlaceholderError: a value :func:`expand` refuses (its message names the key).
    """
    if not isinstance(data, dict):
        return data
    name = data.get("name", DEFAULT_NAME)
    if not isinstance(name, str):
        return data
    for key, value in list(_values(data)):
        try:
            expanded = expand(value, name)
        except PlaceholderError as exc:
            raise PlaceholderError(f"{key}: {exc}") from None
        if expanded != value:
            data = _with(data, key.split("."), expanded)
    return data


def problem_message(value: str) -> str:
    """Why :func:`expand` refuses ``value`` (for the issue's message)."""
    shown = ", ".join(repr(t) for t in dict.fromkeys(bad_tokens(value)))
    shell = " (dlmspec does not expand environment variables: the job gets the text as written)" if "${" in value else ""
    return (f"holds {shown}: the one placeholder of a run's paths is {PLACEHOLDER} (the spec's name, after "
            f"extends and --set); write {{{{ and }}}} for literal braces{shell}")


def problem_hint(key: str, value: str) -> str:
    """The fix of a refused ``value`` at ``key``: the value :func:`suggest` gives, as TOML."""
    fixed = suggest(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'set {key} = "{fixed}"'
