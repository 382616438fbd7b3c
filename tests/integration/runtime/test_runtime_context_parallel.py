"""Context parallelism without Transformer Engine: two CPU processes (gloo) against CP = 1.

:class:`~dlmspec.backends.megatron.attention.SDPACoreAttention` all-gathers keys and values over the
CP group (megatron-core ``cp_comm_type = "all_gather"``). Each test spawns a world of two
processes (``cpu_world_kit.spawn_world``, a file store in ``tmp_path``) and checks, on every
rank, that CP = 2 gives what CP = 1 gives on the whole sequence:

* the attention output and dQ/dK/dV of the core attention, rows of this rank's positions
  (megatron's ``2*cp``-chunk layout, :func:`~dlmspec.backends.megatron.attention.cp_rank_positions`),
  for bidirectional, causal and block-causal attention;
* a tiny ``GPTModel`` (RoPE, q/k norm, GQA) through :class:`ObjectiveForwardStep`
  (masks drawn on the full sequence, then ``get_batch_on_this_cp_rank``), megatron DDP and
  ``finalize_model_grads`` (gradients summed over data x context parallel ranks and divided
  by the tokens of the whole batch): per-token loss and every parameter's gradient, for MDM
  (bidirectional) and AR (causal).

Workers patch what megatron-core sends to CUDA (they are separate processes): buffers
allocated on ``torch.cuda.current_device()`` (DDP, the all-gather) and RoPE's CP slice
(``rope_utils.get_pos_emb_on_this_cp_rank`` builds its index with ``pin_memory=True`` and
``.cuda()``; the index logic itself runs unchanged).
"""

from __future__ import annotations

import datetime
import os

import pytest
import torch

WORLD = 2


def _patch_cuda_for_cpu() -> None:
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    plain_tensor = torch.tensor

    def tensor(*args, pin_memory=False, **kwargs):
        return plain_tensor(*args, **kwargs)

    torch.tensor = tensor


def _init(rank: int, store: str) -> None:
    import torch.distributed as dist

    _patch_cuda_for_cpu()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))


def _spawn(fn, tmp_path, *args) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from cpu_world_kit import spawn_world

    spawn_world(fn, args=(str(tmp_path / "store"), *args), nprocs=WORLD)


# --------------------------------------------------------------------------- core attention


