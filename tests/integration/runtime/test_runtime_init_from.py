"""checkpoint.init_from in the runtime (backends/megatron/init_from.py), on CPU.

A tiny random Hugging Face Qwen3 (backends/convert/tiny.py) is converted into the run's cache
by the real child-process converter and loaded into the runtime's own GPTModel (build_model,
local spec with SDPA, megatron DDP): the logits equal the Hugging Face model's. Then: a second
start reuses the cache, a cache without its completion marker or made from other weights is
converted again, a model whose dimensions differ is refused before any conversion, a resume
wins over init_from, ``mcore:`` loads a dlmspec run's checkpoint, and in a world of two
processes rank 0 converts while rank 1 waits (and both stop on rank 0's error).

megatron-core on CPU as in tests/integration/runtime/test_runtime_model.py: a gloo world of one process with
``torch.cuda.current_device`` patched to ``"cpu"``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from cpu_world_kit import megatron_cpu_world, spawn_world
import torch
import torch.distributed as dist

from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import unwrap_model

from dlmspec.backends.convert import dims_from_hf_config, hf_to_mcore
from dlmspec.backends.convert.hf_io import read_hf_config
from dlmspec.backends.convert.mcore_model import transformer_config_kwargs
from dlmspec.backends.convert.tiny import make_tiny_hf
from dlmspec.backends.megatron import init_from as init_mod
from dlmspec.backends.megatron.init_from import (
    MARKER_NAME,
    InitFromError,
    default_cache_dir,
    initialize_from,
    parse_init_from,
)
from dlmspec.backends.megatron.layers import build_layer_spec, build_model
from dlmspec.backends.megatron.checkpointing import save_checkpoint, start_point
from dlmspec.backends.megatron.config import CheckpointConfig

ATOL = 1e-4


@pytest.fixture(scope="module", autouse=True)
def cpu_megatron(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        yield


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Qwen3 folder (qk-norm, head_dim 24 != hidden/heads) and its reference model."""
    src, reference = make_tiny_hf("qwen3", tmp_path_factory.mktemp("hf") / "qwen3", seed=3)
    return src, reference


def _run(src: Path, *, dtype=torch.float32, **dims_changes):
    """The runtime's TransformerConfig, GPTModel kwargs and model for the folder's dimensions
    (optionally changed), as a compiled train.py builds them (build_model, DDP)."""
    dims = dims_from_hf_config(read_hf_config(src))
    config = TransformerConfig(**{**transformer_config_kwargs(dims, params_dtype=dtype), **dims_changes},
                               calculate_per_token_loss=True)
    model_kwargs = dict(vocab_size=dims.padded_vocab_size, max_sequence_length=128, position_embedding_type="rope",
                        rotary_base=int(dims.rotary_base), rotary_percent=1.0,
                        share_embeddings_and_output_weights=dims.tied)
    spec = build_layer_spec(attention="causal", qk_layernorm=dims.qk_layernorm, normalization="RMSNorm",
                            use_transformer_engine=False)
    torch.manual_seed(0)
    model = build_model(config, layer_spec=spec, ddp_config=DistributedDataParallelConfig(), **model_kwargs)
    return config, model_kwargs, model


def _logits(model, tokens: torch.Tensor) -> torch.Tensor:
    gpt = unwrap_model(model[0])
    gpt.eval()
    pos = torch.arange(tokens.shape[1]).expand_as(tokens)
    with torch.no_grad():
        return gpt(tokens, pos, None).float()


TOKENS = torch.randint(0, 100, (2, 13), generator=torch.Generator().manual_seed(7))


def _in_process(calls: list):
    """A converter that runs hf_to_mcore here (world of one) instead of in a child process."""
    def convert(src, dst, dims):
        calls.append(dst)
        hf_to_mcore(src, dst, dims=dims)
    return convert


