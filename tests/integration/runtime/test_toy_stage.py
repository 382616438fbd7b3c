"""A training stage defined in this module alone, through the stage registries: the compiler's
(:mod:`dlmspec.stages`), the planner's (:data:`dlmspec.plan.memory.STAGE_MEMORY_TERMS`) and the
runtime's (:data:`dlmspec.backends.megatron.stages.STAGES`).

The toy stage pre-trains and, beside the policy, keeps a frozen reference copy built by the
seam's model factory; it logs the KL divergence of the policy to it (both through the seam's
tensor-parallel logits function), reads the run's tokenizer from the seam, keeps an RNG stream of
its own in the checkpoints, and its spec is validated, planned (with the reference's memory as a
term of its own), compiled and trained on CPU (test_runtime_loop's one-process gloo world with a
real, plain SGD update in place of megatron's CUDA-only optimizer).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dlmspec.backends.megatron import checkpointing, training
from dlmspec.backends.megatron import stages as runtime_stages
from dlmspec.backends.megatron.stage import PretrainStage
from dlmspec.check.registry import load_for
from dlmspec.plan import make_plan
from dlmspec.plan import memory as plan_memory
from dlmspec.plan import time as plan_time
from dlmspec.render.compile import compile_spec
from dlmspec import stages as compiler_stages
from runtime_loop_kit import _Optimizer, cpu_train  # noqa: F401 (fixture)

TOY = "toy-kl"
#: The toy's memory term: the frozen reference copy of this rank's weights.
REFERENCE_TERM = "reference_weights"
#: The toy's time term: the two forward passes (policy and reference) of its KL.
KL_FORWARDS = "kl_forwards"
#: The report key of the toy's KL sums: ``[KL summed over positions, positions]``.
KL_REPORT = "toy kl"

SPEC = """
name = "toy"
[stage]
kind = "{kind}"
[model]
num_layers = 2
hidden_size = 64
ffn_hidden_size = 128
num_attention_heads = 4
num_query_groups = 2
vocab_size = 128
max_position_embeddings = 32
transformer_impl = "local"
[objective]
kind = "mdm"
mask_token_id = 126
[train]
micro_batch_size = 2
global_batch_size = 4
seq_length = 32
train_iters = 4
lr = 0.01
eval_interval = 2
eval_iters = 1
[precision]
dtype = "fp32"
[kernels]
cross_entropy = "megatron"
qkv_fusion = false
compiled_norm = false
[data]
mock = true
num_workers = 0
[data.tokenizer]
type = "NullTokenizer"
vocab_size = 120
[checkpoint]
save = "ckpt"
save_interval = 2
[logging]
log_interval = 2
[cluster]
gpu = "h100"
gpus_per_node = 1
nodes = 1
"""


class ToyKLStage(PretrainStage):
    """Pre-training, plus a frozen reference copy of the policy and the KL divergence to it.

    Per microbatch, without gradients: ``KL(policy || reference)`` summed over the positions of
    the microbatch's tokens (``sum_v p log(p / q)``, the logits of both from the seam's
    ``logits_fn``), reported beside the loss under ``"toy kl"``; the loop logs its interval mean
    as ``kl_to_reference``. Each step draws one number from an RNG stream of its own
    (:attr:`draws`), which its checkpoint state keeps.
    """

    def __init__(self, run, options=None) -> None:
        super().__init__(run, options)
        self.generator = torch.Generator().manual_seed(run.seed + 17)
        self.steps = 0
        self.draws: list[int] = []
        self.counted: list[int] = []
        self.reference = self.policy = None
        self.tokenizer = None
        self.resources = None

    def setup(self, ctx, *, layer_spec, model_kwargs) -> None:
        super().setup(ctx, layer_spec=layer_spec, model_kwargs=model_kwargs)
        self.resources = ctx.resources
        self.tokenizer = ctx.resources.tokenizer  # built from the spec record (NullTokenizer)

    def prepare_model(self, model):
        used = super().prepare_model(model)
        self.reference = self.resources.model_factory.frozen_copy(model)
        self.policy = model
        return used

    def before_step(self, iteration, model) -> None:
        self.steps += 1
        self.draws.append(int(torch.randint(0, 2**30, (1,), generator=self.generator)))

    def forward_step(self, data_iterator, model):
        taken = []

        def tap():
            item = next(data_iterator)
            taken.append(item)
            yield item

        output, loss_func = super().forward_step(tap(), model)
        tokens = taken[0].batch["tokens"].to(self._ctx.device)
        log_p = F.log_softmax(self.resources.logits_fn(model)(tokens), dim=-1)
        log_q = F.log_softmax(self.resources.logits_fn(self.reference[0])(tokens), dim=-1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)  # [b, s]
        sums = torch.stack([kl.sum(), torch.tensor(float(kl.numel()))])

        def with_kl(output_tensor):
            loss, num_tokens, report = loss_func(output_tensor)
            return loss, num_tokens, {**report, KL_REPORT: sums}

        return output, with_kl

    def interval_metrics(self, sums):
        out = super().interval_metrics(sums)
        kl = sums[KL_REPORT]
        out["kl_to_reference"] = float(kl[0] / kl[1])
        return out

    def samples_consumed(self, iteration: int) -> int:
        self.counted.append(iteration)
        return super().samples_consumed(iteration)

    def state_dict(self):
        return {"generator": self.generator.get_state(), "steps": self.steps}

    def load_state_dict(self, state) -> None:
        self.generator.set_state(state["generator"])
        self.steps = int(state["steps"])


def _reference_bytes(shape, lay, inputs) -> float:
    """The frozen reference: one more copy of the rank's weights (sharded like the policy's)."""
    return inputs.param_bytes * (inputs.params[0] + inputs.params[1])


def _kl_forward_seconds(shape, lay, breakdown) -> float:
    """Two forward passes per microbatch (policy and reference logits): a forward is a third of
    the step's compute (the backward costs twice the forward)."""
    return 2 * (breakdown["gemm"] + breakdown["attention"] + breakdown["elementwise"]) / 3


