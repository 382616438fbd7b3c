"""The rules of block diffusion (dlmspec/check/block_diffusion.py): the bundled demo-bd3lm spec is
clean, and each setting block diffusion cannot run (no or a non-dividing block size, an empty
clipped range, Transformer Engine layers, context or pipeline parallelism, document masks, cut
sequences, block_causal layers) is refused at its key with a fix that validates; SDPA is a
warning that names FlexAttention; block diffusion's keys on another objective are ignored loudly."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlmspec.check import find
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
BD3 = ROOT / "specs" / "demo-bd3lm.toml"
DLM = ROOT / "specs" / "demo-dlm.toml"


def _spec_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "bd3.toml"
    path.write_text(f'extends = "{BD3}"\nname = "bd3-case"\n{body}\n', encoding="utf-8")
    return path


def _issues(spec):
    return {i.rule: i for i in find(("spec", "runtime"), spec)}


def test_the_bundled_block_diffusion_spec_has_no_error_or_warning() -> None:
    issues = find(("spec", "runtime"), load(BD3).spec)
    assert [i for i in issues if i.severity in ("error", "warning")] == []


CASES = [
    ("[objective]\nblock_size = 24", "bd3lm-block-divides-seq", "objective.block_size", {"objective.block_size": 16}),
    ("[objective]\nnoise_clip_min = 0.8\nnoise_clip_max = 0.3", "bd3lm-noise-clip-order", "objective.noise_clip_min",
     None),
    ('[model]\ntransformer_impl = "transformer_engine"\nattention_backend = "auto"', "bd3lm-transformer-engine",
     "model.transformer_impl", {"model.transformer_impl": "local"}),
    ("[objective]\nvariable_length_prob = 0.01", "bd3lm-variable-length", "objective.variable_length_prob",
     {"objective.variable_length_prob": 0.0}),
    ('[objective]\nattention_mask = "block_causal"', "bd3lm-attention-mask", "objective.attention_mask", None),
    ("[data]\nreset_attention_mask = true", "bd3lm-document-mask", "data.reset_attention_mask",
     {"data.reset_attention_mask": False}),
    ('[model]\nattention_backend = "sdpa"', "bd3lm-dense-sdpa", "model.attention_backend",
     {"model.attention_backend": "flex"}),
]


@pytest.mark.parametrize("body,rule,key,fix", CASES)
def test_a_setting_block_diffusion_cannot_run_is_reported_at_its_key(tmp_path, body, rule, key, fix) -> None:
    issues = _issues(load(_spec_file(tmp_path, body)).spec)
    assert rule in issues, sorted(issues)
    assert issues[rule].key == key
    if fix is not None:
        assert issues[rule].fix.set == fix


def test_a_missing_block_size_is_refused_with_a_divisor() -> None:
    spec = load(DLM, ['objective.kind="bd3lm"', "objective.variable_length_prob=0.0",
                       'model.transformer_impl="local"', 'model.attention_backend="flex"']).spec
    issues = _issues(spec)
    assert issues["bd3lm-needs-block-size"].severity == "error"
    assert issues["bd3lm-needs-block-size"].fix.set == {"objective.block_size": 16}
    assert "block-size-ignored" not in issues


@pytest.mark.parametrize("sets,rule,key", [
    (["parallel.context_parallel_size=2", "cluster.gpus_per_node=2"], "bd3lm-context-parallel",
     "parallel.context_parallel_size"),
    (["parallel.pipeline_model_parallel_size=2", "cluster.gpus_per_node=2"], "bd3lm-pipeline",
     "parallel.pipeline_model_parallel_size"),
])
def test_context_and_pipeline_parallelism_are_refused_with_the_reason(sets, rule, key) -> None:
    issues = _issues(load(BD3, sets).spec)
    assert rule in issues and issues[rule].key == key and issues[rule].severity == "error"


def test_block_diffusion_keys_on_masked_diffusion_are_reported_ignored() -> None:
    issues = find(("spec",), load(DLM, ["objective.ar_loss_weight=0.5", "objective.noise_clip_max=0.8"]).spec)
    keys = {i.key for i in issues if i.rule == "bd3lm-keys-ignored"}
    assert keys == {"objective.ar_loss_weight", "objective.noise_clip_max"}


def test_auto_layers_take_the_local_path_for_block_diffusion() -> None:
    from dlmspec.resolve import resolve

    r = resolve(load(BD3, ['model.transformer_impl="auto"']).spec)
    assert r.transformer_impl == "local"
