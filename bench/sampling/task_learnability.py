"""Can the task pipeline learn? A CPU check of ``dlmspec task make`` data, the runtime's objectives,
the sampler and the checker, with a small pure-torch transformer in place of megatron-core's.

What is the pipeline's own (nothing re-implemented):

- the task rows: :func:`dlmspec.tasks.make.task_files` (the files ``dlmspec task make`` writes);
- the token stream: ``dlmspec data prepare --append-eod`` of ``pretrain-train.jsonl`` (GPT-2's
  BPE), read back as megatron-core ``GPTDataset`` samples through
  :func:`dlmspec.backends.megatron.data.build_datasets` (documents packed into ``seq_length``
  windows, the loss mask megatron gives);
- the objective: :class:`~dlmspec.backends.megatron.objectives.mdm.MaskedDiffusionObjective` /
  :class:`~dlmspec.backends.megatron.objectives.ar.AutoregressiveObjective` ``prepare_batch``
  and :func:`~dlmspec.backends.megatron.objectives.base.reduce_loss` (loss sum over ``num_tokens``);
- the scoring: :func:`dlmspec.backends.megatron.generation_eval.score_prompts` (the sampler
  :func:`~dlmspec.backends.generate.sampler.generate` / ``generate_ar`` with the task specs'
  ``[generate]`` settings, the GPT-2 detokenizer, :func:`dlmspec.tasks.check.exact_match`) on the
  held-out ``test.jsonl``.

What differs from a GPU run: the model (:class:`SmallLM`, a pre-norm transformer with RoPE,
bidirectional for MDM, causal for AR) and the vocabulary: GPT-2 ids are renumbered onto the ids
the task uses (a bijection, :class:`CompactVocab`; the ``[MASK]`` id after them), so the output
layer is a few dozen columns, not 50,257. Renumbering changes no sequence the model sees.

Modes (``--mode``):

- ``mdm``: masked diffusion on the packed task text (``specs/task-addition-dlm.toml``'s
  pre-training: every token, operands included, masked at rate ``t``);
- ``mdm-answer``: the same windows, but megatron's loss mask restricted to the answer tokens and
  their EOD (what ``dlmspec data prepare --sft`` gives SFT): the prompt is never masked and carries
  no loss, as in LLaDA's SFT (Nie et al. 2025, sec. 2.3);
- ``mdm-sft``: masked diffusion on one example a row as LLaDA's SFT lays it out (Nie et al. 2025,
  sec. 2.3; ``dlmspec data prepare --sft`` with ``packed_sequence = false``): the prompt, the
  answer, then EOD up to the prompt plus ``--canvas`` positions (8), the prompt never masked,
  the answer and every EOD after it masked and scored. With the default the rows are the canvas the
  sampler fills (the prompt, then 8 positions), so training and sampling see the same layout;
  ``--canvas 8,32@801`` switches to 32 positions at step 801, and ``--eval-gen-lengths 8,32`` scores
  each evaluation on both canvases (what a model tuned on one canvas does on another); no
  ``GPTDataset`` (``sft-train.jsonl`` is tokenised here);
- ``ar``: next-token prediction on the packed task text (``specs/task-addition-ar.toml``).

Output: one JSON object (``--json``) with the loss curve, held-out accuracy and its Wilson 95 %
interval at each evaluation, and the settings. Usage::

    python bench/sampling/task_learnability.py --mode mdm-answer --digits 2 --steps 400 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import Tensor, nn

MODES = ("mdm", "mdm-answer", "mdm-sft", "ar")


class CompactVocab:
    """GPT-2 ids <-> ``0 .. n-1`` for the ``n`` ids a task uses; ``mask_id = n`` (the ``[MASK]``
    slot after them, as the demo's ``[MASK]`` takes the first padded slot)."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.full = sorted(set(int(i) for i in ids))
        self.index = {f: c for c, f in enumerate(self.full)}
        self.mask_id = len(self.full)
        self.size = len(self.full) + 1
        self._lut = torch.full((max(self.full) + 1,), -1, dtype=torch.int64)
        self._lut[torch.tensor(self.full)] = torch.arange(len(self.full))

    def to_compact(self, ids: Tensor) -> Tensor:
        out = self._lut[ids]
        if bool((out < 0).any()):
            raise ValueError("a token id outside the task's vocabulary")
        return out

    def to_full(self, ids: Sequence[int]) -> List[int]:
        return [self.full[i] for i in ids if 0 <= i < len(self.full)]


def rope(x: Tensor, positions: Tensor) -> Tensor:
    """Rotary embedding (Su et al. 2021, arXiv:2104.09864, eq. 34, the half-split layout
    megatron-core uses): ``x [b, h, s, d]``, ``positions [b, s]``."""
    d = x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = positions.to(torch.float32)[:, None, :, None] * inv  # [b, 1, s, d/2]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.up, self.gate, self.down = (nn.Linear(dim, 4 * dim, bias=False), nn.Linear(dim, 4 * dim, bias=False),
                                         nn.Linear(4 * dim, dim, bias=False))

    def forward(self, h: Tensor, positions: Tensor, mask: Optional[Tensor]) -> Tensor:
        b, s, dim = h.shape
        q, k, v = self.qkv(self.n1(h)).view(b, s, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        q, k = rope(q, positions), rope(k, positions)
        a = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = h + self.proj(a.transpose(1, 2).reshape(b, s, dim))
        x = self.n2(h)
        return h + self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class SmallLM(nn.Module):
    """A pre-norm RoPE transformer (RMSNorm, SwiGLU: the demo model's layer kinds), ``causal`` or
    bidirectional; ``forward(tokens [b, s], attention_mask [b, s] bool or None) -> logits [b, s, V]``
    with the sampler's position rule (``attention_mask.cumsum - 1``, as ``gpt_logits_fn``)."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm, self.out = nn.RMSNorm(dim), nn.Linear(dim, vocab, bias=False)
        self.causal = causal

    def forward(self, tokens: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        b, s = tokens.shape
        if attention_mask is None:
            positions = torch.arange(s).unsqueeze(0).expand(b, s)
            allowed = torch.ones(b, 1, s, s, dtype=torch.bool)
        else:
            positions = (attention_mask.to(torch.int64).cumsum(-1) - 1).clamp(min=0)
            allowed = attention_mask.bool().view(b, 1, 1, s).expand(b, 1, s, s)
        if self.causal:
            allowed = allowed & torch.ones(s, s, dtype=torch.bool).tril()
        # a fully hidden row (a causal pad query) attends to itself only: no NaN
        allowed = allowed | torch.eye(s, dtype=torch.bool)
        h = self.emb(tokens)
        for block in self.blocks:
            h = block(h, positions, allowed)
        return self.out(self.norm(h))


def answer_mask(tokens: Tensor, equals_id: int, eod_id: int) -> Tensor:
    """``[b, s]`` float: 1 at the answer tokens of each packed document (after its ``" ="`` up to
    and including its EOD), 0 elsewhere; a window's leading answer tail (its ``" ="`` cut off
    before the window) counts too (``dlmspec data prepare --sft``'s response mask is the same set
    of positions: the response and its EOD)."""
    out = torch.zeros(tokens.shape, dtype=torch.float32)
    for r in range(tokens.shape[0]):
        row = tokens[r].tolist()
        inside = False
        if equals_id not in row[: (row.index(eod_id) if eod_id in row else len(row))]:
            inside = eod_id in row  # the window starts inside an answer
        for i, tok in enumerate(row):
            if inside:
                out[r, i] = 1.0
            if tok == equals_id:
                inside = True
            elif tok == eod_id:
                inside = False
    return out


def wilson(correct: int, n: int, z: float = 1.959964) -> List[float]:
    """Wilson's score interval (Wilson 1927) of ``correct / n``."""
    if n == 0:
        return [0.0, 1.0]
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def prepare(work: str, args: argparse.Namespace) -> Dict[str, Any]:
    """Write the task files and prepare the pre-training token stream in a folder of ``work``
    named by the task settings (kept: a second run with the same settings reuses it)."""
    from dlmspec.files import write_atomic
    from dlmspec.tasks.make import TASKS, resolve_options, task_files

    work = os.path.join(work, f"{args.task}-d{args.digits}-train{args.train}-test{args.test}-seed{args.seed}")
    task = TASKS[args.task]
    options = resolve_options(task, {"digits": args.digits})
    files = task_files(task, options, args.seed, {"train": args.train, "validation": 100, "test": args.test})
    os.makedirs(os.path.join(work, "task"), exist_ok=True)
    for name, data in files.items():
        write_atomic(os.path.join(work, "task", name), data)
    prefix = os.path.join(work, "data", "train")
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    cmd = [sys.executable, "-m", "dlmspec.cli", "data", "prepare", "--input", os.path.join(work, "task", "pretrain-train.jsonl"),
           "--output-prefix", prefix, "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", args.vocab_file,
           "--merge-file", args.merge_file, "--append-eod", "--workers", "1"]
    if not os.path.exists(prefix + "_text_document.idx"):
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return {"prefix": prefix + "_text_document", "test": os.path.join(work, "task", "test.jsonl")}