@pytest.fixture()
def toy_registered():
    """The toy stage in all three registries, removed again afterwards."""
    compiler_stages.register_stage_kind(compiler_stages.StageKind(
        TOY, "pre-training with a frozen reference model and its KL (tests/integration/runtime/test_toy_stage.py)",
        imports=((__name__, ""),)))
    plan_memory.register_stage_memory_term(TOY, plan_memory.StageMemoryTerm(
        REFERENCE_TERM, "frozen reference copy of the weights", _reference_bytes))
    plan_time.register_stage_time_term(TOY, plan_time.StageTimeTerm(
        KL_FORWARDS, "forward passes of the policy and the reference for the KL", _kl_forward_seconds))
    runtime_stages.register_stage(TOY, ToyKLStage)
    try:
        yield
    finally:
        compiler_stages.STAGE_KINDS.pop(TOY, None)
        plan_memory.STAGE_MEMORY_TERMS.pop(TOY, None)
        plan_time.STAGE_TIME_TERMS.pop(TOY, None)
        runtime_stages.STAGES.pop(TOY, None)


def _spec(tmp_path: Path, kind: str = TOY) -> Path:
    path = tmp_path / f"{kind}.toml"
    path.write_text(SPEC.format(kind=kind), encoding="utf-8")
    return path


class _SGD(_Optimizer):
    """Plain SGD on megatron DDP's gradient buffers (``param.main_grad``), so the policy moves
    away from its reference (megatron's optimizers need CUDA)."""

    def __init__(self, model, lr: float = 0.05) -> None:
        super().__init__()
        self.params = [p for chunk in model for p in chunk.parameters() if p.requires_grad]
        self.lr = lr

    def step(self):
        self.steps += 1
        with torch.no_grad():
            for p in self.params:
                grad = getattr(p, "main_grad", None)
                grad = p.grad if grad is None else grad
                if grad is not None:
                    p.add_(grad, alpha=-self.lr)
        return True, 1.0, None


