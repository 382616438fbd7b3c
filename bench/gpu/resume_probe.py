"""What a training step starts from, fingerprinted: a bench-only probe for bench/devbox/gpu/demo_resume.sh.

a resume driver's ``--compile`` adds ``import resume_probe; resume_probe.install()`` to the
deterministic runs' train.py (this file is copied beside it). Before the steps that follow
iterations ``RESUME_PROBE_AT`` (default 100, 101, 200, 201) it writes one JSON line to
``runs/<the train.py folder's name>/probe.jsonl``: an exact integer fingerprint of every model
parameter, of each fp32 main parameter and Adam moment of megatron's optimizer, Adam's step
counts, the learning rates and weight decays, the scheduler's step count and the RNG states.
Comparing an uninterrupted run's lines with a resumed run's names what the resume did not
restore.
"""

from __future__ import annotations

import json
import os
import sys

import torch

AT = {int(x) for x in os.environ.get("RESUME_PROBE_AT", "100,101,200,201").split(",") if x}
#: Steps (1-based) whose forward is traced module by module (RESUME_PROBE_LAYERS=5,6).
LAYER_STEPS = {int(x) for x in os.environ.get("RESUME_PROBE_LAYERS", "").split(",") if x}


def fingerprint(t: torch.Tensor) -> str:
    """The bits of ``t`` as one exact integer (two weighted sums of its 16- or 32-bit words)."""
    t = t.detach().contiguous()
    if t.element_size() == 2:
        words = t.view(torch.int16).to(torch.int64).flatten()
    elif t.element_size() == 4:
        words = t.view(torch.int32).to(torch.int64).flatten()
    elif t.element_size() == 1:
        words = t.view(torch.uint8).to(torch.int64).flatten()
    else:
        words = t.view(torch.int32).to(torch.int64).flatten()
    index = torch.arange(1, words.numel() + 1, device=words.device, dtype=torch.int64) % 1000003
    return f"{int(words.sum())}:{int((words * index).sum())}"


def _optimizers(optimizer):
    return getattr(optimizer, "chained_optimizers", [optimizer])


def snapshot(parts, iteration: int) -> dict:
    """The fingerprints of what step ``iteration + 1`` starts from."""
    from megatron.core import tensor_parallel
    from megatron.core.utils import unwrap_model

    out = {"iteration": iteration, "model": {}, "main": [], "exp_avg": [], "exp_avg_sq": [], "steps": [],
           "lr": [], "weight_decay": []}
    for i, chunk in enumerate(parts.model):
        for name, p in unwrap_model(chunk).named_parameters():
            out["model"][f"{i}.{name}"] = fingerprint(p)
    for opt in _optimizers(parts.optimizer):
        inner = opt.optimizer
        for group in inner.param_groups:
            out["lr"].append(group["lr"])
            out["weight_decay"].append(group["weight_decay"])
            for p in group["params"]:
                out["main"].append(fingerprint(p))
                state = inner.state.get(p, {})
                out["exp_avg"].append(fingerprint(state["exp_avg"]) if "exp_avg" in state else None)
                out["exp_avg_sq"].append(fingerprint(state["exp_avg_sq"]) if "exp_avg_sq" in state else None)
                step = state.get("step")
                out["steps"].append(float(step) if step is not None else None)
    out["steps"] = sorted({s for s in out["steps"] if s is not None})
    out["buffers"] = {}
    out["tensor_attrs"] = {}
    for i, chunk in enumerate(parts.model):
        for name, b in unwrap_model(chunk).named_buffers():
            out["buffers"][f"{i}.{name}"] = f"{b.dtype}:{tuple(b.shape)}:{fingerprint(b)}"
        for mname, m in unwrap_model(chunk).named_modules():
            params = {id(p) for p in m.parameters(recurse=False)} | {id(b) for b in m.buffers(recurse=False)}
            for attr, v in vars(m).items():
                if isinstance(v, torch.Tensor) and id(v) not in params and v.numel() > 0:
                    out["tensor_attrs"][f"{i}.{mname}.{attr}"] = f"{v.dtype}:{tuple(v.shape)}:{fingerprint(v)}"
        out["training_flags"] = sorted({f"{type(m).__name__}={m.training}" for m in unwrap_model(chunk).modules()})
    out["flags"] = {
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "bf16_reduced": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "fp16_reduced": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "fp32_precision": torch.get_float32_matmul_precision(), "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "sdp": [torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
                torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled()],
        "grad_enabled": torch.is_grad_enabled(), "autocast": torch.is_autocast_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
    }
    out["scheduler_num_steps"] = getattr(parts.scheduler, "num_steps", None)
    out["torch_rng"] = fingerprint(torch.get_rng_state())
    out["cuda_rng"] = fingerprint(torch.cuda.get_rng_state())
    out["tracker"] = {k: fingerprint(v) for k, v in tensor_parallel.get_cuda_rng_tracker().get_states().items()}
    return out


