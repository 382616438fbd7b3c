"""What an RL stage (``[stage] kind = "rl"``) plans besides the policy's forward and backward.

Per optimizer step (``train.global_batch_size`` = prompts x ``G`` completion rows of
``train.seq_length`` positions; a rollout batch serves ``grpo_iterations`` = mu steps):

* **Rollouts** (``rl_rollout``, backends/rl/stage.py through the sampler): one rollout batch per mu
  steps. The masked-diffusion sampler makes ``generate.steps`` forward calls (LLaDA's sampler: one
  per denoising step; ``remasking = "threshold"`` / ``"factor"`` commit at least one token per step,
  so ``steps`` is their upper bound; ``cfg_scale > 0`` doubles the rows of each call); the AR
  sampler makes ``gen_length`` calls, each over the sequence so far without a KV cache (mean
  length ``seq - gen_length / 2``). What a diffusion call computes depends on ``[generate] cache``
  (backends/generate/block_cache.py; Fast-dLLM, Wu et al. 2025, arXiv:2505.22618 sec. 3.2), with
  ``L = seq`` the canvas, ``P = L - gen_length`` the prompt, ``B = block_length``, ``n =
  gen_length / B`` blocks of ``k = steps / n`` steps and ``r = cache_refresh`` (unset: ``k``, a
  refresh at each block's first step only):

  - ``"none"``: every call runs all ``L`` columns: ``steps`` full passes.
  - ``"prefix"`` / ``"dual"``: per block, ``ceil(k / r)`` refresh calls run all ``L`` columns (and
    store every layer's keys and values); the other ``k - ceil(k / r)`` calls run ``q`` query
    columns against all ``L`` keys (the cached ones and their own): ``q = L - (P + b B)`` for
    block ``b`` under ``"prefix"`` (the block and the masked suffix), ``q = B`` under ``"dual"``.
    The attended length is ``L`` keys in every call. Such a call costs ``q / L`` of a full pass in
    both its linear layers (``q`` columns) and its attention (``q x L`` of ``L x L`` scores).

  :func:`sampler_schedule` gives the calls, the full-pass equivalents and these lengths. Each call
  is an inference forward over all the rank's rows at once (:func:`sampler_work`): the decoder's
  GEMMs, attention and element-wise work over the canvas (``equivalents`` full passes) and the
  output layer over the columns a call returns logits for (the block's under the diffusion sampler,
  whose block function slices the hidden states before the output layer; every position so far
  under the AR one), not a third of a training step, whose output layer and cross entropy cover every
  position. Every call also moves its logits through memory (:func:`logits_traffic`): the model's
  ``[s, b, V]`` logits transposed to ``[b, s, V]`` (megatron-core ``GPTModel``), made float32 and,
  for the diffusion sampler's commit (backends/generate/sampler.py ``sample_tokens``), float64 for
  the argmax, the Gumbel noise at ``temperature > 0`` and the softmax of the confidence, at the
  calibrated HBM bandwidth (``hbm_gbps x memory_efficiency``). Eager, every call, cached or not,
  adds a third of one microbatch's kernel launches (a cached call launches as many kernels). With
  ``[generate] cuda_graph`` (the default) the sampler replays the forward as a CUDA graph
  (backends/generate/cuda_graphs.py) where it can (:func:`graph_fallback`: a diffusion rollout at
  TP 1, without FSDP, overlapped parameter gathers or ``compile``): a replay has no host launch
  work, and each of the forward's kernels (a third of one microbatch's) costs the GPU only its
  floor, ``Calibration.gpu_seconds_per_kernel``. Rollout time = ``(compute + logits + calls x
  launches) / mu``. For a small model the logits are a large part of a call: the addition spec's
  rollout batch (128 rows, 8 calls of 8 block columns, temperature 1, graphs) plans at 6.1 ms a call
  on an H100, 2.3 ms of decoder, 0.1 ms of output layer, 2.2 ms of logits (142 bytes over each of
  a row's 8 x 50,304 logits) and 1.5 ms of kernel floors: 48.7 ms a batch, where one H100 measured
  52.9 ms, and 44.1 ms at the call's own 24-position canvas (17 % under;
  ``bench/results/rl/2026-12-07-h100-rollout-planned-vs-measured.json``, planned on CPU
  from that result and the sampler's batch-1, 8 and 32 runs: the default low-confidence sampler
  within 7 %, eager within 8 %). Not priced: the host's own work per step, which a
  ``threshold`` / ``factor`` step exposes (one host synchronisation a step: those runs planned
  8-27 % under), top-k / top-p filtering (a sort over the vocabulary), and a batch's prompt
  lengths (the plan takes ``train.seq_length`` as the canvas).
* **Scoring** (``rl_scoring``): the estimator's forward passes per log-probability (one-step and
  ar: 1; coupled: 2, DiffuCoder's complementary pair; mc-elbo: K). The policy's own training pass
  is one forward and backward of the base step; the other ``n - 1`` passes also run backward (a
  forward and backward each), priced as the base pass: compute and kernel launches (a small
  model's step is launch-bound; on one H100 the addition demo's coupled-GRPO update took 0.126 s
  more than diffu-GRPO's, its second view priced at 0.118 s, where compute alone gave 0.015 s and
  the plan was 36 % under the measured step). With mu > 1 the rollout policy's log-probabilities
  (n forwards for each inner iteration after the first, made at rollout time: the first iteration
  compares with the training forward's own, detached) and with ``grpo_kl_beta > 0`` the
  reference's (n forwards per inner iteration) add forwards without backward; the ``ar``
  estimator's are made once per rollout batch (it draws no masks). Each is priced at its compute
  and its kernel launches, a third of the step's: on one H100 the AR addition run at 512 rows
  (8 microbatches, 2 no-grad passes per microbatch per step) measured 1.03 s a step where these
  passes priced at their compute alone planned 0.70 s
  (``bench/results/rl/2026-12-07-h100-grpo-ar-64-prompts.json``).
* **Memory** (``rl_reference``): with ``grpo_kl_beta > 0`` a frozen copy of this rank's weights in
  the run's dtype (:meth:`dlmspec.backends.megatron.stage.ModelFactory.frozen_copy`), held the
  whole step. The sampler's ``[rows, seq, vocab]`` float32 logits exist during the rollout only,
  when no activation is held: :func:`rl_plan` reports them, the step's peak does not count them.
* **Checkpoints** (:func:`reference_checkpoint`): the reference's weights are saved beside the
  policy's (megatron-core distributed checkpointing: each tensor once over all ranks, in the run's
  dtype) in every checkpoint after its first refresh (after ``ref_model_sync_steps`` steps), or in
  every checkpoint without ``checkpoint.init_from``; before a refresh a resume reads ``init_from``
  again.

Reads ``[stage.rl]`` (:attr:`dlmspec.plan.shape.ModelShape.stage_options`, defaults of
:class:`dlmspec.spec.models.RLSpec` where unwritten) and the rollout sampler's ``[generate]``
settings (the ``"generate"`` entry the shape adds for an RL stage).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from dlmspec.gpus import GPU
from dlmspec.plan.calibration import Calibration
from dlmspec.plan.compute import shape_forward_parts
from dlmspec.plan.elementwise import elementwise_bytes
from dlmspec.plan.launches import kernels_per_microbatch
from dlmspec.plan.memory import (StageMemoryTerm, StageTermInputs, linear_params, register_stage_memory_term,
                                 stage_layer_counts)
from dlmspec.plan.shape import Layout, ModelShape, attention_backend, input_length
from dlmspec.plan.time import (ATTENTION_BACKEND_SPEED, StageTimeTerm, attention_peak_flops, peak_flops,
                              register_stage_time_term)
from dlmspec.wording import duration

#: ``[stage.rl]`` defaults the planner reads (as :class:`dlmspec.spec.models.RLSpec`).
RL_DEFAULTS: dict[str, Any] = {"algorithm": "diffu-grpo", "estimator": None, "elbo_samples": 4,
                               "grpo_iterations": 1, "grpo_kl_beta": 0.04, "grpo_group_size": 8,
                               "grpo_prompts_per_step": 8, "ref_model_sync_steps": 64}
#: ``[generate]`` defaults the planner reads (as :class:`dlmspec.spec.models.GenerateSpec`).
GENERATE_DEFAULTS: dict[str, Any] = {"gen_length": 128, "steps": 128, "block_length": 128, "cfg_scale": 0.0,
                                     "remasking": "low_confidence", "cache": "none", "cache_refresh": None,
                                     "cuda_graph": True, "compile": False, "temperature": 0.0}
#: The algorithm's estimator (backends/rl/rollout.py ALGORITHM_ESTIMATOR).
ALGORITHM_ESTIMATOR = {"diffu-grpo": "one-step", "coupled-grpo": "coupled", "grpo": "ar"}
#: Estimators whose rollouts decode left to right (exact token log-probabilities of an
#: autoregressive model); every other estimator's rollouts run the masked-diffusion sampler.
LEFT_TO_RIGHT_ESTIMATORS = frozenset({ALGORITHM_ESTIMATOR["grpo"]})
#: Estimators whose log-probabilities draw nothing (backends/rl/estimators.py ``deterministic``):
#: the stage scores the rollout policy and the reference once per rollout batch for them.
DETERMINISTIC_ESTIMATORS = frozenset({"ar"})


def rl_options(shape: ModelShape) -> dict[str, Any]:
    """``[stage.rl]`` of ``shape`` with :data:`RL_DEFAULTS` filled, and ``"generate"``: the rollout
    sampler's settings with :data:`GENERATE_DEFAULTS` filled."""
    options = dict(shape.stage_options)
    gen = dict(options.pop("generate", ()) or ())
    out = {**RL_DEFAULTS, **{k: v for k, v in options.items() if v is not None or k == "estimator"}}
    out["generate"] = {**GENERATE_DEFAULTS, **{k: v for k, v in gen.items() if v is not None}}
    return out


