"""What the Dream and LLaDA data files (specs/published/) record beyond the spec's values: the Dream
team's later SFT trainers' settings as theirs (no floor on t, per-micro-batch masked-token
normalisation, an option dlmspec has), the ids verified against a public copy of Dream's
configuration class, LLaDA's architecture values verified against a public copy of its config.json,
the in-step cut and the micro-batch-1 weighting, and the 1.2T drop as LLaDA's FAQ tells it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _settings(name: str) -> dict[str, dict]:
    data = tomllib.loads((ROOT / "specs" / "published" / f"{name}.toml").read_text(encoding="utf-8"))
    return {s["key"] if s["key"] != "-" else s["name"]: s for s in data["setting"]}


def test_dream_table_records_the_later_sft_trainers_settings_as_theirs():
    from dlmspec.backends.megatron.objective import LOSS_NORMALIZATIONS

    dream = _settings("dream-7b-adapt")
    norm = dream["train.loss_normalization"]
    assert norm["status"] == "unverified" and "micro_batch_masked" in norm["note"]
    assert "fsdp_sft_trainer.py:830-831" in norm["source"]
    assert "micro_batch_masked" in LOSS_NORMALIZATIONS
    eps = dream["objective.eps"]
    assert eps["status"] == "unverified" and "gen_utils.py" in eps["source"] and "min=0.0" in eps["note"]
    assert eps["spec_value"] == 0.001  # the spec's own value, unchanged without a Dream 7B source


def test_dream_ids_are_verified_with_their_source():
    dream = _settings("dream-7b-adapt")
    for key, value in (("derived.mask_token_id", 151666), ("data.tokenizer.eod_id", 151643)):
        entry = dream[key]
        assert (entry["status"], entry["value"]) == ("matches", value)
        assert "DreamLM/Dream-Coder@87409da:instruct/src/inference/fast_dllm/configuration_dream.py" in entry["source"]


def test_llada_architecture_values_are_verified_and_its_departures_recorded():
    llada = _settings("llada-8b-pretrain")
    for key, value in (("model.rotary_base", 500000.0), ("model.layernorm_epsilon", 1e-5),
                       ("model.untie_embeddings_and_output_weights", True)):
        entry = llada[key]
        assert (entry["status"], entry["value"]) == ("matches", value), key
        assert "config.json" in entry["source"]
    assert not [k for k, s in llada.items() if s["status"] == "unverified"]
    assert "in step on every data-parallel rank" in llada["objective.variable_length"]["note"]
    assert "micro batch of 1" in llada["train.loss_normalization"]["note"]
    points = llada["train.lr_points"]
    assert "README.md:146-150" in points["source"] and "crashed" in points["note"]