def install() -> None:
    """Wrap ``dlmspec.backends.megatron.training.train_step`` to write a snapshot before the
    steps after the iterations in ``AT``."""
    from dlmspec.backends.megatron import training

    name = os.path.basename(os.path.dirname(os.path.abspath(sys.argv[0])))
    path = os.path.join("runs", name, "probe.jsonl")
    original = training.train_step

    def train_step(parts, stage, feed, iteration):
        if iteration in AT and int(os.environ.get("RANK", "0")) == 0:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a") as f:
                f.write(json.dumps(snapshot(parts, iteration)) + "\n")
        handles = _trace_layers(parts, iteration + 1, os.path.join("runs", name, "layers.jsonl")) \
            if iteration + 1 in LAYER_STEPS else []
        try:
            return original(parts, stage, feed, iteration)
        finally:
            for h in handles:
                h.remove()

    training.train_step = train_step
    if os.environ.get("RESUME_PROBE_INPUTS"):
        _install_inputs(os.path.join("runs", name, "inputs.jsonl"))
    if os.environ.get("RESUME_PROBE_SDPA"):
        _install_sdpa(os.path.join("runs", name, "sdpa.jsonl"))


def _install_inputs(path: str) -> None:
    """With ``RESUME_PROBE_INPUTS=1``: one JSON line per training microbatch with fingerprints of
    what the objective prepared (input ids, labels, loss weights, positions, attention mask),
    then one per loss with the output layer's input (hidden states) and the loss sum, so a
    difference after a resume is placed: the batch, the forward, or the loss."""
    from dlmspec.backends.megatron import stage as stage_module

    def write(record: dict) -> None:
        if int(os.environ.get("RANK", "0")) == 0:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def fp(t):
        return fingerprint(t) if isinstance(t, torch.Tensor) else None

    original_prepare = stage_module.ObjectiveForwardStep.prepare

    def prepare(self, item):
        ob, position_ids, attention_mask = original_prepare(self, item)
        if getattr(item, "stream", None) == stage_module.TRAIN_STREAM:
            write({"what": "batch", "iteration": item.iteration, "index": item.index,
                   "tokens": fp(item.batch["tokens"]), "input_ids": fp(ob.input_ids), "labels": fp(ob.labels),
                   "loss_weights": fp(ob.loss_weights), "position_ids": fp(position_ids),
                   "attention_mask": fp(attention_mask), "num_tokens": int(ob.num_tokens)})
        return ob, position_ids, attention_mask

    stage_module.ObjectiveForwardStep.prepare = prepare
    original_fused = stage_module._fused_loss_func

    def fused(ob, weight, impl, hidden):
        out = original_fused(ob, weight, impl, hidden)
        if torch.is_grad_enabled():
            write({"what": "loss", "hidden": fp(hidden), "weight": fp(weight), "loss_sum": fp(out[0].detach())})
        return out

    stage_module._fused_loss_func = fused


def _trace_layers(parts, step: int, path: str) -> list:
    """Forward hooks on every module of the first model chunk for step ``step``: one JSON line
    per module call, in call order, with fingerprints of its first tensor input and output, so a
    difference is placed at the first module whose inputs agree and outputs do not."""
    from megatron.core.utils import unwrap_model

    def first_tensor(x):
        if isinstance(x, torch.Tensor):
            return x
        if isinstance(x, (tuple, list)):
            for y in x:
                t = first_tensor(y)
                if t is not None:
                    return t
        if isinstance(x, dict):
            for y in x.values():
                t = first_tensor(y)
                if t is not None:
                    return t
        return None

    def hook(name):
        def fn(module, args, kwargs, output):
            if not torch.is_grad_enabled():
                return
            ti, to = first_tensor((args, kwargs)), first_tensor(output)
            rec = {"step": step, "name": name, "type": type(module).__name__, "training": module.training,
                   "in": fingerprint(ti) if ti is not None else None,
                   "in_meta": f"{ti.dtype}:{tuple(ti.shape)}:{ti.stride()}" if ti is not None else None,
                   "out": fingerprint(to) if to is not None else None,
                   "out_meta": f"{to.dtype}:{tuple(to.shape)}:{to.stride()}" if to is not None else None}
            if int(os.environ.get("RANK", "0")) == 0:
                with open(path, "a") as f:
                    f.write(json.dumps(rec) + "\n")
        return fn

    os.makedirs(os.path.dirname(path), exist_ok=True)
    model = unwrap_model(parts.model[0])
    return [m.register_forward_hook(hook(n or "<model>"), with_kwargs=True) for n, m in model.named_modules()]


def _install_sdpa(path: str) -> None:
    """With ``RESUME_PROBE_SDPA=1``: one JSON line per ``scaled_dot_product_attention`` call with
    the backend PyTorch picks for it (``torch._fused_sdp_choice`` inside the caller's
    ``sdpa_kernel`` context), the mask's presence, strides and the output's strides."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention
    calls = {"n": 0}

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        choice = torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        out = original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                       enable_gqa=enable_gqa)
        calls["n"] += 1
        if int(os.environ.get("RANK", "0")) == 0 and calls["n"] <= 400:
            rec = {"call": calls["n"], "choice": int(choice), "mask": attn_mask is not None,
                   "grad": torch.is_grad_enabled(), "q_stride": q.stride(), "k_stride": k.stride(),
                   "q_ptr_mod": q.data_ptr() % 256, "k_ptr_mod": k.data_ptr() % 256, "v_ptr_mod": v.data_ptr() % 256,
                   "out_stride": out.stride(), "priority": [int(b) for b in torch._C._get_sdp_priority_order()]
                   if hasattr(torch._C, "_get_sdp_priority_order") else None,
                   "enabled": [torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
                               torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled()]}
            with open(path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        return out

    F.scaled_dot_product_attention = sdpa
