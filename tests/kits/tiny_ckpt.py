"""A tiny checkpoint as the dlmspec runtime writes it, built on CPU for the loader and CLI tests.

:func:`write_runtime_checkpoint` builds a one-layer ``GPTModel`` with the runtime's own
``build_layer_spec`` / ``build_model``, records the spec with the runtime's ``spec_record`` and
saves it with the runtime's ``save_checkpoint`` (``runs/NAME/checkpoints/iter_*`` + ``latest``),
so the loader reads exactly what a training run leaves. GPT-2's tokenizer of the shared data kit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest
import torch
from shared_kit import SHARED_DATA

GPT2 = SHARED_DATA / "tokenizers" / "gpt2"
VOCAB, PADDED, EOD, MASK = 50257, 50304, 50256, 50257
#: GPT-2 ids of " The quick brown fox jumps over the lazy" (any 8 real ids would do).
TOKENS = torch.tensor([[464, 2068, 7586, 21831, 18045, 625, 262, 16931]])
#: The spec.lock.toml saved in the tiny checkpoints: its [generate] table.
LOCK_TEXT = "[generate]\ngen_length = 16\nsteps = 8\nblock_length = 8\n"


def record_and_model(kind: str = "mdm", *, seed: int = 0, seq_length: int = 32):
    """``(chunks, record, layer_spec)`` of a tiny run; call inside a megatron CPU world."""
    import torch.nn.functional as F
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    from dlmspec.backends.megatron.config import ObjectiveConfig, RunConfig, ScheduleConfig
    from dlmspec.backends.megatron.data import DataConfig
    from dlmspec.backends.megatron.layers import build_layer_spec, build_model, layer_spec_attention
    from dlmspec.backends.megatron.spec_record import spec_record

    torch.manual_seed(seed)
    config = TransformerConfig(
        num_layers=1, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, num_query_groups=2, kv_channels=8,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        qk_layernorm=True, hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False,
    )
    attention = "bidirectional" if kind == "mdm" else "causal"
    spec = build_layer_spec(attention=attention, qk_layernorm=True, use_transformer_engine=False)
    model_kwargs = dict(vocab_size=PADDED, max_sequence_length=128, position_embedding_type="rope",
                        rotary_base=10000, rotary_percent=1.0, share_embeddings_and_output_weights=False)
    chunks = build_model(config, layer_spec=spec, **model_kwargs)
    run = RunConfig(
        objective=ObjectiveConfig(kind=kind, mask_token_id=MASK if kind == "mdm" else None),
        data=DataConfig(seq_length=seq_length, vocab_size=VOCAB, eod_id=EOD, mock=True),
        schedule=ScheduleConfig(micro_batch_size=1, global_batch_size=1, train_iters=10), name=f"tiny-{kind}",
        seed=seed,
    )
    record = spec_record(
        run, transformer_config=config, model_kwargs=model_kwargs, optimizer_config=OptimizerConfig(lr=1e-3),
        attention=layer_spec_attention(spec), block_size=None, parallel_sizes={"tensor_model_parallel_size": 1},
        world_size=1, tokenizer={"type": "GPT2BPETokenizer", "vocab_file": str(GPT2 / "vocab.json"),
                                 "merge_file": str(GPT2 / "merges.txt")},
    )
    return chunks, record, spec


def write_runtime_checkpoint(run_dir: Path, kind: str = "mdm", *, iteration: int = 10, seed: int = 0,
                             lock_text: Optional[str] = None, perturb: float = 0.0) -> Path:
    """Save a tiny runtime checkpoint under ``run_dir/checkpoints`` (inside a megatron CPU world).

    Returns:
        The ``iter_*`` folder.
    """
    from dlmspec.backends.megatron.checkpointing import save_checkpoint
    from dlmspec.backends.megatron.layers import layer_spec_backend
    from dlmspec.backends.megatron.spec_record import SpecLock, spec_metadata

    chunks, record, spec = record_and_model(kind, seed=seed)
    if perturb:
        with torch.no_grad():
            for p in chunks[0].parameters():
                p.add_(perturb * torch.randn_like(p))
    lock = SpecLock(content_hash="sha256:" + "0" * 64, text=lock_text)
    path = save_checkpoint(
        str(run_dir / "checkpoints"), iteration=iteration, model=chunks, consumed_train_samples=0, seed=seed,
        metadata={"layer_spec": layer_spec_backend(spec), "spec": spec_metadata(lock, record)},
        spec_lock_text=lock_text,
    )
    return Path(path)


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory):
    """Two runs written once per session: ``{"mdm": (run_dir, iter_dir, logits), "ar": ...}``, the
    logits being the saved model's on :data:`TOKENS` (saving spawns megatron-core's writer process:
    seconds, so the loader and CLI tests share these)."""
    from cpu_world_kit import megatron_cpu_world
    from dlmspec.backends.generate.models import gpt_logits_fn

    root = tmp_path_factory.mktemp("runs")
    out = {}
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        for kind, seed in (("mdm", 0), ("ar", 1)):
            chunks, _, _ = record_and_model(kind, seed=seed)
            ref = gpt_logits_fn(chunks[0].eval())(TOKENS)[..., :VOCAB]
            path = write_runtime_checkpoint(root / kind, kind, seed=seed, lock_text=LOCK_TEXT)
            out[kind] = (root / kind, path, ref)
    return out


def gpt2_tokenizer():
    """GPT-2's BPE of the shared data kit (:func:`dlmspec.tokenizers.build_tokenizer`)."""
    from dlmspec.tokenizers import build_tokenizer

    return build_tokenizer("GPT2BPETokenizer", vocab_file=str(GPT2 / "vocab.json"), merge_file=str(GPT2 / "merges.txt"))


def write_dataset(prefix: Path, texts: list[str]) -> Path:
    """A Megatron indexed dataset (``prefix.bin`` / ``.idx``) of ``texts`` tokenized with GPT-2, EOD appended."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    tok = gpt2_tokenizer()
    builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.uint16)
    for text in texts:
        ids = tok.tokenize(text) + [EOD]
        builder.add_document(torch.tensor(ids, dtype=torch.int64), [len(ids)])
    builder.finalize(str(prefix) + ".idx")
    return prefix


#: Sentences of the tests' dataset (any English text would do).
TEXTS = [
    "The quick brown fox jumps over the lazy dog. It was a bright cold day in April.",
    "Python is a programming language that lets you work quickly and integrate systems effectively.",
    "A list is a sequence of values; a dictionary maps keys to values. Both are built in.",
    "The sun rose over the hills, and the town woke slowly to the sound of the bells.",
]
