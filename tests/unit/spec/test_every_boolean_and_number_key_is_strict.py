"""Every boolean, integer and float key of the spec is strict: a quoted value (``cuda_graph = "no"``,
``lr = "3e-4"``) is an error naming the key, never silently converted (pydantic's lax mode takes
``"no"`` for false and ``"1"`` for true)."""

from __future__ import annotations

import typing

import pytest
from pydantic import BaseModel, Strict

from dlmspec.spec import models as spec_module
from dlmspec.spec.load import SpecError, load_text


def _scalar_fields(model: type[BaseModel], prefix: str = "", seen: frozenset = frozenset()):
    """``(dotted key, FieldInfo)`` of every bool/int/float field of ``model`` and of the tables under it."""
    for name, field in model.model_fields.items():
        args = (field.annotation, *typing.get_args(field.annotation))
        for arg in args:
            if isinstance(arg, type) and issubclass(arg, BaseModel) and arg not in seen:
                yield from _scalar_fields(arg, f"{prefix}{name}.", seen | {arg})
        if any(a in (bool, int, float) for a in args):
            yield prefix + name, field


FIELDS = sorted(_scalar_fields(spec_module.Spec), key=lambda kv: kv[0])


def test_the_walk_finds_the_generate_switches() -> None:
    keys = {k for k, _ in FIELDS}
    assert {"generate.cuda_graph", "generate.compile", "train.lr", "data.mock"} <= keys


@pytest.mark.parametrize(("key", "field"), FIELDS, ids=[k for k, _ in FIELDS])
def test_the_key_is_strict(key: str, field) -> None:
    assert any(isinstance(m, Strict) and m.strict for m in field.metadata), \
        f"{key}: annotate it with dlmspec.spec.section's Bool / Int / Float (strict), not the plain type"


@pytest.mark.parametrize("text", ['cuda_graph = "no"', 'compile = "yes"'])
def test_a_quoted_generate_switch_is_refused_with_the_unquoted_value(text: str) -> None:
    spec = ('name = "x"\n[model]\nnum_layers = 2\nhidden_size = 64\nnum_attention_heads = 4\n'
            '[train]\nseq_length = 32\nmicro_batch_size = 1\nglobal_batch_size = 1\ntrain_iters = 1\n'
            f'[data]\nmock = true\n[generate]\n{text}\n')
    with pytest.raises(SpecError) as err:
        load_text(spec)
    key = text.split(" = ")[0]
    message = str(err.value)
    assert f"generate.{key}" in message and "without quotes" in message, message
