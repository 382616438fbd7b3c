"""The one schema of a benchmark result file, and the one function that writes it.

Every suite launcher (``bench/<suite>/run.py``) writes its result through :func:`write_result` to
``bench/results/<suite>/<date>-<gpu>-<name>.json`` (or the same name under ``--out``). A result is a
JSON object (:class:`Result`)::

    {
      "schema": "dlmspec-bench/1",           # SCHEMA_VERSION
      "suite": "throughput",                 # one of SUITES
      "name": "qwen3-1.7b-bf16",             # what was measured, [a-z0-9._-]
      "date": "2026-12-06",                  # ISO date of the run (UTC)
      "command": ["python", "bench/throughput/run.py", "..."],   # argv that reproduces it
      "versions": {"python": "3.12.3", "torch": "2.11.0", "dlmspec": "0.1.0", ...},   # str or null
      "hardware": {"gpu": "h200", "gpu_name": "NVIDIA H200", "gpu_count": 1, "host": "...", ...},
      "values": {...},                        # the suite's measurements (any JSON object)
      "status": "ok"                          # ok | partial | failed | dry
    }

``hardware.gpu`` is the lower-case GPU family of the file name (``h100``, ``h200``, ``cpu`` without a
GPU). :func:`validate` raises :class:`ResultInvalid` naming the key, the value and why; writing goes
through :func:`dlmspec.files.write_atomic` and never overwrites an existing file (a ``-2``, ``-3``...
suffix is added).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = "dlmspec-bench/1"
#: The suites and what each measures (bench/README.md lists their commands).
SUITES = {
    "throughput": "training tokens/s and MFU of dlmspec against Hugging Face peers, one model, one GPU count",
    "calibration": "measured peak memory and step time of the planner's calibration configurations",
    "sampling": "generation tokens/s of dlmspec generate against a LLaDA-style Hugging Face loop",
    "data": "dlmspec data prepare: tokens/s and peak memory on CPU",
    "demos": "the stage demos end to end: pre-training + resume, SFT",
    "scaling": "a scaling study trained and evaluated end to end: isoFLOP and data-constrained runs, their losses",
}
STATUSES = ("ok", "partial", "failed", "dry")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,79}$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
#: JSON Schema (draft 2020-12) of a result file, for tools outside Python; :func:`validate` checks
#: the same rules (and is what the launchers run).
JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "dlmspec benchmark result",
    "type": "object",
    "required": ["schema", "suite", "name", "date", "command", "versions", "hardware", "values", "status"],
    "additionalProperties": False,
    "properties": {
        "schema": {"const": SCHEMA_VERSION},
        "suite": {"enum": sorted(SUITES)},
        "name": {"type": "string", "pattern": _NAME.pattern},
        "date": {"type": "string", "pattern": _DATE.pattern},
        "command": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        "versions": {"type": "object", "required": ["python", "dlmspec"],
                     "additionalProperties": {"type": ["string", "null"]}},
        "hardware": {"type": "object", "required": ["gpu", "gpu_count"],
                     "properties": {"gpu": {"type": "string", "pattern": "^[a-z0-9_-]+$"},
                                    "gpu_count": {"type": "integer", "minimum": 0}}},
        "values": {"type": "object"},
        "status": {"enum": list(STATUSES)},
        "notes": {"type": "string"},
    },
}


class ResultInvalid(ValueError):
    """A result that breaks the schema: ``key``, ``value`` and ``why``."""

    def __init__(self, key: str, value: Any, why: str) -> None:
        self.key, self.value, self.why = key, value, why
        super().__init__(f"result key {key!r} = {value!r}: {why}")


def utc_today() -> str:
    """Today's date in UTC, ``YYYY-MM-DD``: the ``date`` of a result and of its file name."""
    return _dt.datetime.now(_dt.timezone.utc).date().isoformat()


@dataclass
class Result:
    """One benchmark result (see the module docstring for the meaning of each field)."""

    suite: str
    name: str
    command: list[str]
    versions: dict[str, str | None]
    hardware: dict[str, Any]
    values: dict[str, Any]
    status: str = "ok"
    date: str = field(default_factory=utc_today)
    notes: str = ""
    schema: str = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not data["notes"]:
            del data["notes"]
        return data


