"""The Hugging Face baseline: masked-diffusion training of a plain ``transformers``
Qwen3 model with a hand-written loop, the way HF-based DLM trainers do it.

    python bench/throughput/hf_baseline.py --micro-batch-sizes 2,4,6,8 --json hf.json

What runs (one optimizer step = ``--grad-accum`` microbatches, default 1, as the megatron runtime
with ``global_batch_size = grad_accum * micro_batch_size``):

* model: ``Qwen3ForCausalLM(Qwen3Config(...))`` built from a config (no download) with the
  Qwen3-1.7B architecture (:data:`throughput_common.QWEN3_1_7B`: 28 layers, hidden 2048,
  intermediate 6144, 16 heads, 8 KV heads, head dim 128, vocabulary 151936, untied embeddings,
  RoPE base 1e6, RMSNorm eps 1e-6), ``attn_implementation="sdpa"``;
* bidirectional attention: every attention module gets ``is_causal = False`` and the model is
  given a ready mask mapping ``{"full_attention": None}`` (transformers 5.x skips its own mask
  construction when ``attention_mask`` is a dict), so ``sdpa_attention_forward`` calls
  ``scaled_dot_product_attention(..., attn_mask=None, is_causal=False, enable_gqa=True)``: the
  flash kernel, no mask tensor. When the objective truncates a sequence (LLaDA's 1% variable
  length) the mapping holds the boolean key-padding mask ``[b, 1, 1, s]`` instead (``True`` =
  attend, SDPA's convention), exactly the keys the megatron runtime masks.
  :func:`check_bidirectional` proves it on a tiny model at start-up, on the benchmark's own
  device and dtype: changing late tokens must change early logits, and must not with a causal
  or key-padding mask;
* objective: :class:`dlmspec.backends.megatron.objective.MaskedDiffusionObjective` (LLaDA, weight
  ``1/t``, eps 1e-3, ``variable_length_prob`` 0.01 as ``bench/runtime/train_reference.py``),
  with the runtime's per-microbatch masking generator
  (:func:`dlmspec.backends.megatron.rng.masking_generator` of ``(seed, iteration, 0, 0)``), so both sides
  draw the same noise levels, masks and truncations at the same steps; tokens are random ids;
* loss: per-token cross entropy over the full ``[b, s, V]`` logits as transformers computes them
  (the bf16 ``lm_head`` output upcast to fp32, as ``ForCausalLMLoss`` does; no label shift),
  reduced by :func:`dlmspec.backends.megatron.objective.reduce_loss` and divided by the token count
  (LLaDA's normalisation, the runtime's ``calculate_per_token_loss``);
* optimizer: ``torch.optim.AdamW(fused=True)``, lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight
  decay 0.1 on matrices only, gradient clipping at 1.0 (the reference script's values);
* precision (default) ``bf16``: parameters, gradients and Adam moments all bf16, no fp32 master
  weights - about 8 bytes of model state per parameter against megatron's 18 (bf16 weights, fp32
  gradient buffer, fp32 main weights, two fp32 moments), so the baseline has the cheaper
  optimizer. ``--fp32-master`` gives the apples-to-apples variant: fp32 parameters, gradients and
  moments (16 bytes/parameter) with the forward under ``torch.autocast(bfloat16)`` (what the HF
  Trainer does with ``bf16=True``).

``--impl`` (the strong peers; ``plain`` is all of the above):

* ``liger``: Liger Kernel's RoPE, RMSNorm (every norm, the q/k norms included) and SwiGLU MLP
  (``apply_liger_kernel_to_qwen3`` before the model is built; transformers' forward and loss are
  not patched), and Liger's fused linear cross entropy on the masked rows only: the decoder's final
  hidden states at positions with ``loss_weights != 0`` are gathered (``[n, H]``, no ``[b, s, V]``
  logits) and ``liger_fused_linear_cross_entropy(h, lm_head.weight, labels)`` gives their cross
  entropy. Liger has no per-token weights (its ``ce_weight`` is per class), so the objective's 1/t
  reaches it through ``--flce-reduction``: ``none`` (default: per-row losses times their weights;
  Liger 0.8 folds the per-token upstream gradient into the logits gradient in backward, at the
  cost of recomputing the chunked logits there) or ``grouped`` (one ``reduction="sum"`` call per
  distinct weight - one per sequence under LLaDA - times that weight: Liger's gradient-in-forward
  path, scaled by the scalar upstream gradient; it holds one lm_head-sized weight gradient per
  group until backward). Either way the loss is ``sum(CE * loss_weights) / num_tokens``, the plain
  loop's (tests/test_bench_throughput_peers.py checks loss and every gradient on CPU against the
  plain loop, through :func:`torch_fused_linear_cross_entropy`, a pure-torch stand-in of Liger's
  function with its signature);
* ``liger-compile``: the same with ``torch.compile`` of each decoder layer (``nn.Module.compile``,
  ``--compile-backend``, default inductor); should a compiled step fail (not out of memory), the
  micro batch runs again with ``torch._dynamo.config.suppress_errors = True`` and the JSON's
  ``impl_setup.compile_fallback`` says so; ``impl_setup.dynamo`` has the graph and graph-break counts;
* ``liger-compile-fp8``: the compiled loop with torchao float8 training
  (``convert_to_float8_training``, tensorwise recipe: dynamic per-tensor scales) on the 7 linears
  of every decoder layer (q/k/v/o, gate/up/down), before compiling; ``lm_head`` stays bf16 (its
  weight goes to Liger's loss) and the embedding is no linear.

Timing: CUDA events around each whole step (token draw, objective, forward, loss, backward,
clipping, optimizer step, zero_grad) after ``--warmup`` untimed steps; the median of the
``--steps`` timed steps gives tokens/s, model TFLOP/s (:func:`throughput_common.flops_per_token`,
the planner's count, the same numerator as for megatron), MFU against 989 TFLOP/s, and
``torch.cuda.max_memory_allocated`` since the micro batch started. Each micro batch of
``--micro-batch-sizes`` runs in turn on the same model and optimizer; an out-of-memory error is
caught, memory is freed (``gc``, ``empty_cache``) and larger micro batches are skipped. The JSON
(``--json``) holds the command, versions, GPU, each attempt and the best one that fits.

Exit codes: 0 some micro batch ran, 1 none did, 2 bad arguments, 3 the bidirectionality check
failed (nothing is timed then: a causal baseline would not be the same workload).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import shlex
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput_common import (  # noqa: E402
    PEAK_TFLOPS,
    PRESETS,
    ROOT,
    best_attempt,
    flops_per_token,
    host_info,
    parse_int_list,
    summarize,
)

# the checkout's dlmspec only when none is installed: in the checkout, dlmspec.backends exists only
# through an editable install (pyproject maps backends/ into it); an installed wheel has it itself
# (an earlier GPU run: ROOT first shadowed the wheel and every HF job failed with "No module named dlmspec.backends")
if importlib.util.find_spec("dlmspec") is None and str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from dlmspec.backends.megatron.objective import MaskedDiffusionObjective, ObjectiveBatch, reduce_loss  # noqa: E402
from dlmspec.backends.megatron.rng import masking_generator  # noqa: E402

PRECISIONS = {
    "bf16": "pure bf16: bf16 parameters, gradients and fused-AdamW moments, no fp32 master weights "
            "(~8 bytes of model state per parameter; megatron keeps ~18: bf16 weights, fp32 grads, "
            "fp32 main weights, fp32 moments)",
    "fp32-master": "fp32 parameters, gradients and fused-AdamW moments (~16 bytes/parameter), forward "
                   "and backward under torch.autocast(bfloat16) (HF Trainer bf16=True)",
    "fp32": "fp32 parameters and compute, no autocast (CPU tests)",
}


#: ``--impl`` choices: the plain loop (a row of its own) and the strong peers.
IMPLS = {
    "plain": "transformers Qwen3ForCausalLM as is: full [b, s, V] logits upcast to fp32, per-token cross entropy",
    "liger": "Liger Kernel RoPE, RMSNorm and SwiGLU (apply_liger_kernel_to_qwen3, before the model is built) and "
             "Liger's fused linear cross entropy on the masked rows only (no logits tensor)",
    "liger-compile": "liger + torch.compile of each decoder layer (nn.Module.compile, in place)",
    "liger-compile-fp8": "liger-compile + torchao float8 training (convert_to_float8_training, tensorwise scaling) on "
                         "every nn.Linear of the decoder layers (q/k/v/o, gate/up/down); lm_head stays bf16 "
                         "(Liger's fused linear cross entropy takes its weight)",
}
#: ``--flce-reduction`` choices: how the objective's per-token weights reach Liger's loss.
FLCE_REDUCTIONS = {
    "none": "one fused-linear-cross-entropy call over all masked rows with reduction='none', each row's loss times "
            "its weight (Liger >= 0.8 folds the per-token upstream gradient into the logits gradient in backward, "
            "recomputing the chunked logits there)",
    "grouped": "one call with reduction='sum' per distinct weight value (LLaDA: one per sequence, weight 1/t), "
               "each times its weight: Liger's compute-the-gradient-in-forward path, scaled by the scalar "
               "upstream gradient; holds one lm_head-sized weight gradient per group until backward",
}


def torch_fused_linear_cross_entropy(input, weight, target, bias=None, ce_weight=None, ignore_index: int = -100,
                                     lse_square_scale: float = 0.0, label_smoothing: float = 0.0,
                                     reduction: str = "mean", softcap=None, return_z_loss: bool = False,
                                     accum_dtype=None, use_token_scaling: bool = False,
                                     return_token_accuracy: bool = False, return_predicted_tokens: bool = False,
                                     chunk_mem_const: int = 1):
    """Pure-torch stand-in of ``liger_kernel.transformers.functional.liger_fused_linear_cross_entropy``
    (same parameters, Liger 0.8.5), for CPU where Liger (Triton) cannot import.

    ``input`` ``[n, H]``, ``weight`` ``[V, H]``, ``target`` ``[n]`` int64; the logits
    ``input @ weight.T (+ bias)`` in the input's dtype, upcast to fp32 for the cross entropy (as
    Liger's kernel and transformers' ``ForCausalLMLoss`` do). ``reduction``: ``"mean"`` (over rows
    whose target is not ``ignore_index``), ``"sum"`` or ``"none"`` (``[n]`` fp32).

    Raises:
        NotImplementedError: for any option the benchmark does not use (class weights, z-loss,
            label smoothing, softcap, token scaling, accuracy/prediction outputs).
    """
    if (ce_weight is not None or lse_square_scale or label_smoothing or softcap is not None or return_z_loss
            or use_token_scaling or return_token_accuracy or return_predicted_tokens):
        raise NotImplementedError("the stand-in implements plain cross entropy only")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    logits = F.linear(input, weight, bias)
    return F.cross_entropy(logits.float(), target, ignore_index=ignore_index, reduction=reduction)


def load_liger(standin: bool = False) -> Dict[str, Any]:
    """Liger's pieces: ``{"apply": callable(), "flce": callable, "source": str, "version": str|None}``.

    ``apply()`` patches transformers' Qwen3 module (RoPE function, ``Qwen3RMSNorm``, ``Qwen3MLP``;
    not its forward, not its loss), so it must run before the model is built. ``standin=True``
    (CPU tests): ``apply`` does nothing (transformers' own modules stay) and ``flce`` is
    :func:`torch_fused_linear_cross_entropy`.

    Raises:
        ImportError: when ``liger_kernel`` (or Triton under it) cannot be imported.
    """
    if standin:
        return {"apply": lambda: None, "flce": torch_fused_linear_cross_entropy, "version": None,
                "source": "stand-in: bench/throughput/hf_baseline.py torch_fused_linear_cross_entropy; HF modules kept"}
    import importlib.metadata

    from liger_kernel.transformers import apply_liger_kernel_to_qwen3
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    def apply() -> None:
        apply_liger_kernel_to_qwen3(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=False)

    return {"apply": apply, "flce": liger_fused_linear_cross_entropy,
            "version": importlib.metadata.version("liger-kernel"),
            "source": "liger_kernel.transformers.apply_liger_kernel_to_qwen3(rope, rms_norm, swiglu) + "
                      "liger_kernel.transformers.functional.liger_fused_linear_cross_entropy"}


def float8_filter(module, fqn: str) -> bool:
    """torchao's ``module_filter_fn``: convert the decoder layers' linears, never ``lm_head``."""
    return fqn != "lm_head" and not fqn.endswith(".lm_head")


def convert_float8(model, *, emulate: bool = False) -> List[str]:
    """``torchao.float8.convert_to_float8_training`` with the tensorwise recipe (dynamic per-tensor
    scales, cuBLAS fp8 GEMMs) on every ``nn.Linear`` but ``lm_head``; returns the converted names.
    ``emulate=True`` (CPU tests) casts to fp8 and back but multiplies in high precision.

    Raises:
        ImportError: when torchao cannot be imported. RuntimeError: when nothing was converted.
    """
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name("tensorwise")
    if emulate:
        import dataclasses

        config = dataclasses.replace(config, emulate=True)
    convert_to_float8_training(model, module_filter_fn=float8_filter, config=config)
    names = [name for name, mod in model.named_modules() if type(mod).__name__ == "Float8Linear"]
    if not names:
        raise RuntimeError("convert_to_float8_training converted no module")
    return names


def masked_flce_loss(hidden: torch.Tensor, lm_weight: torch.Tensor, ob: ObjectiveBatch, flce, *,
                     reduction: str = "none") -> torch.Tensor:
    """LLaDA loss of one microbatch from the final hidden states, never materialising full logits.

    Args:
        hidden: ``[b, s, H]`` final hidden states (after the last norm).
        lm_weight: ``[V, H]`` output-layer weight.
        ob: the objective's batch; rows with ``loss_weights != 0`` (the masked, non-truncated
            positions) are gathered, ``[n, H]``, and only they reach ``flce``.
        flce: Liger's ``liger_fused_linear_cross_entropy`` or :func:`torch_fused_linear_cross_entropy`.
        reduction: a :data:`FLCE_REDUCTIONS` key.

    Returns:
        fp32 scalar ``sum(CE * loss_weights) / num_tokens`` - the same number as :func:`mdm_loss`
        of the full logits (``tests/test_bench_throughput.py`` checks loss and gradients on CPU).
    """
    b, s, h = hidden.shape
    flat_w = ob.loss_weights.reshape(b * s)
    rows = torch.nonzero(flat_w, as_tuple=True)[0]
    denom = ob.num_tokens.clamp(min=1).float()
    if rows.numel() == 0:  # nothing masked: a zero that keeps the graph
        return hidden.sum().float() * 0.0
    weights = flat_w.index_select(0, rows)
    if reduction == "none":
        x = hidden.reshape(b * s, h).index_select(0, rows)
        y = ob.labels.reshape(b * s).index_select(0, rows)
        per_row = flce(x, lm_weight, y, reduction="none")
        return (per_row.float() * weights).sum() / denom
    if reduction != "grouped":
        raise ValueError(f"reduction must be one of {sorted(FLCE_REDUCTIONS)}, got {reduction!r}")
    values, inverse, counts = torch.unique(weights, return_inverse=True, return_counts=True)
    rows = rows.index_select(0, torch.argsort(inverse, stable=True))  # rows of one weight side by side
    x = hidden.reshape(b * s, h).index_select(0, rows)
    y = ob.labels.reshape(b * s).index_select(0, rows)
    sizes = counts.tolist()
    total = None
    for value, xg, yg in zip(values.tolist(), x.split(sizes), y.split(sizes)):
        part = flce(xg, lm_weight, yg, reduction="sum").float() * value
        total = part if total is None else total + part
    return total / denom


# --------------------------------------------------------------------------- model


def build_config(arch: Dict[str, Any], seq_length: int, *, initializer_range: float = 0.02):
    """A ``transformers.Qwen3Config`` for ``arch`` with SDPA attention and no KV cache.

    Raises:
        RuntimeError: if the installed transformers does not keep the RoPE base (its config
            API changed: ``rope_parameters`` in 5.x, ``rope_theta`` before).
    """
    from transformers import Qwen3Config

    theta = float(arch["rope_theta"])
    common = dict(
        vocab_size=arch["vocab_size"],
        hidden_size=arch["hidden_size"],
        intermediate_size=arch["ffn_hidden_size"],
        num_hidden_layers=arch["num_layers"],
        num_attention_heads=arch["num_attention_heads"],
        num_key_value_heads=arch["num_query_groups"],
        head_dim=arch["kv_channels"],
        hidden_act="silu",
        max_position_embeddings=max(int(seq_length), 4096),
        rms_norm_eps=arch["rms_norm_eps"],
        tie_word_embeddings=arch["tie_word_embeddings"],
        attention_bias=False,
        attention_dropout=0.0,
        use_sliding_window=False,
        use_cache=False,
        initializer_range=initializer_range,
        attn_implementation="sdpa",
    )
    try:
        config = Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": theta}, **common)
    except TypeError:  # transformers 4.x
        config = Qwen3Config(rope_theta=theta, **common)
    rope = getattr(config, "rope_parameters", None) or {}
    got = rope.get("rope_theta", getattr(config, "rope_theta", None)) if isinstance(rope, dict) else None
    if got is None or float(got) != theta:
        raise RuntimeError(f"Qwen3Config did not keep rope_theta={theta} (got {got!r}): transformers API changed")
    config._attn_implementation = "sdpa"
    return config


def build_model(arch: Dict[str, Any], seq_length: int, *, device: torch.device, param_dtype: torch.dtype,
                initializer_range: float = 0.02):
    """``Qwen3ForCausalLM`` built directly on ``device`` with ``param_dtype`` parameters, made
    bidirectional by :func:`make_bidirectional`, in train mode.

    Raises:
        RuntimeError: if the model does not use SDPA or a parameter has another dtype.
    """
    from transformers import Qwen3ForCausalLM

    config = build_config(arch, seq_length, initializer_range=initializer_range)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(param_dtype)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    if model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"model uses attention {model.config._attn_implementation!r}, not sdpa")
    wrong = {p.dtype for p in model.parameters()} - {param_dtype}
    if wrong:
        raise RuntimeError(f"parameters of dtype {wrong} in a {param_dtype} model")
    make_bidirectional(model)
    model.train()
    return model


def make_bidirectional(model) -> int:
    """Set ``is_causal = False`` on every attention module; returns how many.

    transformers' ``sdpa_attention_forward`` reads ``module.is_causal`` when no mask is passed
    (``is_causal = q_len > 1 and attention_mask is None and module.is_causal``).

    Raises:
        RuntimeError: if no module has ``is_causal`` or their number differs from the layers.
    """
    patched = 0
    for module in model.modules():
        if isinstance(getattr(module, "is_causal", None), bool):
            module.is_causal = False
            patched += 1
    if patched != model.config.num_hidden_layers:
        raise RuntimeError(f"set is_causal=False on {patched} modules, expected {model.config.num_hidden_layers}")
    return patched


def mask_mapping(model, key_padding: Optional[torch.Tensor]) -> Dict[str, Optional[torch.Tensor]]:
    """The ready ``attention_mask`` mapping the model's layers read (one entry per layer type).

    Args:
        key_padding: ``None`` (no mask: flash kernel) or the objective's megatron-convention
            mask ``[b, 1, 1, s]`` bool, ``True`` = key *not* attended; it is inverted to SDPA's
            ``True`` = attend.
    """
    mask = None if key_padding is None else ~key_padding.to(torch.bool)
    types = getattr(model.config, "layer_types", None) or ["full_attention"]
    return {layer_type: mask for layer_type in set(types)}


def forward_logits(model, input_ids: torch.Tensor, key_padding: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Full logits ``[b, s, V]`` (parameter/autocast dtype) with bidirectional attention."""
    out = model(input_ids=input_ids, attention_mask=mask_mapping(model, key_padding), use_cache=False)
    return out.logits


