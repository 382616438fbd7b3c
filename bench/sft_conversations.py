"""Build the demo SFT conversation set from the shared corpus (without the data kit: from this
Python's standard library docstrings, :func:`stdlib_corpus`), and print (or run) the
``dlmspec data prepare --sft`` commands that tokenize it.

Each conversation is one prose paragraph of the Python documentation (the data kit's
``corpus/pydocs-*.jsonl``, see its README) with an instruction as the user turn, and the
paragraph's first sentence as the assistant turn::

    {"messages": [{"role": "user", "content": "Quote the first sentence of this passage.\\n\\n<passage>"},
                  {"role": "assistant", "content": "<its first sentence>"}]}

A paragraph is prose when it is not indented (code, tables, directives' bodies), does not start
with RST markup (``..``, ``:``, ``*``, ``-``, ``=``, ``+``, ``|``, ``>>>``), has 200 to 1,500
characters and at least two sentences; a sentence ends at ``.``, ``!`` or ``?`` followed by
whitespace and a capital letter. The split is by document: the training set comes from
``pydocs-train.jsonl``, the held-out set from ``pydocs-valid.jsonl`` (documents no training
conversation comes from). The output is deterministic (file order; ``--max-train`` and
``--max-heldout`` keep an evenly spaced subset).

Usage (from the repository root)::

    python bench/sft_conversations.py            # writes .data/sft/{train,heldout}.jsonl, prints commands
    python bench/sft_conversations.py --run      # ... and runs them (.data/demo-sft-*_text_document)

The commands use the GPT-2 tokenizer at ``.data/gpt2/`` (copied there from the data kit when it is
missing), ChatML and ``--seq-length 512`` (the demo model's ``train.seq_length``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The data kit beside the checkout (../shared/data), or the one of /work/shared.
KIT_CANDIDATES = (REPO.parent / "shared" / "data", Path("/work/shared/data"))
INSTRUCTION = "Quote the first sentence of this passage."
MIN_CHARS, MAX_CHARS = 200, 1500
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
MARKUP_START = ("..", ":", "*", "-", "=", "+", "|", ">>>", "#", "~", "^", "`")


#: What gets the demo's GPT-2 tokenizer without the data kit (docs/getting-started.md).
GPT2_DOWNLOAD = ".venv/bin/hf download openai-community/gpt2 vocab.json merges.txt --local-dir .data/gpt2"


def kit_dir() -> Path | None:
    """The shared data kit's folder (``../shared/data`` beside the checkout first), or ``None``."""
    for candidate in KIT_CANDIDATES:
        if (candidate / "corpus" / "pydocs-train.jsonl").is_file():
            return candidate
    return None


