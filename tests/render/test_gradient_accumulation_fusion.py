"""``[kernels] gradient_accumulation_fusion``: train.py turns megatron-core's fusion on where it
runs (Transformer Engine linears, and APEX's ``fused_weight_gradient_mlp_cuda`` for the output
layer's ``ColumnParallelLinear``), decided on the GPU machine; ``true`` refuses with exit 2 where
it cannot run; ``false`` keeps it off."""

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
from test_compile_megatron import _import  # noqa: E402

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
        assert module.gradient_accumulation_fusion() is (te and apex)
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
    assert module.gradient_accumulation_fusion() is False


@pytest.mark.parametrize("te, apex, says", [(True, False, "APEX"), (False, True, "Transformer Engine layers")])
def test_true_refuses_with_exit_2_where_it_cannot_run(te: bool, apex: bool, says: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    module = _import(compiled(tmp_path, True))
    machine(monkeypatch, te=te, apex=apex)
    with pytest.raises(SystemExit) as exc:
        module.gradient_accumulation_fusion()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert says in err and 'set it to "auto"' in err
    machine(monkeypatch, te=True, apex=True)
    assert module.gradient_accumulation_fusion() is True