def mdm_loss(logits: torch.Tensor, ob: ObjectiveBatch) -> torch.Tensor:
    """LLaDA loss of one microbatch: ``sum(CE * loss_weights) / num_tokens`` (fp32 scalar).

    The cross entropy is taken over the full logits upcast to fp32 (transformers'
    ``ForCausalLMLoss`` does ``logits.float()``), per token, without label shift.
    """
    b, s, v = logits.shape
    per_token = F.cross_entropy(logits.float().reshape(b * s, v), ob.labels.reshape(b * s), reduction="none")
    loss_sum, num_tokens, _ = reduce_loss(per_token.view(b, s), ob)
    return loss_sum / num_tokens.clamp(min=1).to(loss_sum.dtype)


def plain_loss(model, ob: ObjectiveBatch) -> torch.Tensor:
    """The plain loop's loss: :func:`forward_logits` (full logits) then :func:`mdm_loss`."""
    logits = forward_logits(model, ob.input_ids, ob.attention_mask)
    return mdm_loss(logits, ob)


def make_flce_loss(flce, reduction: str = "none"):
    """The Liger loops' loss ``fn(model, ob)``: the decoder (``model.model``, bidirectional, the same
    mask mapping as :func:`forward_logits`) gives the final hidden states ``[b, s, H]``, then
    :func:`masked_flce_loss` with ``model.lm_head.weight``."""

    def loss_fn(model, ob: ObjectiveBatch) -> torch.Tensor:
        out = model.model(input_ids=ob.input_ids, attention_mask=mask_mapping(model, ob.attention_mask), use_cache=False)
        return masked_flce_loss(out.last_hidden_state, model.lm_head.weight, ob, flce, reduction=reduction)

    return loss_fn


