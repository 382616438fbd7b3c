"""What the stage seam lends a stage and takes back from it (backends/megatron/stage.py,
stages.py, metrics.py): the model factory's frozen copy, the tokenizer, the logits function,
the reduction of a stage's own loss reports, its metrics in the train record, the runtime stage
registry. The whole loop with a stage of its own: tests/integration/runtime/test_toy_stage.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from dlmspec.backends.megatron import stage as stage_module
from dlmspec.backends.megatron.config import LoggingConfig, TrainState
from dlmspec.backends.megatron.layers import build_layer_spec
from dlmspec.backends.megatron.metrics import DLM_REPORT, IntervalMeter, MetricsLogger, dlm_record
from dlmspec.backends.megatron.sft import SftStage
from dlmspec.backends.megatron.stage import (
    LM_LOSS,
    ModelFactory,
    PretrainStage,
    StageBase,
    StageResourceError,
    StageResources,
    StageSeam,
    sum_reports,
    tokenizer_from_record,
)
from dlmspec.backends.megatron.stages import STAGES, build_stage, register_stage
from runtime_loop_kit import SEQ, VOCAB, _config, _run, cpu_train  # noqa: F401 (fixture)


def _factory() -> ModelFactory:
    return ModelFactory(_config(), build_layer_spec(attention="bidirectional", use_transformer_engine=False),
                        dict(vocab_size=VOCAB, max_sequence_length=SEQ, position_embedding_type="rope",
                             rotary_base=10000))


@pytest.fixture()
def model_parallel(cpu_train):  # noqa: F811
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1)
    yield


def test_a_frozen_copy_has_the_policys_weights_and_no_gradients(model_parallel) -> None:
    factory = _factory()
    policy = factory.build()
    rng_before = torch.get_rng_state()
    reference = factory.frozen_copy(policy)
    assert torch.equal(torch.get_rng_state(), rng_before)  # built without drawing weights
    for (name, p), (_, q) in zip(policy[0].named_parameters(), reference[0].named_parameters()):
        assert torch.equal(p, q), name
        assert p.data_ptr() != q.data_ptr() and not q.requires_grad
    assert not reference[0].training
    tokens = torch.randint(0, VOCAB, (2, SEQ))
    logits_fn = StageResources(factory).logits_fn
    policy[0].eval()
    assert torch.equal(logits_fn(policy[0])(tokens), logits_fn(reference[0])(tokens))
    with torch.no_grad():
        next(policy[0].parameters()).add_(1.0)
    assert not torch.equal(logits_fn(policy[0])(tokens), logits_fn(reference[0])(tokens))
    ModelFactory.copy_weights(policy, reference)  # a refresh
    assert torch.equal(logits_fn(policy[0])(tokens), logits_fn(reference[0])(tokens))


def test_a_frozen_copy_of_a_megatron_fsdp_model_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(stage_module, "model_uses_megatron_fsdp", lambda model: True)
    with pytest.raises(StageResourceError, match="parallel.fsdp"):
        _factory().frozen_copy([torch.nn.Linear(2, 2)])


def test_copy_weights_refuses_another_number_of_chunks() -> None:
    with pytest.raises(ValueError, match="2 source chunk"):
        ModelFactory.copy_weights([torch.nn.Linear(2, 2)] * 2, [torch.nn.Linear(2, 2)])


def test_the_tokenizer_comes_from_the_spec_record() -> None:
    tok = StageResources(_factory(), record={"data.tokenizer.type": "NullTokenizer",
                                             "data.tokenizer.vocab_size": 100}).tokenizer
    assert tok.detokenize([3, 4]) == "3 4"


def test_a_missing_or_broken_tokenizer_is_named_with_the_remedy(tmp_path: Path) -> None:
    with pytest.raises(StageResourceError, match=r"set \[data.tokenizer\]"):
        tokenizer_from_record({})
    broken = {"data.tokenizer.type": "GPT2BPETokenizer", "data.tokenizer.vocab_file": str(tmp_path / "none.json"),
              "data.tokenizer.merge_file": str(tmp_path / "none.txt")}
    with pytest.raises(StageResourceError, match="GPT2BPETokenizer.*cannot be built"):
        StageResources(_factory(), record=broken).tokenizer


def test_a_logits_function_needs_both_pipeline_ends() -> None:
    chunk = torch.nn.Linear(2, 2)
    chunk.pre_process, chunk.post_process = True, False  # the first of two pipeline stages
    with pytest.raises(StageResourceError, match="pipeline_model_parallel_size must be 1"):
        StageResources(_factory()).logits_fn(chunk)


def test_reports_are_summed_by_key_with_the_loss_always_there() -> None:
    reports = [{LM_LOSS: torch.tensor([2.0, 4.0]), "reward": torch.tensor([1.0, 1.0, 3.0])},
               {LM_LOSS: torch.tensor([1.0, 2.0]), "reward": torch.tensor([0.5, 1.0, 1.0]), "note": "text"}]
    sums = sum_reports(reports, torch.device("cpu"))
    assert sums[LM_LOSS].tolist() == [3.0, 6.0] and sums["reward"].tolist() == [1.5, 2.0, 4.0]
    assert set(sums) == {LM_LOSS, "reward"}
    assert sum_reports([], torch.device("cpu"))[LM_LOSS].tolist() == [0.0, 0.0]  # a rank without the last stage


def test_a_stage_without_the_optional_members_gets_pretrainings_defaults() -> None:
    class Bare:
        kind = "bare"

    run = _run()
    seam = StageSeam(Bare(), run)
    assert seam.samples_consumed(7) == run.schedule.global_batch_size
    assert seam.state_dict() == {} and seam.interval_metrics({}) == {}
    dlm = torch.zeros(10)
    dlm[8:] = torch.tensor([3.0, 4.0])
    assert seam.interval_metrics({DLM_REPORT: dlm}) == dlm_record(dlm)
    assert isinstance(PretrainStage(run), StageBase) and isinstance(SftStage(run), StageBase)


def _meter_record(tmp_path: Path, metrics) -> dict:
    logger = MetricsLogger(LoggingConfig(run_dir=str(tmp_path), console="plain"), enabled=True)
    meter = IntervalMeter(torch.device("cpu"), tokens_per_step=8, flops_per_token=1, world_size=1, peak_tflops=None)
    meter.add(torch.tensor([2.0, 1.0]), True, 1.0, sums={LM_LOSS: torch.tensor([2.0, 1.0]), "kl": torch.tensor([1.0, 4.0])})
    meter.add(torch.tensor([2.0, 1.0]), True, 1.0, sums={"kl": torch.tensor([3.0, 4.0])})
    try:
        meter.log(logger, TrainState(iteration=2), train_iters=4, lr=0.1, metrics=metrics)
    finally:
        logger.close()
    return [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]


def test_a_stages_interval_metrics_reach_the_train_record(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda *a, **k: None)
    record = _meter_record(tmp_path, lambda sums: {"kl_mean": float(sums["kl"][0] / sums["kl"][1])})
    assert record["kl_mean"] == pytest.approx(0.5) and record["loss"] == pytest.approx(2.0)


def test_a_stage_metric_may_not_replace_the_loops_own(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda *a, **k: None)
    with pytest.raises(ValueError, match=r"\['loss'\]"):
        _meter_record(tmp_path, lambda sums: {"loss": 0.0})


def test_the_runtime_registry_builds_stages_and_refuses_unknown_or_conflicting_kinds() -> None:
    run = _run()
    assert type(build_stage("pretrain", run)) is PretrainStage and type(build_stage("sft", run)) is SftStage
    with pytest.raises(SystemExit, match="stage.kind = 'nope' has no runtime stage here"):
        build_stage("nope", run)
    with pytest.raises(ValueError, match="already"):
        register_stage("sft", PretrainStage)
    register_stage("sft", SftStage)  # the same class again: allowed
    with pytest.raises(ValueError, match="non-empty string"):
        register_stage("", PretrainStage)
    assert STAGES["sft"] is SftStage


def test_sft_builds_its_objective_through_the_shared_setup() -> None:
    run = _run()
    run = dataclasses.replace(run, objective=dataclasses.replace(run.objective, variable_length_prob=0.3,
                                                                 variable_length="micro_batch", unshift=True))
    sft = SftStage(run).objective_config()
    assert (sft.variable_length_prob, sft.variable_length, sft.unshift) == (0.0, "sequence", False)
    assert PretrainStage(run).objective_config() is run.objective
