"""validate on [eval.generation]: the prompts file's rows (file and line named, exit 2), `every` a
multiple of eval_interval, and the layouts the sampler cannot run; the bundled task specs pass."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dlmspec.cli.commands import app

ROOT = Path(__file__).resolve().parents[3]
TASK_SPEC = ROOT / "specs" / "task-addition-dlm.toml"


def _validate(tmp_path: Path, body: str):
    spec = tmp_path / "spec.toml"
    spec.write_text(f'extends = "{TASK_SPEC}"\nname = "t"\n' + body)
    result = CliRunner().invoke(app, ["validate", str(spec), "--json"])
    out = json.loads(result.stdout)
    return result.exit_code, out["issues"] + out.get("warnings", [])


def test_a_malformed_row_is_an_error_naming_the_file_and_line(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": " 1 + 2 =", "answer": " 3"}\n\n{"prompt": " 4 + 4 =", "answer": 8}\n')
    code, issues = _validate(tmp_path, f'[eval.generation]\nprompts = "{prompts}"\n')
    assert code == 2
    (issue,) = [i for i in issues if i["rule"] == "eval-generation-prompts"]
    assert issue["key"] == "eval.generation.prompts" and f"{prompts}:3: 'answer' is a int" in issue["message"]
    assert issue["hint"] and issue["severity"] == "error"


def test_a_good_prompts_file_passes_and_a_missing_one_is_a_path_warning(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": " 1 + 2 =", "answer": " 3", "id": "a"}\n')
    code, issues = _validate(tmp_path, f'[eval.generation]\nprompts = "{prompts}"\n')
    assert code == 0 and not [i for i in issues if i["key"].startswith("eval.")]
    code, issues = _validate(tmp_path, f'[eval.generation]\nprompts = "{tmp_path / "absent.jsonl"}"\n')
    assert code == 0
    (issue,) = [i for i in issues if i["key"] == "eval.generation.prompts"]
    assert issue["rule"] == "path-not-found" and issue["severity"] == "warning"


def test_every_must_be_a_multiple_of_eval_interval(tmp_path):
    code, issues = _validate(tmp_path, '[eval.generation]\nprompts = "p.jsonl"\nevery = 300\n')
    assert code == 2
    (issue,) = [i for i in issues if i["rule"] == "eval-generation-every"]
    assert "eval_interval = 200" in issue["message"] and "every = 200" in issue["hint"]


def test_pipeline_parallel_and_a_textless_tokenizer_are_refused(tmp_path):
    body = ('[parallel]\npipeline_model_parallel_size = 2\n[cluster]\ngpus_per_node = 2\n'
            '[eval.generation]\nprompts = "p.jsonl"\n')
    code, issues = _validate(tmp_path, body)
    assert code == 2
    found = [i for i in issues if i["rule"] == "eval-generation-layout"]
    assert [i["key"] for i in found] == ["parallel.pipeline_model_parallel_size"]
    code, issues = _validate(tmp_path, '[data]\nmock = true\n[data.tokenizer]\ntype = "NullTokenizer"\n'
                             'vocab_size = 50000\n[eval.generation]\nprompts = "p.jsonl"\n')
    assert "data.tokenizer.type" in [i["key"] for i in issues if i["rule"] == "eval-generation-layout"]
