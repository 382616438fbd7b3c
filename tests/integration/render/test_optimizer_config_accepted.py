"""The optimizer-state keys of ``[train]`` reach megatron-core 0.16.1's ``OptimizerConfig`` through
the compiled train.py, and the rules of ``dlmspec/check/optimizer.py`` that mirror
``OptimizerConfig.__post_init__`` refuse exactly the option combinations it refuses.

``OptimizerConfig.__post_init__`` imports Transformer Engine for the precision-aware optimizer
(its version, then ``FusedAdam``'s signature), which this CPU machine does not have: the tests
that build accepted combinations put a stand-in package with Transformer Engine 2.x's
``FusedAdam`` signature (the keywords megatron-core asserts) in ``sys.modules``; one test builds
without it and checks train.py's own refusal (exit 2, a message) instead of megatron-core's
``TypeError``."""

from __future__ import annotations

import itertools
import sys
import types
from typing import Any

import pytest
import torch

from compile_megatron_kit import _import
from dlmspec.check import find
from dlmspec.check.optimizer import MEGATRON_CORE_CONFIG_RULES
from dlmspec.render.compile import check_spec, render
from dlmspec.resolve import resolve
from dlmspec.spec.load import load
from spec_kit import spec_file

TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.uint8}

#: Accepted combinations (each a change of the spec_kit default, 8 GPUs with the distributed
#: optimizer): the compiled OptimizerConfig must hold these values.
ACCEPTED: dict[str, dict[str, Any]] = {
    "precision-aware": {"train.use_precision_aware_optimizer": True},
    "bf16-moments": {"train.use_precision_aware_optimizer": True, "train.exp_avg_dtype": "bf16",
                     "train.exp_avg_sq_dtype": "bf16"},
    "fp8-moments-fp16-master": {"train.use_precision_aware_optimizer": True, "train.exp_avg_dtype": "fp8",
                                "train.exp_avg_sq_dtype": "fp8", "train.main_params_dtype": "fp16"},
    "bf16-grads": {"train.use_precision_aware_optimizer": True, "train.main_grads_dtype": "bf16",
                   "parallel.grad_reduce_in_fp32": False, "train.store_param_remainders": False},
    "cpu-offload": {"train.use_precision_aware_optimizer": True, "train.optimizer_cpu_offload": True},
    "cpu-offload-half": {"train.use_precision_aware_optimizer": True, "train.optimizer_cpu_offload": True,
                         "train.optimizer_offload_fraction": 0.5, "train.overlap_cpu_optimizer_d2h_h2d": True},
}

#: What the compiled OptimizerConfig's fields must be, per accepted combination (beyond the defaults).
EXPECTED: dict[str, dict[str, Any]] = {
    "precision-aware": {"use_precision_aware_optimizer": True, "exp_avg_dtype": torch.float32},
    "bf16-moments": {"exp_avg_dtype": torch.bfloat16, "exp_avg_sq_dtype": torch.bfloat16,
                     "main_params_dtype": torch.float32, "store_param_remainders": True},
    "fp8-moments-fp16-master": {"exp_avg_dtype": torch.uint8, "exp_avg_sq_dtype": torch.uint8,
                                "main_params_dtype": torch.float16},
    "bf16-grads": {"main_grads_dtype": torch.bfloat16, "store_param_remainders": False},
    "cpu-offload": {"optimizer_cpu_offload": True, "optimizer_offload_fraction": 1.0,
                    "overlap_cpu_optimizer_d2h_h2d": False},
    "cpu-offload-half": {"optimizer_cpu_offload": True, "optimizer_offload_fraction": 0.5,
                         "overlap_cpu_optimizer_d2h_h2d": True},
}


def _fused_adam_standin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put a ``transformer_engine`` package whose ``FusedAdam`` has Transformer Engine 2.x's
    keywords (and version 2.8) where megatron-core's ``OptimizerConfig`` imports them."""
    te = types.ModuleType("transformer_engine")
    te.__version__ = "2.8.0"
    te_pytorch = types.ModuleType("transformer_engine.pytorch")
    te_optim = types.ModuleType("transformer_engine.pytorch.optimizers")

    class FusedAdam:  # the signature of transformer_engine/pytorch/optimizers/fused_adam.py (TE 2.x)
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                     bias_correction=True, adam_w_mode=True, capturable=False, master_weights=False,
                     master_weight_dtype=torch.float32, exp_avg_dtype=torch.float32,
                     exp_avg_sq_dtype=torch.float32, use_decoupled_grad=False, store_param_remainders=False,
                     set_grad_none=None):
            raise AssertionError("not built on CPU")

    te_optim.FusedAdam = FusedAdam
    te_pytorch.optimizers = te_optim
    te.pytorch = te_pytorch
    for name, module in (("transformer_engine", te), ("transformer_engine.pytorch", te_pytorch),
                         ("transformer_engine.pytorch.optimizers", te_optim)):
        monkeypatch.setitem(sys.modules, name, module)
    import megatron.core.utils as mcore_utils

    monkeypatch.setattr(mcore_utils, "_te_version", None)  # read again from the stand-in


