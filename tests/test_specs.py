"""The bundled specs (specs/*.toml): each loads, resolves and passes every check with no
warning, and the figures their comments state are what dlmspec computes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dlmspec.cli import spec_issues
from dlmspec.loader import load
from dlmspec.resolve import resolve

SPECS = sorted((Path(__file__).resolve().parent.parent / "specs").glob("*.toml"))


def test_bundled_specs_exist() -> None:
    names = {p.stem for p in SPECS}
    assert {"demo-dlm", "demo-ar", "megadlms-1.7b-mdm", "megadlms-1.7b-ar", "llada-8b-pretrain",
            "mixtral-8x7b-mdm"} <= names


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_bundled_spec_is_clean(path: Path) -> None:
    loaded = load(path)
    resolved = resolve(loaded.spec)
    assert [str(i) for i in spec_issues(loaded, resolved)] == []
    assert loaded.spec.name == path.stem
    assert resolved.train_iters > 0


def _resolved(stem: str):
    return resolve(load(next(p for p in SPECS if p.stem == stem)).spec)


@pytest.mark.parametrize(("mdm", "ar"), [("demo-dlm", "demo-ar"), ("megadlms-1.7b-mdm", "megadlms-1.7b-ar")])
def test_ar_baselines_differ_only_in_objective(mdm: str, ar: str) -> None:
    a, b = _resolved(mdm), _resolved(ar)
    assert (a.spec.objective.kind, a.attention_mask) == ("mdm", "bidirectional")
    assert (b.spec.objective.kind, b.attention_mask) == ("ar", "causal")
    ignore = {"name", "description", "objective", "checkpoint", "logging"}
    assert a.spec.model_dump(exclude=ignore) == b.spec.model_dump(exclude=ignore)


def test_demo_description_figures() -> None:
    r = _resolved("demo-dlm")
    assert round(r.params.total / 1e6) == 153 and round(r.params.non_embedding / 1e6) == 76
    assert r.mask_token_id == 50257 < r.padded_vocab_size


def test_llada_schedule_figures() -> None:
    r = _resolved("llada-8b-pretrain")
    tr = r.spec.train
    assert r.tokens_per_step == 1280 * 4096 and r.dp == 64 and r.num_microbatches == 20
    assert r.train_iters == math.ceil(2.3e12 / r.tokens_per_step) == 438_691
    assert tr.lr_wsd_decay_iters == math.ceil(1.1e12 / r.tokens_per_step) == 209_809
    assert r.mask_token_id == 126336


def test_mixtral_layout_figures() -> None:
    r = _resolved("mixtral-8x7b-mdm")
    assert (r.dp, r.expert_dp, r.num_microbatches) == (16, 2, 32)
    assert r.padded_vocab_size == 32128 and r.mask_token_id == 32000
    assert round(r.params.total / 1e9, 1) == 46.7 and round(r.params.active / 1e9, 1) == 12.9


def test_megadlms_figures() -> None:
    r = _resolved("megadlms-1.7b-mdm")
    assert (r.dp, r.num_microbatches, r.mask_token_id) == (8, 4, 50277)
