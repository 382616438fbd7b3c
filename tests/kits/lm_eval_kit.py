"""Helpers shared by tests (moved from test_lm_eval_model.py): _write_tasks, offline_lm_eval."""

from __future__ import annotations

import json
from pathlib import Path
import pytest


def _write_tasks(folder: Path) -> list[dict]:
    """Three tiny tasks over local JSON files: multiple choice, generation, rolling perplexity."""
    folder.mkdir(parents=True, exist_ok=True)
    mc = [{"context": "the cat", "choices": [" sat", " dog"], "label": 0},
          {"context": "a dog", "choices": [" ran", " cat sat"], "label": 1},
          {"context": "we", "choices": [" go", " are"], "label": 0}]
    (folder / "mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in mc))
    (folder / "gen.jsonl").write_text(json.dumps({"q": "ab", "a": "hi"}) + "\n")
    (folder / "ppl.jsonl").write_text(json.dumps({"text": "the cat sat"}) + "\n")

    def local(name: str) -> dict:
        return {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(folder / name)}},
                "test_split": "test"}

    return [
        {"task": "tiny_mc", **local("mc.jsonl"), "output_type": "multiple_choice", "doc_to_text": "{{context}}",
         "doc_to_choice": "{{choices}}", "doc_to_target": "{{label}}", "target_delimiter": "",
         "metric_list": [{"metric": "acc"}]},
        {"task": "tiny_gen", **local("gen.jsonl"), "output_type": "generate_until", "doc_to_text": "{{q}}",
         "doc_to_target": "{{a}}", "target_delimiter": "",
         "generation_kwargs": {"until": ["."], "max_gen_toks": 9},
         "metric_list": [{"metric": "exact_match"}]},
        {"task": "tiny_ppl", **local("ppl.jsonl"), "output_type": "loglikelihood_rolling",
         "doc_to_text": "", "doc_to_target": "{{text}}",
         "metric_list": [{"metric": "word_perplexity"}]},
    ]


@pytest.fixture
def offline_lm_eval(tmp_path: Path, monkeypatch):
    """No network, a private datasets cache, and two of lm-eval's slow steps skipped: indexing its
    thousands of bundled task files (only local tasks are used) and the environment report (it
    imports transformers and runs subprocesses)."""
    import lm_eval.evaluator
    import lm_eval.tasks

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    original = lm_eval.tasks.TaskManager

    def local_only(*args, **kwargs):
        kwargs["include_defaults"] = False
        return original(*args, **kwargs)

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", local_only)
    monkeypatch.setattr(lm_eval.evaluator, "add_env_info", lambda results: None)
    return local_only
