"""A member that fails keeps, beside its log's last lines (torchrun's summary, which names no
cause), the first line that names the error: bench/scaling/run.py ``first_error``."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_scaling_run_first_error", ROOT / "bench" / "scaling" / "run.py")
scaling_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scaling_run)

TORCHRUN_LOG = """\
/site/megatron/core/optimizer/__init__.py:24: UserWarning: Transformer Engine and Apex are not installed. Falling back to Torch optimizers.
  warnings.warn(
[rank0]: Traceback (most recent call last):
[rank0]:   File "train.py", line 40, in <module>
[rank0]:     val = val.float()
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.28 GiB. GPU 0 has a total capacity of 79.18 GiB
E1206 15:20:45 torch/distributed/elastic/multiprocessing/api.py: failed (exitcode: 1)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
"""


def test_the_first_error_line_is_the_exception_not_torchruns_summary() -> None:
    got = scaling_run.first_error(TORCHRUN_LOG.splitlines())
    assert got.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.28 GiB")


def test_a_log_without_an_error_line_names_none() -> None:
    lines = [l for l in TORCHRUN_LOG.splitlines() if "OutOfMemoryError" not in l]
    assert scaling_run.first_error(lines) is None
    assert scaling_run.first_error([]) is None
