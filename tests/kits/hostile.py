"""Hostile checkpoint files for the tests of ``dlmspec.backends.checkpoint_safety``: each holds
a pickle that, unpickled by plain ``pickle`` / ``torch.load(weights_only=False)``, creates a
canary file. The tests check the file is refused and the canary never appears."""

from __future__ import annotations

import builtins
import io
import os
import pickle
from pathlib import Path


class SystemPayload:
    """Reduces to ``os.system("touch CANARY")`` (pickled as ``posix.system``)."""

    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self):
        return (os.system, (f"touch {self.canary}",))


class ExecPayload:
    """Reduces to ``builtins.exec("open(CANARY, 'w').close()")``: a callable writing the canary."""

    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self):
        return (builtins.exec, (f"open({str(self.canary)!r}, 'w').close()",))


def dotted_name_payload(canary: Path) -> bytes:
    """A protocol-4 pickle of ``STACK_GLOBAL("torch.distributed.checkpoint.filesystem", "os.system")``
    called with ``"touch CANARY"``: plain ``pickle`` resolves the dotted name to ``os.system``."""
    def text(s: str) -> bytes:
        b = s.encode()
        return b"\x8c" + bytes([len(b)]) + b  # SHORT_BINUNICODE

    return (b"\x80\x04" + text("torch.distributed.checkpoint.filesystem") + text("os.system") + b"\x93"
            + text(f"touch {canary}") + b"\x85" + b"R" + b".")


def payloads(canary: Path) -> dict[str, bytes]:
    """The ``.metadata`` payloads by name."""
    return {"os.system": pickle.dumps(SystemPayload(canary)), "exec": pickle.dumps(ExecPayload(canary)),
            "dotted-name": dotted_name_payload(canary)}


def torch_saved(obj) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def write_metadata_payload(ckpt: Path, payload: bytes) -> Path:
    (ckpt / ".metadata").write_bytes(payload)
    return ckpt / ".metadata"


def plant_byte_object(ckpt: Path, fqn: str, data: bytes) -> Path:
    """Append ``data`` to the checkpoint's first ``.distcp`` file and point the stored byte
    object ``fqn`` at it (added to the index if the checkpoint has no such object). The index
    is this test's own file, so plain ``pickle`` reads and writes it here."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    with open(ckpt / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    target = sorted(ckpt.glob("*.distcp"))[0]
    offset = target.stat().st_size
    with open(target, "ab") as f:
        f.write(data)
    info = _StorageInfo(relative_path=target.name, offset=offset, length=len(data))
    indexes = [i for i in metadata.storage_data if i.fqn == fqn]
    if not indexes:
        metadata.state_dict_metadata[fqn] = BytesStorageMetadata()
        indexes = [MetadataIndex(fqn)]
    for index in indexes:
        metadata.storage_data[index] = info
    with open(ckpt / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    return target


def write_common_payload(ckpt: Path, canary: Path) -> Path:
    """``common.pt`` holding ``{"iteration": <os.system payload>}``."""
    (ckpt / "common.pt").write_bytes(torch_saved({"iteration": SystemPayload(canary)}))
    return ckpt / "common.pt"