def _compiled_train(tmp_path, changes: dict[str, Any], name: str):
    path = spec_file(tmp_path, {"name": "o", **changes}, file_name=f"{name}.toml")
    loaded = load(path)
    resolved = resolve(loaded.spec)
    check_spec(loaded, resolved)
    train = tmp_path / f"{name}_train.py"
    train.write_text(render(resolved, path.name)["train.py"], encoding="utf-8")
    return _import(train)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_compiled_optimizer_config_holds_the_optimizer_state_keys(name: str, tmp_path, monkeypatch) -> None:
    module = _compiled_train(tmp_path, ACCEPTED[name], name)
    _fused_adam_standin(monkeypatch)  # after the import: megatron-core's modules probe the real package
    _, _, ddp_config, optimizer_config = module.build_configs()  # runs OptimizerConfig.__post_init__
    for field, value in EXPECTED[name].items():
        assert getattr(optimizer_config, field) == value, field
    assert optimizer_config.use_precision_aware_optimizer is True
    assert optimizer_config.use_distributed_optimizer is True
    assert ddp_config.grad_reduce_in_fp32 == (optimizer_config.main_grads_dtype == torch.float32)


def test_compiled_job_without_transformer_engine_exits_2_naming_it(tmp_path, monkeypatch, capsys) -> None:
    module = _compiled_train(tmp_path, ACCEPTED["cpu-offload"], "no-te")
    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # its import fails, as on this machine
    with pytest.raises(SystemExit) as exc:
        module.build_configs()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "use_precision_aware_optimizer" in err and "Install Transformer Engine" in err


#: The grid of option values the rules and megatron-core are compared on.
GRID_KEYS = ("train.optimizer", "parallel.use_distributed_optimizer", "train.use_precision_aware_optimizer",
             "train.exp_avg_dtype", "train.main_params_dtype", "train.main_grads_dtype", "train.optimizer_cpu_offload")
GRID_VALUES = (("adam", "sgd"), (True, False), (True, False), ("fp32", "bf16"), ("fp32", "fp16"), ("fp32", "bf16"),
               (False, True))


def _core_refuses(values: dict[str, Any]) -> bool:
    """Whether megatron-core 0.16.1's OptimizerConfig raises for these options (as train.py
    passes them: dtypes as torch dtypes, the offload fraction as dlmspec's default)."""
    from megatron.core.optimizer import OptimizerConfig

    try:
        OptimizerConfig(
            optimizer=values["train.optimizer"], bf16=True, params_dtype=torch.bfloat16,
            use_distributed_optimizer=values["parallel.use_distributed_optimizer"],
            use_precision_aware_optimizer=values["train.use_precision_aware_optimizer"],
            exp_avg_dtype=TORCH[values["train.exp_avg_dtype"]], main_params_dtype=TORCH[values["train.main_params_dtype"]],
            main_grads_dtype=TORCH[values["train.main_grads_dtype"]],
            optimizer_cpu_offload=values["train.optimizer_cpu_offload"], optimizer_offload_fraction=1.0,
        )
    except (AssertionError, RuntimeError, TypeError):
        return True
    return False


def test_rules_refuse_exactly_what_optimizer_config_refuses(monkeypatch) -> None:
    from dlmspec.spec.models import Spec
    from spec_kit import spec_dict

    _fused_adam_standin(monkeypatch)
    disagreements = []
    for combo in itertools.product(*GRID_VALUES):
        values = dict(zip(GRID_KEYS, combo))
        # bf16 main gradients go with a bf16 DDP buffer (Megatron-LM's rule, main-grads-dtype-grad-buffer)
        values["parallel.grad_reduce_in_fp32"] = values["train.main_grads_dtype"] == "fp32"
        spec = Spec.model_validate(spec_dict(values))
        fired = {i.rule for i in find(("spec",), spec) if i.severity == "error"} & MEGATRON_CORE_CONFIG_RULES
        if bool(fired) != _core_refuses(values):
            disagreements.append((values, sorted(fired)))
    assert not disagreements, disagreements[:3]
    assert len(list(itertools.product(*GRID_VALUES))) == 128
