"""What the RL planner's tests share (not a test module): an RL stage over the demo specs
(8 prompts x 4 completions = 32 rows, 128 generated tokens in 64 steps of blocks of 32, 300 steps)
and the rollout's GPU work as dlmspec/plan/rl.py prices it."""

from __future__ import annotations

from pathlib import Path

from dlmspec.plan import Plan, make_plan
from dlmspec.plan.rl import rl_options, sampler_work
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

SPECS = Path(__file__).resolve().parents[2] / "specs"
#: ``--set`` overrides making a bundled spec an RL stage (its rollouts sampled at temperature 0.9).
RL_SETS = ['stage.kind="rl"', 'stage.rl.prompts="p.jsonl"', "stage.rl.grpo_group_size=4",
           "stage.rl.grpo_prompts_per_step=8", "train.global_batch_size=32", "generate.temperature=0.9",
           "generate.gen_length=128", "generate.steps=64", "generate.block_length=32", "train.train_iters=300"]
#: The eager rollout forward (``[generate] cuda_graph = false``): its launches are priced.
EAGER = "generate.cuda_graph=false"


def rl_plan(*extra: str, spec: str = "demo-dlm.toml") -> Plan:
    """The plan of bundled ``spec`` as an RL stage (:data:`RL_SETS`, then ``extra``)."""
    return make_plan(resolve(load(SPECS / spec, [*RL_SETS, *extra]).spec))


def rollout_work(p: Plan) -> dict[str, float]:
    """A rollout batch's GPU work besides launches (dlmspec/plan/rl.py ``sampler_work``):
    ``{"decoder", "head", "logits"}``."""
    return sampler_work(p.shape, p.layout, rl_options(p.shape), p.gpu, p.calibration)