def _train_module(tmp_path: Path, spec: Path):
    out = tmp_path / "out"
    compile_spec(spec, out)
    path = out / "train.py"
    module_spec = importlib.util.spec_from_file_location("toy_train", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module, path.read_text(encoding="utf-8")


def _train(module, tmp_path: Path, **schedule):
    """The compiled train.py's objects, made to run on CPU, trained with its own build_stage()."""
    transformer_config, model_kwargs, ddp_config, optimizer_config = module.build_configs()
    transformer_config.use_cpu_initialization = True
    transformer_config.bias_dropout_fusion = False
    run = module.build_run()
    run = dataclasses.replace(
        run, data=dataclasses.replace(run.data, cache_dir=str(tmp_path / "cache")),
        schedule=dataclasses.replace(run.schedule, **schedule),
        checkpoint=dataclasses.replace(run.checkpoint, exit_signals=()),
        # absolute: wandb's service, started by an earlier test of the session, has another working directory
        logging=dataclasses.replace(run.logging, run_dir=str(Path(run.logging.run_dir).resolve()),
                                    console="plain", wandb_project="dlmspec-test",
                                    wandb_exp_name="toy", wandb_mode="offline"),
    )
    stage = module.build_stage(run)
    result = training.train(run, transformer_config=transformer_config, layer_spec=module.build_layer(),
                            model_kwargs=model_kwargs, ddp_config=ddp_config, optimizer_config=optimizer_config,
                            **module.PARALLEL_SIZES, stage=stage)
    return run, stage, result


def _events(run):
    return [json.loads(line) for line in (Path(run.logging.run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture()
def wandb_offline(tmp_path, monkeypatch):
    """wandb's own folders inside the test's, offline, with a fake key."""
    pytest.importorskip("wandb")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567")
    monkeypatch.delenv("WANDB_MODE", raising=False)


def test_an_unregistered_stage_kind_is_refused_by_validate(tmp_path: Path) -> None:
    _, _, issues = load_for("validate", _spec(tmp_path))
    errors = [i for i in issues if i.severity == "error"]
    assert [(i.key, i.rule) for i in errors] == [("stage.kind", "stage-kind-known")]
    assert "'toy-kl'" in errors[0].message and "'pretrain'" in errors[0].message


def test_the_toy_stage_validates_and_plans_its_reference_memory_and_time(tmp_path: Path, toy_registered) -> None:
    loaded, resolved, issues = load_for("validate", _spec(tmp_path))
    assert not [i for i in issues if i.severity == "error"]
    toy_plan = make_plan(resolved).to_dict()
    _, base_resolved, _ = load_for("validate", _spec(tmp_path, "pretrain"))
    base_plan = make_plan(base_resolved).to_dict()
    toy, base = toy_plan["memory"], base_plan["memory"]
    assert REFERENCE_TERM not in base["breakdown"] and REFERENCE_TERM not in base["allocated_terms"]
    term = toy["breakdown"][REFERENCE_TERM]
    assert term == 4 * base_resolved.params_padded.total  # fp32 weights, one rank (TP = PP = 1)
    assert toy["allocated_terms"][-1] == REFERENCE_TERM
    assert toy["peak_allocated_bytes"] - base["peak_allocated_bytes"] == term
    assert sum(toy["breakdown"][k] for k in toy["allocated_terms"]) == pytest.approx(toy["peak_allocated_bytes"], abs=20)
    seconds, base_seconds = toy_plan["time"]["breakdown_seconds"], base_plan["time"]["breakdown_seconds"]
    assert list(seconds)[-1] == KL_FORWARDS and KL_FORWARDS not in base_seconds
    assert seconds[KL_FORWARDS] > 0 and seconds[KL_FORWARDS] == pytest.approx(_kl_forward_seconds(None, None, base_seconds))
    assert toy_plan["time"]["step_seconds"] == pytest.approx(base_plan["time"]["step_seconds"] + seconds[KL_FORWARDS])


def test_the_toy_stage_compiles_and_trains_on_cpu_through_the_registries(
        tmp_path: Path, toy_registered, cpu_train, wandb_offline, monkeypatch) -> None:  # noqa: F811
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(training, "get_megatron_optimizer", lambda config, model: _SGD(model))
    module, text = _train_module(tmp_path, _spec(tmp_path))
    assert f"import {__name__}  # registers stage 'toy-kl'" in text
    assert "build_stage_of('toy-kl', run, None)" in text

    run, stage, result = _train(module, tmp_path)
    assert isinstance(stage, ToyKLStage) and (result.iteration, result.exit_reason) == (4, "completed")
    assert type(stage.tokenizer).__name__ == "DefaultTokenizerText" and stage.tokenizer.detokenize([1, 2]) == "1 2"
    assert stage.counted == [0, 1, 2, 3] and result.consumed_train_samples == 16
    # the reference is frozen, the policy moved away from it
    from megatron.core.utils import unwrap_model

    policy = dict(unwrap_model(stage.policy[0]).named_parameters())
    reference = dict(unwrap_model(stage.reference[0]).named_parameters())
    assert sorted(policy) == sorted(reference) and not any(p.requires_grad for p in reference.values())
    assert any(not torch.equal(policy[k], reference[k]) for k in policy)
    trains = [e for e in _events(run) if e["event"] == "train"]
    assert [e["iteration"] for e in trains] == [2, 4]
    kls = [e["kl_to_reference"] for e in trains]
    assert all(kl > 0 for kl in kls) and kls[1] > kls[0]  # step 0 has KL 0, then the policy drifts
    assert all("mask_ratio" in e for e in trains)  # pre-training's own metrics still there

    from dlmspec.backends.megatron.wandb_log import read_offline_run

    (run_file,) = sorted(Path(run.logging.run_dir, "wandb", "wandb").glob("offline-run-*/run-*.wandb"))
    logged = {row["_step"]: row for row in read_offline_run(str(run_file))["history"] if "train/loss" in row}
    assert [logged[e["iteration"]]["train/kl_to_reference"] for e in trains] == pytest.approx(kls)


def test_the_toy_stage_state_is_saved_and_restored_on_resume(
        tmp_path: Path, toy_registered, cpu_train, wandb_offline, monkeypatch) -> None:  # noqa: F811
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(training, "get_megatron_optimizer", lambda config, model: _SGD(model))
    module, _ = _train_module(tmp_path, _spec(tmp_path))
    load = checkpointing.dist_checkpointing.load
    # the fake optimizer's empty state is dropped by megatron's loader: hand it back (test_runtime_loop)
    monkeypatch.setattr(checkpointing.dist_checkpointing, "load", lambda *a, **k: {**load(*a, **k), "optimizer": {}})

    _, whole, _ = _train(module, tmp_path / "whole", train_iters=4)
    import shutil

    shutil.rmtree(tmp_path / "ckpt")
    _, first, _ = _train(module, tmp_path / "first", stop_at_iteration=2)
    _, second, result = _train(module, tmp_path / "second")
    assert result.resumed_from == 2 and result.iteration == 4
    assert first.draws == whole.draws[:2]
    assert second.draws == whole.draws[2:]  # its own RNG stream continued from the checkpoint
    assert second.steps == 4