def run(args: argparse.Namespace) -> Dict[str, Any]:
    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.megatron.data import DataConfig, build_datasets
    from dlmspec.backends.megatron.generation_eval import score_prompts
    from dlmspec.backends.megatron.objectives.ar import AutoregressiveObjective
    from dlmspec.backends.megatron.objectives.base import ObjectiveRng, reduce_loss
    from dlmspec.backends.megatron.objectives.mdm import MaskedDiffusionObjective
    from dlmspec.tasks.rows import read_task_rows
    from dlmspec.tokenizers import build_tokenizer

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    if not torch.distributed.is_initialized():  # megatron-core's dataset builder asks for the rank
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    work = args.work or tempfile.mkdtemp(prefix="task-learnability-")
    paths = prepare(work, args)
    tok = build_tokenizer("GPT2BPETokenizer", vocab_file=args.vocab_file, merge_file=args.merge_file)
    eod = int(tok.eod)
    equals = tok.tokenize(" =")
    assert len(equals) == 1, equals
    ar = args.mode == "ar"
    data = DataConfig(seq_length=args.seq_length, vocab_size=tok.vocab_size, eod_id=eod, blend=[(paths["prefix"], 1.0)],
                      cache_dir=os.path.join(os.path.dirname(paths["prefix"]), "cache"))
    train_ds, _ = build_datasets(data, seed=args.seed, train_samples=args.steps * args.batch, valid_samples=0,
                                 add_extra_token_to_sequence=ar)
    # the task's vocabulary: every id of the stream plus the digits and signs (held-out prompts may use more)
    ids = {eod, equals[0], *tok.tokenize(" +")} | {t for d in range(10) for t in tok.tokenize(f" {d}")}
    for i in range(min(len(train_ds), 2000)):
        ids.update(int(t) for t in train_ds[i]["tokens"].tolist())
    sft_rows = None
    if args.mode == "mdm-sft":
        sft_rows = []
        for line in open(os.path.join(os.path.dirname(paths["test"]), "sft-train.jsonl"), encoding="utf-8"):
            row = json.loads(line)
            prompt, answer = tok.tokenize(row["prompt"]), tok.tokenize(row["response"]) + [eod]
            sft_rows.append((prompt, answer))
        prompt_width = max(len(p) for p, _ in sft_rows)
    vocab = CompactVocab(sorted(ids))
    model = SmallLM(vocab.size, args.dim, args.layers, args.heads, causal=ar)
    objective = AutoregressiveObjective() if ar else MaskedDiffusionObjective(vocab.mask_id, eps=1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = max(1, args.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, max(0, s - warm) / max(1, args.steps - warm))))))
    rows = read_task_rows(paths["test"], max_rows=args.test)
    configs = {n: GenerateConfig(kind="ar" if ar else "mdm", mask_token_id=None if ar else vocab.mask_id,
                                 eos_token_id=vocab.index[eod], pad_token_id=vocab.index[eod], gen_length=n, steps=n,
                                 block_length=8, remasking="low_confidence", temperature=0.0)
               for n in args.eval_gen_lengths}
    config = configs[args.eval_gen_lengths[0]]

    def encode(text: str) -> List[int]:
        return vocab.to_compact(torch.tensor(tok.tokenize(text))).tolist()

    def decode(ids: List[int]) -> str:
        return tok.detokenize(vocab.to_full(ids))

    def encode_after_eod(text: str) -> List[int]:
        return [vocab.index[eod]] + encode(text)

    def evaluate() -> Dict[str, Any]:
        model.eval()
        with torch.no_grad():
            out = score_prompts(model, rows, encode=encode, decode=decode, config=config, batch_size=250,
                                device="cpu")
            # the prompt after an EOD, as every document but a window's first follows one in the packed stream
            eod_out = score_prompts(model, rows, encode=encode_after_eod, decode=decode, config=config,
                                    batch_size=250, device="cpu")
            longer = {}
            for n, cfg in list(configs.items())[1:]:
                o = score_prompts(model, rows, encode=encode, decode=decode, config=cfg, batch_size=250, device="cpu")
                longer[str(n)] = {"correct": o["correct"], "accuracy": o["correct"] / o["count"],
                                  "wilson95": wilson(o["correct"], o["count"]),
                                  "examples": [c["completion"] for c in o["completions"][:3]]}
        model.train()
        return {"correct": out["correct"], "count": out["count"], "accuracy": out["correct"] / out["count"],
                "wilson95": wilson(out["correct"], out["count"]), "gen_length": config.gen_length,
                "at_gen_length": longer,
                "examples": [c["completion"] for c in out["completions"][:3]],
                "after_eod": {"correct": eod_out["correct"], "accuracy": eod_out["correct"] / eod_out["count"],
                              "wilson95": wilson(eod_out["correct"], eod_out["count"]),
                              "examples": [c["completion"] for c in eod_out["completions"][:3]]}}

    order = torch.Generator().manual_seed(args.seed)
    masking = torch.Generator().manual_seed(args.seed + 1)
    curve, evals, start = [], [], time.perf_counter()
    for step in range(1, args.steps + 1):
        if sft_rows is not None:  # one example a row: prompt, answer, EOD to the canvas width; right-padded
            canvas = canvas_at(args.canvas, step)
            width = prompt_width + canvas
            picks = torch.randint(len(sft_rows), (args.batch,), generator=order).tolist()
            tokens = torch.full((args.batch, width), eod, dtype=torch.int64)
            loss_mask = torch.zeros(args.batch, width)
            for r, i in enumerate(picks):
                prompt, answer = sft_rows[i]
                tokens[r, :len(prompt) + len(answer)] = torch.tensor(prompt + answer)
                loss_mask[r, len(prompt):len(prompt) + canvas] = 1.0  # the answer and the EODs of the canvas
            samples = None
        else:
            picks = torch.randint(len(train_ds), (args.batch,), generator=order).tolist()
            samples = [train_ds[i] for i in picks]
            tokens = torch.stack([s["tokens"] for s in samples])
            loss_mask = torch.stack([s["loss_mask"] for s in samples])
        batch = {"tokens": vocab.to_compact(tokens), "loss_mask": loss_mask}
        if ar:
            batch["labels"] = vocab.to_compact(torch.stack([s["labels"] for s in samples]))
        if args.mode == "mdm-answer":
            batch["loss_mask"] = loss_mask * answer_mask(tokens, equals[0], eod)
        ob = objective.prepare_batch(batch, ObjectiveRng(masking=masking))
        logits = model(ob.input_ids)
        ce = nn.functional.cross_entropy(logits.flatten(0, 1), ob.labels.flatten(), reduction="none").view(ob.labels.shape)
        loss_sum, num_tokens, _ = reduce_loss(ce, ob)
        loss = loss_sum / num_tokens.clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 10 == 0:
            curve.append([step, round(float(loss.detach()), 4)])
        if step % args.eval_every == 0 or step == args.steps:
            record = {"step": step, "seconds": round(time.perf_counter() - start, 1), **evaluate()}
            evals.append(record)
            print(json.dumps({**{k: record[k] for k in ("step", "seconds", "correct", "count", "accuracy")},
                              "after_eod": record["after_eod"]["accuracy"],
                              **{f"gen{n}": v["accuracy"] for n, v in record["at_gen_length"].items()}}), flush=True)
    params = sum(p.numel() for p in model.parameters())
    return {"mode": args.mode, "task": args.task, "digits": args.digits, "train_rows": args.train, "test_rows": len(rows),
            "steps": args.steps, "batch": args.batch, "seq_length": args.seq_length, "lr": args.lr,
            "canvas": [list(x) for x in args.canvas] if args.mode == "mdm-sft" else None,
            "eval_gen_lengths": args.eval_gen_lengths,
            "model": {"dim": args.dim, "layers": args.layers, "heads": args.heads, "parameters": params,
                      "vocabulary": vocab.size},
            "chance": "exact match of a sum of two uniform operands: about 1 / 10**digits by guessing",
            "loss_curve": curve, "evaluations": evals, "final": evals[-1] if evals else None}


