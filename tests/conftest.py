"""Shared fixtures."""

from __future__ import annotations

import os

# One OpenMP thread a process, for the test processes and every process they start, unless set:
# under ``-n auto`` each core runs a worker, and torch's default of a thread per core
# oversubscribes them (threads spinning for each other). The compiled launch.sh defaults to the same.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

import shared_kit  # noqa: E402
from cpu_world_kit import gloo_world  # noqa: E402, F401 (a fixture every test can ask for)


#: Tests that hold a machine-wide resource (a SLURM cluster, two-rank gloo worlds, torchrun's
#: rendezvous ports): under pytest-xdist (``-n auto --dist loadgroup``) they run in one group, one
#: after another on one worker, never beside each other.
EXCLUSIVE = "exclusive"
EXCLUSIVE_MODULES = {
    "tests/integration/launch/test_check.py",                       # torchrun, 2 ranks, free ports
    "tests/integration/runtime/test_runtime_context_parallel.py",   # 2-rank gloo worlds
    "tests/integration/runtime/test_runtime_fsdp.py",               # 2-rank gloo world
    "tests/integration/runtime/test_runtime_init_from.py",          # a 2-rank gloo world
    "tests/integration/runtime/test_rl_reference_resume_other_layout.py",  # 2-rank gloo worlds
    "tests/integration/runtime/test_rl_reference_per_rank_checkpoints.py",  # 2-rank gloo worlds
    "tests/integration/slurm/test_submit_chain.py",                 # the one-node SLURM cluster
    "tests/integration/hostile/test_hostile_files.py",              # parallel cases judged hung by wall time
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Put the tests of :data:`EXCLUSIVE_MODULES` and those marked ``slurm`` in one xdist group; skip
    the tests marked ``shared_data`` when the offline data kit is missing (tests/kits/shared_kit.py)."""
    root = config.rootpath
    for item in items:
        where = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        if where in EXCLUSIVE_MODULES or item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group(EXCLUSIVE))
    if shared_kit.PRESENT:
        return
    skip = pytest.mark.skip(reason=shared_kit.MISSING_REASON)
    for item in items:
        if item.get_closest_marker("shared_data"):
            item.add_marker(skip)


@pytest.fixture
def spec_dict():
    """The spec factory (tests/kits/spec_kit.py): ``spec_dict({"train.seq_length": 1024}, name="v")``
    returns a fresh small valid spec dict with those changes."""
    import spec_kit

    return spec_kit.spec_dict


@pytest.fixture
def spec_file(tmp_path):
    """The spec factory writing TOML: ``spec_file({"parallel.tensor_model_parallel_size": 2})`` returns
    ``tmp_path/spec.toml`` (``file_name=`` for another name in tmp_path)."""
    import spec_kit

    def write(*changes, **tables):
        return spec_kit.spec_file(tmp_path, *changes, **tables)

    return write