def test_hf_weights_are_converted_once_and_give_the_hf_logits(tiny, tmp_path, monkeypatch):
    src, reference = tiny
    config, model_kwargs, model = _run(src)
    with torch.no_grad():
        expected = reference(input_ids=TOKENS).logits
    assert (_logits(model, TOKENS)[..., :100] - expected).abs().max() > 0.1  # random init differs
    cache = tmp_path / "ckpt" / "init_from_hf"
    got = initialize_from(f"hf:{src}", model=model, cache_dir=str(cache), transformer_config=config,
                          model_kwargs=model_kwargs)
    assert got.kind == "hf" and got.cache == "converted" and got.reason == "no converted copy yet"
    assert got.source == str(src) and got.checkpoint == str(cache) and got.convert_seconds > 0
    marker = json.loads((cache / MARKER_NAME).read_text())
    assert marker["fingerprint"]["source"] == str(src)
    assert marker["fingerprint"]["dims"]["padded_vocab_size"] == model_kwargs["vocab_size"] == 128
    assert (cache / "metadata.json").is_file()
    assert [p.name for p in cache.parent.iterdir()] == ["init_from_hf"]  # no temporary leftovers
    logits = _logits(model, TOKENS)
    assert logits.shape == (2, 13, 128)
    assert torch.allclose(logits[..., :100], expected, atol=ATOL, rtol=0), float((logits[..., :100] - expected).abs().max())
    assert "converted into" in got.describe() and "iteration 0" in got.describe()
    assert got.to_record()["cache"] == "converted" and json.dumps(got.to_record())

    # A second start (a new model, as after a relaunch) reuses the cache: no conversion.
    def refuse(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(init_mod, "run_converter", refuse)
    _, _, again = _run(src)
    second = initialize_from(f"hf:{src}", model=again, cache_dir=str(cache), transformer_config=config,
                             model_kwargs=model_kwargs)
    assert second.cache == "reused" and second.reason is None and second.convert_seconds == 0.0
    assert torch.equal(_logits(again, TOKENS), logits)


def test_a_half_written_or_stale_cache_is_converted_again(tiny, tmp_path, monkeypatch):
    src, reference = tiny
    config, model_kwargs, model = _run(src)
    calls: list = []
    monkeypatch.setattr(init_mod, "run_converter", _in_process(calls))
    cache = tmp_path / "init_from_hf"
    # an interrupted conversion: files but no marker, and a temporary directory beside it
    cache.mkdir()
    (cache / "metadata.json").write_text("{}")
    (cache / "__0_0.distcp").write_bytes(b"partial")
    (tmp_path / ".init_from_hf.tmp-dead").mkdir()
    got = initialize_from(f"hf:{src}", model=model, cache_dir=str(cache), transformer_config=config,
                          model_kwargs=model_kwargs)
    assert len(calls) == 1 and got.cache == "converted" and "no completion marker" in got.reason
    assert sorted(p.name for p in tmp_path.iterdir()) == ["init_from_hf"]
    with torch.no_grad():
        expected = reference(input_ids=TOKENS).logits
    assert torch.allclose(_logits(model, TOKENS)[..., :100], expected, atol=ATOL, rtol=0)

    # other weights in the same folder (re-downloaded: new size / mtime): converted again
    st = os.stat(src / "model.safetensors")
    os.utime(src / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    try:
        third = initialize_from(f"hf:{src}", model=model, cache_dir=str(cache), transformer_config=config,
                                model_kwargs=model_kwargs)
    finally:
        os.utime(src / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert len(calls) == 2 and third.cache == "converted" and "another source" in third.reason


def test_bf16_run_loads_the_fp32_weights_cast(tiny, tmp_path, monkeypatch):
    src, reference = tiny
    config, model_kwargs, model = _run(src, dtype=torch.bfloat16)
    monkeypatch.setattr(init_mod, "run_converter", _in_process([]))
    initialize_from(f"hf:{src}", model=model, cache_dir=str(tmp_path / "c"), transformer_config=config,
                    model_kwargs=model_kwargs)
    emb = unwrap_model(model[0]).embedding.word_embeddings.weight
    assert emb.dtype == torch.bfloat16
    assert torch.equal(emb[:100], reference.model.embed_tokens.weight.detach().to(torch.bfloat16))
    assert torch.count_nonzero(emb[100:]) == 0  # megatron's vocabulary padding rows


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"hidden_size": 96}, "model.hidden_size"),
        ({"num_query_groups": 4}, "model.num_query_groups"),
        ({"qk_layernorm": False}, "model.qk_layernorm"),
    ],
)
def test_a_model_of_other_dimensions_is_refused_before_converting(tiny, tmp_path, monkeypatch, changes, key):
    src, _ = tiny
    config, model_kwargs, model = _run(src, **changes)
    calls: list = []
    monkeypatch.setattr(init_mod, "run_converter", _in_process(calls))
    with pytest.raises(InitFromError) as info:
        initialize_from(f"hf:{src}", model=model, cache_dir=str(tmp_path / "c"), transformer_config=config,
                        model_kwargs=model_kwargs)
    assert key in str(info.value) and "the checkpoint" in str(info.value)
    assert calls == [] and not (tmp_path / "c").exists()


def test_missing_and_malformed_sources_are_named(tiny, tmp_path):
    src, _ = tiny
    config, model_kwargs, model = _run(src)
    for bad in ("/models/x", "hf:", "safetensors:/x"):
        with pytest.raises(InitFromError, match="hf:PATH"):
            parse_init_from(bad)
    with pytest.raises(InitFromError, match="not a Hugging Face folder"):
        initialize_from(f"hf:{tmp_path}/nope", model=model, cache_dir=str(tmp_path / "c"),
                        transformer_config=config, model_kwargs=model_kwargs)
    with pytest.raises(InitFromError, match="does not exist"):
        initialize_from(f"mcore:{tmp_path}/nope", model=model, cache_dir=str(tmp_path / "c"),
                        transformer_config=config, model_kwargs=model_kwargs)
    assert parse_init_from("mcore:runs/x:y") == ("mcore", "runs/x:y")
    assert default_cache_dir("runs/a/ckpt", "runs/a") == "runs/a/ckpt/init_from_hf"
    assert default_cache_dir(None, "runs/a") == "runs/a/init_from_hf"


