"""A data-constrained pair of the demo family, for masked diffusion (DLM) and autoregressive (AR)
models: the same model (1.5M non-embedding parameters) and the same compute (2.4M training
tokens), once over 2.4M unique tokens (one epoch) and once over 300k unique tokens eight times
(eight epochs of a capped prefix of the corpus). Ni et al. 2025 ("Diffusion Language Models are
Super Data Learners") and Prabhudesai et al. 2025 report that repetition costs a DLM less than an
AR model; Muennighoff et al. 2023 that AR returns diminish after ~4 epochs.

    dlmspec plan specs/scaling-demo-repeat.py        # epochs and unique tokens per member
    python bench/scaling/run.py --gpus 1             # trains and evaluates it with the isoFLOP study

The cap (data.train[].max_unique_tokens) keeps the longest prefix of whole documents of the
demo corpus (.data/demo-train, see demo-dlm.toml) within the unique tokens, the same documents
every run; validation data is not capped, so both runs are scored on the same held-out text.
"""

from dlmspec.dsl import Spec

SIZE = 1.5e6
TOKENS = 2_400_000
EPOCHS = 8

#: As specs/scaling-demo-isoflop.py: 4,096 tokens a step, one evaluation and one checkpoint at the end.
SMALL_RUNS = {
    "train": {"micro_batch_size": 8, "global_batch_size": 8, "eval_interval": 100_000, "eval_iters": 10},
    "checkpoint": {"save_interval": 100_000},
}

spec = {}
for base_name, prefix in (("demo-dlm", "repeat-dlm"), ("demo-ar", "repeat-ar")):
    base = Spec.load(base_name).replace(name=prefix, **SMALL_RUNS)
    spec.update(Spec.data_constrained(base, [SIZE], [TOKENS], [1]))
    spec.update(Spec.data_constrained(base, [SIZE], [TOKENS / EPOCHS], [EPOCHS]))
