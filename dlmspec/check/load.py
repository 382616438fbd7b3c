"""What the loader reports while reading a spec file (scope ``load``): the file itself, its
syntax, ``extends``, ``--set``, integers beyond int64 and the schema (types, ranges, allowed
values, unknown keys, presets). :func:`dlmspec.spec.load.load` raises these as one
:class:`~dlmspec.errors.SpecError`; they are registered here so that ``dlmspec show --rules``
lists every check and tests can hold each to a failing example. A schema error comes with
what the command's other rules find in the rest of the spec
(:func:`dlmspec.check.registry.with_rule_issues`)."""

from __future__ import annotations

from dlmspec.check.registry import Rule, add_rule

for _id, _source, _summary in (
    ("file", "dlmspec.spec.load.load (regular files of at most MAX_SPEC_BYTES, read as UTF-8)",
     "the spec file and each file it extends is a readable regular UTF-8 file of at most 4 MiB"),
    ("toml", "tomllib (TOML 1.0)", "a .toml spec is valid TOML"),
    ("python", "dlmspec.spec.load (a .py spec runs and assigns spec, a dlmspec.spec.models.Spec or a dict)",
     "a .py spec runs without raising or exiting and assigns spec = Spec(...) (or a dict)"),
    ("nesting", "dlmspec.spec.load.MAX_DEPTH (deeper input makes the TOML parser and pydantic recurse)",
     "tables and arrays nest at most 32 levels"),
    ("extends", "dlmspec.spec.load (extends deep-merges a parent spec; chains of at most MAX_EXTENDS files)",
     "extends names a spec file, without a cycle, in a chain of at most 32 files"),
    ("set", "dlmspec.spec.load.parse_set_value (--set section.key=value, the value read as TOML)",
     "each --set is section.key=value with a TOML value"),
    ("int64", "megatron-core, torch and numpy hold counts, sizes, ids and seeds in int64",
     "every integer of the spec fits in int64"),
    ("schema", "dlmspec.spec.models (the pydantic models: types, ranges, allowed values, required and unknown keys)",
     "every key is a key of the schema, with a value of its type, range and allowed values"),
    ("unknown-preset", "dlmspec.spec.presets.PRESETS", "model.preset names a preset of the catalog"),
    ("name-placeholder", "dlmspec.spec.names (the run's paths expand {name} to the spec's name; {{ and }} are "
     "literal braces)", "the run's paths and names hold no brace but {name}, {{ and }}"),
):
    add_rule(Rule(_id, "error", _source, _summary, None, scope="load"))
