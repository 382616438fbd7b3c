"""The base of every table of the spec (:class:`Section`) and its strict number and boolean types,
shared by :mod:`dlmspec.spec.models` and the modules that hold some of its tables
(:mod:`dlmspec.spec.stage_models`, :mod:`dlmspec.spec.generate_models`). Everything here is also
importable from :mod:`dlmspec.spec.models`."""

from typing import Annotated, Any

from annotated_types import Ge, Gt

from pydantic import BaseModel, ConfigDict, Field, Strict

from dlmspec.spec import python


class Section(BaseModel):
    """Base of every table: unknown keys are errors (a typo never passes silently), and numbers
    are finite (TOML's ``inf``/``nan`` are never a valid size, rate or length).

    Validators are built on first use (``defer_build``): ``dlmspec validate`` builds one, the
    :class:`Spec`'s, which holds every table, instead of one per table at import (the import of
    this module was a fifth of the command's time; bench/validate). Annotations are real types,
    not strings (no ``from __future__ import annotations``), so pydantic need not evaluate them.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, defer_build=True)

    def __init__(self, /, **data: Any) -> None:
        """Validate ``data``; a Python spec's keywords are recorded with their lines
        (:func:`dlmspec.spec.python.note_init`)."""
        super().__init__(**data)
        python.note_init(self, data)

    def __setattr__(self, name: str, value: Any) -> None:
        """Assignment is validated (``spec.train.lr = "x"`` raises pydantic's ValidationError)
        and, in a Python spec, recorded with its line (:func:`dlmspec.spec.python.note_assign`)."""
        super().__setattr__(name, value)
        if not name.startswith("_"):
            python.note_assign(self, name)


#: Largest ``model.num_layers`` accepted: far above any published model (Llama-3-405B has 126),
#: and small enough that per-layer lists (``moe_layer_freq``, the planner's stages) stay cheap.
MAX_LAYERS = 10_000


#: The spec's number and boolean types: pydantic's strict mode, so a quoted value (``lr = "3e-4"``,
#: ``global_batch_size = "256"``, ``mock = "yes"``) is an error naming the key, never silently
#: converted; a float field still takes an integer (``lr = 1``: pydantic's strict float accepts
#: ``int``), and an int or float field never takes a bool. :mod:`dlmspec.spec.load` turns the error
#: into the fix with the value unquoted (``train.lr = 3e-4``). ``dlmspec.spec.fast`` checks the
#: same (its ``_value`` takes exactly these Python types).
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
PosInt = Annotated[int, Strict(), Gt(0)]
NonNegInt = Annotated[int, Strict(), Ge(0)]
PosFloat = Annotated[float, Strict(), Gt(0)]


def _empty_list() -> list:
    """``default_factory`` of the list keys: a Python function, whose signature pydantic reads
    without the tokenizer that ``inspect.signature(list)`` needs (its regexes take about 5 ms
    to compile, in every ``dlmspec validate``)."""
    return []


def _table() -> Any:
    """Default of a table: ``{}``, validated by the parent's validator (every key at its default).

    ``Field(default_factory=TheTable)`` would build ``TheTable``'s own validator the first time
    a spec leaves the table out (with :class:`Section`'s ``defer_build``); this way one validator,
    the :class:`Spec`'s, serves every table. The JSON Schema is the same (pydantic lists no
    default for a factory)."""
    return Field(default_factory=dict, validate_default=True)