def finish_impl(model, impl: str, *, compile_backend: str = "inductor", fp8_emulate: bool = False) -> Dict[str, Any]:
    """What ``--impl`` adds once the (Liger-patched) model is built: torchao float8 first
    (:func:`convert_float8`; torchao converts before compiling), then ``torch.compile`` of each
    decoder layer in place (``nn.Module.compile``: parameter names unchanged). Returns a record of
    what was done (module classes, converted linears, compiled layers)."""
    info: Dict[str, Any] = {"impl": impl, "impl_note": IMPLS[impl]}
    layer0 = model.model.layers[0]
    info["modules"] = {"norm": type(layer0.input_layernorm).__name__, "mlp": type(layer0.mlp).__name__,
                       "attention": type(layer0.self_attn).__name__}
    if impl.endswith("-fp8"):
        names = convert_float8(model, emulate=fp8_emulate)
        info["float8"] = {"recipe": "tensorwise", "emulate": fp8_emulate, "converted_linears": len(names),
                          "converted_example": names[:7], "kept_high_precision": ["lm_head"]}
    if "-compile" in impl:
        for layer in model.model.layers:
            layer.compile(backend=compile_backend)
        info["compiled"] = {"what": "each decoder layer, nn.Module.compile", "backend": compile_backend,
                            "layers": len(model.model.layers)}
    return info


