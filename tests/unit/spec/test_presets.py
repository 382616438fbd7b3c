"""Preset parameter counts against the figures their authors publish (dlmspec.spec.presets.PUBLISHED).

A published figure given as a rounded string ("1.7B") admits anything that rounds to it, plus
0.5%; an exact integer admits 0.5%. The counts come from dlmspec.params, which counts the modules
megatron-core builds, so this also checks the presets' dimensions."""

import pytest

from dlmspec.params import count_parameters
from dlmspec.spec.presets import PRESETS, PUBLISHED
from dlmspec.spec.models import ModelSpec


def _bounds(figure: int | str) -> tuple[float, float]:
    if isinstance(figure, int):
        return figure * 0.995, figure * 1.005
    number = figure.rstrip("B")
    decimals = len(number.split(".")[1]) if "." in number else 0
    value, half_unit = float(number) * 1e9, 0.5 * 10 ** (-decimals) * 1e9
    return (value - half_unit) * 0.995, (value + half_unit) * 1.005


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_parameter_counts_match_published(name: str) -> None:
    counts = count_parameters(ModelSpec(preset=name))
    total, active, source = PUBLISHED[name]
    low, high = _bounds(total)
    assert low <= counts.total <= high, f"{name}: {counts.total:,} total vs {total} ({source})"
    low, high = _bounds(active)
    assert low <= counts.active <= high, f"{name}: {counts.active:,} active vs {active} ({source})"


def test_every_preset_has_a_published_figure() -> None:
    assert set(PRESETS) == set(PUBLISHED)


def test_exact_figures() -> None:
    # Exact safetensors counts: no rounding to hide behind.
    assert count_parameters(ModelSpec(preset="llama-3-8b")).total == 8_030_261_248
    assert count_parameters(ModelSpec(preset="llama-3-70b")).total == 70_553_706_496
    assert count_parameters(ModelSpec(preset="qwen2.5-7b")).total == 7_615_616_512


def test_bounds_reject_a_wrong_count() -> None:
    low, high = _bounds("1.7B")
    assert not low <= 1.80e9 <= high and low <= 1.72e9 <= high
