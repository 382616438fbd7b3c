"""Shared fixtures."""

from __future__ import annotations

import pytest

import shared_kit
from cpu_world_kit import gloo_world  # noqa: F401 (a fixture every test can ask for)


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``shared_data`` when the offline data kit is missing (tests/kits/shared_kit.py)."""
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
