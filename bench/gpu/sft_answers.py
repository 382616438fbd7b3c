"""The fine-tuned demo model's answers on held-out prompts beside the base
model's. ``prompts`` (CPU machine) writes the first N held-out conversations' prompts, as the SFT
data holds them (every token before the first response token: the ChatML user turn and the
assistant header), to a JSONL of ``{"prompt_ids": [...], "reference": ...}``; on the GPU machine
``bench/demos/sft_demo.sh``'s runs are then sampled with ``dlmspec generate``.

Usage: python bench/gpu/sft_answers.py prompts [--n 8] [--out .data/sft/heldout_prompts.jsonl]
       (also writes OUT's _base twin: the same prompts as text, for the base model)
       python bench/gpu/sft_answers.py table BASE.json TUNED.json PROMPTS.jsonl OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HELDOUT = ".data/demo-sft-heldout_text_document"


def prompts(n: int, out: Path) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from dlmspec.tokenizers import build_tokenizer

    tokens = IndexedDataset(HELDOUT)
    flags = IndexedDataset(HELDOUT + "_response")
    tok = build_tokenizer("GPT2BPETokenizer", vocab_file=".data/gpt2/vocab.json", merge_file=".data/gpt2/merges.txt")
    special = {i: t for t, i in json.loads(Path(HELDOUT + ".dlmspec.json").read_text())["sft"]["special_tokens"].items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    base_out = out.with_name(out.stem + "_base" + out.suffix)
    with out.open("w") as f, base_out.open("w") as g:
        for i in range(min(n, len(tokens))):
            ids, resp = tokens[i].tolist(), flags[i].tolist()
            start = resp.index(1)
            reference = [t for t, r in zip(ids[start:], resp[start:]) if r and t < 50257]
            f.write(json.dumps({"prompt_ids": ids[:start], "reference": tok.detokenize(reference)}) + "\n")
            g.write(json.dumps({"prompt": as_text(ids[:start], special, tok)}) + "\n")
    print(f"wrote {min(n, len(tokens))} prompts to {out} (and as text, for the base model, to {base_out})")


def as_text(ids: list, special: dict, tok) -> str:
    """The prompt as text, the chat tokens written out (``<|im_start|>``): the base model has no
    embeddings for the ids the SFT data gave them (``dlmspec generate`` refuses ids outside its
    vocabulary), so it reads the same conversation as plain text, tokenized by its own tokenizer."""
    text, run = "", []
    for i in ids + [None]:
        if i is None or i in special:
            text += tok.detokenize(run) if run else ""
            run = []
            if i is not None:
                text += special[i]
        else:
            run.append(i)
    return text


def table(base: Path, tuned: Path, prompt_file: Path, out: Path) -> None:
    rows = [json.loads(line) for line in prompt_file.read_text().splitlines() if line.strip()]
    b, t = json.loads(base.read_text()), json.loads(tuned.read_text())
    bo, to = b["result"]["outputs"], t["result"]["outputs"]
    out.write_text(json.dumps({
        "what": "held-out prompts of the demo SFT set: the base (pre-trained) and the fine-tuned model's answers",
        "settings": {"base": b["result"].get("settings"), "tuned": t["result"].get("settings")},
        "answers": [{"reference": r["reference"], "base": x.get("text"), "tuned": y.get("text")}
                    for r, x, y in zip(rows, bo, to)],
    }, indent=1) + "\n")
    print(out.read_text()[:4000])


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prompts")
    a.add_argument("--n", type=int, default=8)
    a.add_argument("--out", type=Path, default=Path(".data/sft/heldout_prompts.jsonl"))
    t = sub.add_parser("table")
    for name in ("base", "tuned", "prompt_file", "out"):
        t.add_argument(name, type=Path)
    args = p.parse_args()
    prompts(args.n, args.out) if args.cmd == "prompts" else table(args.base, args.tuned, args.prompt_file, args.out)
