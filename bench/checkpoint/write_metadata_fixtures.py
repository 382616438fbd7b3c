"""Write real checkpoints of this machine's torch and megatron-core, for the tests of
``dlmspec.backends.checkpoint_safety`` (its ``.metadata`` allow-list and weights-only reads).

Usage (repository root; CUDA is hidden, everything runs on CPU in a gloo group of world size 1)::

    python bench/checkpoint/write_metadata_fixtures.py OUT_DIR

writes ``OUT_DIR/torch-<torch version>_mcore-<megatron-core version>/`` holding:

* ``torch_dist/``: a one-layer GPTModel (hidden 16, vocabulary 64, local spec) with an
  ``OptimizerParamScheduler``, saved by the runtime's own
  ``dlmspec.backends.megatron.checkpointing.save_checkpoint`` (``.metadata``, ``*.distcp``,
  ``common.pt``, ``metadata.json``, ``dlmspec.json``): model tensors, TE-less ``_extra_state``
  byte objects, the per-rank ``rng_state`` byte object;
* ``fsdp_dtensor/``: a ``torch.distributed.checkpoint.save`` shaped like
  ``dlmspec.backends.megatron.fsdp.save_checkpoint_fsdp``'s (which needs CUDA): the same
  model's tensors as DTensors on a one-rank CPU ``DeviceMesh`` (Shard(0)), Adam-style
  optimizer DTensors, and ``fsdp.dlmspec_entries`` (run state and RNG state as JSON text).

The tests (tests/integration/checkpoint/test_checkpoint_safety.py) load every folder under
tests/fixtures/checkpoints through the safe readers. Under 200 KiB per folder; copy the
written folder into tests/fixtures/checkpoints/ to add it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path


def _versions() -> str:
    import megatron.core
    import torch

    mcore = getattr(megatron.core, "__version__", None)
    if mcore is None:
        from importlib.metadata import version

        mcore = version("megatron-core")
    return f"torch-{torch.__version__.split('+')[0]}_mcore-{mcore}"


def _tiny_model():
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    from dlmspec.backends.megatron.layers import build_layer_spec, build_model

    torch.manual_seed(0)
    config = TransformerConfig(
        num_layers=1, hidden_size=16, ffn_hidden_size=32, num_attention_heads=2, num_query_groups=1, kv_channels=8,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        qk_layernorm=True, hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False,
    )
    spec = build_layer_spec(attention="bidirectional", qk_layernorm=True, use_transformer_engine=False)
    return build_model(config, layer_spec=spec, vocab_size=64, max_sequence_length=32,
                       position_embedding_type="rope", rotary_base=10000, rotary_percent=1.0,
                       share_embeddings_and_output_weights=False)


def _scheduler(chunks):
    import torch
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    adam = torch.optim.Adam([p for c in chunks for p in c.parameters()], lr=1e-3)
    return OptimizerParamScheduler(adam, init_lr=0.0, max_lr=1e-3, min_lr=1e-4, lr_warmup_steps=2,
                                   lr_decay_steps=10, lr_decay_style="cosine", start_wd=0.0, end_wd=0.0,
                                   wd_incr_steps=10, wd_incr_style="constant")


def write_torch_dist(dest: Path, work: Path) -> None:
    from dlmspec.backends.megatron.checkpointing import save_checkpoint

    chunks = _tiny_model()
    path = save_checkpoint(str(work / "checkpoints"), iteration=3, model=chunks, scheduler=_scheduler(chunks),
                           consumed_train_samples=12, seed=7, interval_loss=[4.5, 12.0, 0.0])
    shutil.copytree(path, dest)


def write_fsdp_dtensor(dest: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from dlmspec.backends.megatron.checkpointing import _rng_state
    from dlmspec.backends.megatron.fsdp import dlmspec_entries

    mesh = init_device_mesh("cpu", (1,))
    model = {k: distribute_tensor(v.detach().float(), mesh, [Shard(0)])
             for k, v in _tiny_model()[0].state_dict().items() if isinstance(v, torch.Tensor) and v.dim() > 0}
    optimizer = {"state": {k: {"exp_avg": distribute_tensor(torch.zeros_like(v.full_tensor()), mesh, [Shard(0)]),
                               "exp_avg_sq": distribute_tensor(torch.ones_like(v.full_tensor()), mesh, [Shard(0)]),
                               "step": torch.tensor(3.0)} for k, v in model.items()},
                 "param_groups": [{"lr": 1e-3, "weight_decay": 0.0, "params": sorted(model)}]}
    run_state = {"iteration": 3, "consumed_train_samples": 12, "seed": 7,
                 "opt_param_scheduler": {"max_lr": 1e-3, "num_steps": 12, "lr_decay_style": "cosine"}}
    state = {"model": model, "optimizer": optimizer, **dlmspec_entries(run_state, _rng_state([4.5, 12.0, 0.0]))}
    dest.mkdir(parents=True)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(dest)))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch: the CPU save path, on any machine
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    out = Path(argv[0]) / _versions()
    if out.exists():
        print(f"{out} exists: remove it first", file=sys.stderr)
        return 2
    torch.cuda.current_device = lambda: "cpu"  # megatron-core asks for it (RoPE, DDP buffers)
    torch.cuda.synchronize = lambda *a, **k: None  # megatron-core's checkpoint staging
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dist.init_process_group("gloo", init_method=f"file://{work / 'store'}", rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
        try:
            write_torch_dist(out / "torch_dist", work)
            write_fsdp_dtensor(out / "fsdp_dtensor")
        finally:
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()
    for f in sorted(out.rglob("*")):
        if f.is_file():
            print(f"{f.stat().st_size:>8}  {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
