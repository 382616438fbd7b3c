"""The runtime's model FLOPs per data token (``model_flops_per_token_of``, what ``train()`` logs as
``model_flops_per_token``, MFU's numerator and ``dlmspec fit``'s ``C = flops_per_token * tokens``)
equal the planner's for the same compiled spec: ``flops.model_per_step / (global_batch *
seq_length)``. Masked diffusion, next-token prediction and block diffusion (2L input positions at
the three-part mask's density, the output layer on the x_t half without an AR loss, on both halves
with one or under sequence parallelism, the mask's density averaged over a block-size schedule's steps; and in an SFT stage). The data-token count
(``data_only``) equals the planner's ``data_mfu`` numerator. Each spec is compiled to train.py and its
configs built as ``train()`` receives them."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from compile_megatron_kit import _import  # noqa: E402

from dlmspec.backends.megatron import metrics  # noqa: E402
from dlmspec.plan import make_plan  # noqa: E402
from dlmspec.plan.time import mfu_peak_flops  # noqa: E402
from dlmspec.render.compile import render  # noqa: E402
from dlmspec.resolve import resolve  # noqa: E402
from dlmspec.spec.load import load  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
CASES = {
    "mdm": ("demo-dlm.toml", []),
    "ar": ("demo-ar.toml", []),
    "bd3lm": ("demo-bd3lm.toml", []),
    "bd3lm-ar-loss": ("demo-bd3lm.toml", ["objective.ar_loss_weight=0.5"]),
    "bd3lm-block-schedule": ("demo-bd3lm.toml", ["objective.block_size_schedule=[[0, 4], [100, 16], [200, 512]]"]),
    "bd3lm-sft": ("demo-bd3lm-sft.toml", []),
    "bd3lm-sequence-parallel": ("demo-bd3lm.toml", ["parallel.tensor_model_parallel_size=2",
                                                    "parallel.sequence_parallel=true", "cluster.gpus_per_node=2"]),
}


def _both(case: str, tmp_path: Path):
    """(runtime FLOPs per data token, runtime data-only FLOPs, plan) of a case."""
    name, sets = CASES[case]
    resolved = resolve(load(ROOT / "specs" / name, sets).spec)
    train = tmp_path / "train.py"
    train.write_text(render(resolved, "spec.toml")["train.py"], encoding="utf-8")
    module = _import(train)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config, model_kwargs, _, _ = module.build_configs()
        layer, run = module.build_layer(), module.build_run()
    runtime = metrics.model_flops_per_token_of(config, layer, model_kwargs, run.data.seq_length, run.objective,
                                               run.schedule.train_iters)
    data = metrics.model_flops_per_token_of(config, layer, model_kwargs, run.data.seq_length, data_only=True)
    return runtime, data, make_plan(resolved)


@pytest.mark.parametrize("case", sorted(CASES))
def test_runtime_flops_per_data_token_equal_the_planned_step_flops(case: str, tmp_path: Path) -> None:
    runtime, data, plan = _both(case, tmp_path)
    lay = plan.layout
    planned = plan.time.flops.model_per_step / (lay.global_batch * lay.seq)
    assert runtime == pytest.approx(planned, rel=1e-9, abs=1)
    # MFU's data-token count: the planner's data_mfu numerator
    t = plan.time
    planned_data = t.data_mfu * mfu_peak_flops(plan.gpu, lay.dtype) * lay.world * t.step_seconds / (lay.global_batch * lay.seq)
    assert data == pytest.approx(planned_data, rel=1e-9, abs=1)


def test_block_diffusion_counts_twice_the_decoder_work_of_masked_diffusion(tmp_path: Path) -> None:
    """The data-token count of BD3 is MDM's; the step's is the doubled input at (L + B) / 2 keys with
    the output layer on L rows: by hand for the demo (L = 512, B = 16, 12 layers of width 768)."""
    runtime, data, plan = _both("bd3lm", tmp_path)
    mdm, _, _ = _both("mdm", tmp_path)
    assert data == mdm
    s = plan.shape
    h, a, g, d, f, V, n = s.hidden, s.heads, s.groups, s.head_dim, s.ffn, s.vocab, s.num_layers
    linear = 2 * h * (a + 2 * g) * d + 2 * a * d * h + 3 * 2 * h * f
    want = 3 * (1024 * n * (linear + 4 * a * d * (512 + 16) / 2) + 512 * 2 * h * V) / 512
    assert runtime == pytest.approx(want, abs=1)
