"""``dlmspec new``: write a starter spec for a preset (``--preset``) that validates, plans and compiles
as written, or copy a bundled spec (``--from``); a parallel layout that fits is chosen with the
planner.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional

import typer

from dlmspec import objectives
from dlmspec.cli.app import app
from dlmspec.cli.commands.common import NEW_FROM_MARK, _SET_HELP, _written_by_new, check_output_file, write_output_file
from dlmspec.cli.help import Command
from dlmspec.cli.output import human_count, print_envelope, report_warnings, use_json
from dlmspec.errors import SpecError, SpecIssue
from dlmspec.gpus import GiB
from dlmspec.escape import comment, toml_document
from dlmspec.spec.presets import MASK_TOKEN_IDS, PRESETS
from dlmspec.wording import count, plural

if TYPE_CHECKING:
    from dlmspec.resolve import Resolved


#: Spec keys a layout search chooses (:data:`dlmspec.plan.SPEC_KEYS`); ``dlmspec new`` searches
#: only when no ``--set`` names one of them.
_LAYOUT_KEYS = frozenset({
    "parallel.tensor_model_parallel_size", "parallel.pipeline_model_parallel_size",
    "parallel.virtual_pipeline_model_parallel_size", "parallel.context_parallel_size",
    "parallel.expert_model_parallel_size", "parallel.expert_tensor_parallel_size", "parallel.sequence_parallel",
    "train.micro_batch_size", "recompute.granularity", "recompute.method", "recompute.num_layers",
    "parallel.use_distributed_optimizer",
})


def _starter_mask(preset: str, vocab_size: int) -> tuple[int, int, str]:
    """``(mask_token_id, NullTokenizer vocab_size, why)`` for an mdm starter spec of ``preset``.

    [MASK] must be a row of the embedding that the data never contains (rules
    ``mask-token-range`` and ``mask-token-distinct``): the id the published model reserves, else
    the first padded row, else (a vocabulary that is a multiple of 128: no padded row at any TP
    size) the last row. The mock NullTokenizer emits ids 0..vocab_size, so its vocab_size stays
    below the mask id.
    """
    if preset in MASK_TOKEN_IDS:
        mask = MASK_TOKEN_IDS[preset]
        why = f"the id {preset}'s tokenizer reserves for it"
    elif vocab_size % 128:
        mask = vocab_size
        why = f"the first padded embedding row ({preset} has {vocab_size:,} token ids)"
    else:
        mask = vocab_size - 1
        why = (f"the last embedding row: {preset}'s {vocab_size:,} rows are a multiple of 128, so padding "
               "leaves none free. The mock NullTokenizer below never emits it; with the real tokenizer, use "
               "an id it never emits (e.g. an unused or reserved special token)")
    return mask, min(vocab_size - 1, mask - 1), why


def starter_spec(
    name: str,
    preset: str,
    *,
    objective: str = "mdm",
    gpu: str = "h100",
    nodes: int = 1,
    gpus_per_node: int = 8,
    seq_length: int | None = None,
    overrides: Iterable[str] = (),
    layout: dict[str, Any] | None = None,
    layout_note: str | None = None,
) -> str:
    """A starter spec (TOML text) for ``preset``: mock data with a NullTokenizer (so it runs
    at once as a benchmark), bf16, a 1,000-step cosine schedule, a global batch of at least 256
    sequences (the smallest multiple of the GPU count), and for ``mdm`` an explicit [MASK] id
    (:func:`_starter_mask`). The layout is data parallel only unless ``layout`` (dotted spec key
    -> value, e.g. from :func:`dlmspec.plan.search.search`) says otherwise; ``layout_note`` is
    the header line that explains it. ``overrides`` (``--set``) are applied last.

    Raises:
        SpecError: unknown preset, or a malformed ``--set`` override.
    """
    from dlmspec.spec.dotted import parse_set_value, set_dotted
    from dlmspec.spec.schema_errors import set_syntax_issue

    if preset not in PRESETS:
        from dlmspec.spec.schema_errors import preset_hint

        raise SpecError([SpecIssue("--preset", "unknown preset", value=preset, hint=preset_hint(preset),
                                   rule="unknown-preset")])
    from dlmspec.check.moe import SEQUENTIAL_EXPERTS_NOTE  # here: `new --help` imports no rules

    model = PRESETS[preset]
    world = nodes * gpus_per_node
    seq = seq_length or min(4096, model["max_position_embeddings"])
    vocab = model["vocab_size"]
    objective_table: dict[str, Any] = {"kind": objective}
    registered = objectives.find(objective)  # an unregistered kind: refused by validate, below
    if objectives.is_diffusion(objective):
        mask, null_vocab, mask_why = _starter_mask(preset, vocab)
        objective_table["mask_token_id"] = mask
    else:
        null_vocab, mask_why = vocab - 1, None
    data: dict[str, Any] = {
        "name": name,
        "description": f"{preset} {(registered.adjective or objective) if registered is not None else 'autoregressive'} "
        f"pretraining on {world} {gpu} {plural('GPU', world)} (starter spec from `dlmspec new`)",
        # grouped-GEMM experts for a fine-grained MoE (rule moe-sequential-experts)
        "model": {"preset": preset, **({"moe_grouped_gemm": True}
                                       if (model.get("num_experts") or 0) >= SEQUENTIAL_EXPERTS_NOTE else {})},
        "objective": objective_table,
        "parallel": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1},
        "precision": {"dtype": "bf16"},
        "train": {
            "micro_batch_size": 1,
            "global_batch_size": -(-256 // world) * world,
            "seq_length": seq,
            "train_iters": 1000,
            "lr": 3e-4,
            "min_lr": 3e-5,
            "lr_decay_style": "cosine",
            "lr_warmup_iters": 100,
        },
        "data": {"mock": True, "tokenizer": {"type": "NullTokenizer", "vocab_size": null_vocab}},
        "checkpoint": {"save": "runs/{name}/checkpoints", "save_interval": 500},  # {name}: the spec's name
        "cluster": {"gpu": gpu, "gpus_per_node": gpus_per_node, "nodes": nodes},
        "logging": {"log_interval": 10, "tensorboard_dir": "runs/{name}/tensorboard"},
    }
    for key, value in (layout or {}).items():
        set_dotted(data, key, value)
    problems = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            problems.append(set_syntax_issue(item))
            continue
        try:
            set_dotted(data, key.strip(), parse_set_value(text.strip()))
        except ValueError as exc:
            problems.append(SpecIssue(key.strip(), str(exc), value=item, rule="set"))
    if problems:
        raise SpecError(problems)
    lines = [
        f"{name}: written by `dlmspec new --preset {preset}`.",
        "It trains on random tokens (data.mock) so it validates, plans and compiles as written. For real",
        "data, prepare an indexed dataset (`dlmspec data prepare`), then set in [data]: mock = false,",
        '  train = ["PREFIX_text_document"], and [data.tokenizer] type/model of the model\'s tokenizer.',
    ]
    if mask_why:
        lines.append(f"[MASK] = {data['objective'].get('mask_token_id')}: {mask_why}.")
    lines.append(layout_note or "Parallel layout: data parallel only.")
    lines.append("`dlmspec show --presets` lists presets; `dlmspec validate` checks this file, `dlmspec plan` "
                 "shows its memory and speed.")
    header = "".join(f"# {comment(line)}\n" for part in lines for line in _wrap(part, 96))
    return header + "\n" + toml_document(data)


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False) or [""]


def _fitting_layout(resolved: Resolved) -> tuple[dict[str, Any] | None, str, str]:
    """The fastest layout of ``resolved``'s model and GPUs whose planned peak leaves the
    headroom the ``memory-headroom`` rule asks for (:func:`dlmspec.plan.search.search`).

    Returns:
        ``(layout, note, hint)``: the layout as dotted spec keys and the header line that
        explains it; or ``None``, why nothing fits, and what would (the smallest node count,
        up to 64 nodes of the same GPUs, that fits).
    """
    from dlmspec.plan import HEADROOM_WARNING
    from dlmspec.plan.search import search
    from dlmspec.resolve import resolve

    def best(candidate: Resolved) -> tuple[Any, Any]:
        result = search(candidate, top=20, state_options=False)  # a starter keeps fp32 optimizer state
        cap = HEADROOM_WARNING * candidate.gpu.memory_bytes
        return next((c for c in result.top if c.peak_bytes <= cap), None), result

    found, result = best(resolved)
    if found is None and result.top:
        failure = "its layouts fit only without the 5% memory headroom the planner asks for"
    elif found is None:
        smallest = result.smallest.peak_bytes / GiB if result.smallest else float("nan")
        failure = (f"the smallest planned peak of its {result.evaluated:,} layouts is {smallest:.1f} GiB per GPU, "
                   f"against {resolved.gpu.memory_bytes / GiB:.1f} GiB")
    if found is not None:
        lay = found.layout
        note = (f"Parallel layout: the fastest that fits with headroom (`dlmspec plan --search`): TP {lay.tp} x "
                f"PP {lay.pp}{f' (virtual {lay.vpp})' if lay.vpp > 1 else ''} x CP {lay.cp} x DP {lay.dp}"
                f"{f', EP {lay.ep}' if lay.ep > 1 else ''}, micro batch {lay.micro_batch}, recompute "
                f"{lay.recompute}; planned peak {found.peak_bytes / GiB:.1f} of "
                f"{resolved.gpu.memory_bytes / GiB:.1f} GiB per GPU.")
        return found.spec_changes(), note, ""
    spec, cluster = resolved.spec, resolved.spec.cluster
    for nodes in (2, 4, 8, 16, 32, 64):
        if nodes <= cluster.nodes:
            continue
        bigger, _ = best(resolve(spec.replace(**{"cluster.nodes": nodes})))
        if bigger is not None:
            return None, failure, (f"pass --nodes {nodes} ({nodes} nodes of {cluster.gpus_per_node} fit), "
                                   "or a GPU with more memory (--gpu)")
    return None, failure, "use a GPU with more memory (--gpu): not even 64 nodes fit"


@app.command(cls=Command)
def new(
    ctx: typer.Context,
    output: str = typer.Argument(..., help="Spec file to write (.toml)."),
    preset: Optional[str] = typer.Option(None, "--preset", "-p", help="Model preset (dlmspec show --presets)."),
    from_: Optional[str] = typer.Option(None, "--from", help="Copy a bundled spec by name instead (e.g. demo-dlm; "
                                        "the names are the files of the repository's specs/ folder)."),
    objective: str = typer.Option("mdm", "--objective", help="mdm (masked diffusion) or ar."),
    gpu: str = typer.Option("h100", "--gpu", help="GPU catalog id (dlmspec show --gpus)."),
    nodes: int = typer.Option(1, "--nodes", min=1, help="Nodes."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, help="GPUs per node."),
    seq_length: Optional[int] = typer.Option(None, "--seq-length", min=1, help="Default: min(4096, the preset's context)."),
    set_: list[str] = typer.Option([], "--set", "-s", help=_SET_HELP),
    force: bool = typer.Option(False, "--force", help="Overwrite OUTPUT if `dlmspec new` wrote it."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Write a starter spec for a model preset that validates, plans and compiles as written,
    or (--from NAME) a copy of a bundled spec.

    The layout is the fastest that fits with headroom, as `dlmspec plan --search` ranks them
    (data parallel or not), unless --set chooses parallel keys. When nothing fits, nothing is
    written and the message says how many nodes would do.
    """
    from dlmspec.cli.validate import _memory

    use_json(ctx, json_output)
    target = Path(output)
    if target.suffix != ".toml":
        stem = target.stem if target.suffix else target.name
        raise SpecError([SpecIssue("<output>", "dlmspec new writes a TOML spec, so its file name ends in .toml "
                                   "(a .py name would hold TOML that Python cannot run)", value=output,
                                   hint=f"use {target.with_name(stem + '.toml')}", rule="arguments")])
    if (preset is None) == (from_ is None):
        raise SpecError([SpecIssue("--preset", "give exactly one of --preset NAME and --from NAME", value=preset,
                                   hint="e.g. --preset qwen3-0.6b, or --from demo-dlm", rule="arguments")])
    if from_ is not None:
        _copy_bundled(target, from_, force=force, json_output=json_output)
        return
    if objectives.find(objective) is None:
        raise SpecError([SpecIssue("--objective", "not an objective", value=objective,
                                   hint=f"use {objectives.kinds_text()}",
                                   rule="arguments")])
    check_output_file(target, force=force, key="<output>", command="new", written_by=_written_by_new)
    name = target.stem.replace(".", "-") or "dlmspec-run"
    options = dict(objective=objective, gpu=gpu, nodes=nodes, gpus_per_node=gpus_per_node, seq_length=seq_length,
                   overrides=set_)
    text, loaded, resolved, issues = _starter(name, preset, file=target.name, where=f"{output} (not written)",
                                              **options)
    for issue in issues:  # the text is not written yet: point at the command line instead
        issue.file, issue.line = f"{output} (not written)", None
        if issue.severity == "error" and issue.hint and not issue.key.startswith(("<", "-")):
            issue.hint += " (pass changes to `dlmspec new` as --set section.key=value)"
    if any(i.severity == "error" for i in issues):
        raise SpecError(issues)
    check_output_file(target, force=force, key="<output>", command="new", written_by=_written_by_new)
    write_output_file(target, text, key="<output>")
    for issue in issues:
        issue.file = output
    if json_output:
        print_envelope("new", ok=True, issues=issues,
                       result={"output": output, "name": name, "preset": preset, "from": None,
                               "derived": resolved.derived(), "memory": _memory(resolved)})
        return
    report_warnings(issues)
    print(f"wrote {output}: {human_count(resolved.params.total)} parameters, {count(resolved.world_size, 'GPU')} as "
          f"TP {resolved.tp} x PP {resolved.pp} x CP {resolved.cp} x DP {resolved.dp}; "
          f"next: dlmspec validate {output}, dlmspec plan {output}")