def parse_canvas(text: str) -> List[tuple]:
    """``"8"`` or ``"8,32@800"``: the ``mdm-sft`` rows' generated positions (the answer and the EODs
    after it), each from the step after ``@`` (the first from step 1). Returns ``[(from_step, canvas)]``
    sorted by step.

    Raises:
        ValueError: a canvas below 1, a step below 1, or no entry from step 1.
    """
    out = []
    for part in text.split(","):
        size, _, start = part.strip().partition("@")
        entry = (int(start) if start else 1, int(size))
        if entry[0] < 1 or entry[1] < 1:
            raise ValueError(f"--canvas {text!r}: sizes and steps must be >= 1")
        out.append(entry)
    out.sort()
    if out[0][0] != 1:
        raise ValueError(f"--canvas {text!r}: the first size must start at step 1 (no '@')")
    return out


def canvas_at(schedule: Sequence[tuple], step: int) -> int:
    """The canvas of ``step`` under :func:`parse_canvas`'s schedule."""
    return [size for start, size in schedule if start <= step][-1]


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=MODES, default="mdm")
    p.add_argument("--task", choices=("addition", "addition-padded"), default="addition-padded")
    p.add_argument("--digits", type=int, default=2)
    p.add_argument("--train", type=int, default=4000)
    p.add_argument("--test", type=int, default=500)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-length", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--canvas", type=parse_canvas, default=parse_canvas("8"),
                   help="mdm-sft: generated positions a row (answer, then EOD), optionally changing at a step: "
                        "8 (default), or 8,32@800 (8 until step 799, then 32)")
    p.add_argument("--eval-gen-lengths", type=lambda t: [int(x) for x in t.split(",")], default=[8],
                   help="the sampler's gen_length at each evaluation, the first the headline (default 8; "
                        "e.g. 8,32: blocks of 8, one step a token)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", default=None, help="folder for the task and token files (default: a new temp folder)")
    p.add_argument("--vocab-file", default=os.environ.get("GPT2_VOCAB", ".data/gpt2/vocab.json"))
    p.add_argument("--merge-file", default=os.environ.get("GPT2_MERGES", ".data/gpt2/merges.txt"))
    p.add_argument("--json", default=None, help="write the result here")
    args = p.parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=2)
    if args.json:
        from dlmspec.files import write_atomic

        write_atomic(args.json, (text + "\n").encode())
    print(json.dumps(result["final"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
