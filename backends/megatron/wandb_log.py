"""Weights & Biases logging of the logging rank: the scalars TensorBoard gets, the run's provenance
as config, one W&B run per run directory (a requeued job resumes it).

Megatron-LM's names (``--wandb-project``, ``--wandb-exp-name``, ``--wandb-save-dir``, files under
``<save dir>/wandb``) plus entity, mode and tags. The API key is never passed or written: the
``wandb`` library reads ``WANDB_API_KEY`` (or ``~/.netrc``) itself, and offline mode needs none.
The run's id is kept in ``<save dir>/dlmspec-wandb-id`` and ``wandb.init(id=..., resume="allow")``
continues it after a requeue (W&B ignores steps at or below the last one it holds, so the steps
a resume repeats are not logged twice). :func:`read_offline_run` reads an offline run's
``run-<id>.wandb`` file back with wandb's own record type (tests and ``bench/devbox/gpu/viz_demo.sh``).
"""

from __future__ import annotations

import os
import secrets
import struct
from typing import Any, Dict, List, Optional

from .config import LoggingConfig

#: The file under the W&B save directory that holds the run's id.
RUN_ID_FILE = "dlmspec-wandb-id"
#: ``logging.wandb_mode`` values (``wandb.init(mode=...)``).
WANDB_MODES = ("online", "offline")


def save_dir(config: LoggingConfig) -> str:
    """The W&B save directory: ``wandb_save_dir``, else ``<run_dir>/wandb`` (Megatron-LM's
    default is ``<save>/wandb``)."""
    return config.wandb_save_dir or os.path.join(config.run_dir, "wandb")


def run_id(directory: str) -> str:
    """The W&B run id kept in ``<directory>/dlmspec-wandb-id``, made (16 lowercase hex digits,
    random) and written on first use, so every launch of the run directory logs to one W&B run."""
    path = os.path.join(directory, RUN_ID_FILE)
    from dlmspec.files import FileRefused, read_text, write_atomic

    try:
        found = read_text(path, limit=4096, what="W&B run id file").strip()
        if found and all(c.isalnum() or c in "-_" for c in found):
            return found
    except FileRefused:  # missing, a pipe, a device, huge or not text: a new id replaces it
        pass
    os.makedirs(directory, exist_ok=True)
    new = secrets.token_hex(8)
    write_atomic(path, new + "\n")  # never through a link planted at the file or a temporary name
    return new


class WandbRun:
    """One W&B run of the logging rank (:meth:`start` opens it).

    Args:
        run: The ``wandb`` run object (``wandb.init``'s result).
    """

    def __init__(self, run: Any) -> None:
        self.run = run

    @classmethod
    def start(cls, config: LoggingConfig, *, name: str, config_values: Optional[Dict[str, Any]] = None) -> "WandbRun":
        """``wandb.init`` for ``config``'s project, entity, mode and tags, named ``name``, with
        ``config_values`` as the W&B config, resuming the run id of :func:`run_id`.

        Raises:
            ValueError: ``config.wandb_mode`` is not ``"online"`` or ``"offline"``.
            SystemExit: code 2 with a message when the ``wandb`` library is not installed.
        """
        if config.wandb_mode not in WANDB_MODES:
            raise ValueError(f"logging.wandb_mode must be one of {WANDB_MODES}, got {config.wandb_mode!r}")
        try:
            import wandb  # only a run that logs to W&B needs the library
        except ImportError:
            raise SystemExit("train.py: logging.wandb_project is set but the wandb library is not installed: "
                             "pip install wandb (or remove logging.wandb_project)") from None
        directory = save_dir(config)
        os.makedirs(directory, exist_ok=True)
        run = wandb.init(
            project=config.wandb_project, entity=config.wandb_entity, name=name, dir=directory,
            id=run_id(directory), resume="allow", mode=config.wandb_mode, tags=list(config.wandb_tags) or None,
            settings=wandb.Settings(console="off", silent=True),
        )
        if config_values:  # a resumed run's config changes (iteration, weights): allowed, latest launch wins
            run.config.update(config_values, allow_val_change=True)
        return cls(run)

    def log(self, values: Dict[str, float], step: int) -> None:
        """Log ``values`` (``{"train/loss": ...}``) at ``step`` (the iteration)."""
        if values:
            self.run.log(values, step=step)

    def finish(self) -> None:
        """Close the run (offline: its files are complete once this returns)."""
        self.run.finish()


# --------------------------------------------------------------------------- reading offline runs

#: The ``.wandb`` file's layout (wandb's LevelDB-style log): a 7-byte header, then 32 KiB blocks of
#: records, each ``<crc32c:4><length:2><type:1>`` + data (type 1 full, 2 first, 3 middle, 4 last).
_HEADER, _BLOCK, _RECORD_HEADER = 7, 32768, 7


def read_offline_run(path: str) -> Dict[str, Any]:
    """An offline W&B run file read back with wandb's own record type
    (``wandb.proto.wandb_internal_pb2.Record``).

    Args:
        path: ``run-<id>.wandb`` inside ``offline-run-<time>-<id>/``.

    Returns:
        ``{"run_id", "project", "name", "config": {key: JSON text}, "history": [{key: float, "_step": int}]}``.

    Raises:
        ValueError: The file does not start with W&B's header.
    """
    from wandb.proto import wandb_internal_pb2  # tests and the bench script only

    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(b":W&B"):
        raise ValueError(f"{path} is not a W&B run file (no ':W&B' header)")
    records: List[Any] = []
    pos, pending = _HEADER, b""
    while pos + _RECORD_HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _RECORD_HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + _RECORD_HEADER])
        pos += _RECORD_HEADER
        if kind == 0 and length == 0:  # zero padding up to the block's end
            pos += left - _RECORD_HEADER
            continue
        pending += data[pos:pos + length]
        pos += length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    out: Dict[str, Any] = {"run_id": None, "project": None, "name": None, "config": {}, "history": []}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out.update(run_id=record.run.run_id, project=record.run.project, name=record.run.display_name)
            out["config"].update({item.key: item.value_json for item in record.run.config.update})
        elif kind == "config":
            out["config"].update({item.key: item.value_json for item in record.config.update})
        elif kind == "history":
            row: Dict[str, Any] = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = int(item.value_json) if key == "_step" else _number(item.value_json)
            out["history"].append(row)
    return out


def _number(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text
