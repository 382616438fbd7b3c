"""Rich tables of a plan and of a layout search (what ``dlmspec plan`` prints).

Cells are :class:`rich.text.Text`, never markup strings, so nothing from a spec is read as
markup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from dlmspec.gpus import GiB
from dlmspec.pipeline_split import rank_layers
from dlmspec.plan import Plan
from dlmspec.plan.memory import ALLOCATED_TERMS, RESERVED_TERMS, stage_memory_label
from dlmspec.plan.provenance import outside_text, paths_text, provenance
from dlmspec.plan.shape import pipeline_split
from dlmspec.plan.sft import sft_lines
from dlmspec.plan.rl import rl_lines
from dlmspec.wording import count, duration


if TYPE_CHECKING:  # `dlmspec plan` without --search does not import the search
    from dlmspec.plan.search import SearchResult

#: What each memory term is, one line (the docs have the formulas).
MEMORY_LABELS = {
    "weights": "bf16/fp32 parameters (DDP param buffer)",
    "gradients": "main_grad buffer (fp32 with grad_reduce_in_fp32)",
    "optimizer_states": "master weights + Adam moments (sharded with dist. optimizer; dtypes: [train])",
    "fp8_weight_cache": "Transformer Engine fp8 weights + transposes",
    "fsdp_unsharded_buffers": "FSDP: gathered weights, unsharded grads",
    "sp_gather_buffer": "sequence-parallel all-gather buffer",
    "activations": "saved activations x in-flight microbatches",
    "embedding_output_activations": "embedding dropout, final norm, output-layer input",
    "batch_and_objective": "token ids, labels, loss weights, per-token loss",
    "loss_logits": "the loss: bf16 logits + fp32 softmax (megatron), or one chunk + weight gradient (fused_linear)",
    "backward_transient": "one layer's backward (+ recomputed activations)",
    "optimizer_step_transient": "optimizer-step temporaries",
    "allocated_overhead": "cuBLAS workspaces, RNG, small buffers (calibrated)",
    "cuda_context": "CUDA context and kernels (not allocated)",
    "nccl_buffers": "NCCL communicator buffers (not allocated)",
    "allocator_reserve": "caching-allocator fragmentation (not allocated)",
}


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f}"


def _count(n: float) -> str:
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}"
    return str(int(n))


def plan_renderable(plan: Plan) -> Group:
    """The plan as a group of tables: layout summary, memory breakdown of the peak stage (and
    per stage when pipelined) and the time breakdown with throughput."""
    lay, peak, t = plan.layout, plan.memory.peak, plan.time
    head = Text()
    head.append(f"{plan.name}", style="bold")
    head.append(
        f": {_count(plan.shape.total_params)} parameters"
        + (f" ({_count(plan.shape.active_params)} active)" if plan.shape.active_params != plan.shape.total_params else "")
        + f" on {lay.world} x {plan.gpu.id} ({plan.gpu.name})\n"
    )
    vpp = f" x VPP {lay.vpp}" if lay.vpp > 1 else ""
    if lay.pipeline_split is not None:  # megatron-core's uneven split: the layers of each rank
        vpp += f" (layers per rank {', '.join(str(n) for n in rank_layers(pipeline_split(plan.shape, lay)))})"
    ep = f", EP {lay.ep} x ETP {lay.etp}" if plan.shape.is_moe else ""
    head.append(
        f"TP {lay.tp}{' (SP)' if lay.sp and lay.tp > 1 else ''} x PP {lay.pp}{vpp} x CP {lay.cp} x DP {lay.dp}{ep}; "
        f"micro batch {lay.micro_batch} x {count(lay.num_microbatches, 'microbatch')} x seq {lay.seq}; "
        f"recompute {lay.recompute}; distributed optimizer {'on' if lay.distributed_optimizer else 'off'}"
        + (f"; fp8 (recipe {lay.fp8_recipe})" if lay.fp8 else "") + "\n"
    )
    head.append(f"layers: {plan.runtime['transformer_impl']}", style="dim")
    prov = plan.provenance if plan.provenance is not None else provenance(plan)
    cal = prov["calibration"]
    head.append(f"\ncalibration: {cal['text']}", style="dim" if cal["status"] == "calibrated" else "yellow")
    if prov.get("paths"):
        head.append(f"\n{paths_text(prov['paths'])}", style="dim")
    outside = outside_text(prov["outside_measured"], prov["measured_range"])
    if outside:
        head.append(f"\nwarning: {outside}", style="yellow")
    if prov.get("public_points"):
        head.append(f"\npublic points: {prov['public_points']['text']}", style="dim")
    if plan.runtime.get("cross_entropy"):
        head.append(f"\nloss: {plan.runtime['cross_entropy']}", style="dim")
    if plan.runtime.get("attention"):
        head.append(f"\nattention: {plan.runtime['attention']}", style="dim")
    if plan.runtime.get("kernels"):
        head.append(f"\nkernels: {plan.runtime['kernels']}", style="dim")
    if plan.runtime.get("kernels_hint"):
        head.append(f"\nhint: {plan.runtime['kernels_hint']}", style="yellow")
    if plan.runtime.get("host_launch"):
        head.append(f"\nhost: {plan.runtime['host_launch']}", style="dim")
    if plan.runtime.get("optimizer_state"):
        head.append(f"\noptimizer state: {plan.runtime['optimizer_state']}", style="dim")

    mem = Table(title=f"memory per GPU (GiB), peak on pipeline stage {peak.stage} during "
                      f"{peak.phase.replace('_', ' ')}", title_justify="left")
    mem.add_column("term")
    mem.add_column("GiB", justify="right")
    mem.add_column("what", style="dim")
    for key in ALLOCATED_TERMS + peak.stage_terms:
        value = peak.breakdown[key]
        if value:
            mem.add_row(Text(key), Text(_gib(value)), Text(MEMORY_LABELS.get(key) or stage_memory_label(key)))
    mem.add_row(Text("peak allocated", style="bold"), Text(_gib(peak.peak_allocated_bytes), style="bold"),
                Text("compare: torch.cuda.max_memory_allocated()"))
    for key in RESERVED_TERMS:
        value = peak.breakdown[key]
        if value:
            mem.add_row(Text(key), Text(_gib(value)), Text(MEMORY_LABELS[key]))
    style = "bold green" if plan.fits else "bold red"
    mem.add_row(Text("peak", style=style), Text(_gib(peak.peak_bytes), style=style),
                Text(f"of {_gib(plan.gpu.memory_bytes)} GiB: {'fits' if plan.fits else 'DOES NOT FIT'}", style=style))

    parts: list = [head, mem]
    if len(plan.memory.stages) > 1:
        st = Table(title="per pipeline stage (GiB)", title_justify="left")
        for col in ("stage", "layers", "in flight", "weights+grads+optimizer", "activations", "logits", "peak"):
            st.add_column(col, justify="right")
        for s in plan.memory.stages:
            b = s.breakdown
            static = b["weights"] + b["gradients"] + b["optimizer_states"]
            acts = b["activations"] + b["embedding_output_activations"]
            st.add_row(Text(str(s.stage)), Text(str(s.layers[0] + s.layers[1])), Text(f"{s.in_flight:g}"),
                       Text(_gib(static)), Text(_gib(acts)), Text(_gib(b["loss_logits"])), Text(_gib(s.peak_bytes)))
        parts.append(st)

    tt = Table(title=f"time per step (slowest stage {t.slowest_stage})", title_justify="left")
    tt.add_column("term")
    tt.add_column("time", justify="right")
    tt.add_column("share", justify="right")
    for key in t.breakdown:  # TIME_TERMS, then the stage's own
        value = t.breakdown[key]
        if value:
            tt.add_row(Text(key), Text(duration(value)), Text(f"{100 * value / t.step_seconds:.1f}%"))
    tt.add_row(Text("step", style="bold"), Text(duration(t.step_seconds), style="bold"), Text(""))
    parts.append(tt)

    summary = Text()
    summary.append(f"{t.tokens_per_second:,.0f} tokens/s", style="bold")
    summary.append(f", {t.model_tflops_per_gpu:,.0f} model TFLOP/s per GPU, MFU {100 * t.mfu:.1f}%")
    if t.flops.recompute_per_step:
        summary.append(f" ({t.hardware_tflops_per_gpu:,.0f} TFLOP/s with recomputation)")
    if plan.shape.extra_seq_length:
        summary.append(f"\nper data token ({lay.seq:,} a sequence): {t.tokens_per_second:,.0f} tokens/s, MFU "
                       f"{100 * t.data_mfu:.1f}% (the model FLOPs of those tokens); the input's "
                       f"{lay.seq + plan.shape.extra_seq_length:,} positions: {t.input_positions_per_second:,.0f}/s, "
                       f"MFU {100 * t.mfu:.1f}% (their FLOPs at the mask's attention density)")
    if lay.train_iters:
        summary.append(f"\n{lay.train_iters:,} steps: {duration(t.to_train_seconds)}, {t.gpu_hours:,.1f} GPU-hours")
    parts.append(summary)
    for phase in plan.phases:
        parts.append(Text(f"{phase.during} ({phase.name}): +{_gib(phase.extra_bytes)} GiB per GPU, peak "
                          f"{_gib(phase.peak_bytes)} GiB{'' if phase.fits else ' (does not fit)'}"
                          + (f", {duration(phase.step_seconds)} a step" if phase.step_seconds else "")
                          + f"; {phase.note}"))
    if plan.sft is not None:
        parts.append(Text("\n".join(sft_lines(plan.sft, lay.train_iters, t.to_train_seconds))))
    if getattr(plan, "rl", None) is not None:
        parts.append(Text("\n".join(rl_lines(plan.rl))))
    return Group(*parts)


def search_renderable(result: SearchResult, top: int, *, set_lines: bool = True) -> Group:
    """The search result: the spec's own layout errors (if any, apart: they do not apply to
    the layouts found), a summary line and the ranked layouts with their ``--set`` lines
    (``set_lines=False`` leaves those out: :func:`print_search` prints them unwrapped); a ``!``
    marks a layout above the memory headroom threshold (ranked after the others)."""
    from dlmspec.plan import HEADROOM_WARNING

    parts: list = []
    if result.spec_layout_issues:
        note = Text(f"The spec's own layout breaks {count(len(result.spec_layout_issues), 'rule')}; the search sets "
                    "these keys itself, so they do not apply to the layouts below:\n", style="yellow")
        for issue in result.spec_layout_issues:
            note.append(f"  {issue.key} = {issue.value!r}: {issue.message} [{issue.rule}]\n")
        parts.append(note)
    head = Text(result.message, style="bold" if result.top else "bold red")
    parts.append(head)
    if result.calibration:
        parts.append(Text(f"calibration: {result.calibration['text']}",
                          style="dim" if result.calibration["status"] == "calibrated" else "yellow"))
    if not result.top:
        return Group(*parts)
    table = Table(title=f"top {min(top, len(result.top))} layouts by tokens/s", title_justify="left")
    from dlmspec.plan.search import optimizer_state_name

    for col in ("#", "TP", "PP", "VPP", "CP", "EP", "DP", "mbs", "microbatches", "recompute", "dist.opt", "opt. state",
                "peak GiB", "memory", "tokens/s", "MFU"):
        table.add_column(col, justify="right")
    lines = Text(no_wrap=True, overflow="ignore")  # one copy-pasteable line per layout
    for i, c in enumerate(result.top, 1):
        lay = c.layout
        table.add_row(*[Text(x) for x in (
            str(i), str(lay.tp), str(lay.pp), str(lay.vpp) if lay.vpp > 1 else "-", str(lay.cp), str(lay.ep),
            str(lay.dp), str(lay.micro_batch), str(lay.num_microbatches) + (" *" if lay.num_microbatches < lay.pp else ""),
            lay.recompute + (f" ({'+'.join(lay.recompute_modules)})" if lay.recompute == "selective" else ""),
            "on" if lay.distributed_optimizer else "off", optimizer_state_name(lay) or "spec",
            _gib(c.peak_bytes), f"{100 * c.memory_fraction:.1f}%{' !' if c.tight else ''}",
            f"{c.tokens_per_second:,.0f}", f"{100 * c.mfu:.1f}%")])
        lines.append(f"#{i}: {' '.join(c.set_args())}\n")
    parts.append(table)
    if any(c.tight for c in result.top):
        parts.append(Text(f"! above {HEADROOM_WARNING:.0%} of the GPU's memory: fits as planned, but allocator "
                          "fragmentation or an unplanned workspace can push it over; ranked after the layouts "
                          "with headroom", style="yellow"))
    if any(c.layout.num_microbatches < c.layout.pp for c in result.top):
        parts.append(Text("* fewer microbatches per step than pipeline stages: most of the step is the pipeline "
                          "bubble (counted in tokens/s); a larger train.global_batch_size fills it", style="yellow"))
    parts.append(Text(f"Ties (within {100 * _tie_tolerance():g}% of tokens/s) go to the simpler layout: fewer "
                      "parallel dimensions, then less CP, interleaving, PP, EP, TP and recomputation.",
                      style="dim"))
    if set_lines:
        parts.append(lines)
    return Group(*parts)


def _tie_tolerance() -> float:
    from dlmspec.plan.search import TIE_TOLERANCE

    return TIE_TOLERANCE


def print_plan(plan: Plan, console: Console) -> None:
    """Print :func:`plan_renderable`."""
    console.print(plan_renderable(plan))


def print_search(result: SearchResult, top: int, console: Console) -> None:
    """Print :func:`search_renderable`, then one ``--set`` line per layout, whole: a line is
    never wrapped or cut at the terminal's width, so it can be copied as it is."""
    console.print(search_renderable(result, top, set_lines=False))
    for i, c in enumerate(result.top, 1):
        console.print(Text(f"#{i}: {' '.join(c.set_args())}"), soft_wrap=True)


