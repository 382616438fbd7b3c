"""``dlmspec.flops.model_flops_per_data_token``: the step's model FLOPs per data token for an input
longer than the data (block diffusion's x_t (+) x_0), the count the runtime logs. Without extra
positions it is ``model_flops_per_token``; with them, the decoder runs every input position and the
output layer its rows; an output length outside the input is refused."""

from __future__ import annotations

import pytest

from dlmspec.flops import model_flops_per_data_token, model_flops_per_token

DIMS = (2, 64, 256, 4, 2, 16, 1024, 256)  # L layers, h, f, a, g, d, V, s


def test_without_extra_positions_it_is_the_per_token_count() -> None:
    for attention in ("bidirectional", "causal"):
        assert model_flops_per_data_token(*DIMS, attention=attention) == pytest.approx(
            model_flops_per_token(*DIMS, attention=attention), rel=1e-12)


def test_a_doubled_input_counts_the_decoder_twice_and_the_output_rows_once() -> None:
    n_layers, h, f, a, g, d, V, s = DIMS
    keys = (s + 16) / 2  # blocks of 16 under the block-diffusion mask
    decoder = n_layers * (2 * h * (a + 2 * g) * d + 2 * a * d * h + 3 * 2 * h * f + 4 * a * d * keys)
    got = model_flops_per_data_token(*DIMS, extra_seq_length=s, keys=keys, output_length=s)
    assert got == pytest.approx(3 * (2 * s * decoder + s * 2 * h * V) / s)
    both = model_flops_per_data_token(*DIMS, extra_seq_length=s, keys=keys)  # both halves scored
    assert both - got == pytest.approx(3 * 2 * h * V)


@pytest.mark.parametrize("output_length", [0, 513])
def test_an_output_length_outside_the_input_is_refused(output_length: int) -> None:
    with pytest.raises(ValueError, match="output_length"):
        model_flops_per_data_token(*DIMS, extra_seq_length=256, output_length=output_length)
