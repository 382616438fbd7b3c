"""Megatron-FSDP (parallel.fsdp = "megatron"): what can be checked without a GPU.

megatron-core 0.16.1's FullyShardedDataParallel cannot be built on a CPU (gloo) world: it asks
``torch.cuda.current_device()`` for its device and builds CUDA streams and a ``DeviceMesh`` of
device type "cuda" (seen here: "Torch not compiled with CUDA enabled"). So this checks the
wiring: the compiled configs (tests/unit/render/test_compile_megatron.py executes them with FSDP variations),
the compiler's refusals (tests/integration/render/test_compile.py), the runtime's own refusals, the checkpoint
module's use of torch.distributed.checkpoint around the model state, and the planner's FSDP
terms against megatron-core's constants. The wrapped run is ``demo-fsdp`` on two GPUs
(bench/devbox/gpu/fsdp_resume.sh).
"""

from __future__ import annotations

import importlib.util
import inspect
import warnings
from pathlib import Path

import pytest
import torch

from dlmspec.render.compile import compile_spec
from dlmspec.plan import make_plan
from dlmspec.plan.calibration import Calibration
from dlmspec.plan.memory import MEGATRON_FSDP_UNIT, fsdp_sharding, fsdp_unsharded_bytes
from dlmspec.plan.shape import layout
from dlmspec.plan.comm import ddp_buckets, dp_comm_seconds, dp_overlap
from dlmspec.resolve import resolve
from dlmspec.spec.models import Spec

from cpu_world_kit import megatron_cpu_world

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "specs" / "demo-dlm.toml"

FSDP = ["parallel.fsdp=\"megatron\"", "parallel.data_parallel_sharding_strategy=\"optim_grads_params\"",
        "kernels.cross_entropy=\"megatron\"", "cluster.gpus_per_node=2", "train.global_batch_size=64"]


def _ddp(**kw):
    from megatron.core.distributed import DistributedDataParallelConfig

    base = dict(use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params",
                use_distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True)
    base.update(kw)
    return DistributedDataParallelConfig(**base)


# ------------------------------------------------------------------------------------------
# megatron-core 0.16.1 has what the runtime calls


def test_megatron_core_has_the_fsdp_api_the_runtime_uses() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel
        from megatron.core.distributed.fsdp.src.megatron_fsdp.uneven_dtensor import (  # noqa: F401
            preprocess_state_dict_for_uneven_dtensor,
        )
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
        from megatron.core.transformer.fsdp_dtensor_checkpoint import (  # noqa: F401
            handle_experts_in_state_dict,
            handle_fp8_extra_state_case,
            handle_swiglu_in_state_dict,
        )
        from megatron.core.utils import unwrap_model
    params = inspect.signature(FullyShardedDataParallel.__init__).parameters
    assert {"config", "ddp_config", "module", "disable_bucketing"} <= set(params)
    # unwrap_model stops at the MegatronFSDP module (not in its list), which the checkpoint helpers take
    assert "megatron_FSDP" in inspect.getsource(unwrap_model)
    assert "metadata" in inspect.signature(DistributedOptimizer.sharded_state_dict).parameters
    assert "fsdp_dtensor" in inspect.getsource(DistributedOptimizer.sharded_state_dict)
    assert "num_experts" in inspect.signature(handle_experts_in_state_dict).parameters
    # the constant the planner models (dlmspec.plan.memory.MEGATRON_FSDP_UNIT)
    from megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp import MegatronFSDP

    source = inspect.getsource(MegatronFSDP._init_fsdp_param_and_grad_buffer)
    assert f"max(\n                {MEGATRON_FSDP_UNIT:_}, suggested_communication_unit_size" in source
    assert "suggested_communication_unit_size // 2" in source


def test_the_wrapper_needs_cuda_on_this_machine() -> None:
    """Why the wrapped model is not tested here: FullyShardedDataParallel needs CUDA."""
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel

    source = inspect.getsource(FullyShardedDataParallel)
    assert "torch.device(f'cuda:{torch.cuda.current_device()}')" in source
    assert 'device_type="cuda"' in source


