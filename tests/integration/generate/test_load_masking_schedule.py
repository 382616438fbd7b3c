"""A checkpoint's masking schedule: the runtime's spec record names a schedule other than linear
(backends/megatron/spec_record.py), the loader reads it back through the objective's registration
(backends/generate/load.py ``record_schedule``) for the sampler and the ELBO, and a record whose
schedule is damaged is refused naming the file, the keys and a fix."""

from __future__ import annotations

import pytest

from dlmspec.backends.generate.load import LoadError, record_schedule
from dlmspec.backends.megatron.config import ObjectiveConfig
from dlmspec.backends.megatron.spec_record import _schedule_record
from dlmspec.objectives.schedules import MaskingSchedule


def test_runtime_records_a_schedule_other_than_linear_only() -> None:
    assert _schedule_record(ObjectiveConfig(mask_token_id=5)) == {}
    assert _schedule_record(ObjectiveConfig(mask_token_id=5, noise_schedule="cosine")) == {
        "objective.noise_schedule": "cosine"}
    assert _schedule_record(ObjectiveConfig(mask_token_id=5, noise_schedule="polynomial", noise_schedule_exponent=2.0)) == {
        "objective.noise_schedule": "polynomial", "objective.noise_schedule_exponent": 2.0}


def test_loader_reads_the_recorded_schedule_back() -> None:
    base = {"objective.kind": "mdm"}
    assert record_schedule("x/dlmspec.json", base) == MaskingSchedule("linear")
    record = {**base, **_schedule_record(ObjectiveConfig(mask_token_id=5, noise_schedule="polynomial",
                                                         noise_schedule_exponent=3.0))}
    assert record_schedule("x/dlmspec.json", record) == MaskingSchedule("polynomial", 3.0)
    assert record_schedule("x/dlmspec.json", {"objective.kind": "ar"}).is_linear


@pytest.mark.parametrize("bad", [
    {"objective.noise_schedule": "sqrt"},
    {"objective.noise_schedule": ["cosine"]},
    {"objective.noise_schedule": "polynomial", "objective.noise_schedule_exponent": -1.0},
    {"objective.noise_schedule": "polynomial", "objective.noise_schedule_exponent": "two"},
    {"objective.noise_schedule": "polynomial", "objective.noise_schedule_exponent": float("nan")},
])
def test_damaged_schedule_in_a_record_is_refused(bad: dict) -> None:
    with pytest.raises(LoadError) as caught:
        record_schedule("run/iter_0000010/dlmspec.json", {"objective.kind": "mdm", **bad})
    text = str(caught.value)
    assert "run/iter_0000010/dlmspec.json" in text and "objective.noise_schedule" in text
    assert "load a checkpoint the dlmspec runtime wrote" in text
