"""The summary ``dlmspec data prepare --sft`` prints after a run (:func:`print_sft_summary`): counts,
bad rows by kind with their first line numbers (at most :data:`KEEP_LINES` each), cut rows and the
special-token ids, every string escaped for the terminal.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from rich.console import Console
from rich.table import Table
from rich.text import Text

from dlmspec.data.outputs import DatasetOutput

@dataclass
class SftResult:
    """What :func:`prepare_sft` wrote; ``to_dict()`` is the ``--json`` summary."""

    input: str
    output_prefix: str
    tokenizer_type: str
    vocab_size: int
    eod: int
    dtype: str
    chat_template: str
    chat_template_sha256: str
    format: str
    documents: int
    tokens: int
    response_tokens: int
    prompt_tokens: int
    rows: dict[str, int]
    bad_rows: dict[str, int]
    bad_row_lines: dict[str, list[int]]
    truncated_lines: list[int]
    special_tokens: dict[str, int]
    special_tokens_in_vocab: dict[str, int]
    max_length: Optional[int]
    overlong: str
    on_bad: str
    datasets: list[DatasetOutput]
    record: str
    elapsed_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tokens_per_s"] = round(self.tokens_per_s, 1)
        data["elapsed_s"] = round(self.elapsed_s, 3)
        return data


#: Line numbers kept per kind for the summary and the record.
KEEP_LINES = 20


def _same(a: str, b: str) -> bool:
    """Whether two paths name one file (links followed); False when either is missing."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _token_text(tokenizer: Any, token_id: int) -> str:
    """The string of one id (``<|endoftext|>``), or "" when the tokenizer cannot say."""
    hf = getattr(getattr(tokenizer, "_tokenizer", None), "tokenizer", None)
    if hf is not None and hasattr(hf, "convert_ids_to_tokens"):  # its detokenize drops special tokens
        with contextlib.suppress(Exception):
            return str(hf.convert_ids_to_tokens(token_id) or "")
    try:
        return str(tokenizer.detokenize([token_id]))
    except Exception:  # noqa: BLE001
        return ""


def _lines_text(kept: list[int], total: int) -> str:
    text = ", ".join(str(n) for n in kept)
    return text + (f" and {total - len(kept):,} more" if total > len(kept) else "")


def print_sft_summary(console: Console, result: SftResult) -> None:
    """The summary table of ``data prepare --sft`` (as the pre-training prepare prints it)."""
    table = Table(title="dlmspec data prepare --sft", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    rows = result.rows
    specials = ", ".join(f"{t} {i}" for t, i in result.special_tokens.items()) or "none"
    rows_out = [
        ("input", f"{result.input} ({result.format})"),
        ("tokenizer", f"{result.tokenizer_type} (vocab {result.vocab_size:,}, eod {result.eod}, {result.dtype})"),
        ("chat template", f"{result.chat_template} (sha256 {result.chat_template_sha256[:12]})"),
        ("new token ids", specials),
        ("rows", f"{rows['read']:,} read, {rows['written']:,} written, {rows['skipped']:,} skipped, "
                 f"{rows['truncated']:,} truncated"),
    ]
    for kind_, count in result.bad_rows.items():
        rows_out.append((f"bad: {kind_}", f"{count:,} (lines {_lines_text(result.bad_row_lines[kind_], count)})"))
    if rows["truncated"]:
        rows_out.append(("truncated", f"{rows['truncated']:,} to --seq-length {result.max_length:,} "
                         f"(lines {_lines_text(result.truncated_lines, rows['truncated'])})"))
    rows_out += [
        ("tokens", f"{result.tokens:,} ({result.response_tokens:,} response, {result.prompt_tokens:,} prompt)"),
        ("elapsed", f"{result.elapsed_s:.2f} s"),
        ("tokens/s", f"{result.tokens_per_s:,.0f}"),
        ("dataset", f"{result.datasets[0].prefix}.{{bin,idx}}"),
        ("response flags", f"{result.datasets[1].prefix}.{{bin,idx}}"),
        ("record", result.record),
    ]
    for name, value in rows_out:
        table.add_row(Text(name), Text(value))
    console.print(table)