def test_resume_wins_over_init_from(tmp_path):
    save = tmp_path / "ckpt"
    ckpt = CheckpointConfig(save_dir=str(save), init_from="hf:/models/x")
    assert start_point(ckpt) == (None, "hf:/models/x")  # nothing to resume: the initial weights
    (save / "iter_0000010").mkdir(parents=True)
    (save / "latest").write_text("iter_0000010\n")
    assert start_point(ckpt) == (str(save / "iter_0000010"), None)  # a restarted job continues
    assert start_point(CheckpointConfig(save_dir=str(save), resume=False, init_from="hf:/models/x")) == (
        None, "hf:/models/x")
    other = CheckpointConfig(save_dir=str(tmp_path / "new"), load_dir=str(save), init_from="mcore:/m")
    assert start_point(other) == (str(save / "iter_0000010"), None)
    assert start_point(CheckpointConfig(save_dir=str(tmp_path / "new"))) == (None, None)


def test_mcore_init_from_a_dlmspec_run_checkpoint(tiny, tmp_path):
    src, reference = tiny
    config, model_kwargs, trained = _run(src)
    with torch.no_grad():
        for p in unwrap_model(trained[0]).parameters():
            p.add_(0.01)
    save_checkpoint(str(tmp_path / "run"), iteration=5, model=trained, consumed_train_samples=40, seed=1)
    _, _, fresh = _run(src)
    got = initialize_from(f"mcore:{tmp_path / 'run'}", model=fresh, cache_dir=str(tmp_path / "unused"),
                          transformer_config=config, model_kwargs=model_kwargs)
    assert got.kind == "mcore" and got.cache is None and got.checkpoint == str(tmp_path / "run" / "iter_0000005")
    assert not (tmp_path / "unused").exists()
    a, b = unwrap_model(trained[0]).state_dict(), unwrap_model(fresh[0]).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a if torch.is_tensor(a[k]))


def _two_ranks(rank: int, store: str, src: str, converted: str, work: str) -> None:
    """One rank of the two-process world: forked from cpu_world_kit's fork server (torch and
    megatron-core imported there once), a gloo group on a file store; its result in its own file."""
    import torch.cuda

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    parallel_state.initialize_model_parallel(1, 1)
    calls = []

    def fake(s, dst, dims):  # a copy of the test's conversion stands in for the child process
        calls.append(dst)
        shutil.copytree(converted, dst)

    init_mod.run_converter = fake
    dims = dims_from_hf_config(read_hf_config(src))
    config = TransformerConfig(**transformer_config_kwargs(dims), calculate_per_token_loss=True)
    kw = dict(vocab_size=dims.padded_vocab_size, max_sequence_length=128, position_embedding_type="rope",
              rotary_base=int(dims.rotary_base), share_embeddings_and_output_weights=dims.tied)
    model = build_model(config, layer_spec=build_layer_spec(attention="causal", qk_layernorm=True,
                        normalization="RMSNorm", use_transformer_engine=False), **kw)
    out = {"rank": rank}
    try:
        initialize_from("hf:" + work + "/missing", model=model, cache_dir=work + "/cache", transformer_config=config,
                        model_kwargs=kw)
    except InitFromError as exc:
        out["error"] = str(exc)
    got = initialize_from("hf:" + src, model=model, cache_dir=work + "/cache", transformer_config=config,
                          model_kwargs=kw)
    out.update(cache=got.cache, calls=len(calls),
               emb=float(unwrap_model(model[0]).embedding.word_embeddings.weight[:100].double().sum()))
    with open(os.path.join(work, f"result{rank}.json"), "w") as f:
        json.dump(out, f)
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def test_two_ranks_rank0_converts_and_both_load(tiny, tmp_path):
    src, reference = tiny
    converted = tmp_path / "converted"
    hf_to_mcore(src, converted, dims=dims_from_hf_config(read_hf_config(src)))
    spawn_world(_two_ranks, args=(str(tmp_path / "store"), str(src), str(converted), str(tmp_path)), nprocs=2)
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("result*.json"))]
    assert len(results) == 2
    by_rank = {r["rank"]: r for r in results}
    for r in results:  # both ranks stopped on rank 0's error instead of waiting
        assert "not a Hugging Face folder" in r["error"]
    assert (by_rank[0]["calls"], by_rank[1]["calls"]) == (1, 0)  # only rank 0 converts
    assert by_rank[0]["cache"] == by_rank[1]["cache"] == "converted"
    expected = float(reference.model.embed_tokens.weight.detach().double().sum())
    assert by_rank[0]["emb"] == pytest.approx(expected) and by_rank[1]["emb"] == pytest.approx(expected)
    assert (tmp_path / "cache" / MARKER_NAME).is_file()
