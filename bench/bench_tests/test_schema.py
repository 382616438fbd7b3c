"""bench/schema.py: one result schema, validated on write, never overwriting."""

from __future__ import annotations

import json

import pytest

from schema import SUITES, Result, ResultInvalid, read_result, result_path, validate, write_result


def _result(**changes):
    base = dict(suite="throughput", name="qwen3-1.7b-bf16", command=["python", "bench/throughput/run.py"],
                versions={"python": "3.12.3", "dlmspec": "0.1.0", "torch": None},
                hardware={"gpu": "h100", "gpu_count": 1}, values={"tokens_per_s": 1.0}, date="2026-12-06")
    base.update(changes)
    return Result(**base)


def test_write_result_puts_the_file_at_suite_date_gpu_name_and_reads_back(tmp_path):
    path = write_result(_result(), tmp_path)
    assert path == tmp_path / "throughput" / "2026-12-06-h100-qwen3-1.7b-bf16.json"
    assert read_result(path)["values"] == {"tokens_per_s": 1.0}


def test_a_second_result_of_the_same_day_does_not_overwrite_the_first(tmp_path):
    first = write_result(_result(), tmp_path)
    second = write_result(_result(values={"tokens_per_s": 2.0}), tmp_path)
    assert second.name == "2026-12-06-h100-qwen3-1.7b-bf16-2.json"
    assert json.loads(first.read_text())["values"] == {"tokens_per_s": 1.0}


@pytest.mark.parametrize("changes, key", [
    ({"suite": "speed"}, "suite"),
    ({"name": "Has Spaces"}, "name"),
    ({"date": "2026-13-01"}, "date"),
    ({"command": []}, "command"),
    ({"versions": {"python": "3.12"}}, "versions.dlmspec"),
    ({"hardware": {"gpu": "H100", "gpu_count": 1}}, "hardware.gpu"),
    ({"hardware": {"gpu": "h100", "gpu_count": True}}, "hardware.gpu_count"),
    ({"status": "great"}, "status"),
    ({"values": {"mfu": float("nan")}}, "values"),
])
def test_a_result_that_breaks_the_schema_is_refused_naming_its_key(tmp_path, changes, key):
    with pytest.raises(ResultInvalid) as err:
        write_result(_result(**changes), tmp_path)
    assert err.value.key == key
    assert not list(tmp_path.rglob("*.json"))


def test_unknown_top_level_keys_are_refused():
    data = _result().to_dict()
    data["speedup"] = 2
    with pytest.raises(ResultInvalid) as err:
        validate(data)
    assert err.value.key == "speedup"


def test_every_suite_has_a_launcher_and_a_results_path():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for suite in SUITES:
        assert (root / "bench" / suite / "run.py").is_file(), suite
        assert result_path(root / "bench" / "results", suite, "2026-12-06", "h100", "x").parent.name == suite


def test_committed_suite_results_follow_the_schema():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "bench" / "results"
    for suite in SUITES:
        for path in sorted((root / suite).glob("*.json")):
            data = read_result(path)
            assert path.name == f"{data['date']}-{data['hardware']['gpu']}-{data['name']}.json" or \
                path.name.startswith(f"{data['date']}-{data['hardware']['gpu']}-{data['name']}-"), path
