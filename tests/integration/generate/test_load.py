"""backends/generate/load.py: a checkpoint the runtime wrote loads into the model its spec record
describes (the same logits as the model that was saved), from the run, save or iter_* folder; bad
paths are refused naming why and what to pass."""

from __future__ import annotations

import json

import pytest
import torch

from tiny_ckpt import EOD, MASK, TOKENS, VOCAB, tiny_runs  # noqa: F401 (a fixture)

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)

def test_a_runtime_checkpoint_loads_into_the_model_it_records(tiny_runs):
    from dlmspec.backends.generate.load import load_model

    run_dir, path, ref = tiny_runs["mdm"]
    model = load_model(str(run_dir), device="cpu")
    try:
        assert (model.kind, model.mask_token_id, model.eos_token_id, model.pad_token_id) == ("mdm", MASK, EOD, EOD)
        assert (model.source, model.path, model.iteration, model.vocab_size) == ("dlmspec", str(path), 10, VOCAB)
        assert model.generate_table == {"gen_length": 16, "steps": 8, "block_length": 8}
        assert model.record["model.hidden_size"] == 32
        logits = model.logits_fn(TOKENS)
        assert logits.shape == (1, TOKENS.shape[1], VOCAB)
        assert torch.allclose(logits, ref, atol=1e-5)
        assert model.decode(model.encode(" the quick brown fox")) == " the quick brown fox"
    finally:
        model.close()
    import torch.distributed as dist

    assert not dist.is_initialized()  # close() released the group loading created


def test_the_save_folder_and_the_iter_folder_load_the_same_checkpoint(tiny_runs):
    from dlmspec.backends.generate.load import find_checkpoint

    run_dir, path, _ = tiny_runs["mdm"]
    assert find_checkpoint(str(run_dir)) == ("dlmspec", str(path))
    assert find_checkpoint(str(run_dir / "checkpoints")) == ("dlmspec", str(path))
    assert find_checkpoint(str(path)) == ("dlmspec", str(path))


def test_an_ar_checkpoint_is_causal(tiny_runs):
    from dlmspec.backends.generate.load import load_model

    run_dir, _, ref = tiny_runs["ar"]
    model = load_model(str(run_dir), device="cpu")
    try:
        assert (model.kind, model.mask_token_id) == ("ar", None)
        logits = model.logits_fn(TOKENS)
        assert torch.allclose(logits, ref, atol=1e-5)
        changed = TOKENS.clone()
        changed[0, -1] = 11
        assert torch.allclose(model.logits_fn(changed)[0, :-1], logits[0, :-1], atol=1e-5)  # the past never sees the future
    finally:
        model.close()


def test_bad_paths_are_refused_with_why_and_a_remedy(tiny_runs, tmp_path):
    from dlmspec.backends.generate.load import LoadError, load_model

    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    norecord = tmp_path / "norecord"
    norecord.mkdir()
    (norecord / "dlmspec.json").write_text(json.dumps({"iteration": 3}))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "latest").write_text("iter_0000100")
    cases = {
        tmp_path / "nowhere": "does not exist",
        tmp_path / "file.txt": "is a file",
        tmp_path / "empty": "is not a checkpoint",
        norecord: "no spec record",
        broken: "does not exist",
    }
    for path, why in cases.items():
        with pytest.raises(LoadError, match=why) as info:
            load_model(str(path), device="cpu")
        assert info.value.fix and info.value.path


def test_a_hugging_face_checkpoint_loads_through_the_converter(tmp_path):
    """(b): an HF folder goes through backends/convert into the runtime's GPTModel: an AR family gives
    the transformers model's logits; a LLaDA one loads as mdm with bidirectional attention."""
    from dlmspec.backends.convert.tiny import make_tiny_hf
    from dlmspec.backends.generate.load import LoadError, load_model

    tokens = torch.tensor([[1, 5, 7, 9, 11, 2]])
    src, reference = make_tiny_hf("qwen3", tmp_path / "qwen3", seed=3)
    model = load_model(str(src), device="cpu")
    try:
        assert (model.kind, model.source, model.mask_token_id, model.tokenizer) == ("ar", "hf", None, None)
        with torch.no_grad():
            want = reference(input_ids=tokens).logits
        assert torch.allclose(model.logits_fn(tokens), want, atol=1e-4)
        # an AR family decodes with megatron-core's KV cache, the tokens of the full recompute
        from dlmspec.backends.generate.config import GenerateConfig
        from dlmspec.backends.generate.sampler import generate_ar

        config = GenerateConfig(kind="ar", gen_length=6)
        prompts = [[1, 5, 7, 9], [11, 2]]
        cached = generate_ar(None, prompts, config, step_fn=model.ar_step_fn(max_new_tokens=6))
        assert cached.generated == generate_ar(model.logits_fn, prompts, config).generated
    finally:
        model.close()
    src, _ = make_tiny_hf("llada", tmp_path / "llada", seed=3)
    with pytest.raises(LoadError, match="outside the padded vocabulary"):
        load_model(str(src), device="cpu", mask_token_id=500)
    model = load_model(str(src), device="cpu")  # the mask token of its config.json
    try:
        assert (model.kind, model.mask_token_id, model.record["objective.attention_mask"]) == ("mdm", 99, "bidirectional")
        changed = tokens.clone()
        changed[0, -1] = 12
        assert not torch.allclose(model.logits_fn(changed)[0, 0], model.logits_fn(tokens)[0, 0])  # sees the future
    finally:
        model.close()


def test_a_loaded_ar_checkpoint_decodes_with_the_cache_and_an_mdm_one_says_why_not(tiny_runs):
    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.load import load_model
    from dlmspec.backends.generate.models import GPTKVCacheStep
    from dlmspec.backends.generate.sampler import generate_ar

    model = load_model(str(tiny_runs["ar"][0]), device="cpu")
    try:
        assert model.kv_cache_fallback is None
        step = model.ar_step_fn(max_new_tokens=6)
        assert isinstance(step, GPTKVCacheStep)
        config = GenerateConfig(kind="ar", gen_length=6, eos_token_id=model.eos_token_id)
        prompts = [model.encode("The quick brown fox"), model.encode("Hello")]
        cached = generate_ar(None, prompts, config, step_fn=step)
        full = generate_ar(model.logits_fn, prompts, config)
        assert cached.generated == full.generated and step.incremental_calls == cached.steps - 1
        assert cached.sequences.max() < model.vocab_size  # the loaded model's columns (no padded vocabulary)
    finally:
        model.close()
    model = load_model(str(tiny_runs["mdm"][0]), device="cpu")
    try:
        assert model.ar_step_fn(max_new_tokens=4) is None and "bidirectional" in model.kv_cache_fallback
    finally:
        model.close()
