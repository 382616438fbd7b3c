"""``dlmspec show``: a spec with every default filled in and its derived values (or the run folder's
records), or the catalogs of GPUs, presets and rules.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from dlmspec.cli.app import app
from dlmspec.cli.commands.common import _SET_HELP, spec_data
from dlmspec.cli.help import Command
from dlmspec.cli.output import _text, human_count, print_envelope, stdout, use_json
from dlmspec.credentials import redact
from dlmspec.errors import SpecError, SpecIssue
from dlmspec.gpus import GPUS, GiB, gpu_ids
from dlmspec.escape import toml_document
from dlmspec.spec.presets import MASK_TOKEN_IDS, PUBLISHED, preset_names

if TYPE_CHECKING:
    from dlmspec.resolve import Resolved
    from dlmspec.spec.models import Spec


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
    nothing is there, it names a folder path (``runs/demo``) and not a spec file (``.toml``, ``.py``),
    nor a sweep member (``specs/sweep.py::member``: the file before ``::``)."""
    file = path.split("::", 1)[0]
    return (not os.path.lexists(path) and os.sep in path.rstrip(os.sep)
            and not file.lower().endswith((".toml", ".py")))


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
    from dlmspec.data.repetition import repetition, repetition_lines
    from dlmspec.escape import comment

    repeated = repetition(loaded.spec, resolved)  # None with mock data
    if json_output:
        result = {"spec": redact(data), "derived": redact(resolved.derived())}
        if repeated is not None:
            result["data"] = repeated.to_dict()
        print_envelope("show", ok=True, result=result)
        return
    header = (f"# Only what differs from the defaults, printed by `dlmspec show --minimal {Path(spec).name}`\n"
              if minimal else f"{SHOW_HEADER}: every default is written out\n")
    epochs = "" if repeated is None else "".join(f"# {comment(line)}\n" for line in repetition_lines(repeated))
    sys.stdout.write(header + toml_document(redact(data)) + "\n" + derived_comment(resolved) + epochs)


def minimal_data(spec: Spec) -> dict[str, Any]:
    """:func:`spec_data` without the keys at their defaults (under ``[model]``, the preset's
    values when ``preset`` is set) and without empty tables
    (:func:`dlmspec.spec.show.without_defaults`): TOML that loads back to ``spec``.

    Raises:
        SpecError: see :func:`spec_data`.
    """
    from dlmspec.spec.show import without_defaults

    return without_defaults(spec_data(spec))
