from dlmspec.dsl import Spec

base = Spec.load("demo-dlm")                  # specs/demo-dlm.toml, as a Spec
base.train.lr = 4e-4                          # validated on assignment
spec = {                                      # a sweep: one compile folder per name
    f"demo-mb{mb}": base.replace(train={"micro_batch_size": mb})
    for mb in (16, 32)
}
