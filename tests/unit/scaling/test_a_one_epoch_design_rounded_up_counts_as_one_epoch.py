"""A run designed for one epoch lands a little above it (the cap keeps whole documents, a run ends
on a whole step): up to 1% more tokens than unique tokens, the fit keeps it among the single-epoch
points of the law; past that it repeats its data."""
from dlmspec.scaling.runs import RunPoint
from dlmspec.scaling.study import SINGLE_EPOCH, is_single_epoch


def _point(epochs):
    unique = None if epochs is None else 2_399_797
    tokens = 2_400_256 if epochs is None else round(epochs * 2_399_797)
    return RunPoint(run_dir="r", name="r", params=1_471_680, total_params=20_770_368, tokens=tokens, flops=1e14,
                    loss=3.2, stderr=None, loss_source="metrics.jsonl valid", unique_tokens=unique, epochs=epochs)


def test_the_bundled_pairs_one_epoch_run_counts_as_one_epoch() -> None:
    assert is_single_epoch(_point(2_400_256 / 2_399_797))  # 1.0002 epochs, as the H100 study's pair
    assert is_single_epoch(_point(1.0)) and is_single_epoch(_point(0.5)) and is_single_epoch(_point(None))


def test_past_one_percent_a_run_repeats_its_data() -> None:
    assert SINGLE_EPOCH == 1.01
    assert not is_single_epoch(_point(1.02))
    assert not is_single_epoch(_point(8.01))
