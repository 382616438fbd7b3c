"""The commands of ``dlmspec``, registered on :data:`dlmspec.cli.app.app` when this module is
imported: every command's declaration (options, help) and the bodies of ``show``, ``new``,
``schema``, ``compile`` and ``submit`` (``validate`` and ``plan`` run
:func:`dlmspec.cli.validate.run_validate` and :func:`dlmspec.cli.plan.run_plan`).

``validate`` (load, resolve and check a spec: schema, cross-field rules, SLURM settings, memory per
GPU, paths; ``check`` is a hidden alias), ``show`` (the spec with every default filled in and its
derived values; or the GPU, preset and rule catalogs), ``schema`` (the JSON Schema of a spec file,
for editors) and ``new`` (write a starter spec for a preset that validates, plans and compiles as
written). :func:`dlmspec.cli.main` runs the plain forms of ``validate`` and ``plan`` without
importing this module (typer and the app take about 80 ms to build) and hands everything else here.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

import typer

from dlmspec.cli.app import app
from dlmspec.cli.help import Command
from dlmspec.cli.output import (_text, command_name, human_count, print_envelope, progress, report_warnings, stdout,
                                use_json)
from dlmspec.credentials import redact
from dlmspec.errors import SpecError, SpecIssue
from dlmspec.render.escape import comment, toml_document
from dlmspec.gpus import GPUS, GiB, gpu_ids
from dlmspec.spec.presets import MASK_TOKEN_IDS, PRESETS, PUBLISHED, preset_names

# The rules, the loader, the resolver and the pydantic models are imported where a command body
# needs them: `dlmspec --help` and `dlmspec CMD --help` import this module for the declarations
# only (tests/cli/test_help_imports.py holds them to it).
if TYPE_CHECKING:
    from dlmspec.resolve import Resolved
    from dlmspec.spec.models import Spec


_SET_HELP = "Override a key: section.key=value (TOML value; repeatable; applied last)."
_PYTHON_HELP = ("The Python (with torch and megatron-core) launch.sh and launch.sbatch run, e.g. .venv/bin/python "
                "(made absolute; a bare name is looked up on the job's PATH). Default: DLMSPEC_PYTHON at launch "
                "time, else python3. Not part of the spec: the lock file and content hash do not change.")


def validate(
    ctx: typer.Context,
    spec: str = typer.Argument(..., help="Spec file (.toml or .py)."),
    set_: list[str] = typer.Option([], "--set", "-s", help=_SET_HELP),
    strict: bool = typer.Option(False, "--strict", help="Fail (exit 2) on warnings too."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Validate a spec: schema, cross-field rules, SLURM settings and memory per GPU.

    Every problem is reported at once with file, line, key, value, why and a value that works.
    Data, tokenizer and checkpoint paths missing on this machine are warnings (they usually live
    on the cluster). Exit code 0 when the spec is valid (warnings go to stderr), 2 when not.
    Settings the bundled runtime cannot run yet (SFT, RL, FSDP, ...) are reported
    by `dlmspec compile`.
    """
    from dlmspec.cli.validate import run_validate

    use_json(ctx, json_output)
    run_validate(spec, set_, strict=strict, json_output=json_output, command=command_name(ctx))


app.command("validate", cls=Command)(validate)
app.command("check", hidden=True, help="Alias of `dlmspec validate`.", cls=Command)(validate)



def spec_data(spec: Spec) -> dict[str, Any]:
    """``spec`` as JSON-ready data with every default filled in and no ``None`` (TOML has no
    null; unset keys are left out, free-form tables such as ``[lock]`` included).

    Raises:
        SpecError: a value of a Python spec that neither JSON nor TOML can hold (e.g. an object
            in ``[lock]``).
    """
    try:
        data = spec.model_dump(mode="json", exclude_none=True)
    except Exception as exc:  # pydantic's serialization error for an arbitrary object
        raise SpecError([SpecIssue("<spec>", f"holds a value that cannot be written out: {exc}",
                                   hint="spec values are numbers, strings, booleans, lists and tables",
                                   rule="spec-value")]) from None
    return _without_none(data)


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value if v is not None]
    return value


