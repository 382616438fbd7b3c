"""An isoFLOP study of the demo family: 4 model sizes x 3 compute budgets, masked diffusion (DLM)
and autoregressive (AR) side by side, 24 specs from specs/demo-dlm.toml and specs/demo-ar.toml.

    dlmspec plan specs/scaling-demo-isoflop.py        # one row per member: FLOPs, tokens, time
    dlmspec compile specs/scaling-demo-isoflop.py -o out/isoflop
    python bench/scaling/run.py --gpus 1              # trains and evaluates every member (one H100)

Sized for the demo's offline corpus (the Python documentation, prepared as demo-dlm.toml's
.data/demo-train: 3,476,269 GPT-2 tokens): every member trains on at most one epoch of it (the
smallest model at the largest budget: 2.8M tokens). Sizes are non-embedding parameters N, shaped
by dlmspec.dsl.ShapeRule (Chinchilla's head dim 64 and hidden/layers near 64); budgets are
training FLOPs as the planner counts them (dlmspec.flops: 3x the forward GEMMs, attention and the
logits GEMM on the padded vocabulary), not 6ND: at these widths the logits GEMM outweighs 6N.
Budgets this small give a rough law: docs/scaling.md says what it can and cannot tell.
"""

from dlmspec.dsl import Spec

#: Training tokens of the demo corpus as prepared (bench/gpu/prepare.py from the data kit).
CORPUS_TOKENS = 3_476_269
#: Non-embedding parameters of the four sizes.
SIZES = [0.5e6, 1.5e6, 4.5e6, 13.5e6]
#: Training FLOPs of the three budgets.
BUDGETS = [3e13, 6e13, 1.2e14]

#: The demo's settings for small runs: 4,096 tokens a step (8 sequences of 512), one evaluation and
#: one checkpoint at the end of each run (the DSL caps eval_interval at each member's steps).
SMALL_RUNS = {
    "train": {"micro_batch_size": 8, "global_batch_size": 8, "eval_interval": 100_000, "eval_iters": 10},
    "checkpoint": {"save_interval": 100_000},
}

spec = {}
for base_name, prefix in (("demo-dlm", "isoflop-dlm"), ("demo-ar", "isoflop-ar")):
    base = Spec.load(base_name).replace(name=prefix, **SMALL_RUNS)
    spec.update(Spec.isoflop(base, BUDGETS, SIZES))
