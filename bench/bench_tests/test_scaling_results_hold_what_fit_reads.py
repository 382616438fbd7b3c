"""The scaling suite's results folder (bench/scaling/run.py keep_files) holds what ``dlmspec fit``
reads and nothing that would stop it: no empty eval.json (an evaluation the study's budget
stopped), and each dataset's .idx beside its record, so fit counts the unique tokens of a capped
dataset, and so epochs, from the results folder alone."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import scaling_kit
from blend_shards import docs_of, null_tokenizer, write_shard

ROOT = Path(__file__).resolve().parents[2]


def _launcher():
    spec = importlib.util.spec_from_file_location("bench_scaling_run_keep", ROOT / "bench" / "scaling" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_kept_results_drop_an_empty_eval_file_and_carry_the_dataset_index(tmp_path: Path) -> None:
    from dlmspec.scaling.runs import read_point

    run = _launcher()
    data = tmp_path / "data"
    write_shard(str(data / "demo-train_text_document"), docs_of(400), null_tokenizer())  # 100 documents of 4 tokens
    work = tmp_path / "work"
    for name, body in (("stopped", ""), ("evaluated", json.dumps({"ok": True, "result": {"ar": {"nll_per_token": 4.0}}}))):
        folder = run.member_dir(work, name) / "runs" / name
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text(json.dumps({"event": "valid", "iteration": 5, "loss": 4.5}) + "\n")
        (folder / "eval.json").write_text(body)
    kept = tmp_path / "kept"
    run.keep_files(work, [{"name": "stopped"}, {"name": "evaluated"}], kept, data)
    assert sorted(p.name for p in (kept / "runs" / "stopped").iterdir()) == ["metrics.jsonl"]
    assert sorted(p.name for p in (kept / "runs" / "evaluated").iterdir()) == ["eval.json", "metrics.jsonl"]
    assert sorted(p.name for p in (kept / ".data").iterdir()) == ["demo-train_text_document.dlmspec.json",
                                                                 "demo-train_text_document.idx"]
    # a run of the results folder capped at 10 tokens of 4-token documents: 2 whole documents, 8 unique tokens
    capped = {"data.mock": None, "data.split": "100,0,0",
              "data.train": [{"prefix": ".data/demo-train_text_document", "max_unique_tokens": 10}]}
    folder = scaling_kit.write_run(kept / "runs" / "capped", shape=(4, 256), tokens=64, loss=4.5, data=capped)
    point = read_point(str(folder))
    assert point.unique_tokens == 8 and point.epochs == 8.0, point.unique_why
