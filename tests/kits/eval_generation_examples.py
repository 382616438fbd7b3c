"""The failing example of the [eval.generation] rule that reads a file (rule
eval-generation-prompts, dlmspec/check/eval_generation.py): a spec change of
test_validate_compile_agree.BASE and a prompts file with a malformed row; and the action that fixes
it (the user's file, rewritten with valid rows). Shared by test_validate_compile_agree and
test_fixes_validate."""

from __future__ import annotations

from typing import Any

#: A text tokenizer (the rule eval-generation-layout refuses BASE's NullTokenizer) and a prompts file.
CHANGES = {"eval.generation": {"prompts": "task/test.jsonl"},
           "data.tokenizer": {"type": "HuggingFaceTokenizer", "model": "org/name"}}

FILE_EXAMPLES: dict[str, tuple[dict[str, Any], dict[str, str], str]] = {
    "eval-generation-prompts": (CHANGES, {"task/test.jsonl": '{"prompt": " 1 + 2 =", "answer": 3}\n'},
                                "eval.generation.prompts"),
}


def rewrite_prompts(example: Any, issues: list) -> None:
    """Write the prompts file with a valid row (the user's file in practice)."""
    example.files["task/test.jsonl"] = '{"prompt": " 1 + 2 =", "answer": " 3"}\n'
