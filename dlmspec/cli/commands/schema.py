"""``dlmspec schema``: the JSON Schema of a spec file, for editors.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from dlmspec.cli.app import app
from dlmspec.cli.commands.common import SCHEMA_ID, _written_by_schema, check_output_file, write_output_file
from dlmspec.cli.help import Command
from dlmspec.cli.output import print_envelope, use_json
from dlmspec.spec.presets import preset_names


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
