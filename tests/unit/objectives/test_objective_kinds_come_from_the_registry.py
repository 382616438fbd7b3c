"""The ``[objective] kind`` values have one source, :func:`dlmspec.objectives.kinds` (the registry):
``dlmspec.names`` lists none, and the generate settings and convert checks read the registry."""

from __future__ import annotations

import pytest

from dlmspec import names, objectives


class _Toy(objectives.Objective):
    kind = "toy-unmasking"
    diffusion = False
    predicts_next_token = True


def test_names_holds_no_second_list_of_objective_kinds() -> None:
    assert not hasattr(names, "OBJECTIVE_KINDS")
    assert objectives.kinds()[:2] == (names.MDM, names.AR)


def test_a_registered_kind_is_a_decoding_rule_of_generate_settings() -> None:
    from dlmspec import generate_settings
    from dlmspec.generate_settings import GenerateConfig, GenerateConfigError

    with pytest.raises(GenerateConfigError, match="not a decoding rule"):
        GenerateConfig(kind="toy-unmasking")
    objectives.register(_Toy())
    try:
        assert "toy-unmasking" in generate_settings.KINDS
        assert GenerateConfig(kind="toy-unmasking").kind == "toy-unmasking"
    finally:
        objectives.unregister("toy-unmasking")
    assert generate_settings.KINDS == objectives.kinds()


def test_a_registered_kind_is_an_objective_convert_accepts() -> None:
    pytest.importorskip("torch")
    from dlmspec.backends.convert.errors import ConversionError
    from dlmspec.backends.convert.objective import AUTOREGRESSIVE, resolve_objective

    with pytest.raises(ConversionError):
        resolve_objective(AUTOREGRESSIVE, "toy-unmasking", None)
    objectives.register(_Toy())
    try:
        assert resolve_objective(AUTOREGRESSIVE, "toy-unmasking", None).kind == "toy-unmasking"
    finally:
        objectives.unregister("toy-unmasking")