def stdlib_corpus(out: Path, every: int = 20) -> Path:
    """``out/pydocs-{train,valid}.jsonl`` from this interpreter's own Python documentation: the
    docstrings of the standard library's ``.py`` files (read with :mod:`ast`, never imported), one
    ``{"id", "text"}`` document per file in sorted path order, every ``every``-th file held out.
    What the demo builds its conversations from when the data kit (``../shared/data``, whose
    ``pydocs-*.jsonl`` are the Python docs too) is not here. Returns ``out``."""
    import ast
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    splits: dict[str, list[dict]] = {"train": [], "valid": []}
    files = sorted(f for f in root.rglob("*.py") if "site-packages" not in f.parts and "test" not in f.parts
                   and "tests" not in f.parts and "idlelib" not in f.parts)
    for index, path in enumerate(files):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        docs = [ast.get_docstring(tree)] + [ast.get_docstring(node) for node in tree.body
                                            if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
        text = "\n\n".join(d for d in docs if d)
        if text:
            split = "valid" if index % every == every - 1 else "train"
            splits[split].append({"id": str(path.relative_to(root)), "text": text})
    for split, rows in splits.items():
        write_jsonl(out / f"pydocs-{split}.jsonl", rows)
    return out


def prose_paragraphs(text: str) -> list[str]:
    """The paragraphs of a document that are prose (see the module docstring), whitespace joined."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.split("\n")
        if not block.strip() or any(line[:1].isspace() for line in lines if line):
            continue
        if block.lstrip().startswith(MARKUP_START):
            continue
        if len(lines) > 1 and set(lines[1].strip()) <= set("=-~^*#+"):  # a heading and its underline
            continue
        paragraph = " ".join(line.strip() for line in lines)
        if not MIN_CHARS <= len(paragraph) <= MAX_CHARS:
            continue
        if len(SENTENCE_END.split(paragraph)) < 2:
            continue
        out.append(paragraph)
    return out


def conversation(paragraph: str) -> dict:
    """The conversation of one paragraph: the instruction and the passage, then its first sentence."""
    first = SENTENCE_END.split(paragraph, maxsplit=1)[0].strip()
    return {"messages": [{"role": "user", "content": f"{INSTRUCTION}\n\n{paragraph}"},
                         {"role": "assistant", "content": first}]}


def conversations(corpus: Path, limit: int | None) -> list[dict]:
    """Conversations from every prose paragraph of ``corpus`` (JSONL ``{"id", "text"}``), in file
    order; ``limit``: an evenly spaced subset of that many."""
    rows = []
    with corpus.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                rows.extend(conversation(p) for p in prose_paragraphs(json.loads(line)["text"]))
    if limit is not None and len(rows) > limit:
        step = len(rows) / limit
        rows = [rows[int(i * step)] for i in range(limit)]
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus-dir", type=Path, default=None, help="folder of pydocs-{train,valid}.jsonl")
    parser.add_argument("--out", type=Path, default=Path(".data/sft"), help="folder of train.jsonl, heldout.jsonl")
    parser.add_argument("--data", type=Path, default=Path(".data"), help="folder of the prepared datasets")
    parser.add_argument("--max-train", type=int, default=None, help="at most this many training conversations")
    parser.add_argument("--max-heldout", type=int, default=256, help="at most this many held-out conversations")
    parser.add_argument("--seq-length", type=int, default=512)
    parser.add_argument("--run", action="store_true", help="run the prepare commands (with --force)")
    args = parser.parse_args(argv)

    kit = kit_dir()
    # the tokenizer first: without one (and no kit to copy it from) nothing is built, rather than the
    # conversations (seconds of parsing without the kit) before the error
    gpt2 = args.data / "gpt2"
    if not (gpt2 / "vocab.json").is_file() or not (gpt2 / "merges.txt").is_file():
        source = (args.corpus_dir.parent if args.corpus_dir else kit or Path("/nonexistent")) / "tokenizers" / "gpt2"
        if not all((source / name).is_file() for name in ("vocab.json", "merges.txt")):
            print(f"error: the GPT-2 tokenizer is not in {gpt2}/ and there is no data kit to copy it from; "
                  f"get it with: {GPT2_DOWNLOAD} (the pre-training demo's, docs/getting-started.md), "
                  "then run this again", file=sys.stderr)
            return 2
        gpt2.mkdir(parents=True, exist_ok=True)
        for name in ("vocab.json", "merges.txt"):
            shutil.copyfile(source / name, gpt2 / name)
        print(f"copied the GPT-2 tokenizer to {gpt2}/", file=sys.stderr)

    if args.corpus_dir is not None:
        corpus = args.corpus_dir
    elif kit is not None:
        corpus = kit / "corpus"
    else:  # no data kit: the standard library's own documentation
        corpus = stdlib_corpus(args.out / "stdlib-corpus")
        print(f"no data kit (../shared/data): built the corpus from this Python's standard library docstrings "
              f"in {corpus}", file=sys.stderr)
    train = conversations(corpus / "pydocs-train.jsonl", args.max_train)
    heldout = conversations(corpus / "pydocs-valid.jsonl", args.max_heldout)
    write_jsonl(args.out / "train.jsonl", train)
    write_jsonl(args.out / "heldout.jsonl", heldout)
    print(f"wrote {len(train):,} training conversations to {args.out / 'train.jsonl'} and {len(heldout):,} "
          f"held-out ones to {args.out / 'heldout.jsonl'}", file=sys.stderr)

    commands = []
    for split in ("train", "heldout"):
        commands.append([
            "dlmspec", "data", "prepare", "--sft", "--input", str(args.out / f"{split}.jsonl"),
            "--output-prefix", str(args.data / f"demo-sft-{split}"), "--tokenizer-type", "GPT2BPETokenizer",
            "--vocab-file", str(gpt2 / "vocab.json"), "--merge-file", str(gpt2 / "merges.txt"),
            "--chat-template", "chatml", "--seq-length", str(args.seq_length),
        ])
    for command in commands:
        print(shlex.join(command))
    if args.run:
        for command in commands:
            # the dlmspec of this interpreter (the checkout's venv), not whichever is on PATH
            subprocess.run([sys.executable, "-m", "dlmspec.cli", *command[1:], "--force", "--no-progress"],
                           check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
