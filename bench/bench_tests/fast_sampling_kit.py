"""Builders for the fast-sampling suite's CPU tests: a tiny runtime checkpoint of a model LLaDA's
modelling code can express (no q/k norm, no biases, head width = hidden / heads), a task folder of
held-out addition prompts, and where the offline data kit's GPT-2 tokenizer lies.

The checkpoint is written the way the dlmspec runtime writes one (``build_layer_spec`` /
``build_model`` / ``spec_record`` / ``save_checkpoint``), as tests/kits/tiny_ckpt.py does, on a
one-process gloo world with megatron-core's model-parallel state on CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Optional

VOCAB, PADDED, EOD, MASK = 50257, 50304, 50256, 50257


def shared_gpt2() -> Optional[Path]:
    """The data kit's ``tokenizers/gpt2`` folder (``$DLMSPEC_SHARED_DATA``, ``../shared/data`` beside
    the checkout, ``/work/shared/data``), or ``None`` when none is found."""
    root = Path(__file__).resolve().parents[2]
    env = os.environ.get("DLMSPEC_SHARED_DATA")
    for base in ([Path(env)] if env else [root.parent / "shared" / "data", Path("/work/shared/data")]):
        if (base / "tokenizers" / "gpt2" / "vocab.json").is_file():
            return base / "tokenizers" / "gpt2"
    return None


def megatron_cpu_world(tmp: Path) -> "contextlib.AbstractContextManager[None]":
    """A one-process gloo world with megatron-core's model-parallel state (TP = PP = 1) on CPU, its
    file store in ``tmp`` (:func:`dlmspec.backends.megatron.distributed.one_rank_world`),
    ``torch.cuda.current_device`` / ``synchronize`` patched for the CPU while it lasts."""
    from dlmspec.backends.megatron.distributed import one_rank_world

    return one_rank_world("cpu", tmp)


def write_llada_compatible_checkpoint(run_dir: Path, gpt2: Path, *, seed: int = 0) -> Path:
    """A one-layer bidirectional masked-diffusion ``GPTModel`` (hidden 32, 4 heads, 2 groups, no q/k
    norm), saved as a runtime checkpoint under ``run_dir/checkpoints``; call inside
    :func:`megatron_cpu_world`. Returns the ``iter_*`` folder."""
    import torch
    import torch.nn.functional as F
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    from dlmspec.backends.megatron.checkpointing import save_checkpoint
    from dlmspec.backends.megatron.config import ObjectiveConfig, RunConfig, ScheduleConfig
    from dlmspec.backends.megatron.data import DataConfig
    from dlmspec.backends.megatron.layers import build_layer_spec, build_model, layer_spec_attention, layer_spec_backend
    from dlmspec.backends.megatron.spec_record import SpecLock, spec_metadata, spec_record

    torch.manual_seed(seed)
    config = TransformerConfig(
        num_layers=1, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, num_query_groups=2, kv_channels=8,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        qk_layernorm=False, hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False,
    )
    spec = build_layer_spec(attention="bidirectional", qk_layernorm=False, use_transformer_engine=False)
    model_kwargs = dict(vocab_size=PADDED, max_sequence_length=128, position_embedding_type="rope",
                        rotary_base=10000, rotary_percent=1.0, share_embeddings_and_output_weights=False)
    chunks = build_model(config, layer_spec=spec, **model_kwargs)
    with torch.no_grad():  # a sharper output distribution than the init's, so greedy choices have no near-ties
        for p in chunks[0].parameters():
            p.mul_(4.0)
    run = RunConfig(
        objective=ObjectiveConfig(kind="mdm", mask_token_id=MASK),
        data=DataConfig(seq_length=32, vocab_size=VOCAB, eod_id=EOD, mock=True),
        schedule=ScheduleConfig(micro_batch_size=1, global_batch_size=1, train_iters=10), name="tiny-llada", seed=seed,
    )
    record = spec_record(
        run, transformer_config=config, model_kwargs=model_kwargs, optimizer_config=OptimizerConfig(lr=1e-3),
        attention=layer_spec_attention(spec), block_size=None, parallel_sizes={"tensor_model_parallel_size": 1},
        world_size=1, tokenizer={"type": "GPT2BPETokenizer", "vocab_file": str(gpt2 / "vocab.json"),
                                 "merge_file": str(gpt2 / "merges.txt")},
    )
    path = save_checkpoint(
        str(run_dir / "checkpoints"), iteration=10, model=chunks, consumed_train_samples=0, seed=seed,
        metadata={"layer_spec": layer_spec_backend(spec), "spec": spec_metadata(SpecLock(content_hash="sha256:" + "0" * 64, text=None), record)},
        spec_lock_text=None,
    )
    return Path(path)


def write_task(folder: Path, n: int) -> Path:
    """``folder/test.jsonl``: ``n`` addition rows as ``dlmspec task make`` writes them (digits after a
    space), of two prompt lengths, so the batching by length is exercised."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        a, b = (10 + i, 3 + i) if i % 2 else (100 + i, 20 + i)
        digits = lambda x: "".join(" " + d for d in str(x))  # noqa: E731
        rows.append({"id": f"addition-test-{i:06d}", "prompt": f"{digits(a)} +{digits(b)} =", "answer": digits(a + b)})
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def suite_inputs(tmp: Path, spec: Optional[Path] = None) -> list:
    """``bench/sampling/fast_sampling.py`` flags pointing at a complete set of the suite's inputs made
    in ``tmp`` (Fast-dLLM's files, the peers' wheels, a GPT-2 tokenizer folder: empty stand-ins),
    with ``--spec spec`` when given (else the bundled specs)."""
    from bench.sampling import fast_sampling

    fd = tmp / "fast-dllm"
    for name in fast_sampling.FAST_DLLM_FILES:
        (fd / name).parent.mkdir(parents=True, exist_ok=True)
        (fd / name).write_text("x\n")
    wheels = tmp / "wheels"
    wheels.mkdir()
    for name in ("transformers-4.49.0-py3-none-any.whl", "tokenizers-0.21.4-cp39-abi3-manylinux2014_x86_64.whl",
                 "huggingface_hub-0.36.2-py3-none-any.whl"):
        (wheels / name).write_bytes(b"")
    tok = tmp / "gpt2"
    tok.mkdir()
    (tok / "vocab.json").write_text("{}")
    (tok / "merges.txt").write_text("")
    return ["--fast-dllm", str(fd), "--peer-wheels", str(wheels), "--tokenizer-dir", str(tok),
            *(["--spec", str(spec)] if spec is not None else []),
            "--out", str(tmp / "results"), "--work-dir", str(tmp / "work")]
