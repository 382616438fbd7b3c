"""Every default is filled in resolve: Resolved.runtime carries what train.py prints, and the
templates print values without filling any themselves."""

from __future__ import annotations

import re
from pathlib import Path

import tomli_w

from dlmspec.plan.shape import layout
from dlmspec.render.compile import render
from dlmspec.resolve import Resolved, resolve, runtime_values
from dlmspec.spec.load import load
from spec_kit import spec_dict

ROOT = Path(__file__).resolve().parents[3]

SPEC = spec_dict({
    "name": "defaults",
    "model": {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 256},
    "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 128, "train_iters": 10, "eval_interval": 5},
    "logging": {"wandb_project": "p"},
    "recompute": {"granularity": "selective"},
})

#: A value the template decides: ``{{ (a or b) }}``, ``default(...)``, ``x is none`` inside a
#: printed expression.
TEMPLATE_FALLBACK = re.compile(r"\{\{[^}]*(?:\sor\s|default\(|\sis\s+(?:not\s+)?none)[^}]*\}\}")


def test_templates_print_values_without_filling_defaults() -> None:
    found = [f"{path.name}:{n}: {line.strip()}"
             for path in sorted((ROOT / "templates").glob("*.j2"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if TEMPLATE_FALLBACK.search(line)]
    assert found == [], "fill these defaults in dlmspec.resolve:\n" + "\n".join(found)


def test_resolved_carries_the_runtime_values_with_their_defaults(tmp_path: Path) -> None:
    path = tmp_path / "spec.toml"
    path.write_text(tomli_w.dumps(SPEC), encoding="utf-8")
    resolved = resolve(load(path).spec)
    assert isinstance(resolved, Resolved)
    rt = resolved.runtime
    assert rt is runtime_values(resolved)
    assert (rt.save_at_end, rt.tensorboard) == (False, False)  # nothing saved without checkpoint.save
    assert (rt.wandb_exp_name, rt.wandb_mode, rt.wandb_tags) == ("defaults", "online", [])
    assert rt.recompute_modules == ("core_attn",)
    assert (rt.blend, rt.valid_blend) == (None, None)
    lay = layout(resolved)
    assert (lay.recompute_modules, lay.recompute_method, lay.recompute_layers) == (("core_attn",), "uniform", 1)
    train_py = render(resolved, "spec.toml")["train.py"]
    for text in ("save_at_end=False,", "wandb_exp_name='defaults',", "wandb_mode='online',", "wandb_tags=[],",
                 "tensorboard=False,", "blend=None,"):
        assert text in train_py, text