def build_optimizer(model, *, lr: float = 3e-4, weight_decay: float = 0.1, fused: bool = True):
    """``torch.optim.AdamW`` (fused) with weight decay on matrices only (megatron exempts norms
    and biases), betas (0.9, 0.95), eps 1e-8."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)


def _autocast(device: torch.device, precision: str):
    if precision == "fp32-master":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _sdpa_context(backend: str):
    if backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    return sdpa_kernel([names[backend]])


# --------------------------------------------------------------------------- check


def check_bidirectional(device: torch.device, precision: str, seq_length: int = 16) -> Dict[str, Any]:
    """Prove that :func:`build_model` + :func:`forward_logits` attend bidirectionally.

    A tiny model of the same class (2 layers, GQA, init std 0.2 so one token visibly moves the
    logits) on ``device`` in ``precision`` runs three pairs of forwards on sequences that differ
    only in their last token, and compares the logits of the first half:

    * bidirectional (the benchmark's path): they must differ (``> 1e-3`` of the logits' scale);
    * key-padding mask hiding the second half (the truncation path): they must not;
    * transformers' default causal path (``is_causal`` restored, ``attention_mask=None``): they
      must not - this shows the comparison can tell the two apart.

    Returns:
        ``{"bidirectional": bool, "early_logit_change": float, "masked_change": float,
        "causal_change": float, "logit_scale": float, "transformers_attention": str}``.
    """
    from throughput_common import TINY

    param_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    torch.manual_seed(0)
    model = build_model(TINY, seq_length, device=device, param_dtype=param_dtype, initializer_range=0.2)
    model.eval()
    half = seq_length // 2
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randint(0, TINY["tokenizer_vocab"], (1, seq_length), generator=gen)
    y = x.clone()
    y[:, -1] = (x[:, -1] + 1) % TINY["tokenizer_vocab"]  # only the last token differs
    x, y = x.to(device), y.to(device)
    hide = torch.zeros(1, 1, 1, seq_length, dtype=torch.bool, device=device)
    hide[..., half:] = True  # megatron convention: True = not attended

    def early(ids, key_padding=None, causal=False):
        with torch.no_grad(), _autocast(device, precision):
            if causal:
                logits = model(input_ids=ids, use_cache=False).logits
            else:
                logits = forward_logits(model, ids, key_padding)
        return logits[:, :half].float()

    a, b = early(x), early(y)
    change = float((a - b).abs().max())
    masked = float((early(x, hide) - early(y, hide)).abs().max())
    for module in model.modules():
        if isinstance(getattr(module, "is_causal", None), bool):
            module.is_causal = True
    causal = float((early(x, causal=True) - early(y, causal=True)).abs().max())
    scale = float(a.abs().max())
    ok = change > 1e-3 * max(scale, 1e-6) and masked <= 1e-2 * change and causal <= 1e-2 * change
    del model
    return {
        "bidirectional": bool(ok),
        "early_logit_change": change,
        "masked_change": masked,
        "causal_change": causal,
        "logit_scale": scale,
        "transformers_attention": "sdpa",
        "precision": precision,
    }


# --------------------------------------------------------------------------- training


def _is_oom(exc: BaseException) -> bool:
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    return isinstance(exc, oom_type) or "out of memory" in str(exc).lower()


def _train_step(model, optimizer, objective, *, tokens_gen, iteration: int, mbs: int, seq: int, vocab: int,
                seed: int, device: torch.device, precision: str, clip_grad: float, sdpa_backend: str,
                grad_accum: int = 1, loss_fn=None):
    """One optimizer step over ``grad_accum`` microbatches (gradients accumulated, each
    microbatch's loss divided by ``grad_accum``); returns ``(detached mean loss, any truncated?)``.
    Locals (logits, graph) die with the frame, so nothing of this step is alive during the next one."""
    total, any_trunc = None, False
    for index in range(grad_accum):
        loss, trunc = _microbatch(model, objective, tokens_gen=tokens_gen, iteration=iteration, index=index,
                                  mbs=mbs, seq=seq, vocab=vocab, seed=seed, device=device, precision=precision,
                                  sdpa_backend=sdpa_backend, scale=1.0 / grad_accum, loss_fn=loss_fn)
        total = loss if total is None else total + loss
        any_trunc = any_trunc or trunc
    if clip_grad > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total / grad_accum, any_trunc


def _microbatch(model, objective, *, tokens_gen, iteration: int, index: int, mbs: int, seq: int, vocab: int,
                seed: int, device: torch.device, precision: str, sdpa_backend: str, scale: float, loss_fn=None):
    """Forward and backward of one microbatch (loss scaled by ``scale``); ``loss_fn(model, ob)``
    defaults to :func:`plain_loss`."""
    tokens = torch.randint(0, vocab, (mbs, seq), generator=tokens_gen, device=device)
    ob = objective.prepare({"tokens": tokens}, masking_generator(seed, iteration, 0, index, device=device))
    with _autocast(device, precision), _sdpa_context(sdpa_backend):
        loss = (loss_fn or plain_loss)(model, ob)
    (loss * scale if scale != 1.0 else loss).backward()
    return loss.detach(), ob.attention_mask is not None




def run_micro_batch(model, optimizer, objective, arch: Dict[str, Any], *, mbs: int, seq: int, warmup: int,
                    steps: int, seed: int, device: torch.device, precision: str, clip_grad: float,
                    sdpa_backend: str, flops: float, peak_tflops: float, grad_accum: int = 1,
                    loss_fn=None) -> Dict[str, Any]:
    """Train ``warmup + steps`` steps of micro batch ``mbs`` and summarise the timed ones.

    Raises:
        Whatever the step raises (out of memory included): :func:`main` classifies it.
    """
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    tokens_gen = torch.Generator(device=device)
    tokens_gen.manual_seed(seed)
    marks: List[Any] = []
    losses, truncated = [], []
    for it in range(warmup + steps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            start = time.perf_counter()
        loss, trunc = _train_step(
            model, optimizer, objective, tokens_gen=tokens_gen, iteration=it, mbs=mbs, seq=seq,
            vocab=arch["tokenizer_vocab"], seed=seed, device=device, precision=precision,
            clip_grad=clip_grad, sdpa_backend=sdpa_backend, grad_accum=grad_accum, loss_fn=loss_fn,
        )
        if cuda:
            end.record()
        else:
            end = time.perf_counter()
        marks.append((start, end))
        losses.append(loss)
        truncated.append(trunc)
    if cuda:
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) / 1000.0 for s, e in marks]
    else:
        times = [e - s for s, e in marks]
    loss_values = [float(x) for x in torch.stack(losses).float().cpu()]
    result: Dict[str, Any] = {
        "micro_batch_size": mbs,
        "status": "ok",
        "warmup_steps": warmup,
        "timed_steps": steps,
        "step_times_s": times[warmup:],
        "warmup_step_times_s": times[:warmup],
        "losses": loss_values,
        "truncated_steps": [i + 1 for i, t in enumerate(truncated) if t],
        "grad_accum": grad_accum,
        "tokens_per_step": grad_accum * mbs * seq,
    }
    result.update(summarize(times[warmup:], tokens_per_step=grad_accum * mbs * seq, flops_per_token=flops, peak_tflops=peak_tflops))
    if cuda:
        result["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        result["peak_reserved_gib"] = torch.cuda.max_memory_reserved(device) / 2**30
    else:
        result["peak_mem_gib"] = None
        result["peak_reserved_gib"] = None
    return result


def compile_truncated_path(model, optimizer, arch: Dict[str, Any], loss_fn, *, mbs: int, seq: int, seed: int,
                           device: torch.device, precision: str, sdpa_backend: str) -> Dict[str, Any]:
    """One untimed forward + backward of a batch whose sequences are all truncated, before any
    timed step, so that the compiled layers' second graph (a key-padding mask instead of none) is
    compiled here and not in a timed step that happens to truncate (LLaDA's 1%: about one step in
    nine at micro batch 12). The gradients are dropped; the optimizer does not step. Returns
    ``{"seconds": float}`` or ``{"error": str}`` (recorded, not raised)."""
    objective = MaskedDiffusionObjective(arch["mask_token_id"], eps=1e-3, loss_weighting="llada", variable_length_prob=1.0)
    t0 = time.perf_counter()
    try:
        gen = torch.Generator(device=device)
        gen.manual_seed(seed + 1)
        tokens = torch.randint(0, arch["tokenizer_vocab"], (mbs, seq), generator=gen, device=device)
        ob = objective.prepare({"tokens": tokens}, masking_generator(seed, 10**6, 0, 0, device=device))
        with _autocast(device, precision), _sdpa_context(sdpa_backend):
            loss = loss_fn(model, ob)
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        result: Dict[str, Any] = {"seconds": time.perf_counter() - t0, "key_padding_mask": ob.attention_mask is not None}
    except Exception as exc:  # noqa: BLE001 - the timed steps still run (and compile it if they must)
        result = {"error": f"{type(exc).__name__}: {str(exc)[:1000]}", "seconds": time.perf_counter() - t0}
    optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _dynamo_counters() -> Dict[str, Any]:
    """torch._dynamo's graph and graph-break counts of this process (what compiling the layers gave)."""
    try:
        from torch._dynamo.utils import counters

        return {"unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
                "graph_breaks": {str(k): int(v) for k, v in counters["graph_break"].items()}}
    except Exception as exc:  # noqa: BLE001 - informational
        return {"error": f"{type(exc).__name__}: {exc}"}


def _versions(device: torch.device) -> Dict[str, Any]:
    import transformers

    info: Dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        **host_info(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=torch.cuda.get_device_name(device),
            gpu_memory_gib=props.total_memory / 2**30,
            gpu_capability=f"{props.major}.{props.minor}",
            cudnn=torch.backends.cudnn.version(),
        )
    else:
        info["gpu"] = None
    return info


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="qwen3-1.7b")
    p.add_argument("--impl", choices=list(IMPLS), default="plain",
                   help="plain: today's loop; liger, liger-compile, liger-compile-fp8: the strong peers")
    p.add_argument("--flce-reduction", choices=list(FLCE_REDUCTIONS), default="none",
                   help="how the per-token weights reach Liger's fused linear cross entropy (liger impls)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the -compile impls")
    p.add_argument("--liger-standin", action="store_true",
                   help="CPU tests: pure-torch stand-in of Liger's fused linear cross entropy, HF's own modules")
    p.add_argument("--fp8-emulate", action="store_true", help="CPU tests: torchao float8 in emulation")
    p.add_argument("--seq-length", type=int, default=4096)
    p.add_argument("--micro-batch-sizes", default="2,4,6,8", help="comma-separated, tried in increasing order")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per micro batch")
    p.add_argument("--steps", type=int, default=5, help="timed steps per micro batch")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default=None,
                   help="parameter dtype (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--fp32-master", action="store_true",
                   help="fp32 parameters/gradients/moments with bf16 autocast (apples-to-apples with megatron's fp32 main weights)")
    p.add_argument("--sdpa-backend", choices=["auto", "flash", "efficient", "cudnn", "math"], default="auto")
    p.add_argument("--variable-length-prob", type=float, default=0.01, help="LLaDA truncation probability (train_reference.py: 0.01)")
    p.add_argument("--grad-accum", type=int, default=1, help="microbatches per optimizer step")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--clip-grad", type=float, default=1.0, help="0 disables")
    p.add_argument("--no-fused", action="store_true", help="unfused AdamW (fused is the baseline)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--metrics-jsonl", default=None,
                   help="per-step {event: train, iteration, loss, micro_batch_size} lines (bench/throughput/loss_agreement.py reads them)")
    p.add_argument("--skip-bidirectional-check", action="store_true")
    args = p.parse_args(argv)
    try:
        args.micro_batch_sizes = sorted(set(parse_int_list(args.micro_batch_sizes)))
    except ValueError as exc:
        p.error(str(exc))
    if args.steps < 1 or args.warmup < 0 or args.seq_length < 2:
        p.error("need --steps >= 1, --warmup >= 0, --seq-length >= 2")
    return args


