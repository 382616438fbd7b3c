"""``dlmspec plan SWEEP.py``: one study table (and ``--json`` ``result.study``) whose rows hold
each member's N (non-embedding parameters) beside the total, training FLOPs, tokens, epochs,
GPU-hours and MFU, and the study's total GPU-hours; checked against hand counts for a sweep of
two models (2 and 4 layers) on one dataset of 1,280 tokens.

Hand counts, for spec_kit's model (h 256, f 1024, 8 heads of 32, 4 query groups, vocabulary 1000
padded to 1024, SwiGLU, RMSNorm, no biases, untied embeddings):

* a layer: attention ``h (a d + 2 g d) + a d h = 196,608``, two norms ``2 h = 512``, MLP
  ``2 f h + f h = 786,432``: 983,552; N = ``L x 983,552 + 256`` (the final norm); the total adds
  the two embedding matrices ``2 x 1000 x 256 = 512,000``;
* training FLOPs per token (dlmspec/flops.py): ``3 x [L (2 x 983,040 + 4 a d s) + 2 h V]`` with
  the 983,040 weights of a layer's GEMMs, ``a d = 256``, ``s = 64`` (bidirectional: every key),
  ``V = 1024``; times ``train_iters x 8 x 64`` tokens;
* epochs: tokens / 1,280.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blend_shards import docs_of, null_tokenizer, write_shard
from dlmspec.cli import main
from spec_kit import write_toml, spec_dict

BASE = {"data.mock": None, "data.tokenizer": {"type": "NullTokenizer", "vocab_size": 999},
        "data.train": ["data/a_text_document"], "data.valid": ["data/v_text_document"],
        "train.seq_length": 64, "train.global_batch_size": 8, "train.micro_batch_size": 1,
        "train.lr_warmup_iters": 0, "train.eval_interval": 5, "model.max_position_embeddings": 64}
MEMBERS = {"small": {"model.num_layers": 2, "train.train_iters": 10},
           "large": {"model.num_layers": 4, "train.train_iters": 20}}


def _n(layers: int) -> int:
    return layers * (256 * (256 + 2 * 4 * 32) + 256 * 256 + 2 * 256 + 3 * 1024 * 256) + 256


def _flops(layers: int, iters: int) -> int:
    per_token = 3 * (layers * (2 * 983_040 + 4 * 256 * 64) + 2 * 256 * 1024)
    return per_token * iters * 8 * 64


@pytest.fixture
def sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    write_shard(str(tmp_path / "data/a_text_document"), docs_of(1280), null_tokenizer())
    write_shard(str(tmp_path / "data/v_text_document"), docs_of(64), null_tokenizer())
    for name, changes in MEMBERS.items():
        write_toml(tmp_path / f"{name}.toml", spec_dict(BASE, changes, name=name))
    path = tmp_path / "study.py"
    path.write_text("from dlmspec.dsl import Spec\n"
                    "spec = {name: Spec.load(name + '.toml') for name in ('small', 'large')}\n", encoding="utf-8")
    return path


def test_the_hand_formula_matches_the_parameter_counter(tmp_path: Path) -> None:
    """The hand formula above agrees with dlmspec.params for both models (so the rows below test
    the table, not the formula)."""
    from dlmspec.params import count_parameters
    from dlmspec.spec.load import load

    for layers in (2, 4):
        model = load(write_toml(tmp_path / f"m{layers}.toml", spec_dict({"model.num_layers": layers}))).spec.model
        counts = count_parameters(model)
        assert (counts.non_embedding, counts.total) == (_n(layers), _n(layers) + 2 * 1000 * 256)
    assert (_n(2), _n(4)) == (1_967_360, 3_934_464)


def test_the_study_json_holds_the_hand_counted_numbers(sweep: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["plan", str(sweep), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["result"]
    study = result["study"]
    assert study["parameters"].startswith("N: non-embedding parameters")
    rows = {m["name"]: m for m in study["members"]}
    for name, layers, iters in (("small", 2, 10), ("large", 4, 20)):
        row = rows[name]
        assert row["non_embedding_params"] == _n(layers)
        assert row["total_params"] == _n(layers) + 2 * 1000 * 256
        assert row["training_flops"] == pytest.approx(_flops(layers, iters), rel=1e-12)
        assert row["tokens"] == iters * 8 * 64
        assert row["unique_tokens"] == 1280 and row["epochs"] == pytest.approx(iters * 8 * 64 / 1280)
    # GPU-hours and MFU are the members' own plans; the total is their sum
    plans = {p["name"]: p for p in result["sweep"]}
    for name, row in rows.items():
        assert (row["gpu_hours"], row["mfu"]) == (plans[name]["gpu_hours"], plans[name]["mfu"])
        assert plans[name]["data"]["epochs"] == row["epochs"]
    assert study["total_gpu_hours"] == pytest.approx(rows["small"]["gpu_hours"] + rows["large"]["gpu_hours"])


def test_the_study_table_prints_the_same_numbers(sweep: Path, capsys: pytest.CaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["plan", str(sweep), "--json"]) == 0
    study = json.loads(capsys.readouterr().out)["result"]["study"]
    assert main(["plan", str(sweep)]) == 0
    text = capsys.readouterr().out
    assert "N (non-emb.)" in text and "N: non-embedding parameters" in text
    rows = {cells[0]: cells[1:] for line in text.splitlines() if line.startswith("│")
            for cells in [[c.strip() for c in line.strip("│").split("│")]]}
    # name | N | total | FLOPs | tokens | epochs | GPU-hours | MFU | ...
    assert rows["small"][:5] == ["1.97M", "2.48M", f"{_flops(2, 10):.2e}", "5.12K", "4.00"]
    assert rows["large"][:5] == ["3.93M", "4.45M", f"{_flops(4, 20):.2e}", "10.24K", "8.00"]
    members = {m["name"]: m for m in study["members"]}
    assert rows["small"][6] == f"{100 * members['small']['mfu']:.1f}%"
    total = study["total_gpu_hours"]
    assert total < 100 and f"study total: {total:.3g} GPU-hours over 2 runs" in text