def validate(data: Any) -> dict[str, Any]:
    """Check ``data`` (a parsed result file) against :data:`JSON_SCHEMA`; returns it, raises
    :class:`ResultInvalid` at the first broken rule."""
    if not isinstance(data, dict):
        raise ResultInvalid("<root>", type(data).__name__, "a result is a JSON object")
    allowed = set(JSON_SCHEMA["properties"])
    for key in JSON_SCHEMA["required"]:
        if key not in data:
            raise ResultInvalid(key, None, "missing")
    for key in data:
        if key not in allowed:
            raise ResultInvalid(key, data[key], f"unknown key (allowed: {', '.join(sorted(allowed))})")
    if data["schema"] != SCHEMA_VERSION:
        raise ResultInvalid("schema", data["schema"], f"this reader knows {SCHEMA_VERSION!r}")
    if data["suite"] not in SUITES:
        raise ResultInvalid("suite", data["suite"], f"one of {', '.join(sorted(SUITES))}")
    if not isinstance(data["name"], str) or not _NAME.match(data["name"]):
        raise ResultInvalid("name", data["name"], "lower-case letters, digits, '.', '_', '-' (at most 80)")
    if not isinstance(data["date"], str) or not _DATE.match(data["date"]):
        raise ResultInvalid("date", data["date"], "an ISO date YYYY-MM-DD")
    try:
        _dt.date.fromisoformat(data["date"])
    except ValueError:
        raise ResultInvalid("date", data["date"], "not a calendar date") from None
    cmd = data["command"]
    if not isinstance(cmd, list) or not cmd or not all(isinstance(a, str) for a in cmd):
        raise ResultInvalid("command", cmd, "a non-empty list of strings (the argv that reproduces the result)")
    versions = data["versions"]
    if not isinstance(versions, dict) or not all(isinstance(v, (str, type(None))) for v in versions.values()):
        raise ResultInvalid("versions", versions, "an object of package -> version string (or null)")
    for key in ("python", "dlmspec"):
        if key not in versions:
            raise ResultInvalid(f"versions.{key}", None, "missing")
    hw = data["hardware"]
    if not isinstance(hw, dict):
        raise ResultInvalid("hardware", hw, "an object")
    if not isinstance(hw.get("gpu"), str) or not re.match(r"^[a-z0-9_-]+$", hw["gpu"]):
        raise ResultInvalid("hardware.gpu", hw.get("gpu"), "the lower-case GPU family (h100, h200, cpu)")
    if not isinstance(hw.get("gpu_count"), int) or isinstance(hw.get("gpu_count"), bool) or hw["gpu_count"] < 0:
        raise ResultInvalid("hardware.gpu_count", hw.get("gpu_count"), "an integer >= 0")
    if not isinstance(data["values"], dict):
        raise ResultInvalid("values", data["values"], "an object")
    if data["status"] not in STATUSES:
        raise ResultInvalid("status", data["status"], f"one of {', '.join(STATUSES)}")
    if "notes" in data and not isinstance(data["notes"], str):
        raise ResultInvalid("notes", data["notes"], "a string")
    try:
        json.dumps(data, allow_nan=False)
    except ValueError as exc:
        raise ResultInvalid("values", "NaN/Infinity", f"not JSON ({exc}); write null") from None
    return data


def result_path(root: Path, suite: str, date: str, gpu: str, name: str) -> Path:
    """``root/<suite>/<date>-<gpu>-<name>.json`` (``root`` is ``bench/results`` or ``--out``)."""
    return Path(root) / suite / f"{date}-{gpu}-{name}.json"


def write_result(result: Result, root: Path) -> Path:
    """Validate ``result`` and write it under ``root`` (:func:`result_path`), never over an existing
    file (``-2``, ``-3``, ... before ``.json``). Returns the path written."""
    from dlmspec.files import write_atomic

    data = validate(result.to_dict())
    path = result_path(root, result.suite, result.date, result.hardware["gpu"], result.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    stem, n = path.stem, 2
    while path.exists() or path.is_symlink():
        path = path.with_name(f"{stem}-{n}.json")
        n += 1
    write_atomic(path, json.dumps(data, indent=1, allow_nan=False) + "\n")
    return path


def read_result(path: Path) -> dict[str, Any]:
    """A result file, read through :mod:`dlmspec.files` and validated."""
    from dlmspec.files import read_json

    return validate(read_json(path))