def _starter(name: str, preset: str, *, file: str, where: str, **options: Any) -> tuple[str, Any, Resolved,
                                                                                       list[SpecIssue]]:
    """``dlmspec new``'s spec: :func:`starter_spec` with, unless ``overrides`` choose layout keys,
    the layout ``dlmspec plan --search`` ranks first among those that fit with headroom
    (:func:`_fitting_layout`), data parallel or not; ``(text, loaded, resolved, issues)``. ``where`` names the output in the issue of a model that fits on no layout.

    Raises:
        SpecError: what :func:`starter_spec` raises; no layout fits.
    """
    from dlmspec.cli.validate import spec_issues
    from dlmspec.resolve import resolve
    from dlmspec.spec.load import load_text

    text = starter_spec(name, preset, **options)
    loaded = load_text(text, name=file)
    resolved = resolve(loaded.spec)
    issues = spec_issues(loaded, resolved)
    chosen = {item.partition("=")[0].strip() for item in options.get("overrides", ())}
    if chosen & _LAYOUT_KEYS:
        return text, loaded, resolved, issues
    unfit = any(i.rule in ("memory-fits", "memory-headroom") for i in issues)
    if resolved.gpu is None and not unfit:
        return text, loaded, resolved, issues
    # The layout `dlmspec plan --search` ranks first among those that fit with headroom, whether or
    # not data parallelism alone fits: on many GPUs a pipelined layout plans faster than DP.
    layout, note, hint = _fitting_layout(resolved)
    if layout is None:
        if not unfit:
            return text, loaded, resolved, issues
        raise SpecError([SpecIssue("--nodes", f"{preset} does not fit on {resolved.world_size} x "
                                   f"{options.get('gpu', 'h100')}: {note}", value=options.get("nodes", 1),
                                   hint=hint, rule="memory-fits",
                                   source="dlmspec.plan.search (every layout of the model on these GPUs)",
                                   file=where)])
    text = starter_spec(name, preset, **options, layout=layout, layout_note=note)
    loaded = load_text(text, name=file)
    resolved = resolve(loaded.spec)
    issues = spec_issues(loaded, resolved)
    return text, loaded, resolved, issues