def repetition_renderable(rep) -> Text:
    """The training data's epochs and unique tokens (:func:`dlmspec.data.repetition.repetition_lines`);
    a line past the literature's threshold (``note:``) in yellow, unknown counts dim."""
    from dlmspec.data.repetition import repetition_lines

    text = Text()
    for i, line in enumerate(repetition_lines(rep)):
        style = "yellow" if line.startswith("note:") else "dim" if line.startswith("  unknown:") else ""
        text.append(("\n" if i else "") + line, style=style)
    return text


def _flops(n: float) -> str:
    return f"{n:.2e}"


def _hours(h: float) -> str:
    """GPU-hours with three significant digits below 100 (``0.0253``), else to a tenth."""
    return f"{h:,.1f}" if h >= 100 else f"{h:.3g}"


def study_renderable(rows: list, title: str) -> Group:
    """The sweep's one table (:mod:`dlmspec.plan.study`): per member N (non-embedding) and total
    parameters, training FLOPs, tokens, epochs, GPU-hours, MFU, peak memory per GPU, whether it
    fits; then the study's total GPU-hours and what N means."""
    from dlmspec.plan.study import N_DEFINITION

    table = Table(title=title, title_justify="left")
    for header in ("name", "N (non-emb.)", "total params", "train FLOPs", "tokens", "epochs", "GPU-hours", "MFU",
                   "peak GiB/GPU", "fits", "to train"):
        table.add_column(header)
    for r in rows:
        table.add_row(*(Text(c) for c in (
            r.name, _count(r.non_embedding_params), _count(r.total_params), _flops(r.training_flops),
            _count(r.tokens), "-" if r.epochs is None else f"{r.epochs:,.2f}", _hours(r.gpu_hours),
            f"{100 * r.mfu:.1f}%", _gib(r.peak_bytes), "yes" if r.fits else "NO",
            "-" if r.to_train_seconds is None else duration(r.to_train_seconds))))
    total = sum(r.gpu_hours for r in rows)
    foot = Text()
    foot.append(f"study total: {_hours(total)} GPU-hours over {count(len(rows), 'run')}", style="bold")
    foot.append(f"\n{N_DEFINITION}; train FLOPs: the planner's model FLOPs x train_iters (dlmspec/flops.py, "
                "no recomputation); epochs: tokens / unique training tokens ('-': mock data or counts not readable "
                "here)", style="dim")
    return Group(table, foot)
