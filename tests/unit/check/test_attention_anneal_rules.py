"""The rules of attention annealing (objective.attention_anneal_iters, DiffuLLaMA): a masked-diffusion
spec adapting an AR checkpoint with it validates clean; each setting it cannot run with (another
objective, causal layers, more steps than training, Transformer Engine, context parallelism, document
masks, an SFT stage, no AR checkpoint) is reported at its key with a fix that removes the finding."""

from __future__ import annotations

import pytest

from dlmspec.check import find
from dlmspec.spec.load import load
from spec_kit import spec_file

ANNEAL = {"objective.attention_anneal_iters": 40, "checkpoint.init_from": "mcore:ar-checkpoint",
          "model.transformer_impl": "local", "model.attention_backend": "sdpa"}


def _issues(tmp_path, *changes):
    spec = load(spec_file(tmp_path, ANNEAL, *changes)).spec
    return {i.rule: i for i in find(("spec", "runtime"), spec) if i.rule.startswith("attention-anneal")}


def test_annealing_a_masked_diffusion_model_from_an_ar_checkpoint_is_clean(tmp_path) -> None:
    assert _issues(tmp_path) == {}


CASES = [
    ({"objective.kind": "ar"}, "attention-anneal-objective", "objective.attention_anneal_iters"),
    ({"objective.attention_mask": "block_causal", "objective.block_size": 16}, "attention-anneal-objective",
     "objective.attention_anneal_iters"),
    ({"objective.attention_anneal_iters": 500}, "attention-anneal-iters", "objective.attention_anneal_iters"),
    ({"checkpoint.init_from": None}, "attention-anneal-init-from", "objective.attention_anneal_iters"),
    ({"model.transformer_impl": "transformer_engine", "model.attention_backend": None},
     "attention-anneal-transformer-engine", "model.transformer_impl"),
    ({"parallel.context_parallel_size": 2}, "attention-anneal-context-parallel", "parallel.context_parallel_size"),
    ({"data.reset_attention_mask": True}, "attention-anneal-document-mask", "data.reset_attention_mask"),
]


@pytest.mark.parametrize("change,rule,key", CASES)
def test_a_setting_annealing_cannot_run_with_is_reported_at_its_key_and_its_remedy_clears_it(tmp_path, change, rule,
                                                                                           key) -> None:
    issues = _issues(tmp_path, change)
    assert rule in issues, sorted(issues)
    assert issues[rule].key == key
    fix = issues[rule].fix
    fixed = {**change, **dict(fix.set), **{k: None for k in fix.unset}}
    (tmp_path / "fixed").mkdir()
    assert rule not in _issues(tmp_path / "fixed", fixed), fix


def test_more_annealing_steps_than_training_steps_is_refused_with_train_iters_as_the_remedy(tmp_path) -> None:
    issue = _issues(tmp_path, {"objective.attention_anneal_iters": 500})["attention-anneal-iters"]
    assert issue.fix.set == {"objective.attention_anneal_iters": 100}
    assert issue.severity == "error"


def test_auto_layers_take_the_local_path_for_annealing(tmp_path) -> None:
    from dlmspec.resolve import resolve

    spec = load(spec_file(tmp_path, ANNEAL, {"model.transformer_impl": "auto", "model.attention_backend": None})).spec
    assert resolve(spec).transformer_impl == "local"