def starter_text(name: str, preset: str, **options: Any) -> str:
    """The TOML ``dlmspec new OUT --preset PRESET`` writes for the run ``name`` (``options``:
    :func:`starter_spec`'s keywords; ``Spec.from_preset`` uses it)."""
    return _starter(name, preset, file=f"{name}.toml", where=f"Spec.from_preset({preset!r})", **options)[0]


def bundled_specs() -> dict[str, Any]:
    """The bundled specs (package data of ``dlmspec.specs``: the repository's ``specs/``
    folder), by name (the file name without ``.toml``), sorted."""
    folder = importlib.resources.files("dlmspec.specs")
    return {entry.name[:-5]: entry for entry in sorted(folder.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".toml")}


def _copy_bundled(target: Path, name: str, *, force: bool, json_output: bool) -> None:
    """``dlmspec new OUT --from NAME``: copy the bundled spec ``NAME`` to ``target`` with a header
    line saying where it came from (so ``--force`` may replace it later).

    Raises:
        SpecError: an unknown name (the fix lists the names), or the output cannot be written.
    """
    specs = bundled_specs()
    if name not in specs:
        raise SpecError([SpecIssue("--from", "not a bundled spec", value=name,
                                   hint="one of: " + ", ".join(specs), rule="arguments")])
    check_output_file(target, force=force, key="<output>", command="new", written_by=_written_by_new)
    text = f"#{NEW_FROM_MARK}{name}` (the bundled specs/{name}.toml)\n" + specs[name].read_text(encoding="utf-8")
    write_output_file(target, text, key="<output>")
    if json_output:
        print_envelope("new", ok=True, result={"output": str(target), "name": None, "preset": None, "from": name})
        return
    print(f"wrote {target}: a copy of the bundled spec {name}; next: dlmspec validate {target}")