def estimator_name(options: dict[str, Any]) -> str:
    """The estimator the stage runs: ``[stage.rl] estimator``, else the algorithm's."""
    return str(options.get("estimator") or ALGORITHM_ESTIMATOR[options["algorithm"]])


def estimator_passes(options: dict[str, Any]) -> int:
    """Forward passes of one log-probability (the estimator's ``forward_passes``)."""
    return {"one-step": 1, "ar": 1, "coupled": 2}.get(estimator_name(options), int(options["elbo_samples"]))


def diffusion_rollout(options: dict[str, Any]) -> bool:
    """Whether rollouts run the masked-diffusion sampler."""
    return estimator_name(options) not in LEFT_TO_RIGHT_ESTIMATORS


def sampler_schedule(options: dict[str, Any], seq: int) -> dict[str, Any]:
    """The sampler's work per rollout batch (module docstring, "Rollouts"):

    - ``calls``: forward calls (each doubled by guidance);
    - ``equivalents``: their compute in full-sequence, one-batch forward passes;
    - ``cache``: the ``[generate] cache`` run (``"none"`` for the AR sampler);
    - ``refresh_calls`` / ``cached_calls``: calls that run all ``seq`` columns and calls that run the
      cached ``query_columns`` (mean over the cached calls; 0 without any);
    - ``attended_keys``: keys each query attends (``seq``; the AR sampler's mean prefix length).
    """
    gen = options["generate"]
    if not diffusion_rollout(options):
        length = int(gen["gen_length"])
        mean = max(seq - length / 2.0, 1.0)
        return {"calls": float(length), "equivalents": length * mean / max(seq, 1), "cache": "none",
                "refresh_calls": float(length), "cached_calls": 0.0, "query_columns": 0.0, "attended_keys": mean}
    rows = 2.0 if float(gen["cfg_scale"]) > 0 else 1.0
    steps, cache = float(gen["steps"]), str(gen.get("cache") or "none")
    if cache == "none":
        return {"calls": steps * rows, "equivalents": steps * rows, "cache": cache, "refresh_calls": steps * rows,
                "cached_calls": 0.0, "query_columns": 0.0, "attended_keys": float(seq)}
    length = max(int(seq), 1)
    gen_length = int(gen["gen_length"])
    block = max(1, min(int(gen["block_length"]), gen_length))
    blocks = max(1, gen_length // block)
    per_block = steps / blocks
    refresh = gen.get("cache_refresh")
    refreshes = min(per_block, float(math.ceil(per_block / (int(refresh) if refresh else per_block))))
    cached = per_block - refreshes
    prompt = max(length - gen_length, 0)
    columns = [float(length - (prompt + b * block)) if cache == "prefix" else float(block) for b in range(blocks)]
    columns = [min(max(c, 1.0), float(length)) for c in columns]
    equivalents = sum(refreshes + cached * c / length for c in columns)
    return {"calls": steps * rows, "equivalents": equivalents * rows, "cache": cache,
            "refresh_calls": refreshes * blocks * rows, "cached_calls": cached * blocks * rows,
            "query_columns": sum(columns) / len(columns) if cached > 0 else 0.0, "attended_keys": float(length)}


def rollout_passes(options: dict[str, Any], seq: int) -> float:
    """Forward passes of the sampler per rollout batch, in full-sequence, one-batch equivalents
    (:func:`sampler_schedule`'s ``equivalents``)."""
    return float(sampler_schedule(options, seq)["equivalents"])


def _forward_parts(breakdown: dict[str, float], lay: Layout | None = None) -> tuple[float, float]:
    """``(compute, launches)`` of one forward pass over the rank's rows of a step: a third of the
    step's compute (a quarter under full recomputation) and (a sampler call is one call over all the
    rank's rows) a third of one microbatch's kernel launches (0 without ``lay``)."""
    # full recomputation runs each layer's forward twice: the step's compute is 4 forwards, not 3
    passes = 4.0 if lay is not None and lay.recompute == "full" else 3.0
    compute = (breakdown.get("gemm", 0.0) + breakdown.get("attention", 0.0) + breakdown.get("elementwise", 0.0)) / passes
    if lay is None:
        return compute, 0.0
    microbatches = max(1, lay.global_batch // max(lay.micro_batch * lay.dp, 1))
    return compute, breakdown.get("kernel_launch", 0.0) / (3.0 * microbatches)


def _forward(breakdown: dict[str, float], lay: Layout | None = None) -> float:
    """One forward pass over the rank's rows of a step (:func:`_forward_parts`, summed)."""
    compute, launches = _forward_parts(breakdown, lay)
    return compute + launches


def graph_fallback(options: dict[str, Any], lay: Layout) -> str | None:
    """Why the rollout sampler's forward runs eager under ``[generate] cuda_graph``, or ``None``
    when it replays as a CUDA graph (the runtime's rule: backends/generate/cuda_graphs.py
    ``cuda_graph_unsupported``, and the AR sampler, which calls the model eager)."""
    gen = options["generate"]
    if not gen.get("cuda_graph", True):
        return "[generate] cuda_graph = false"
    if not diffusion_rollout(options):
        return "the AR sampler calls the model eager"
    if gen.get("compile"):
        return "[generate] compile = true (torch.compile's own graphs)"
    if lay.tp > 1:
        return f"tensor_model_parallel_size = {lay.tp}"
    if lay.fsdp != "none":
        return f"fsdp = {lay.fsdp!r}"
    if lay.overlap_param_gather:
        return "overlap_param_gather"
    return None


#: Bytes per logit element of the diffusion sampler's commit after the float32 logits
#: (backends/generate/sampler.py ``sample_tokens``), by what it runs: the float64 copy (read 4,
#: write 8), the argmax (read 8) and the softmax of the confidence (PyTorch's row kernel for rows
#: wider than shared memory: three reads and a write of 8); at ``temperature > 0`` the Gumbel noise
#: (``rand`` write 8, ``log_``, ``neg_``, ``log_`` 16 each, the subtraction read 16 write 8); at a
#: temperature other than 1 ``l / T`` (16).
COMMIT_BYTES = {"greedy": 12 + 8 + 32, "gumbel": 8 + 16 + 16 + 16 + 24, "temperature": 16}
#: Bytes per output element of unsupervised classifier-free guidance in float32
#: (``uncond + (scale + 1) * (cond - uncond)``: three element-wise kernels).
GUIDANCE_BYTES = 12 + 8 + 12


def logits_traffic(options: dict[str, Any], seq: int, *, act_bytes: int) -> dict[str, float]:
    """Bytes each sampler call moves through its logits per row and vocabulary entry (module
    docstring, "Rollouts"): ``{"columns", "bytes"}``, the call's logits columns per row and the
    bytes over each of their ``V`` entries; a call moves ``rows x columns x V x bytes``.

    - the model's output: megatron-core ``GPTModel`` returns ``logits.transpose(0, 1).contiguous()``
      in the compute dtype (``act_bytes`` read and written) and the sampler's ``.float()`` makes
      float32 of it (``act_bytes`` read, 4 written; a float32 run copies the graph's static output
      instead, 4 and 4);
    - diffusion (``columns``: ``block_length``, the block sampler's logits): :data:`COMMIT_BYTES`
      by temperature; with ``cfg_scale > 0`` each call's output part counts twice (the call runs
      both halves) and :data:`GUIDANCE_BYTES` is added;
    - AR (``columns``: the mean length ``seq - gen_length / 2``: every call returns the logits of
      every position, and samples from the last one's, whose commit is left out).
    """
    gen = options["generate"]
    output = 2.0 * act_bytes + (act_bytes + 4.0 if act_bytes != 4 else 8.0)
    if not diffusion_rollout(options):
        return {"columns": sampler_schedule(options, seq)["attended_keys"], "bytes": output}
    temperature = float(gen.get("temperature") or 0.0)
    commit = float(COMMIT_BYTES["greedy"])
    if temperature > 0:
        commit += COMMIT_BYTES["gumbel"] + (COMMIT_BYTES["temperature"] if temperature != 1.0 else 0.0)
    guided = float(gen["cfg_scale"]) > 0
    block = max(1, min(int(gen["block_length"]), int(gen["gen_length"])))
    return {"columns": float(block),
            "bytes": (2.0 * output + GUIDANCE_BYTES if guided else output) + commit}


def _rows(lay: Layout) -> float:
    """The rank's rows of a step, which one sampler call runs together."""
    return lay.global_batch / max(lay.dp, 1)


def sampler_work(shape: ModelShape, lay: Layout, options: dict[str, Any], gpu: GPU,
                 calib: Calibration) -> dict[str, float]:
    """GPU seconds of one rollout batch's forward calls besides their kernel floors or launches, as
    inference runs them rather than a third of a training step (whose output layer and cross entropy
    cover every position):

    - ``decoder``: the layers' GEMMs (``attention_linear``, ``mlp``, ``moe`` of
      :func:`dlmspec.flops.forward_flops_per_token`) and attention (``attention_core`` at the
      canvas' keys) over ``rows x seq`` positions per full-pass equivalent
      (:func:`sampler_schedule`), at the calibrated GEMM and attention efficiencies, and the
      decoder's element-wise bytes (:func:`dlmspec.plan.elementwise.elementwise_bytes` without
      the embedding, the loss and the weight-gradient accumulation), a third of them (the forward's
      share, as the training step's);
    - ``head``: the output layer's GEMM (``2 h V`` a position) over the positions a call returns
      logits for: ``calls x rows x columns`` (:func:`logits_traffic`: the block's columns, or
      every position so far under the AR sampler);
    - ``logits``: the passes over those logits (:func:`logits_traffic`), ``calls x rows x columns x V
      x bytes / (hbm_gbps x memory_efficiency)``, ``calls`` without guidance's doubling (the guided
      rows are in the bytes).
    """
    seq = input_length(shape, lay)
    schedule = sampler_schedule(options, seq)
    traffic = logits_traffic(options, seq, act_bytes=lay.act_bytes)
    rows, t = _rows(lay), lay.tp
    parts = shape_forward_parts(shape, seq)
    gemm_peak, attn_peak = peak_flops(gpu, lay)
    speed = calib.gpu_compute_scale.get(gpu.id, 1.0)
    positions = rows * seq
    decoder_flops = (parts["attention_linear"] + parts["mlp"] + parts["moe"]) * positions / t
    attention_flops = parts["attention_core"] * positions / t
    one = replace(lay, micro_batch=max(1, round(rows)), cp=1)
    counts = stage_layer_counts(shape, one, 0)
    ew = elementwise_bytes(shape, one, -1, counts)  # stage -1: neither the embedding's nor the loss's rank
    if one.impl != "transformer_engine":
        ew -= (2 * one.act_bytes + 8) * linear_params(shape, one, counts)  # main_grad accumulation: training only
    hbm = gpu.hbm_gbps * 1e9 * calib.memory_efficiency
    full = (decoder_flops / (gemm_peak * calib.gemm_efficiency)
            + attention_flops / (attention_peak_flops(gpu, lay, attn_peak) * calib.attention_efficiency
                                 * ATTENTION_BACKEND_SPEED[attention_backend(lay, gpu.compute_capability)])) / speed
    full += ew / 3.0 / hbm
    head_positions = schedule["calls"] * rows * traffic["columns"]
    head = parts["logits"] * head_positions / t / (attn_peak * calib.gemm_efficiency) / speed  # bf16, as training's
    guided = diffusion_rollout(options) and float(options["generate"]["cfg_scale"]) > 0
    logits = head_positions / (2.0 if guided else 1.0) * shape.vocab * traffic["bytes"] / hbm
    return {"decoder": schedule["equivalents"] * full, "head": head, "logits": logits}


def rollout_seconds(shape: ModelShape, lay: Layout, breakdown: dict[str, float], *,
                    calib: Calibration, gpu: GPU) -> float:
    """Rollout time per optimizer step: ``(work + calls x launches) / grpo_iterations`` (module
    docstring): ``work`` :func:`sampler_work`, ``launches`` a CUDA graph's per-kernel GPU floor where
    the forward is replayed as one, else a third of one microbatch's launches."""
    options = rl_options(shape)
    schedule = sampler_schedule(options, input_length(shape, lay))
    _, launches = _forward_parts(breakdown, lay)
    if graph_fallback(options, lay) is None:
        counts = stage_layer_counts(shape, lay, 0)
        launches = kernels_per_microbatch(shape, lay, counts, 0) / 3.0 * calib.gpu_seconds_per_kernel
    work = sum(sampler_work(shape, lay, options, gpu, calib).values())
    return (work + schedule["calls"] * launches) / int(options["grpo_iterations"])


def scoring_passes(options: dict[str, Any]) -> tuple[float, float]:
    """``(old, reference)``: no-grad passes of the estimator (each of its ``n`` forwards over the
    rank's rows) per rollout batch, as the stage makes them (backends/rl/rollout.py ``score_all``):
    the rollout policy's for inner iterations 2..mu (the first takes the training forward's own,
    detached) and, with ``grpo_kl_beta > 0``, the reference's for every inner iteration; the ``ar``
    estimator draws nothing, so each is made once and shared (1 and 1)."""
    mu = int(options["grpo_iterations"])
    deterministic = estimator_name(options) in DETERMINISTIC_ESTIMATORS
    old = 0.0 if mu <= 1 else (1.0 if deterministic else float(mu - 1))
    reference = 0.0 if float(options["grpo_kl_beta"]) <= 0 else (1.0 if deterministic else float(mu))
    return old, reference


def scoring_seconds(shape: ModelShape, lay: Layout, breakdown: dict[str, float]) -> float:
    """The estimator's extra passes, the rollout policy's and the reference's forwards, per step
    (module docstring, "Scoring"): each training pass beyond the base step's is a forward and
    backward of every microbatch, its compute (3 forwards) and its kernel launches (the step's
    ``kernel_launch``, as the base pass: the estimator's views run one after another in the
    forward step and backward through each); a no-grad forward of the rollout policy or the
    reference (:func:`scoring_passes`, per rollout batch, so over mu per step) is priced at its
    compute and its kernel launches, a third of the step's (a forward of every microbatch, no
    backward)."""
    options = rl_options(shape)
    n = estimator_passes(options)
    forward = _forward(breakdown)
    launches = breakdown.get("kernel_launch", 0.0)
    extra = (n - 1) * (3.0 * forward + launches)  # forward and backward of every pass beyond the base step's
    old, reference = scoring_passes(options)
    extra += n * (old + reference) * (forward + launches / 3.0) / int(options["grpo_iterations"])
    return extra


def reference_bytes(shape: ModelShape, lay: Layout, inputs: StageTermInputs) -> float:
    """A frozen copy of the rank's weights (``grpo_kl_beta > 0``), else 0."""
    if float(rl_options(shape)["grpo_kl_beta"]) <= 0:
        return 0.0
    return float(sum(inputs.params)) * inputs.param_bytes


def reference_checkpoint(options: dict[str, Any], *, parameters: int, dtype: str, init_from: bool,
                         train_iters: int) -> tuple[float, int | None]:
    """``(bytes, step)``: what the reference adds to a checkpoint, and the step after which every
    checkpoint holds it (``None``: none does). Bytes: ``parameters`` (the whole model, padded
    vocabulary: what megatron-core's distributed checkpoint writes, each tensor once over all
    ranks) x bytes per weight of ``dtype`` (4 for fp32, else 2: the reference is built in the
    run's dtype, :meth:`dlmspec.backends.megatron.stage.ModelFactory.frozen_copy`). Saved
    (backends/rl/stage.py ``RLStage.sharded_state_dict``) in every checkpoint without ``init_from``
    (step 0: nothing else rebuilds it), else in those after its first refresh, made before the step
    after ``ref_model_sync_steps`` steps when the run has one more step; never with
    ``grpo_kl_beta = 0`` (no reference)."""
    if float(options["grpo_kl_beta"]) <= 0:
        return 0.0, None
    sync = int(options.get("ref_model_sync_steps") or 0)
    if not init_from:
        first: int | None = 0
    elif sync and sync < int(train_iters):
        first = sync
    else:
        return 0.0, None
    return float(parameters) * (4 if dtype == "fp32" else 2), first


register_stage_time_term("rl", StageTimeTerm("rl_rollout", "rollouts (sampler forward passes)", rollout_seconds,
                                             calibrated=True))
register_stage_time_term("rl", StageTimeTerm("rl_scoring", "estimator, rollout-policy and reference passes",
                                             scoring_seconds))
register_stage_memory_term("rl", StageMemoryTerm("rl_reference", "frozen reference model (grpo_kl_beta > 0)",
                                                 reference_bytes))


@dataclass
class RLPlan:
    """An RL stage's rollout counts and times.

    Attributes:
        algorithm, estimator: as the stage runs them.
        rollout_batches: rollout batches in ``train_iters`` steps (``ceil(steps / mu)``).
        prompts_seen: ``rollout_batches x grpo_prompts_per_step``.
        completions: ``rollout_batches x prompts x G``.
        sampler_passes: forward passes per rollout batch (full-sequence equivalents, caches included).
        sampler_calls: forward calls per rollout batch (:func:`sampler_schedule`).
        cache: the rollout sampler's ``[generate] cache``.
        cached_query_columns: columns a cached call runs (mean; 0 without a cache).
        attended_keys: keys each query attends per call.
        cuda_graph_fallback: why the rollout's forward is priced eager (:func:`graph_fallback`),
            ``None`` when it is priced as a CUDA-graph replay.
        estimator_passes: forward passes per log-probability.
        rollout_seconds: one rollout batch (``rl_rollout x mu``).
        step_seconds: one optimizer step (rollout share included).
        rollout_share: the rollout's share of the step time (``rl_rollout``: a rollout batch spread
            over the ``mu`` steps it serves).
        steps_per_rollout: ``mu`` (``grpo_iterations``), the optimizer steps a rollout batch serves.
        to_train_seconds: ``step_seconds x train_iters``.
        rollout_logits_bytes: the sampler's float32 logits of the rank's rows during a rollout
            (not in the step's peak; see the module docstring).
        reference_bytes: the reference model's memory per GPU (0 without KL).
        reference_checkpoint_bytes: what the reference adds to each checkpoint that holds it, over
            all GPUs (:func:`reference_checkpoint`; 0: never saved).
        reference_checkpoint_from: the step after which every checkpoint holds it (0: all of
            them; ``None``: none).
    """

    algorithm: str
    estimator: str
    rollout_batches: int
    prompts_seen: int
    completions: int
    sampler_passes: float
    estimator_passes: int
    rollout_seconds: float
    step_seconds: float
    rollout_share: float
    to_train_seconds: float
    rollout_logits_bytes: float
    reference_bytes: float
    sampler_calls: float = 0.0
    cache: str = "none"
    cached_query_columns: float = 0.0
    attended_keys: float = 0.0
    reference_checkpoint_bytes: float = 0.0
    reference_checkpoint_from: int | None = None
    cuda_graph_fallback: str | None = None
    steps_per_rollout: int = 1

    def to_dict(self) -> dict[str, Any]:
        """The ``rl`` object of :meth:`dlmspec.plan.Plan.to_dict` (keys as the attributes)."""
        return dict(self.__dict__)


def rl_plan(plan: Any, *, init_from: bool = False) -> RLPlan | None:
    """The :class:`RLPlan` of ``plan`` (a :class:`dlmspec.plan.Plan`), ``None`` for other stages;
    ``init_from``: the spec sets ``checkpoint.init_from`` (:func:`reference_checkpoint`)."""
    shape, lay, t = plan.shape, plan.layout, plan.time
    if shape.stage_kind != "rl":
        return None
    options = rl_options(shape)
    mu = int(options["grpo_iterations"])
    batches = -(-int(lay.train_iters or 0) // mu)
    prompts = int(options["grpo_prompts_per_step"])
    rows_per_rank = lay.global_batch / max(lay.dp, 1)
    seq = input_length(shape, lay)
    cfg = 2 if diffusion_rollout(options) and float(options["generate"]["cfg_scale"]) > 0 else 1
    logits = rows_per_rank * cfg * seq * shape.vocab * 4.0
    ref = max((m.breakdown.get("rl_reference", 0.0) for m in plan.memory.stages), default=0.0) \
        if hasattr(plan.memory, "stages") else 0.0
    rollout_step = t.breakdown.get("rl_rollout", 0.0)
    schedule = sampler_schedule(options, seq)
    ckpt_bytes, ckpt_from = reference_checkpoint(options, parameters=int(shape.padded_total_params), dtype=lay.dtype,
                                                 init_from=init_from, train_iters=int(lay.train_iters or 0))
    return RLPlan(
        algorithm=str(options["algorithm"]),
        estimator=estimator_name(options),
        rollout_batches=batches, prompts_seen=batches * prompts,
        completions=batches * prompts * int(options["grpo_group_size"]),
        sampler_passes=rollout_passes(options, seq), estimator_passes=estimator_passes(options),
        rollout_seconds=rollout_step * mu, step_seconds=t.step_seconds, steps_per_rollout=mu,
        rollout_share=rollout_step / t.step_seconds if t.step_seconds else 0.0,
        to_train_seconds=t.to_train_seconds, rollout_logits_bytes=logits, reference_bytes=ref,
        sampler_calls=float(schedule["calls"]), cache=str(schedule["cache"]),
        cached_query_columns=float(schedule["query_columns"]), attended_keys=float(schedule["attended_keys"]),
        reference_checkpoint_bytes=ckpt_bytes, reference_checkpoint_from=ckpt_from,
        cuda_graph_fallback=graph_fallback(options, lay),
    )


def rl_lines(rl: RLPlan) -> list[str]:
    """The plan's lines of an RL stage."""
    gib = 1024 ** 3
    return [
        f"RL ({rl.algorithm}, {rl.estimator} estimator: {rl.estimator_passes} forward pass(es) per log-probability): "
        f"{rl.rollout_batches:,} rollout batches, {rl.prompts_seen:,} prompts, {rl.completions:,} completions",
        f"rollout: {rl.sampler_calls:,.0f} sampler calls ({rl.cache} cache"
        + (f": cached calls run {rl.cached_query_columns:,.0f} of {rl.attended_keys:,.0f} columns" if rl.cached_query_columns else "")
        + f") = {rl.sampler_passes:,.1f} sampler passes of the whole sequence"
        + (", the forward a CUDA graph" if rl.cuda_graph_fallback is None else f", the forward eager ({rl.cuda_graph_fallback})")
        + f", {duration(rl.rollout_seconds)} per rollout batch, which serves {rl.steps_per_rollout} optimizer "
        f"step{'s' * (rl.steps_per_rollout != 1)} ({100 * rl.rollout_share:.0f}% of each {duration(rl.step_seconds)} step); sampler logits "
        f"{rl.rollout_logits_bytes / gib:.1f} GiB per GPU while sampling (not in the training peak)",
        (f"reference model: {rl.reference_bytes / gib:.1f} GiB per GPU; "
         + (("every checkpoint" if not rl.reference_checkpoint_from else
             f"every checkpoint after step {rl.reference_checkpoint_from:,}")
            + f" holds it: +{rl.reference_checkpoint_bytes / gib:.1f} GiB on disk"
            if rl.reference_checkpoint_from is not None else
            "checkpoints hold none (a resume reads checkpoint.init_from again)"))
        if rl.reference_bytes else "reference model: none (grpo_kl_beta = 0)",
    ]