def _write(path: Optional[str], data: Dict[str, Any]) -> None:
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("hf_baseline: --device cuda but CUDA is not available", file=sys.stderr)
            return 2
        device = torch.device("cuda", torch.cuda.current_device())
    if args.fp32_master:
        precision = "fp32-master"
    else:
        precision = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    param_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    arch = PRESETS[args.preset]
    seq = args.seq_length
    flops = flops_per_token(arch, seq)
    argv_list = [sys.executable] + (sys.argv if argv is None else [sys.argv[0]] + list(argv))
    report: Dict[str, Any] = {
        "side": "hf",
        "command": argv_list,
        "command_line": shlex.join(argv_list),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": _versions(device),
        "device": str(device),
        "setup": {
            "preset": args.preset,
            "architecture": arch,
            "seq_length": seq,
            "model": "transformers Qwen3ForCausalLM built from Qwen3Config (no download), attn_implementation=sdpa",
            "attention": "bidirectional: module.is_causal=False on every attention module and a ready mask mapping "
                         "{'full_attention': None} (flash kernel, no mask); boolean key-padding mask [b,1,1,s] only "
                         "for steps where the objective truncated a sequence",
            "sdpa_backend": args.sdpa_backend,
            "precision": precision,
            "precision_note": PRECISIONS[precision],
            "optimizer": f"torch.optim.AdamW(fused={not args.no_fused}), lr {args.lr}, betas (0.9, 0.95), eps 1e-8, "
                         "weight decay 0.1 on matrices only",
            "clip_grad": args.clip_grad,
            "objective": {"kind": "mdm", "mask_token_id": arch["mask_token_id"], "eps": 1e-3,
                          "loss_weighting": "llada", "variable_length_prob": args.variable_length_prob,
                          "masking_rng": "dlmspec.backends.megatron.rng.masking_generator(seed, iteration, 0, 0)"},
            "impl": args.impl,
            "impl_note": IMPLS[args.impl],
            "loss": ("per-token cross entropy over the full [b, s, V] logits upcast to fp32 (as transformers' "
                     "ForCausalLMLoss), weighted by the objective, / num_tokens") if args.impl == "plain" else
                    ("fused linear cross entropy (lm_head + cross entropy, chunked, no [b, s, V] logits) on the "
                     "masked rows only (loss_weights != 0, gathered from the final hidden states), "
                     f"sum(CE * loss_weights) / num_tokens; weights: {FLCE_REDUCTIONS[args.flce_reduction]}"),
            "flce_reduction": args.flce_reduction if args.impl != "plain" else None,
            "data": "random token ids in [0, tokenizer_vocab), a fresh batch every step",
            "global_batch": f"{args.grad_accum} microbatch(es) per optimizer step (gradient accumulation)",
            "warmup_steps": args.warmup,
            "timed_steps": args.steps,
            "timing": "CUDA events around each whole step; median over the timed steps" if device.type == "cuda"
                      else "time.perf_counter around each step (CPU)",
            "seed": args.seed,
        },
        **flops,
        "peak_tflops_per_gpu": args.peak_tflops,
        "num_gpus": 1,
        "attempts": [],
        "best": None,
        "status": "running",
    }
    torch.manual_seed(args.seed)

    loss_fn = None
    if args.impl != "plain":
        try:
            liger = load_liger(args.liger_standin)
            liger["apply"]()  # patches transformers' Qwen3 classes: before any model is built
        except Exception as exc:  # noqa: BLE001 - recorded for run.py
            report["status"] = "import_failed"
            report["error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
            _write(args.json, report)
            print(f"hf_baseline: --impl {args.impl} needs liger_kernel: {report['error']}", file=sys.stderr)
            return 1
        report["versions"]["liger_kernel"] = liger["version"]
        report["setup"]["liger"] = liger["source"]
        loss_fn = make_flce_loss(liger["flce"], args.flce_reduction)
        if args.impl.endswith("-fp8"):
            try:
                import importlib.metadata

                report["versions"]["torchao"] = importlib.metadata.version("torchao")
            except Exception:  # noqa: BLE001 - a version string only
                report["versions"]["torchao"] = None

    if not args.skip_bidirectional_check:
        try:
            report["bidirectional_check"] = check_bidirectional(device, precision)
        except Exception as exc:  # noqa: BLE001 - recorded, then stop
            report["bidirectional_check"] = {"bidirectional": False, "error": f"{type(exc).__name__}: {exc}",
                                             "traceback": traceback.format_exc()[-4000:]}
        print(f"hf_baseline: bidirectional check {report['bidirectional_check']}", flush=True)
        if not report["bidirectional_check"].get("bidirectional"):
            report["status"] = "bidirectional_check_failed"
            _write(args.json, report)
            return 3

    objective = MaskedDiffusionObjective(arch["mask_token_id"], eps=1e-3, loss_weighting="llada",
                                         variable_length_prob=args.variable_length_prob)
    t0 = time.perf_counter()
    try:
        model = build_model(arch, seq, device=device, param_dtype=param_dtype)
        report["impl_setup"] = finish_impl(model, args.impl, compile_backend=args.compile_backend,
                                           fp8_emulate=args.fp8_emulate)
        optimizer = build_optimizer(model, lr=args.lr, fused=not args.no_fused)
    except Exception as exc:  # noqa: BLE001 - recorded for run.py
        report["status"] = "build_failed"
        report["error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
        report["traceback"] = traceback.format_exc()[-4000:]
        _write(args.json, report)
        print(f"hf_baseline: building the model failed: {report['error']}\n{report['traceback']}", file=sys.stderr)
        return 1
    report["parameters"] = sum(p.numel() for p in model.parameters())
    report["build_seconds"] = time.perf_counter() - t0
    print(f"hf_baseline: {report['parameters'] / 1e9:.3f}B parameters, {precision}, "
          f"{flops['flops_per_token'] / 1e9:.2f} GFLOP/token ({flops['flops_source']})", flush=True)
    _write(args.json, report)

    if "-compile" in args.impl and args.variable_length_prob > 0:
        report["impl_setup"]["truncated_path_compiled"] = compile_truncated_path(
            model, optimizer, arch, loss_fn, mbs=args.micro_batch_sizes[0], seq=seq, seed=args.seed, device=device,
            precision=precision, sdpa_backend=args.sdpa_backend)
        _write(args.json, report)

    metrics = open(args.metrics_jsonl, "w", encoding="utf-8") if args.metrics_jsonl else None
    too_big_from = None
    for mbs in args.micro_batch_sizes:
        if too_big_from is not None:
            report["attempts"].append({"micro_batch_size": mbs, "status": "skipped",
                                       "error": f"micro batch {too_big_from} ran out of memory"})
            continue
        t_start = time.perf_counter()

        def attempt_once():
            return run_micro_batch(
                model, optimizer, objective, arch, mbs=mbs, seq=seq, warmup=args.warmup, steps=args.steps,
                seed=args.seed, device=device, precision=precision, clip_grad=args.clip_grad,
                sdpa_backend=args.sdpa_backend, flops=flops["flops_per_token"], peak_tflops=args.peak_tflops,
                grad_accum=args.grad_accum, loss_fn=loss_fn,
            )

        try:
            try:
                attempt = attempt_once()
            except Exception as exc:  # noqa: BLE001 - a compile failure gets one retry, recorded
                if "-compile" not in args.impl or _is_oom(exc) or "compile_fallback" in report["impl_setup"]:
                    raise
                # torch.compile could not take a layer (e.g. one of Liger's Triton kernels): the
                # frames that fail to compile run eagerly from here on, and the JSON says so
                import torch._dynamo as dynamo  # (a plain "import torch._dynamo" would make torch local to main)

                report["impl_setup"]["compile_fallback"] = {
                    "error": f"{type(exc).__name__}: {str(exc)[:1500]}",
                    "then": "torch._dynamo.config.suppress_errors = True (frames that fail to compile run eagerly), "
                            "dynamo reset, the micro batch run again"}
                print(f"hf_baseline: compiled step failed ({type(exc).__name__}: {str(exc)[:300]}); retrying with "
                      "torch._dynamo.config.suppress_errors = True", flush=True)
                optimizer.zero_grad(set_to_none=True)
                dynamo.reset()
                dynamo.config.suppress_errors = True
                attempt = attempt_once()
        except Exception as exc:  # noqa: BLE001 - classified and recorded
            oom = _is_oom(exc)
            attempt = {"micro_batch_size": mbs, "status": "oom" if oom else "error",
                       "error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
            if not oom:
                attempt["traceback"] = traceback.format_exc()[-4000:]
            if device.type == "cuda":
                attempt["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            if oom:
                too_big_from = mbs
        # Free what a failed step left behind before the next micro batch.
        optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        attempt["seconds"] = time.perf_counter() - t_start
        report["attempts"].append(attempt)
        if attempt["status"] == "ok":
            print(f"hf_baseline: micro batch {mbs}: {attempt['median_step_time_s'] * 1000:.0f} ms/step, "
                  f"{attempt['tokens_per_s']:,.0f} tok/s, {attempt['tflops_per_gpu']:.1f} TFLOP/s, "
                  f"MFU {100 * attempt['mfu']:.1f}%, peak {attempt['peak_mem_gib'] or 0:.1f} GiB, "
                  f"losses {[round(x, 3) for x in attempt['losses']]}", flush=True)
            if metrics:
                for i, (loss, dt) in enumerate(zip(attempt["losses"], attempt["warmup_step_times_s"] + attempt["step_times_s"])):
                    metrics.write(json.dumps({"event": "train", "iteration": i + 1, "loss": loss, "step_time_s": dt,
                                              "micro_batch_size": mbs, "precision": precision}) + "\n")
        else:
            print(f"hf_baseline: micro batch {mbs}: {attempt['status']}: {attempt['error'][:300]}", flush=True)
        _write(args.json, report)
    if metrics:
        metrics.close()
    if "-compile" in args.impl:
        report["impl_setup"]["dynamo"] = _dynamo_counters()

    best = best_attempt(report["attempts"])
    report["best"] = best and {k: best[k] for k in ("micro_batch_size", "median_step_time_s", "tokens_per_s",
                                                    "tflops_per_gpu", "mfu", "peak_mem_gib")}
    report["status"] = "ok" if best else "failed"
    _write(args.json, report)
    if best:
        print(f"hf_baseline: best micro batch {best['micro_batch_size']}: {best['tokens_per_s']:,.0f} tok/s, "
              f"MFU {100 * best['mfu']:.1f}%", flush=True)
    return 0 if best else 1


if __name__ == "__main__":
    sys.exit(main())