def spec_toml(spec: Spec) -> str:
    """``spec`` as a TOML document with every default filled in (it loads back to ``spec``),
    secrets written as ``"<hidden>"`` (:func:`dlmspec.credentials.redact`; such a spec does
    not validate anyway)."""
    return toml_document(redact(spec_data(spec)))


def derived_comment(resolved: Resolved) -> str:
    """The derived values as TOML comment lines (``# key = value``), so a spec printed with
    them still loads."""
    lines = ["# Derived values (dlmspec.resolve):"]
    for key, value in _flat(resolved.derived()):
        lines.append(f"#   {key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def _flat(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        if isinstance(value, dict):
            out.extend(_flat(value, f"{prefix}{key}."))
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _gpu_rows() -> list[dict[str, Any]]:
    return [
        {
            "id": g.id,
            "name": g.name,
            "memory_gib": round(g.memory_bytes / GiB, 1),
            "bf16_tflops": g.bf16_tflops,
            "fp8_tflops": g.fp8_tflops,
            "hbm_gbps": g.hbm_gbps,
            "nvlink_gbps": g.nvlink_gbps,
            "compute_capability": f"{g.compute_capability[0]}.{g.compute_capability[1]}",
        }
        for g in (GPUS[i] for i in gpu_ids())
    ]


def _preset_rows() -> list[dict[str, Any]]:
    from dlmspec.params import count_parameters
    from dlmspec.spec.models import ModelSpec

    rows = []
    for name in preset_names():
        model = ModelSpec.model_validate({"preset": name})
        counts = count_parameters(model)
        total, active, source = PUBLISHED.get(name, (None, None, None))
        rows.append(
            {
                "id": name,
                "num_layers": model.num_layers,
                "hidden_size": model.hidden_size,
                "num_attention_heads": model.num_attention_heads,
                "num_query_groups": model.num_query_groups or model.num_attention_heads,
                "num_experts": model.num_experts,
                "vocab_size": model.vocab_size,
                "mask_token_id": MASK_TOKEN_IDS.get(name),
                "parameters": counts.total,
                "active_parameters": counts.active,
                "published": None if total is None else _published(total, active),
                "published_source": source,
            }
        )
    return rows


def _published(total: int | str, active: int | str) -> str:
    text = f"{total:,}" if isinstance(total, int) else total
    if active != total:
        text += f" ({active:,} active)" if isinstance(active, int) else f" ({active} active)"
    return text


def _rule_rows() -> list[dict[str, Any]]:
    """Every rule of :data:`dlmspec.check.RULES`, by scope (the loader's first, the runtime's last)."""
    from dlmspec.check import RULES, SCOPE_NAMES

    ordered = sorted(RULES.values(), key=lambda r: SCOPE_NAMES.index(r.scope))
    return [{"id": r.id, "scope": r.scope, "severity": r.severity, "summary": r.summary, "source": r.source,
             "fix": r.fix} for r in ordered]


def _print_rows(rows: list[dict[str, Any]], columns: list[tuple[str, str]], title: str) -> None:
    """``columns``: (row key, header) pairs; parameter counts print as 1.2M etc."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for _, header in columns:
        table.add_column(header, overflow="fold")
    for row in rows:
        cells = []
        for key, _ in columns:
            value = row[key]
            if value is None:
                cells.append(_text(""))
            elif key in ("parameters", "active_parameters"):
                cells.append(_text(human_count(value)))
            else:
                cells.append(_text(str(value)))
        table.add_row(*cells)
    stdout().print(table)


def _names_a_run_folder(path: str) -> bool:
    """Whether ``dlmspec show PATH`` should answer ``PATH`` as a run folder although there is none:
    nothing is there, it names a folder path (``runs/demo``) and not a spec file (``.toml``, ``.py``)."""
    return (not os.path.lexists(path) and os.sep in path.rstrip(os.sep)
            and not path.lower().endswith((".toml", ".py")))


@app.command(cls=Command)
def show(
    ctx: typer.Context,
    spec: Optional[str] = typer.Argument(None, help="Spec file (.toml or .py) to print resolved, or a run "
                                         "directory (its provenance and last metrics)."),
    set_: list[str] = typer.Option([], "--set", "-s", help=_SET_HELP),
    gpus: bool = typer.Option(False, "--gpus", help="List the GPU catalog."),
    presets: bool = typer.Option(False, "--presets", help="List the model presets with parameter counts."),
    rules: bool = typer.Option(False, "--rules", help="List every rule: loader, spec, paths, SLURM, memory, runtime."),
    json_output: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
    minimal: bool = typer.Option(False, "--minimal", help="Print only the keys whose values differ from the "
                                 "defaults (and the preset's dimensions): the shortest TOML of the same spec."),
) -> None:
    """Print a spec with every default filled in and its derived values, or a catalog.

    The printed spec is TOML that loads back to the same spec (derived values are comments);
    `dlmspec validate` knows it (its first line) and does not warn about the defaults it wrote.
    --minimal prints only what differs from the defaults. Secrets (tokens, keys, credentials in
    URLs, secret-named env entries) print as `"<hidden>"`, as validate shows them. The spec is
    not checked (use ``dlmspec validate``); it only has to load. Given a run directory
    (``[logging] run_dir``, the folder holding metrics.jsonl): the provenance of its last launch
    and its last metrics.
    """
    use_json(ctx, json_output)
    chosen = [name for name, on in (("--gpus", gpus), ("--presets", presets), ("--rules", rules)) if on]
    if spec is not None and not chosen and (os.path.isdir(spec) or _names_a_run_folder(spec)):
        # a run directory (or a path that can only mean one): provenance, last metrics
        from dlmspec.cli.runs import show_run

        return show_run(spec, set_=set_, json_output=json_output)
    if len(chosen) + (spec is not None) != 1:
        raise SpecError([SpecIssue("<arguments>", "give exactly one of SPEC, --gpus, --presets, --rules",
                                   value=" ".join(chosen + ([spec] if spec else [])) or None,
                                   hint="e.g. dlmspec show specs/demo-dlm.toml, or dlmspec show --gpus",
                                   rule="arguments")])
    if spec is None:
        rows, columns, title = {
            "--gpus": (_gpu_rows(), [("id", "id"), ("name", "name"), ("memory_gib", "memory GiB"),
                                     ("bf16_tflops", "bf16 TFLOP/s"), ("fp8_tflops", "fp8 TFLOP/s"),
                                     ("hbm_gbps", "HBM GB/s"), ("nvlink_gbps", "NVLink GB/s"),
                                     ("compute_capability", "CC")], "GPU catalog (dense peak, per GPU)"),
            "--presets": (_preset_rows(), [("id", "id"), ("num_layers", "layers"), ("hidden_size", "hidden"),
                                           ("num_attention_heads", "heads"), ("num_query_groups", "groups"),
                                           ("num_experts", "experts"), ("vocab_size", "vocab"),
                                           ("mask_token_id", "[MASK]"), ("parameters", "params"),
                                           ("active_parameters", "active"), ("published", "published")],
                          "Model presets (params counted with the tokenizer vocabulary)"),
            "--rules": (_rule_rows(), [("id", "id"), ("scope", "scope"), ("severity", "severity"),
                                       ("summary", "rule"), ("source", "source")],
                        "Rules (validate reports them, compile refuses their errors)"),
        }[chosen[0]]
        if json_output:
            print_envelope("show", ok=True, result={chosen[0][2:]: rows})
        else:
            _print_rows(rows, columns, title)
        return
    from dlmspec.resolve import resolve
    from dlmspec.spec.load import load
    from dlmspec.spec.show import SHOW_HEADER

    loaded = load(spec, set_)
    resolved = resolve(loaded.spec)
    data = minimal_data(loaded.spec) if minimal else spec_data(loaded.spec)
    if json_output:
        print_envelope("show", ok=True, result={"spec": redact(data), "derived": redact(resolved.derived())})
        return
    header = (f"# Only what differs from the defaults, printed by `dlmspec show --minimal {Path(spec).name}`\n"
              if minimal else f"{SHOW_HEADER}: every default is written out\n")
    sys.stdout.write(header + toml_document(redact(data)) + "\n" + derived_comment(resolved))


def minimal_data(spec: Spec) -> dict[str, Any]:
    """:func:`spec_data` without the keys at their defaults (under ``[model]``, the preset's
    values when ``preset`` is set) and without empty tables
    (:func:`dlmspec.spec.show.without_defaults`): TOML that loads back to ``spec``.

    Raises:
        SpecError: see :func:`spec_data`.
    """
    from dlmspec.spec.show import without_defaults

    return without_defaults(spec_data(spec))


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
    model = PRESETS[preset]
    world = nodes * gpus_per_node
    seq = seq_length or min(4096, model["max_position_embeddings"])
    vocab = model["vocab_size"]
    objective_table: dict[str, Any] = {"kind": objective}
    if objective == "mdm":
        mask, null_vocab, mask_why = _starter_mask(preset, vocab)
        objective_table["mask_token_id"] = mask
    else:
        null_vocab, mask_why = vocab - 1, None
    data: dict[str, Any] = {
        "name": name,
        "description": f"{preset} {'masked-diffusion' if objective == 'mdm' else 'autoregressive'} "
        f"pretraining on {world} {gpu} GPU(s) (starter spec from `dlmspec new`)",
        "model": {"preset": preset},
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
        result = search(candidate, top=20)
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


#: The first comment lines of a spec ``dlmspec new`` wrote say so (:func:`starter_spec`).
NEW_SPEC_MARK = ": written by `dlmspec new --preset "
#: The header line of a bundled spec copied by ``dlmspec new --from NAME``.
NEW_FROM_MARK = " dlmspec: written by `dlmspec new --from "

#: The ``$id`` of the schema ``dlmspec schema`` writes (:func:`spec_json_schema`).
SCHEMA_ID = "https://dlmspec.invalid/spec.schema.json"


def _written_by_new(path: Path) -> bool:
    """Whether ``path`` begins with the header comment of :func:`starter_spec` (possibly
    wrapped over several ``#`` lines)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(4096).decode("utf-8", "replace")
    except OSError:
        return False
    lines = []
    for line in head.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(lines)
    return NEW_SPEC_MARK in text or NEW_FROM_MARK.strip() in text


def _written_by_schema(path: Path) -> bool:
    """Whether ``path`` is a JSON schema ``dlmspec schema`` wrote (its ``$id``)."""
    try:
        if path.stat().st_size > 1 << 22:
            return False
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("$id") == SCHEMA_ID


def check_output_file(target: Path, *, force: bool, key: str, command: str,
                      written_by: Callable[[Path], bool]) -> None:
    """Refuse to write ``target`` when it is a symbolic link (never written through), exists and
    is not a regular file, exists without ``force``, or exists and was not written by
    ``command`` (``written_by``): ``--force`` replaces only a file dlmspec wrote.

    Raises:
        SpecError: with ``key`` (the argument or flag), the path and the fix.
    """
    def refuse(message: str, hint: str) -> SpecError:
        return SpecError([SpecIssue(key, message, value=str(target), hint=hint, rule="output-file")])

    if target.is_symlink():
        raise refuse("is a symbolic link; dlmspec does not write through links",
                     f"give the file's own path ({os.path.realpath(target)}), or remove the link")
    if not target.exists():
        return
    if not target.is_file():
        raise refuse("exists and is not a regular file", "choose another file name")
    if not force:
        raise refuse("the file exists and would be overwritten", "pass --force, or choose another file name")
    if not written_by(target):
        raise refuse(f"the file exists and was not written by `dlmspec {command}`: --force replaces only "
                     "a file it wrote", "move it away (or remove it) first, or choose another file name")


def write_output_file(target: Path, text: str, *, key: str) -> None:
    """Write ``text`` to ``target`` atomically (a temporary file beside it, then ``os.replace``:
    a failed write leaves the old file whole), mode ``0666`` less the umask.

    Raises:
        SpecError: the file cannot be written (key ``key``).
    """
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
        tmp = None
    except (OSError, ValueError) as exc:
        raise SpecError([SpecIssue(key, f"cannot write the file: {getattr(exc, 'strerror', None) or exc}",
                                   value=str(target), hint="choose a writable path", rule="output-file")]) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


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
    if objective not in ("mdm", "ar"):
        raise SpecError([SpecIssue("--objective", "not an objective", value=objective, hint="use mdm or ar",
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
    print(f"wrote {output}: {human_count(resolved.params.total)} parameters, {resolved.world_size} GPU(s) as "
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


def spec_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a spec file, from the pydantic models of
    :mod:`dlmspec.spec.models`, adjusted to what the loader accepts: ``extends`` (then nothing is
    required: the parent supplies it), ``[model] preset`` instead of the dimensions it fills
    (an enum of the preset ids), ``cluster.gpu`` as an enum of the catalog, and prefix strings
    as ``data.train`` / ``data.valid`` entries."""
    from dlmspec.gpus import gpu_ids
    from dlmspec.spec.models import Spec

    schema = Spec.model_json_schema()
    defs = schema["$defs"]
    model, train = defs["ModelSpec"], defs["TrainSpec"]
    dimensions = model.pop("required")
    train_required = train.pop("required")
    top_required = schema.pop("required")
    model["properties"]["preset"] = {"type": "string", "enum": preset_names(),
                                     "description": model["properties"]["preset"].get("description", "")}
    defs["ClusterSpec"]["properties"]["gpu"]["enum"] = gpu_ids()
    for key in ("train", "valid"):
        entry = defs["DataSpec"]["properties"][key]
        entry["items"] = {"anyOf": [{"type": "string", "description": "indexed-dataset prefix (weight 1)"},
                                    entry["items"]]}
    schema["properties"] = {"extends": {"type": "string", "description": "Parent spec file (relative to this "
                                        "one), deep-merged under this file's keys."}, **schema["properties"]}
    schema["anyOf"] = [
        {"required": ["extends"]},
        {"required": top_required,
         "properties": {"model": {"anyOf": [{"required": ["preset"]}, {"required": dimensions}]},
                        "train": {"required": train_required}}},
    ]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": SCHEMA_ID, **schema}


@app.command(cls=Command)
def schema(
    ctx: typer.Context,
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write the schema to this file instead of stdout."),
    force: bool = typer.Option(False, "--force", help="Overwrite OUTPUT if `dlmspec schema` wrote it."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout (the schema "
                                     "itself under result.json_schema, unless --output writes it)."),
) -> None:
    """Print the JSON Schema of spec files, so editors complete and check them.

    With taplo / Even Better TOML, write `dlmspec schema -o dlmspec.schema.json` and start a
    spec with the line `#:schema ./dlmspec.schema.json`. The schema checks names, types, ranges
    and allowed values; `dlmspec validate` also checks the rules between keys.
    """
    use_json(ctx, json_output)
    data = spec_json_schema()
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    if output is None:
        if json_output:
            print_envelope("schema", ok=True, result={"output": None, "bytes": len(text.encode()), "json_schema": data})
        else:
            sys.stdout.write(text)
        return
    target = Path(output)
    check_output_file(target, force=force, key="--output", command="schema", written_by=_written_by_schema)
    write_output_file(target, text, key="--output")
    if json_output:
        print_envelope("schema", ok=True, result={"output": output, "bytes": len(text.encode())})
    else:
        print(f"wrote {output} ({len(text.encode()):,} bytes)")


@app.command("compile", cls=Command)
def compile_command(
    ctx: typer.Context,
    spec: str = typer.Argument(..., help="Spec file (.toml or .py)."),
    output: str = typer.Option(..., "--output", "-o", help="Directory for train.py, launch.sh, launch.sbatch, "
                               "spec.lock.toml and plan.json (created if missing)."),
    set_: list[str] = typer.Option([], "--set", "-s", help=_SET_HELP),
    force: bool = typer.Option(False, "--force", help="Write into a non-empty directory: replace the files "
                               "dlmspec generates, keep the others."),
    python: Optional[str] = typer.Option(None, "--python", help=_PYTHON_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Compile a spec into a directory that runs it.

    The spec is checked first (as by `dlmspec validate`, plus what the runtime cannot run yet);
    nothing is written when it has an error.
    The same spec always gives the same bytes.
    """
    from dlmspec.render.compile import compile_spec, launch_interpreter

    use_json(ctx, json_output)
    from dlmspec.spec.python_load import sweep_targets

    members = sweep_targets(spec, set_)
    if len(members) > 1:
        _compile_sweep(members, output, set_, force=force, python=python, json_output=json_output)
        return
    result = compile_spec(spec, output, overrides=set_, force=force, python=python)
    if json_output:
        print_envelope("compile", ok=True, issues=result.warnings,
                       result={"name": result.resolved.spec.name, "content_hash": result.content_hash,
                               "output": output, "files": [p.name for p in result.files],
                               "python": launch_interpreter(python), "launch": str(Path(output) / "launch.sh")})
        return
    report_warnings(result.warnings)
    names = ", ".join(p.name for p in result.files)
    stdout().print(_text(f"compiled {result.resolved.spec.name} ({result.content_hash[:19]}) into {output}: {names}"))
    launch = Path(output) / "launch.sh"
    stdout().print(_text(f"run it from the directory the spec's relative paths refer to: bash {launch}"))
    if python is None:
        stdout().print(_text("it runs $DLMSPEC_PYTHON, else python3: compile with --python PATH to name the "
                             "interpreter that has torch and megatron-core"))


def _compile_sweep(members: list[str], output: str, overrides: list[str], *, force: bool, python: str | None,
                   json_output: bool) -> None:
    """``dlmspec compile SWEEP.py -o DIR``: each member into ``DIR/<name>``, in the sweep's order.
    Every member is checked first; nothing is written when one has an error (all are reported).

    Raises:
        SpecError: the members' errors, or an unusable output directory.
    """
    from dlmspec.check import load_for
    from dlmspec.cli.validate import member_issues
    from dlmspec.render.compile import compile_spec

    failed: list[SpecIssue] = []
    for target in progress(members, f"checking {len(members)} members"):
        try:
            _, _, issues = load_for("compile", target, overrides)
        except SpecError as exc:
            issues = exc.issues
        if any(i.severity == "error" for i in issues):
            failed.extend(member_issues(target, issues))
    if failed:
        raise SpecError(failed)
    results = []
    for target in members:
        name = target.rpartition("::")[2]
        results.append(compile_spec(target, Path(output) / name, overrides=overrides, force=force, python=python))
    if json_output:
        print_envelope("compile", ok=True, issues=[w for r in results for w in r.warnings],
                       result={"sweep": [{"name": r.resolved.spec.name, "content_hash": r.content_hash,
                                          "output": str(r.out_dir), "files": [p.name for p in r.files]}
                                         for r in results]})
        return
    for r in results:
        report_warnings(r.warnings)
        stdout().print(_text(f"compiled {r.resolved.spec.name} ({r.content_hash[:19]}) into {r.out_dir}"))


@app.command("submit", cls=Command)
def submit_command(
    ctx: typer.Context,
    targets: list[str] = typer.Argument(..., help="Spec files or compiled directories, in order; each "
                                        "starts after the previous one succeeds (--dependency=afterok); a "
                                        "Python sweep's members run side by side."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Where to compile a spec (several specs: "
                                         "one subdirectory each, by file name). Default: compiled/NAME, NAME the spec file's name "
                                         "without its suffix."),
    set_: list[str] = typer.Option([], "--set", "-s", help=_SET_HELP),
    force: bool = typer.Option(False, "--force", help="Replace the generated files of a directory that holds "
                               "another compile."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the commands (as bash) and do nothing."),
    check: Optional[str] = typer.Option(None, "--check", help="CPU check run instead of training: env "
                                        "(rendezvous, ranks, environment; JSON report) or train (simulated "
                                        "preemptible job). Sets DLMSPEC_CHECK_MODE."),
    sbatch_arg: list[str] = typer.Option([], "--sbatch-arg", help="Extra sbatch option, e.g. "
                                         "--sbatch-arg=--hold (repeatable)."),
    python: Optional[str] = typer.Option(None, "--python", help=_PYTHON_HELP + " For spec files only."),
    after: Optional[str] = typer.Option(None, "--after", help="Job id the first job (each member of "
                                        "a sweep) waits for (--dependency=afterok:JOBID): continue a chain "
                                        "submitted before."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout (the jobs, or "
                                     "with --dry-run the script); progress lines go to stderr."),
) -> None:
    """Submit specs (compiled first) or compiled directories to SLURM with sbatch.

    Run it from the directory the specs' relative paths refer to: the jobs start there.

    Exit code 2 when a spec is invalid, sbatch is missing, or sbatch refuses a script.
    """
    from dlmspec.cli.submit import submit

    use_json(ctx, json_output)
    script: list[str] = []
    if json_output:
        def echo(line: str) -> None:
            (script.append if dry_run else lambda text: print(text, file=sys.stderr))(line)
    else:
        echo = print
    jobs = submit(targets, output=output, overrides=set_, force=force, dry_run=dry_run, check_mode=check,
                  sbatch_args=sbatch_arg, echo=echo, python=python, after=after)
    if json_output:
        print_envelope("submit", ok=True, result={
            "dry_run": dry_run, "script": "\n".join(script) + "\n" if dry_run else None,
            "jobs": [{"job_id": j.job_id, "after": j.after, "target": j.step.target, "name": j.step.name,
                      "directory": str(j.step.directory), "script": str(j.step.script)} for j in jobs]})


@app.command("plan", cls=Command)
def plan_command(
    ctx: typer.Context,
    spec: str = typer.Argument(..., help="Spec file (.toml or .py)."),
    set_: list[str] = typer.Option([], "--set", "-s", help=_SET_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print the plan (or search) as JSON on stdout."),
    search: bool = typer.Option(False, "--search", help="Rank the parallel layouts that fit, fastest first."),
    top: Optional[int] = typer.Option(None, "--top", help="Layouts to rank, fastest first (default 5). --top N "
                                      "implies --search: ranking layouts is what --search does, so the number is "
                                      "never silently ignored."),
) -> None:
    """Per-GPU memory, step time and MFU of a spec; --search finds layouts that fit.

    Exit code 2 when the spec has an error, when its peak memory exceeds the GPU (the plan and
    what would make it fit are printed), or when --search finds no layout.
    """
    from dlmspec.cli.plan import run_plan

    use_json(ctx, json_output)
    code = run_plan(spec, set_, json_output, search, top)
    if code:
        raise typer.Exit(code)


from dlmspec.cli import plot as _plot  # noqa: E402,F401  (registers `dlmspec plot` on the app)
