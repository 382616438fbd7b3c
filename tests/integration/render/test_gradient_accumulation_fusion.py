"""``[kernels] gradient_accumulation_fusion``: train.py turns megatron-core's fusion on where it
runs, decided on the GPU machine: "auto" with Transformer Engine layers and APEX's
``fused_weight_gradient_mlp_cuda`` (the output layer's ``ColumnParallelLinear`` needs it): the
TransformerConfig's flag; ``true`` also without APEX, in the Transformer Engine linears only
(each built from a config copy with the flag on), and exit 2 on the local layers; ``false`` off.
Transformer Engine is not installed here: its linear classes are stood in for by plain ones."""

from __future__ import annotations

import itertools
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

import dlmspec.backends.megatron.layers as layers  # noqa: E402
import megatron.core.tensor_parallel.layers as tp_layers  # noqa: E402
from compile_megatron_kit import _import  # noqa: E402

from dlmspec.render.compile import render  # noqa: E402
from dlmspec.resolve import resolve  # noqa: E402
from dlmspec.spec.load import load_text  # noqa: E402
from small_spec import SMALL_SPEC  # noqa: E402


def compiled(tmp_path: Path, value: object = None, impl: str = "auto") -> Path:
    """train.py of the small spec; ``value`` None: the key left at its default."""
    changes = {"model.transformer_impl": impl}
    if value is not None:
        changes["kernels.gradient_accumulation_fusion"] = value
    spec = load_text(SMALL_SPEC).spec.replace(**changes)
    train = tmp_path / "train.py"
    train.write_text(render(resolve(spec), "spec.toml")["train.py"], encoding="utf-8")
    return train


def machine(monkeypatch: pytest.MonkeyPatch, *, te: bool, apex: bool) -> None:
    """This machine as one with (or without) Transformer Engine layers and APEX's kernel."""
    monkeypatch.setattr(tp_layers, "_grad_accum_fusion_available", apex)
    backend = layers.BACKEND_TRANSFORMER_ENGINE if te else layers.BACKEND_LOCAL_SDPA
    monkeypatch.setattr(layers, "layer_spec_backend", lambda spec: backend)


@pytest.mark.parametrize("te, apex", list(itertools.product([True, False], repeat=2)))
def test_auto_fuses_only_with_transformer_engine_and_apex(te: bool, apex: bool, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    module = _import(compiled(tmp_path, "auto"))
    machine(monkeypatch, te=te, apex=apex)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert module.gradient_accumulation_fusion() == ("all" if te and apex else "off")
        if not te:  # build_configs' TransformerConfig (TE-only configs are not built on CPU)
            config = module.build_configs()[0]
            assert config.gradient_accumulation_fusion is False


def test_default_spec_fuses_on_a_machine_with_transformer_engine_and_apex(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The key left out ("auto"): build_configs' TransformerConfig has the fusion on where it runs."""
    module = _import(compiled(tmp_path))
    machine(monkeypatch, te=True, apex=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert module.build_configs()[0].gradient_accumulation_fusion is True


def test_false_keeps_it_off_everywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _import(compiled(tmp_path, False))
    machine(monkeypatch, te=True, apex=True)
    assert module.gradient_accumulation_fusion() == "off"


def test_true_refuses_with_exit_2_on_the_local_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    module = _import(compiled(tmp_path, True))
    machine(monkeypatch, te=False, apex=True)
    with pytest.raises(SystemExit) as exc:
        module.gradient_accumulation_fusion()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "needs Transformer Engine layers" in err and 'set it to "auto"' in err


@pytest.mark.parametrize("apex, expected", [(True, "all"), (False, "te_linears")])
def test_true_fuses_the_transformer_engine_linears_with_or_without_apex(apex: bool, expected: str, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    module = _import(compiled(tmp_path, True))
    machine(monkeypatch, te=True, apex=apex)
    assert module.gradient_accumulation_fusion() == expected
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # the shared TransformerConfig (the output layer's too) carries the flag only with APEX
        assert module.build_configs()[0].gradient_accumulation_fusion is apex


class StandInLinear:
    """Stands in for transformer_engine.pytorch.Linear: records the flag megatron-core's TE
    wrappers read from ``config`` in ``__init__`` (``fuse_wgrad_accumulation``)."""

    def __init__(self, in_features: int, out_features: int, *, config, bias: bool = False):
        self.config = config
        self.fuse_wgrad_accumulation = config.gradient_accumulation_fusion


class StandInColumnLinear(StandInLinear):
    pass


class StandInNorm:
    def __init__(self, *, config):
        self.config = config


def test_te_linears_are_built_with_the_fusion_and_the_shared_config_is_left_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import dataclass
    from typing import Any, Union

    from megatron.core.transformer.spec_utils import ModuleSpec, build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    @dataclass
    class Submodules:
        linear_qkv: Union[ModuleSpec, type] = None
        linear_proj: Union[ModuleSpec, type] = None
        norm: Union[ModuleSpec, type] = None
        nested: Any = None

    module = _import(compiled(tmp_path, True))
    monkeypatch.setattr(module, "te_linear_types", lambda: (StandInLinear,))
    spec = ModuleSpec(module=object, submodules=Submodules(
        linear_qkv=StandInColumnLinear, linear_proj=ModuleSpec(module=StandInLinear, params={"bias": True}),
        norm=StandInNorm, nested=ModuleSpec(module=object, submodules=Submodules(linear_qkv=StandInColumnLinear))))
    fused = module.te_linears_fuse_wgrad(spec)
    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4)
    assert config.gradient_accumulation_fusion is False
    sub = fused.submodules
    qkv = build_module(sub.linear_qkv, 64, 192, config=config)
    proj = build_module(sub.linear_proj, 64, 64, config=config)
    nested = build_module(fused.submodules.nested.submodules.linear_qkv, 64, 192, config=config)
    norm = build_module(sub.norm, config=config)
    for linear, base in ((qkv, StandInColumnLinear), (proj, StandInLinear), (nested, StandInColumnLinear)):
        assert isinstance(linear, base) and linear.fuse_wgrad_accumulation is True and linear.config is not config
    assert sub.linear_qkv is fused.submodules.nested.submodules.linear_qkv  # one subclass per class
    assert norm.config is config and sub.norm is StandInNorm  # not a linear: untouched
    assert config.gradient_accumulation_fusion is False  # the shared config (output layer's) stays off
    assert spec.submodules.linear_qkv is StandInColumnLinear  # the original spec is not changed
