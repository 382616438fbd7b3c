"""Build the tiny checkpoints the hostile corpus copies into its cases (run once per corpus, in
its own process: it imports torch and megatron-core and starts a one-process gloo world on CPU).

``python tests/hostile/build_checkpoints.py OUT``

Writes:

* ``OUT/run``: a runtime run (``run/checkpoints/iter_0000010/`` with ``.metadata``,
  ``*.distcp``, ``common.pt``, ``dlmspec.json``, ``spec.lock.toml``; ``run/checkpoints/latest``):
  tests/kits/tiny_ckpt.py's one-layer masked-diffusion GPTModel, saved by the runtime's own
  ``save_checkpoint``;
* ``OUT/hf``: a tiny Llama Hugging Face checkpoint (``dlmspec.backends.convert.tiny``) and
  ``OUT/mcore`` its ``dlmspec convert hf-to-mcore`` conversion;
* ``OUT/evil_common.pt`` and ``OUT/evil.distcp``: ``torch.save`` files whose unpickling runs
  the canary payload of :mod:`hostile_data` (for the ``pickle`` class).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "kits")]


class _Factory:
    """The one method of pytest's ``tmp_path_factory`` that ``megatron_cpu_world`` calls."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def mktemp(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def main(out: Path) -> None:
    import pytest
    import torch

    from cpu_world_kit import megatron_cpu_world
    from hostile_data import _Payload
    from tiny_ckpt import LOCK_TEXT, write_runtime_checkpoint

    from dlmspec.backends.convert import hf_to_mcore
    from dlmspec.backends.convert.tiny import make_tiny_hf

    out.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(_Factory(out / "_world"), mp):
        write_runtime_checkpoint(out / "run", "mdm", seed=0, lock_text=LOCK_TEXT)
    make_tiny_hf("llama", out / "hf")
    hf_to_mcore(out / "hf", out / "mcore")
    torch.save({"payload": _Payload()}, out / "evil_common.pt")
    torch.save(_Payload(), out / "evil.distcp")
    (out / "DONE").write_text("ok\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    sys.stdout.flush()
    import multiprocessing
    import os

    for child in multiprocessing.active_children():  # megatron-core's checkpoint writer
        child.kill()

    os._exit(0)  # megatron-core's writer processes and gloo: no slow teardown
