"""The inputs of ``bench/gpu/sft_demo.sh``, made here on the CPU machine from the offline data kit
(``../shared/data``; the GPU machine does not see it): carry ``.data/`` and ``.device/sft-demo/`` along.

1. The demo's pre-training data and GPT-2 tokenizer (``bench/gpu/prepare.py demo_inputs``).
2. A conversation set from the Python-docs corpus: each prose paragraph of two or more sentences
   is a prompt (``"<paragraph>\\n\\nFirst sentence:"``), its first sentence the response
   (``" <sentence>"``), rendered with the ``plain`` template and written in the SFT data
   contract (one document per conversation ending with GPT-2's EOD, ``PREFIX_response`` of 0/1
   flags, the dataset record's ``"sft"`` section): ``.data/demo-sft-train_text_document`` from
   the training documents, ``.data/demo-sft-heldout_text_document`` from the validation
   documents and every 20th training document (none of them in the training set). Existing
   datasets are kept. (``dlmspec data prepare --sft`` writes the same contract from JSONL; this
   script builds its conversations itself so the demo has no dependence on its flags.)
3. ``specs/demo-dlm.toml`` and ``specs/demo-dlm-sft.toml`` compiled into ``.device/sft-demo/base``
   and ``.device/sft-demo/sft`` with run and checkpoint folders under ``runs/bench-sft-demo/``
   (the SFT run starts from the base run's checkpoints).

Usage: ``python bench/gpu/sft_prepare.py [--max-conversations N]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare import ROOT, SHARED, compile_spec, demo_inputs  # noqa: E402

from dlmspec.data.record import write_record  # noqa: E402

GPT2_EOD = 50256
TRAIN, HELDOUT = ".data/demo-sft-train_text_document", ".data/demo-sft-heldout_text_document"
#: The plain template these conversations are rendered with (recorded by its SHA-256).
TEMPLATE = "{{ prompt }}\n\nFirst sentence:{{ ' ' + response }}<|endoftext|>"
#: The longest conversation kept (the demo's train.seq_length).
MAX_TOKENS = 512
RUNS = "runs/bench-sft-demo"
_SENTENCE = re.compile(r"^([A-Z][^\n]{20,300}?[.!?])\s+\S")


def pairs(texts: list[str]) -> list[tuple[str, str]]:
    """``(prompt, response)`` of each prose paragraph (starts with a capital letter, no code,
    300-1500 characters, more than one sentence)."""
    out = []
    for text in texts:
        for para in text.split("\n\n"):
            para = " ".join(para.split())
            if not 300 <= len(para) <= 1500 or ">>>" in para or "::" in para:
                continue
            m = _SENTENCE.match(para)
            if m:
                out.append((para + "\n\nFirst sentence:", " " + m.group(1)))
    return out


def write_conversations(prefix: str, conversations: list[tuple[str, str]], tokenizer) -> dict:
    """Write ``conversations`` in the SFT data contract at ``prefix``; returns the counts."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    tokens = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    resp = IndexedDatasetBuilder(prefix + "_response.bin", dtype=np.uint8)
    written = over_long = n_prompt = n_resp = 0
    for prompt, response in conversations:
        p, r = tokenizer.encode(prompt).ids, tokenizer.encode(response).ids + [GPT2_EOD]
        if len(p) + len(r) > MAX_TOKENS:
            over_long += 1
            continue
        tokens.add_item(torch.tensor(p + r, dtype=torch.int64))
        tokens.end_document()
        resp.add_item(torch.tensor([0] * len(p) + [1] * len(r), dtype=torch.int64))
        resp.end_document()
        written, n_prompt, n_resp = written + 1, n_prompt + len(p), n_resp + len(r)
    tokens.finalize(prefix + ".idx")
    resp.finalize(prefix + "_response.idx")
    sft = {"format": "prompt_response", "chat_template": "plain",
           "chat_template_sha256": hashlib.sha256(TEMPLATE.encode()).hexdigest(),
           "response_prefix": Path(prefix).name + "_response", "special_tokens": {},
           "special_tokens_in_vocab": {"<|endoftext|>": GPT2_EOD}, "eod_id": GPT2_EOD, "max_length": MAX_TOKENS,
           "rows": {"read": len(conversations), "written": written, "skipped": over_long},
           "bad_rows": {"over_long": over_long}, "response_tokens": n_resp, "prompt_tokens": n_prompt}
    write_record(prefix, tokenizer={"type": "GPT2BPETokenizer", "vocab_size": 50257, "eod_id": GPT2_EOD, "files": {}},
                 documents=written, tokens=n_prompt + n_resp, sft=sft)
    return {"prefix": prefix, "conversations": written, "over_long_skipped": over_long,
            "prompt_tokens": n_prompt, "response_tokens": n_resp}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-conversations", type=int, default=None, help="cap each split (a quick CPU check)")
    args = parser.parse_args()
    for line in demo_inputs():
        print(line)
    from tokenizers import ByteLevelBPETokenizer

    kit = SHARED / "tokenizers" / "gpt2"
    tokenizer = ByteLevelBPETokenizer(str(kit / "vocab.json"), str(kit / "merges.txt"))
    corpus = SHARED / "corpus"
    train_docs = [json.loads(line)["text"] for line in (corpus / "pydocs-train.jsonl").open(encoding="utf-8")]
    valid_docs = [json.loads(line)["text"] for line in (corpus / "pydocs-valid.jsonl").open(encoding="utf-8")]
    train = pairs([d for i, d in enumerate(train_docs) if i % 20])
    heldout = pairs(valid_docs + [d for i, d in enumerate(train_docs) if i % 20 == 0])
    if args.max_conversations:
        train, heldout = train[: args.max_conversations], heldout[: args.max_conversations]
    for prefix, convs in ((TRAIN, train), (HELDOUT, heldout)):
        if all((ROOT / (prefix + ext)).is_file() for ext in (".bin", ".idx", "_response.bin", "_response.idx")):
            print(f"kept {prefix}")
            continue
        (ROOT / prefix).parent.mkdir(parents=True, exist_ok=True)
        print(json.dumps(write_conversations(str(ROOT / prefix), convs, tokenizer)))
    out = ROOT / ".device" / "sft-demo"
    compile_spec("specs/demo-dlm.toml", out / "base", [
        f'logging.run_dir="{RUNS}/base"', f'logging.tensorboard_dir="{RUNS}/base/tensorboard"',
        f'checkpoint.save="{RUNS}/base/checkpoints"'])
    compile_spec("specs/demo-dlm-sft.toml", out / "sft", [
        f'logging.run_dir="{RUNS}/sft"', f'logging.tensorboard_dir="{RUNS}/sft/tensorboard"',
        f'checkpoint.save="{RUNS}/sft/checkpoints"', f'checkpoint.init_from="mcore:{RUNS}/base/checkpoints"'])
    print(f"compiled -> {out.relative_to(ROOT)}/base, {out.relative_to(ROOT)}/sft")


if __name__ == "__main__":
    main()
