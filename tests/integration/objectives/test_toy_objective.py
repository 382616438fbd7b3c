"""An objective defined in this test module alone: it registers its compiler half
(:class:`dlmspec.objectives.Objective`: kind, attention, planner terms, train.py keywords) and its
runtime half (``prepare(batch, rng) -> ObjectiveBatch``), and the spec then validates, plans,
compiles, and its compiled ``ObjectiveConfig`` trains a few steps on CPU through the registries,
without any other module knowing its name."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import sys
from pathlib import Path
from typing import Any, List, Mapping, Optional, Tuple

import pytest
import torch


from dlmspec import objectives  # noqa: E402
from dlmspec.backends.megatron import objectives as runtime_objectives  # noqa: E402
from dlmspec.backends.megatron.objectives.base import ObjectiveBatch, ObjectiveRng, RuntimeObjective  # noqa: E402
from dlmspec.check import find  # noqa: E402
from dlmspec.plan import make_plan  # noqa: E402
from dlmspec.render.compile import render  # noqa: E402
from dlmspec.resolve import resolve  # noqa: E402
from dlmspec.spec.load import load  # noqa: E402
from dlmspec.errors import SpecError  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
KIND = "toy-every-other"


class ToyObjective(objectives.Objective):
    """Next-token prediction on a random half of the positions, with a pretend frozen teacher
    (one extra forward pass) for the planner."""

    kind = KIND
    description = "next-token prediction on a random half of the positions"
    attention = "causal"
    attentions = ("causal",)
    loss_row_fraction = 0.5

    def extra_forward_passes(self, objective: Any) -> int:
        return 1

    def dataset_extra_token(self, objective: Any, stage_kind: str) -> bool:
        return True

    def runtime_options(self, objective: Any) -> List[Tuple[str, Any, str]]:
        return [("options", {"share": 0.5}, "the toy's share of positions that carry loss")]


class ToyRuntime(RuntimeObjective):
    kind = KIND
    attention = "causal"

    def __init__(self, share: float) -> None:
        self.share = share

    def prepare_batch(self, batch: Mapping[str, Optional[torch.Tensor]], rng: ObjectiveRng, **options: Any) -> ObjectiveBatch:
        tokens = batch["tokens"]
        labels = batch.get("labels")
        if labels is None:
            labels = torch.roll(tokens, -1, dims=1)
        keep = torch.rand(tokens.shape, generator=rng.masking, device=tokens.device) < self.share
        weights = keep.to(torch.float32)
        return ObjectiveBatch(input_ids=tokens.to(torch.int64), labels=labels.to(torch.int64), loss_weights=weights,
                              num_tokens=keep.sum().to(torch.int), token_mask=keep,
                              position_ids=batch.get("position_ids"), source_ids=tokens)

    def dataset_extra_token(self) -> bool:
        return True


@pytest.fixture()
def toy():
    objectives.register(ToyObjective())
    runtime_objectives.register_runtime(KIND, lambda config, **options: ToyRuntime(config.options["share"]))
    try:
        yield
    finally:
        objectives.unregister(KIND)
        runtime_objectives.unregister_runtime(KIND)


def _spec():
    return load(ROOT / "specs" / "demo-ar.toml", [f'objective.kind="{KIND}"']).spec


def test_toy_kind_is_refused_until_registered() -> None:
    with pytest.raises(SpecError, match="objective.kind"):
        _spec()


def test_toy_validates_and_plans_with_its_own_terms(toy) -> None:
    spec = _spec()
    assert spec.objective.kind == KIND
    assert [i for i in find(("spec", "runtime"), spec) if i.severity == "error"] == []
    toy_plan = make_plan(resolve(spec))
    ar_plan = make_plan(resolve(load(ROOT / "specs" / "demo-ar.toml").spec))
    assert toy_plan.shape.loss_row_fraction == 0.5 and toy_plan.shape.extra_forward_passes == 1
    # one more forward pass, no backward: hardware FLOPs x 4/3 of AR's (no recomputation in demo-ar)
    assert toy_plan.time.flops.hardware_per_step == pytest.approx(ar_plan.time.flops.hardware_per_step * 4 / 3)
    assert toy_plan.time.flops.model_per_step == pytest.approx(ar_plan.time.flops.model_per_step)


def _compiled(tmp_path: Path):
    files = render(resolve(_spec()), "specs/toy.toml")
    path = tmp_path / "toy_train.py"
    path.write_text(files["train.py"], encoding="utf-8")
    module_spec = importlib.util.spec_from_file_location("toy_train", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return files["train.py"], module


def test_toy_compiles_with_its_registered_keywords(toy, tmp_path: Path) -> None:
    text, module = _compiled(tmp_path)
    calls = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "ObjectiveConfig"]
    keywords = {kw.arg: ast.literal_eval(kw.value) for kw in calls[0].keywords}
    assert keywords["kind"] == KIND
    assert "# the toy's share of positions that carry loss" in text
    objective = module.build_run().objective
    assert objective.kind == KIND and objective.options == {"share": 0.5}


from runtime_loop_kit import _config, _run, cpu_train  # noqa: E402,F401  (fixture)


def test_toy_trains_a_few_steps_on_cpu(toy, tmp_path: Path, cpu_train) -> None:
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    from dlmspec.backends.megatron import training
    from dlmspec.backends.megatron.layers import build_layer_spec
    from dlmspec.backends.megatron.stage import PretrainStage
    from runtime_loop_kit import SEQ, VOCAB

    _, module = _compiled(tmp_path)
    run = dataclasses.replace(_run(tmp_path, eval_interval=None), objective=module.build_run().objective)
    stage = PretrainStage(run)
    result = training.train(
        run, transformer_config=_config(), layer_spec=build_layer_spec(attention="causal", use_transformer_engine=False),
        model_kwargs=dict(vocab_size=VOCAB, max_sequence_length=SEQ, position_embedding_type="rope", rotary_base=10000),
        ddp_config=DistributedDataParallelConfig(use_distributed_optimizer=False),
        optimizer_config=OptimizerConfig(lr=1e-3, min_lr=1e-4, use_distributed_optimizer=False), stage=stage)
    assert isinstance(stage.objective, ToyRuntime) and stage.objective.share == 0.5
    assert (result.iteration, result.exit_reason) == (4, "completed")
    # the toy weighs about half of the positions: the step's count of loss tokens says so
    item_batch = {"tokens": torch.zeros(4, 64, dtype=torch.int64)}
    ob = stage.objective.prepare(item_batch, ObjectiveRng(torch.Generator().manual_seed(0)))
    assert 0.4 < float(ob.loss_weights.mean()) < 0.6
