"""Helpers of the block-diffusion tests (no test module imports another): a tiny attention LM that
takes any mask object of ``backends/megatron/masks.py`` and position ids, and a one-process CPU
world for ``training.train`` (the megatron-core pieces that need CUDA replaced by fakes, as
tests/integration/runtime/test_runtime_loop.py does)."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

VOCAB, SEQ, EOD, MASK = 128, 32, 127, 126


class TinyMaskedLM(torch.nn.Module):
    """Embedding + learned positions (read from ``position_ids``) + two single-head attention
    layers applying a mask object's dense form + a head: ``forward(input_ids [b, N], position_ids
    [b, N], mask) -> logits [b, N, V]`` (``mask`` ``None``: bidirectional)."""

    def __init__(self, vocab: int = 16, dim: int = 16, max_positions: int = 64, layers: int = 2, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.nn.Parameter(torch.randn(vocab, dim, generator=g) * 0.5)
        self.pos = torch.nn.Parameter(torch.randn(max_positions, dim, generator=g) * 0.5)
        self.qkv = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(3, dim, dim, generator=g) / dim ** 0.5) for _ in range(layers)])
        self.head = torch.nn.Parameter(torch.randn(dim, vocab, generator=g) / dim ** 0.5)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask=None) -> torch.Tensor:
        x = self.embed[input_ids] + self.pos[position_ids]
        n = input_ids.shape[1]
        allowed = None if mask is None else mask.allowed(n, n)[:, 0]  # [b | 1, n, n]
        for w in self.qkv:
            q, k, v = x @ w[0], x @ w[1], x @ w[2]
            scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
            if allowed is not None:
                scores = scores.masked_fill(~allowed, float("-inf"))
            x = x + torch.softmax(scores, dim=-1) @ v
        return x @ self.head


class FakeOptimizer:
    """What the loop uses of a megatron optimizer (megatron's allocates on CUDA)."""

    def __init__(self) -> None:
        self.param_groups = [{"params": [], "lr": 0.0}]

    def zero_grad(self) -> None:
        pass

    def step(self):
        return True, 1.0, None

    def scale_loss(self, loss):
        return loss

    def sharded_state_dict(self, state, is_loading=False, metadata=None):
        return {}

    def load_state_dict(self, state) -> None:
        pass


def forward_backward(*, forward_step_func, data_iterator, model, num_microbatches, seq_length, micro_batch_size,
                     decoder_seq_length, forward_only, seen=None):
    """megatron-core's no-pipelining schedule without CUDA: forward step, loss, backward per
    microbatch; ``seen`` collects each model output's shape and the class name of the model's
    rotary embedding (``None``: none)."""
    chunk = model[0] if isinstance(model, list) else model
    reports = []
    for _ in range(num_microbatches):
        output, loss_func = forward_step_func(data_iterator, chunk)
        if seen is not None:
            inner = chunk
            while hasattr(inner, "module") and not hasattr(inner, "rotary_pos_emb"):
                inner = inner.module
            rotary = getattr(inner, "rotary_pos_emb", None)
            seen.append((tuple(output.shape), None if rotary is None else type(rotary).__name__))
        loss_sum, _, report = loss_func(output)
        if not forward_only:
            loss_sum.backward()
        reports.append(report)
    return reports


@contextlib.contextmanager
def cpu_train_world(store_dir, monkeypatch, seen=None):
    """A one-process gloo world, CUDA calls pointed at the CPU, optimizer and schedule faked."""
    import functools

    from megatron.core import parallel_state

    from dlmspec.backends.megatron import checks, training

    created = False
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{store_dir / 'store'}", rank=0, world_size=1)
        created = True
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    monkeypatch.setattr(checks, "cuda_problem", lambda **kwargs: None)
    monkeypatch.setattr(training, "prestart_checkpoint_helpers", lambda: None)
    monkeypatch.setattr(training, "get_megatron_optimizer", lambda config, model: FakeOptimizer())
    monkeypatch.setattr(training, "get_forward_backward_func", lambda: functools.partial(forward_backward, seen=seen))
    try:
        yield
    finally:
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        if created:
            dist.destroy_process_group()


def tiny_transformer_config():
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
        kv_channels=16, normalization="RMSNorm", gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, bias_activation_fusion=False,
        bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
        gradient_accumulation_fusion=False, calculate_per_token_loss=True,
    )