# ------------------------------------------------------------------------------------------
# The runtime's refusals


def test_fsdp_problems_name_each_remedy() -> None:
    from megatron.core.optimizer import OptimizerConfig

    from dlmspec.backends.megatron.fsdp import fsdp_problems

    ok = dict(cuda_available=True, environ={})
    if importlib.util.find_spec("einops") is not None:
        assert fsdp_problems(_ddp(), **ok) == []
    assert fsdp_problems(_ddp(use_megatron_fsdp=False), cuda_available=False) == []
    cases = {
        "needs CUDA": dict(cuda_available=False, environ={}),
        "use_distributed_optimizer": dict(ok, optimizer_config=OptimizerConfig(use_distributed_optimizer=False)),
        "pipeline_model_parallel_size = 1": dict(ok, pipeline_model_parallel_size=2),
        "kernels.cross_entropy": dict(ok, cross_entropy="fused_linear"),
        "init_from": dict(ok, init_from="mcore:x"),
        "CUDA_DEVICE_MAX_CONNECTIONS": dict(cuda_available=True, environ={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
    }
    for needle, kwargs in cases.items():
        problems = fsdp_problems(_ddp(), **kwargs)
        assert any(needle in p for p in problems), (needle, problems)


def test_train_refuses_fsdp_without_cuda_before_building(tmp_path_factory, monkeypatch) -> None:
    """On this CPU machine train() stops at once with the reason, before any model exists."""
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    from dlmspec.backends.megatron import checks, training

    out = tmp_path_factory.mktemp("c")
    compile_spec(DEMO, out, force=True, overrides=FSDP + ["data.mock=true", "data.train=[]", "data.valid=[]",
                                                            "data.tokenizer.type=\"NullTokenizer\"",
                                                            "data.tokenizer.vocab_size=50256"])
    spec = importlib.util.spec_from_file_location("fsdp_train", out / "train.py")
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec.loader.exec_module(module)
        tc, model_kwargs, ddp, opt = module.build_configs()
    run = module.build_run()
    run.checkpoint.exit_signals = ()
    run.checkpoint.save_dir = None
    built = []
    monkeypatch.setattr(training, "build_model", lambda *a, **k: built.append(1))
    monkeypatch.setattr(checks, "cuda_problem", lambda **kwargs: None)  # past train()'s own CUDA check, to FSDP's
    with megatron_cpu_world(tmp_path_factory, monkeypatch):
        with pytest.raises(ValueError, match="Megatron-FSDP needs CUDA"):
            training.train(run, transformer_config=tc, layer_spec=module.build_layer(), model_kwargs=model_kwargs,
                           ddp_config=ddp, optimizer_config=opt, **module.PARALLEL_SIZES)
    assert not built


def test_compiled_fsdp_launch_never_sets_max_connections_1(tmp_path: Path) -> None:
    """Megatron-LM refuses CUDA_DEVICE_MAX_CONNECTIONS=1 with Megatron-FSDP; launch.sh sets it
    for TP / sequence parallelism only without FSDP."""
    tp2 = ["parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true", "cluster.gpus_per_node=4",
           "train.global_batch_size=64"]
    compile_spec(DEMO, tmp_path / "ddp", overrides=tp2)
    compile_spec(DEMO, tmp_path / "fsdp", overrides=tp2 + ['parallel.fsdp="megatron"'])
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in (tmp_path / "ddp" / "launch.sh").read_text()
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in (tmp_path / "fsdp" / "launch.sh").read_text()
    text = (tmp_path / "fsdp" / "train.py").read_text()
    assert "use_megatron_fsdp=True" in text and "optimizer_sharding=\"fsdp_dtensor\"" in text


def test_resume_refuses_a_checkpoint_of_the_other_format(tmp_path: Path) -> None:
    import json

    from dlmspec.backends.megatron import checkpointing

    path = tmp_path / "iter_0000010"
    path.mkdir()
    (path / "dlmspec.json").write_text(json.dumps({"seed": 1, "checkpoint_format": "fsdp_dtensor"}))
    with pytest.raises(ValueError, match="parallel.fsdp setting it was saved with \\(megatron\\)"):
        checkpointing.load_checkpoint(str(path), model=[torch.nn.Linear(1, 1)], seed=1)


# ------------------------------------------------------------------------------------------
# The checkpoint module around the model state (DCP on a one-process gloo world)


def test_fsdp_checkpoint_keeps_run_state_and_this_ranks_rng(tmp_path_factory, monkeypatch) -> None:
    """save/load_checkpoint_fsdp with the model state replaced by plain tensors: DCP writes and
    reads back the weights in place, the pickled run state (iteration, samples, seed, scheduler)
    and this rank's RNG state, and hands the unprocessed state dict to the chunk's load_state_dict."""
    from dlmspec.backends.megatron import fsdp

    weights = {"w": torch.arange(6, dtype=torch.float32)}
    monkeypatch.setattr(fsdp, "_state_dict", lambda model, optimizer, is_loading: {"model": dict(weights)})
    monkeypatch.setattr(fsdp, "_preprocess", lambda state, model: state)

    class Chunk:
        loaded = None

        def load_state_dict(self, sd, strict=True):
            Chunk.loaded = sd

    run_state = {"iteration": 7, "consumed_train_samples": 448, "seed": 3, "opt_param_scheduler": {"num_steps": 7}}
    rng = {"torch": torch.get_rng_state(), "note": "rank0"}
    path = tmp_path_factory.mktemp("ckpt")
    with megatron_cpu_world(tmp_path_factory, monkeypatch):
        fsdp.save_checkpoint_fsdp(str(path), model=[Chunk()], run_state=run_state, rng_state=rng)
        weights["w"].zero_()  # load must bring the saved values back, in place
        state, got_rng = fsdp.load_checkpoint_fsdp(str(path), model=[Chunk()], load_rng=True)
        _, no_rng = fsdp.load_checkpoint_fsdp(str(path), model=[Chunk()], load_rng=False)
    assert state == run_state
    assert got_rng["note"] == "rank0" and torch.equal(got_rng["torch"], rng["torch"])
    assert no_rng is None
    assert torch.equal(weights["w"], torch.arange(6, dtype=torch.float32))
    assert Chunk.loaded["w"] is weights["w"]


# ------------------------------------------------------------------------------------------
# The planner's FSDP terms


def _lay(fsdp: str, sharding: str, layers: int = 12):
    spec = Spec.model_validate({
        "name": "p",
        "model": {"num_layers": layers, "hidden_size": 768, "ffn_hidden_size": 2048, "num_attention_heads": 12,
                  "num_query_groups": 4, "vocab_size": 50257, "max_position_embeddings": 1024,
                  "transformer_impl": "local"},
        "kernels": {"cross_entropy": "megatron"},
        "parallel": {"fsdp": fsdp, "data_parallel_sharding_strategy": sharding},
        "train": {"micro_batch_size": 4, "global_batch_size": 8, "seq_length": 512, "train_iters": 10},
        "cluster": {"gpu": "h200", "gpus_per_node": 2, "nodes": 1},
    })
    return resolve(spec)


def test_fsdp_sharding_follows_megatron_strategies() -> None:
    assert fsdp_sharding(layout(_lay("megatron", "optim_grads_params"))) == (True, True, True)
    assert fsdp_sharding(layout(_lay("megatron", "optim_grads"))) == (False, True, True)
    assert fsdp_sharding(layout(_lay("megatron", "optim"))) == (False, False, True)
    assert fsdp_sharding(layout(_lay("megatron", "no_shard"))) == (False, False, False)
    assert fsdp_sharding(layout(_lay("torch", "no_shard"))) == (True, True, True)


def test_megatron_fsdp_unsharded_buffers_follow_megatron_core_windows() -> None:
    lay = layout(_lay("megatron", "optim_grads_params"))
    small, L = 150e6, 12  # under half a unit: everything gathered, every gradient queued
    assert fsdp_unsharded_bytes(lay, small, L, 2, 4) == 2 * small + 4 * small
    big, L = 8e9, 32
    layer = big / L
    assert fsdp_unsharded_bytes(lay, big, L, 2, 4) == 2 * (layer + MEGATRON_FSDP_UNIT / 2) + 4 * (layer + MEGATRON_FSDP_UNIT)
    assert fsdp_unsharded_bytes(layout(_lay("megatron", "optim_grads")), big, L, 2, 4) == 4 * (layer + MEGATRON_FSDP_UNIT)
    assert fsdp_unsharded_bytes(layout(_lay("megatron", "optim")), big, L, 2, 4) == 0
    assert fsdp_unsharded_bytes(layout(_lay("torch", "no_shard")), big, L, 2, 4) == 2 * layer * 6


def test_planned_fsdp_memory_and_communication() -> None:
    bare = Calibration(allocated_overhead_bytes=0, cuda_context_bytes=0, nccl_bytes_per_group=0,
                       allocator_reserve_fraction=0.0, activation_scale=1.0)
    full = make_plan(_lay("megatron", "optim_grads_params"), bare)
    optim = make_plan(_lay("megatron", "optim"), bare)
    b, o = full.memory.peak.breakdown, optim.memory.peak.breakdown
    assert b["weights"] == pytest.approx(o["weights"] / 2)
    assert b["gradients"] == pytest.approx(o["gradients"] / 2)
    assert b["optimizer_states"] == pytest.approx(o["optimizer_states"])
    assert b["fsdp_unsharded_buffers"] == pytest.approx(6 * o["weights"] / 2)  # all weights (bf16) + grads (fp32)
    lay_full, lay_optim = layout(_lay("megatron", "optim_grads_params")), layout(_lay("megatron", "optim"))
    assert ddp_buckets(lay_full, 1e8, 0) == 0
    assert dp_overlap(lay_full) == (True, True)
    assert dp_overlap(lay_optim) == (lay_optim.overlap_grad_reduce, lay_optim.overlap_param_gather)
    gpu = _lay("megatron", "optim").gpu
    grad_full, param_full = dp_comm_seconds(lay_full, gpu, bare, 1e8, 0, 4, 2)
    grad_opt, param_opt = dp_comm_seconds(lay_optim, gpu, bare, 1e8, 0, 4, 2)
    assert grad_full == pytest.approx(grad_opt)
    assert param_full == pytest.approx(2 * param_opt)  # gathered in forward and again in backward


# ------------------------------------------------------------------------------------------
# Two ranks, unevenly sharded DTensors, megatron's DistributedOptimizer fsdp_dtensor state (gloo)

_BUFFER = {"a": (0, 6), "c": (6, 10), "b": (10, 12)}  # one flat buffer of 12, 6 per rank


def _two_rank_worker(rank: int, store: str, path: str, symmetric: bool) -> None:
    """One rank of :func:`test_fsdp_save_with_params_wholly_in_other_ranks_shards`."""
    import datetime
    import types
    from unittest import mock

    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from dlmspec.backends.megatron import fsdp

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=20))
    with mock.patch.object(torch.cuda, "current_device", lambda: "cpu"):
        parallel_state.initialize_model_parallel(1, 1)
    mesh = init_device_mesh("cpu", (2,))
    lo, hi = 6 * rank, 6 * rank + 6

    def shard(name: str, value: float) -> DTensor:
        # Megatron-FSDP's layout: this rank's slice of the parameter's span of the flat buffer
        start, end = _BUFFER[name]
        local = torch.full((max(0, min(end, hi) - max(start, lo)),), value + rank)
        return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size([end - start]),
                                  stride=(1,))

    class Chunk(torch.nn.Module):
        config = types.SimpleNamespace(gated_linear_unit=False, num_moe_experts=None)

        def __init__(self):
            super().__init__()
            for i, name in enumerate(_BUFFER):
                self.register_parameter(name, torch.nn.Parameter(shard(name, 10.0 * (i + 1))))

        def state_dict_for_save_checkpoint(self):
            return dict(self.named_parameters())

        def load_state_dict(self, sd, strict=True):
            Chunk.loaded = sd

    class LazyAdamState(torch.optim.Optimizer):
        # torch Adam's state bookkeeping: created on the first step a parameter has a gradient
        def __init__(self, params):
            super().__init__(params, {"lr": 1.0})

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    if not state:
                        state["step"] = torch.tensor(0.0)
                        state["exp_avg"] = torch.zeros_like(p)
                        state["exp_avg_sq"] = torch.zeros_like(p)
                    state["step"] += 1
                    state["exp_avg"].to_local().add_(1.0)
                    state["exp_avg_sq"].to_local().add_(2.0)

    chunk = Chunk()
    opt = DistributedOptimizer.__new__(DistributedOptimizer)
    opt.ddp_config = types.SimpleNamespace(use_megatron_fsdp=True)
    opt.model_chunks = [chunk]
    opt.optimizer = LazyAdamState(list(chunk.parameters()))
    for _ in range(3):  # Megatron-FSDP: grad None where the local shard is empty
        for p in chunk.parameters():
            p.grad = torch.ones_like(p) if p.to_local().numel() else None
        opt.optimizer.step()
    own = {n for n, p in chunk.named_parameters() if p.to_local().numel()}
    assert {opt._param_name(p) for p in opt.state} == own  # a on rank 0, c and b on rank 1

    patch = mock.patch.object(fsdp, "_symmetric_optimizer_state", lambda state, optimizer: state)
    with (mock.patch.object(torch.cuda, "current_device", lambda: "cpu"),
          patch if not symmetric else mock.MagicMock()):
        fsdp.save_checkpoint_fsdp(path, model=[chunk], optimizer=opt, run_state={"iteration": 3},
                                  rng_state={"rank": rank})
        expected = {n: (p.to_local().clone(), {k: v.to_local().clone() if isinstance(v, DTensor) else v.clone()
                                               for k, v in opt.state[p].items()})
                    for n, p in chunk.named_parameters() if p in opt.state}
        for p in chunk.parameters():
            p.detach().to_local().zero_()
        for s in opt.state.values():
            for v in s.values():
                (v.to_local() if isinstance(v, DTensor) else v).zero_()
        run_state, rng = fsdp.load_checkpoint_fsdp(path, model=[chunk], optimizer=opt, load_rng=True)
    assert run_state == {"iteration": 3} and rng == {"rank": rank}
    assert set(Chunk.loaded) == set(_BUFFER)
    params = dict(chunk.named_parameters())
    for name, (weight, state) in expected.items():
        assert torch.equal(Chunk.loaded[name].to_local(), weight), name
        got = opt.state[params[name]]
        assert set(got) == {"step", "exp_avg", "exp_avg_sq"}, (name, set(got))
        assert float(got["step"]) == 3.0, (name, got["step"])
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(got[key].to_local(), state[key]), (name, key)
    # the placeholders did not become optimizer state: still only this rank's own parameters
    assert {opt._param_name(p) for p in opt.state} == own
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def test_fsdp_save_with_params_wholly_in_other_ranks_shards(tmp_path: Path) -> None:
    """The H200 hang at the first save of demo-fsdp, on two gloo ranks: a parameter that lies
    wholly in the other rank's shard has no optimizer state here (grad None), so each rank's
    fsdp_dtensor optimizer state held different DTensors and the per-DTensor all_gather_object
    of preprocess_state_dict_for_uneven_dtensor did not pair up. With the state made symmetric
    the save completes and a load restores weights, moments and step counters on both ranks."""
    from cpu_world_kit import spawn_world

    (tmp_path / "ckpt").mkdir()
    spawn_world(_two_rank_worker, args=(str(tmp_path / "store"), str(tmp_path / "ckpt"), True), nprocs=2)
    assert (tmp_path / "ckpt" / ".metadata").is_file()
