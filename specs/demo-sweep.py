"""A sweep over the demo's micro batch and recompute: six specs from specs/demo-dlm.toml.

    dlmspec validate specs/demo-sweep.py           # every member, every issue at its line
    dlmspec plan specs/demo-sweep.py               # one row per member: memory, step time, MFU
    dlmspec compile specs/demo-sweep.py -o out/sweep   # out/sweep/<name>/ per member
    dlmspec submit specs/demo-sweep.py --dry-run   # one job per member, side by side

Each member is named after its settings; the demo writes its run paths with {name}
(runs/{name}/checkpoints), so each member gets folders of its own. docs/python.md explains the API.
"""

from dlmspec.dsl import Spec

base = Spec.load("demo-dlm")
RECOMPUTE = {
    "none": {"granularity": "none"},
    "full": {"granularity": "full", "method": "uniform", "num_layers": 1},
}

spec = {
    f"demo-dlm-mb{mb}-{kind}": base.replace(
        train={"micro_batch_size": mb},
        recompute=recompute,
    )
    for mb in (8, 16, 32)
    for kind, recompute in RECOMPUTE.items()
}
