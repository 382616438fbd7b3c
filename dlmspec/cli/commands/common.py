"""What several commands of ``dlmspec`` share: the help of ``--set`` and ``--python``, a spec as plain
data and TOML (:func:`spec_data`, :func:`spec_toml`), and the output files ``new`` and ``schema``
write (:func:`check_output_file`: never overwrite what a user wrote without ``--force``;
:func:`write_output_file`: written atomically) with the marks that tell those files apart.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from dlmspec.credentials import redact
from dlmspec.errors import SpecError, SpecIssue
from dlmspec.escape import toml_document

if TYPE_CHECKING:
    from dlmspec.spec.models import Spec


_SET_HELP = "Override a key: section.key=value (TOML value; repeatable; applied last)."


_PYTHON_HELP = ("The Python (with torch and megatron-core) launch.sh and launch.sbatch run, e.g. .venv/bin/python "
                "(made absolute; a bare name is looked up on the job's PATH). Default: DLMSPEC_PYTHON at launch "
                "time, else python3. Not part of the spec: the lock file and content hash do not change.")


def spec_data(spec: Spec) -> dict[str, Any]:
    """``spec`` as JSON-ready data with every default filled in and no ``None`` (TOML has no
    null; unset keys are left out, free-form tables such as ``[lock]`` included).

    Raises:
        SpecError: a value of a Python spec that neither JSON nor TOML can hold (e.g. an object
            in ``[lock]``).
    """
    try:
        data = spec.model_dump(mode="json", exclude_none=True)
    except Exception as exc:  # pydantic's serialization error for an arbitrary object
        raise SpecError([SpecIssue("<spec>", f"holds a value that cannot be written out: {exc}",
                                   hint="spec values are numbers, strings, booleans, lists and tables",
                                   rule="spec-value")]) from None
    return _without_none(data)


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value if v is not None]
    return value


def spec_toml(spec: Spec) -> str:
    """``spec`` as a TOML document with every default filled in (it loads back to ``spec``),
    secrets written as ``"<hidden>"`` (:func:`dlmspec.credentials.redact`; such a spec does
    not validate anyway)."""
    return toml_document(redact(spec_data(spec)))


#: The first comment lines of a spec ``dlmspec new`` wrote say so (:func:`starter_spec`).
NEW_SPEC_MARK = ": written by `dlmspec new --preset "


#: The header line of a bundled spec copied by ``dlmspec new --from NAME``.
NEW_FROM_MARK = " dlmspec: written by `dlmspec new --from "


#: The ``$id`` of the schema ``dlmspec schema`` writes (:func:`spec_json_schema`).
SCHEMA_ID = "https://dlmspec.invalid/spec.schema.json"


def _written_by_new(path: Path) -> bool:
    """Whether ``path`` begins with the header comment of :func:`starter_spec` (possibly
    wrapped over several ``#`` lines)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(4096).decode("utf-8", "replace")
    except OSError:
        return False
    lines = []
    for line in head.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(lines)
    return NEW_SPEC_MARK in text or NEW_FROM_MARK.strip() in text


def _written_by_schema(path: Path) -> bool:
    """Whether ``path`` is a JSON schema ``dlmspec schema`` wrote (its ``$id``)."""
    try:
        if path.stat().st_size > 1 << 22:
            return False
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("$id") == SCHEMA_ID


def check_output_file(target: Path, *, force: bool, key: str, command: str,
                      written_by: Callable[[Path], bool]) -> None:
    """Refuse to write ``target`` when it is a symbolic link (never written through), exists and
    is not a regular file, exists without ``force``, or exists and was not written by
    ``command`` (``written_by``): ``--force`` replaces only a file dlmspec wrote.

    Raises:
        SpecError: with ``key`` (the argument or flag), the path and the fix.
    """
    def refuse(message: str, hint: str) -> SpecError:
        return SpecError([SpecIssue(key, message, value=str(target), hint=hint, rule="output-file")])

    if target.is_symlink():
        raise refuse("is a symbolic link; dlmspec does not write through links",
                     f"give the file's own path ({os.path.realpath(target)}), or remove the link")
    if not target.exists():
        return
    if not target.is_file():
        raise refuse("exists and is not a regular file", "choose another file name")
    if not force:
        raise refuse("the file exists and would be overwritten", "pass --force, or choose another file name")
    if not written_by(target):
        raise refuse(f"the file exists and was not written by `dlmspec {command}`: --force replaces only "
                     "a file it wrote", "move it away (or remove it) first, or choose another file name")


def write_output_file(target: Path, text: str, *, key: str) -> None:
    """Write ``text`` to ``target`` atomically (a temporary file beside it, then ``os.replace``:
    a failed write leaves the old file whole), mode ``0666`` less the umask.

    Raises:
        SpecError: the file cannot be written (key ``key``).
    """
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
        tmp = None
    except (OSError, ValueError) as exc:
        raise SpecError([SpecIssue(key, f"cannot write the file: {getattr(exc, 'strerror', None) or exc}",
                                   value=str(target), hint="choose a writable path", rule="output-file")]) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