def _attention_worker(rank: int, store: str) -> None:
    from types import SimpleNamespace

    from megatron.core import parallel_state
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from dlmspec.backends.megatron.attention import SDPACoreAttention, cp_rank_positions

    _init(rank, store)
    parallel_state.initialize_model_parallel(1, 1, context_parallel_size=WORLD)
    cp_group = parallel_state.get_context_parallel_group()
    assert cp_group.size() == WORLD and cp_group.rank() == rank
    S, b, heads, hn = 24, 2, 4, 8

    def module(mode, block_size, groups, cp):
        config = TransformerConfig(
            num_layers=1, hidden_size=heads * hn, num_attention_heads=heads, num_query_groups=groups,
            kv_channels=hn, attention_dropout=0.0, use_cpu_initialization=True, context_parallel_size=cp,
            cp_comm_type="all_gather" if cp > 1 else None,
        )
        pg = SimpleNamespace(tp=SimpleNamespace(size=lambda: 1), cp=cp_group)
        return SDPACoreAttention(
            config=config, layer_number=1, attn_mask_type=AttnMaskType.no_mask, attention_type="self",
            cp_comm_type=config.cp_comm_type, pg_collection=pg, mode=mode, block_size=block_size,
        )

    positions = cp_rank_positions(S // WORLD, WORLD, rank)
    cases = [("bidirectional", None, 2), ("bidirectional", None, 4), ("causal", None, 2), ("causal", None, 4),
             ("block_causal", 5, 2), ("block_causal", 6, 4), ("block_causal", 64, 2)]
    for seed, (mode, block_size, groups) in enumerate(cases):
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(S, b, heads, hn, generator=g, dtype=torch.float64)
        k = torch.randn(S, b, groups, hn, generator=g, dtype=torch.float64)
        v = torch.randn(S, b, groups, hn, generator=g, dtype=torch.float64)
        dout = torch.randn(S, b, heads * hn, generator=g, dtype=torch.float64)

        full = [t.clone().requires_grad_(True) for t in (q, k, v)]
        ref = module(mode, block_size, groups, cp=1)(*full, None)
        ref.backward(dout)

        local = [t[positions].clone().requires_grad_(True) for t in (q, k, v)]
        out = module(mode, block_size, groups, cp=WORLD)(*local, None)
        out.backward(dout[positions])
        what = f"{mode} block {block_size} groups {groups} rank {rank}"
        torch.testing.assert_close(out, ref[positions], rtol=1e-10, atol=1e-10, msg=lambda m: f"{what}: out {m}")
        for name, mine, theirs in zip("qkv", local, full):
            torch.testing.assert_close(mine.grad, theirs.grad[positions], rtol=1e-10, atol=1e-10,
                                       msg=lambda m: f"{what}: d{name} {m}")
    parallel_state.destroy_model_parallel()


def test_cp2_attention_output_and_grads_equal_cp1(tmp_path):
    _spawn(_attention_worker, tmp_path)


def test_cp_rank_positions_follow_megatrons_batch_slicing():
    from megatron.core import utils

    from dlmspec.backends.megatron.attention import cp_rank_positions

    S, cp = 24, 3
    full = torch.arange(S).unsqueeze(0)
    for rank in range(cp):
        original = (utils.parallel_state.get_context_parallel_world_size,
                    utils.parallel_state.get_context_parallel_rank)
        try:
            utils.parallel_state.get_context_parallel_world_size = lambda: cp
            utils.parallel_state.get_context_parallel_rank = lambda: rank
            sliced = utils.get_batch_on_this_cp_rank({"tokens": full.clone()})["tokens"][0]
        finally:
            (utils.parallel_state.get_context_parallel_world_size,
             utils.parallel_state.get_context_parallel_rank) = original
        assert torch.equal(sliced, cp_rank_positions(S // cp, cp, rank))


def test_unsupported_cp_comm_types_are_refused():
    from types import SimpleNamespace

    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from dlmspec.backends.megatron.attention import SDPACoreAttention

    for comm in ("p2p", "a2a", None):
        config = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4, kv_channels=8,
                                   use_cpu_initialization=True, context_parallel_size=2)
        with pytest.raises(ValueError, match="cp_comm_type"):
            SDPACoreAttention(config=config, layer_number=1, attn_mask_type=AttnMaskType.no_mask,
                              attention_type="self", cp_comm_type=comm,
                              pg_collection=SimpleNamespace(tp=SimpleNamespace(size=lambda: 1)))


# --------------------------------------------------------------------------- GPTModel


VOCAB, SEQ, EOD, MASK = 128, 32, 127, 126


def _model_worker(rank: int, store: str, kind: str) -> None:
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.utils import unwrap_model

    from dlmspec.backends.megatron.attention import cp_rank_positions
    from dlmspec.backends.megatron.layers import build_layer_spec, build_model
    from dlmspec.backends.megatron.microbatches import MicrobatchItem
    from dlmspec.backends.megatron.objective import AutoregressiveObjective, MaskedDiffusionObjective
    from dlmspec.backends.megatron.rng import TRAIN_STREAM
    from dlmspec.backends.megatron.stage import ObjectiveForwardStep

    _init(rank, store)
    torch.set_default_dtype(torch.float64)  # the norms' weights too: compare to ~1e-12
    attention = "bidirectional" if kind == "mdm" else "causal"
    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, 100, (2, SEQ), generator=g)
    batch = {"tokens": tokens, "position_ids": torch.arange(SEQ).expand(2, SEQ).clone()}
    item = MicrobatchItem(TRAIN_STREAM, 3, 0, batch)

    def run(cp: int, weights=None):
        parallel_state.initialize_model_parallel(1, 1, context_parallel_size=cp)
        config = TransformerConfig(
            num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
            kv_channels=16, normalization="RMSNorm", gated_linear_unit=True,
            activation_func=torch.nn.functional.silu, add_bias_linear=False, qk_layernorm=True,
            hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True, params_dtype=torch.float64,
            bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
            apply_rope_fusion=False, gradient_accumulation_fusion=False, calculate_per_token_loss=True,
            context_parallel_size=cp, cp_comm_type="all_gather" if cp > 1 else None,
        )
        torch.manual_seed(5)
        model = build_model(
            config, layer_spec=build_layer_spec(attention=attention, qk_layernorm=True, use_transformer_engine=False),
            vocab_size=VOCAB, max_sequence_length=SEQ, position_embedding_type="rope", rotary_base=10000,
            ddp_config=DistributedDataParallelConfig(use_distributed_optimizer=False, grad_reduce_in_fp32=False),
        )
        params = dict(unwrap_model(model[0]).named_parameters())
        if weights is not None:
            with torch.no_grad():
                for name, p in params.items():
                    p.copy_(weights[name])
        objective = MaskedDiffusionObjective(MASK) if kind == "mdm" else AutoregressiveObjective()
        # Every rank draws the masks of data-parallel rank 0: at CP = 1 the two ranks are two
        # data-parallel replicas of one batch, so the reduced gradient is still that batch's.
        step = ObjectiveForwardStep(objective, seed=7, data_parallel_rank=0, eod_id=EOD,
                                    device=torch.device("cpu"), context_parallel_size=cp)
        output, loss_func = step(iter([item]), model[0])
        loss_sum, num_tokens, _ = loss_func(output)
        loss_sum.backward()
        reduced_tokens = num_tokens.clone()
        finalize_model_grads(model, num_tokens=reduced_tokens)
        grads = {name: p.main_grad.detach().clone() for name, p in params.items()}
        weights = {name: p.detach().clone() for name, p in params.items()}
        parallel_state.destroy_model_parallel()
        return output.detach(), grads, weights, int(reduced_tokens)

    ref_loss, ref_grads, weights, ref_tokens = run(1)
    loss, grads, _, tokens = run(WORLD, weights)
    positions = cp_rank_positions(SEQ // WORLD, WORLD, rank)
    torch.testing.assert_close(loss, ref_loss[:, positions], rtol=1e-9, atol=1e-9)
    # finalize_model_grads all-reduced num_tokens over DP x CP: both runs count the same batch
    # (CP = 1: twice, once per data-parallel replica; CP = 2: half the sequence per rank, once).
    assert tokens * 2 == ref_tokens
    assert set(grads) == set(ref_grads)
    for name in ref_grads:
        assert float(ref_grads[name].abs().sum()) > 0 or name.endswith("bias"), name
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-9, atol=1e-12,
                                   msg=lambda m: f"{kind} rank {rank} {name}: {m}")


@pytest.mark.parametrize("kind", ["mdm", "ar"])
def test_cp2_gpt_model_loss_and_grads_equal_cp1(tmp_path, kind):
    _spawn(_model_worker, tmp_path, kind)
