"""Generation and ELBO of the demo model, tokens/s beside the peers' way (the sampling suite's worker).

Steps (``bench/sampling/run.py`` runs ``speed``; ``bench/sampling/generate_demo.sh`` all of them; every result JSON holds the command that made it):

- ``prompts``: prompts from the shared corpus (the first documents of ``.data/demo-valid``, their
  first ``--tokens`` ids, as ``{"prompt_ids": [...], "text": ...}`` lines for ``dlmspec generate``).
- ``speed``: tokens/s of masked-diffusion generation at batch 1 and 32, low-confidence and
  threshold decoding, (a) ``dlmspec.backends.generate.sampler.generate`` on the megatron-core model
  ``load_model`` builds, beside (b) the loop of LLaDA's ``generate.py`` / Fast-dLLM's
  ``get_transfer_index`` (a Hugging Face forward per step over the whole canvas, Gumbel noise and
  softmax over the full vocabulary in float64), run on the checkpoint converted to a Hugging Face
  ``Qwen3ForCausalLM`` (the demo's shape: RMSNorm, SwiGLU, GQA, q/k RMSNorm) whose attention is made
  bidirectional (``is_causal = False`` on its attention modules: the stock class runs a DLM causally;
  both logit differences against megatron-core are recorded), as ``convert mcore-to-hf`` of a DLM
  configures it (``is_causal: false``); the weights are mapped in memory from the loaded model.
- ``speed-ar`` (or ``speed --ar-out``): tokens/s of AR decoding at batch 1 and 32 with megatron-core's
  KV cache against full recompute, on a trained AR checkpoint (``--ar-ckpt``) or, by default, the DLM
  checkpoint's weights run causally (demo-ar's shape: the same decode cost, no training).
- ``summary``: the ELBO of the early and the late checkpoints (``dlmspec eval --json`` outputs) with
  95 % intervals and whether they overlap.
- ``make-tiny`` (``--dry`` only): a tiny run (iter 100/200/300) and dataset on CPU, so the script runs
  end to end without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch


def _write(path: str, data: dict) -> None:
    data = {"command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]), **data}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {path}")


# --------------------------------------------------------------------------- prompts


def prompts(args: argparse.Namespace) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from dlmspec.cli.generate_inputs import find_dataset

    data = IndexedDataset(find_dataset(args.data))
    tokenizer = None
    if args.vocab_file:
        from dlmspec.tokenizers import build_tokenizer

        tokenizer = build_tokenizer("GPT2BPETokenizer", vocab_file=args.vocab_file, merge_file=args.merge_file)
    lines = []
    for i in range(len(data)):
        doc = data[i].tolist()
        if len(doc) < 2 * args.tokens:
            continue
        row = {"prompt_ids": doc[: args.tokens]}
        if tokenizer is not None:
            row["text"] = tokenizer.detokenize(row["prompt_ids"])
        lines.append(row)
        if len(lines) == args.n:
            break
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in lines))
    print(f"wrote {len(lines)} prompts to {args.out}")


# --------------------------------------------------------------------------- the peers' loop


def peer_generate(forward, prompt: torch.Tensor, *, steps: int, gen_length: int, block_length: int, mask_id: int,
                  threshold: float | None = None) -> tuple[torch.Tensor, int]:
    """LLaDA generate.py's loop (greedy, no guidance), with Fast-dLLM's threshold rule when given.

    Structure as in github:ML-GSAI/LLaDA generate.py (read, not copied): the whole canvas through the
    model each step, ``x0 = argmax`` of the logits, confidence ``softmax(logits.float64)`` gathered at
    ``x0``, positions right of the block at ``-inf``, ``topk`` per row of the schedule's count
    (or, with ``threshold``, Fast-dLLM ``get_transfer_index``: every confidence >= threshold, at
    least the top one).

    Returns:
        ``(canvas, forward passes)``.
    """
    b, p = prompt.shape
    x = torch.full((b, p + gen_length), mask_id, dtype=torch.long, device=prompt.device)
    x[:, :p] = prompt
    blocks = gen_length // block_length
    per_block = steps // blocks
    passes = 0
    for nb in range(blocks):
        lo, hi = p + nb * block_length, p + (nb + 1) * block_length
        counts = (x[:, lo:hi] == mask_id).sum(dim=1, keepdim=True)
        base, rem = counts // per_block, counts % per_block
        schedule = base + (torch.arange(per_block, device=x.device).unsqueeze(0) < rem).long()
        i = 0
        while bool((x[:, lo:hi] == mask_id).any()) and (threshold is not None or i < per_block):
            mask_index = x == mask_id
            logits = forward(x)
            passes += 1
            x0 = torch.argmax(logits, dim=-1)
            probs = torch.softmax(logits.to(torch.float64), dim=-1)
            x0_p = torch.gather(probs, -1, x0.unsqueeze(-1)).squeeze(-1)
            x0_p[:, hi:] = -float("inf")
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.full_like(x0_p, -float("inf")))
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(b):
                if threshold is not None:
                    chosen = confidence[j] >= threshold
                    chosen[torch.argmax(confidence[j])] = True
                    transfer[j] = chosen & mask_index[j]
                else:
                    k = int(schedule[j, i])
                    if k:
                        transfer[j, torch.topk(confidence[j], k=k).indices] = True
            x[transfer] = x0[transfer]
            i += 1
    return x, passes


def _hf_from_loaded(model, device: torch.device, dtype: torch.dtype, tmp: Path):
    """The loaded megatron-core model's weights as a Hugging Face Qwen3 checkpoint (through
    backends/convert's state-dict mapping), loaded with transformers."""
    from megatron.core.utils import unwrap_model
    from transformers import AutoModelForCausalLM

    from dlmspec.backends.convert import hf_io
    from dlmspec.backends.convert.dims import ModelDims
    from dlmspec.backends.convert.hf_config import hf_config_from_dims
    from dlmspec.backends.convert.state_dict import mcore_to_hf_state_dict

    r = model.record
    dims = ModelDims(
        family="qwen3", num_layers=r["model.num_layers"], hidden_size=r["model.hidden_size"],
        ffn_hidden_size=r["model.ffn_hidden_size"], num_attention_heads=r["model.num_attention_heads"],
        num_query_groups=r["model.num_query_groups"], kv_channels=r["model.kv_channels"],
        vocab_size=r["model.padded_vocab_size"], padded_vocab_size=r["model.padded_vocab_size"],  # keeps the mask id
        tied=not r["model.untie_embeddings_and_output_weights"], qk_layernorm=bool(r["model.qk_layernorm"]),
        max_position_embeddings=r["model.max_position_embeddings"], rotary_base=r["model.rotary_base"],
        norm_epsilon=r["model.layernorm_epsilon"])
    state = {k: v.detach().float().cpu() for k, v in unwrap_model(model.model).state_dict().items()
             if not k.endswith("_extra_state")}
    hf_io.write_hf_checkpoint(str(tmp), mcore_to_hf_state_dict(state, dims), hf_config_from_dims(dims, None))
    hf = AutoModelForCausalLM.from_pretrained(str(tmp), dtype=dtype, attn_implementation="sdpa").to(device).eval()
    return hf


def _set_causal(hf, causal: bool) -> None:
    for module in hf.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = causal


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def speed(args: argparse.Namespace) -> None:
    import tempfile

    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.load import load_model
    from dlmspec.backends.generate.sampler import generate

    model = load_model(args.ckpt, device=args.device)
    dev = model.device
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    base = [r["prompt_ids"] for r in rows]
    results, checks = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        hf = _hf_from_loaded(model, dev, dtype, Path(tmp) / "hf")
        vocab = model.vocab_size

        @torch.no_grad()
        def hf_forward(x: torch.Tensor) -> torch.Tensor:
            return hf(input_ids=x).logits[..., :vocab]

        probe = torch.tensor([base[0]], device=dev)
        ours = model.logits_fn(probe)
        _set_causal(hf, True)
        checks["stock_causal_max_abs_logit_diff"] = float((hf_forward(probe).float() - ours).abs().max())
        _set_causal(hf, False)
        checks["bidirectional_max_abs_logit_diff"] = float((hf_forward(probe).float() - ours).abs().max())
        for batch in args.batches:
            prompts_b = torch.tensor([base[i % len(base)] for i in range(batch)], device=dev)
            for rule in args.remasking:
                config = GenerateConfig(gen_length=args.gen_length, steps=args.steps, block_length=args.block_length,
                                        remasking=rule, threshold=0.9, factor=args.factor, cache=args.cache,
                                        mask_token_id=model.mask_token_id)
                runs = {
                    "dlmspec (megatron-core GPTModel, backends/generate/sampler.py)":
                        lambda: generate(model.logits_fn, prompts_b, config, device=dev),
                    "peers' loop (LLaDA generate.py / Fast-dLLM, HF forward per step)":
                        lambda: peer_generate(hf_forward, prompts_b, steps=args.steps, gen_length=args.gen_length,
                                              block_length=args.block_length, mask_id=model.mask_token_id,
                                              threshold=0.9 if rule == "threshold" else None),
                }
                if rule == "factor":  # the peers' loop here has no factor rule: dlmspec alone
                    runs = dict(list(runs.items())[:1])
                for name, fn in runs.items():
                    fn()  # warm-up (kernels, allocator)
                    _sync(dev)
                    start = time.perf_counter()
                    out = fn()
                    _sync(dev)
                    seconds = time.perf_counter() - start
                    passes = out.forward_passes if hasattr(out, "forward_passes") else out[1]
                    results.append({"implementation": name, "batch": batch, "remasking": rule,
                                    "cache": getattr(out, "cache", "none"), "seconds": seconds,
                                    "forward_passes": passes, "tokens": batch * args.gen_length,
                                    "tokens_per_second": batch * args.gen_length / seconds})
                    print(f"{name[:30]:30s} batch {batch:3d} {rule:15s} {batch * args.gen_length / seconds:10.1f} tok/s "
                          f"({passes} passes)")
    model.close()
    if args.ar_out:  # the AR decode speed in this process (one start of torch + megatron-core fewer)
        speed_ar(args)
    _write(args.out, {"checkpoint": args.ckpt, "device": str(dev), "dtype": str(dtype),
                      "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
                      "settings": {"gen_length": args.gen_length, "steps": args.steps, "block_length": args.block_length,
                                   "threshold": 0.9, "temperature": 0.0, "prompt_tokens": len(base[0])},
                      "tokens_counted": "batch x gen_length (EOS not cut)", "logit_checks": checks, "results": results,
                      "note": "the peers' side is transformers' Qwen3ForCausalLM (weights mapped by backends/convert) "
                              "with is_causal = False on its attention modules (as convert mcore-to-hf of a DLM writes)"})


# --------------------------------------------------------------------------- AR decoding: KV cache on / off


def causal_alias(ckpt: str, out: Path) -> Path:
    """A checkpoint folder that loads ``ckpt``'s weights as an AR (causal) model: every file of
    ``ckpt`` linked, ``dlmspec.json``'s spec record rewritten to ``objective.kind = "ar"``,
    ``attention_mask = "causal"``, no mask token. specs/demo-ar.toml is demo-dlm.toml with
    ``kind = "ar"``, so this is a demo-ar-shaped model at no training cost: the same decode cost as
    a trained demo-ar checkpoint (tokens/s does not depend on the weights), not its text."""
    from dlmspec.backends.generate.load import find_checkpoint

    _, folder = find_checkpoint(ckpt)
    out.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(folder):
        if name != "dlmspec.json":
            os.symlink(os.path.join(folder, name), out / name)
    meta = json.loads(Path(folder, "dlmspec.json").read_text())
    meta["spec"]["record"].update({"objective.kind": "ar", "objective.attention_mask": "causal",
                                   "objective.mask_token_id": None, "objective.block_size": None})
    (out / "dlmspec.json").write_text(json.dumps(meta))
    return out


def speed_ar(args: argparse.Namespace) -> None:
    """tokens/s of AR decoding, megatron-core's KV cache (``LoadedModel.ar_step_fn``) against full
    recompute, at each batch of ``--batches``: greedy, no EOS (every row decodes ``--gen-length``
    tokens), the prompts of ``--prompts`` (cycled to the batch); whether both give the same tokens."""
    import tempfile

    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.load import load_model
    from dlmspec.backends.generate.sampler import generate_ar

    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    base = [r["prompt_ids"] for r in rows]
    with tempfile.TemporaryDirectory() as tmp:
        source = "a trained AR checkpoint" if args.ar_ckpt else (
            f"{args.ckpt}'s weights run causally (causal_alias: demo-ar's shape, not a trained AR model)")
        path = args.ar_ckpt or str(causal_alias(args.ckpt, Path(tmp) / "ar"))
        model = load_model(path, device=args.device)
        dev = model.device
        results, same = [], {}
        for batch in args.batches:
            prompts_b = torch.tensor([base[i % len(base)] for i in range(batch)], device=dev)
            outputs = {}
            for cache in (True, False):
                def run(n: int):
                    config = GenerateConfig(kind="ar", gen_length=n, eos_token_id=None, pad_token_id=0)
                    step = model.ar_step_fn(max_new_tokens=n) if cache else None
                    return generate_ar(model.logits_fn, prompts_b, config, step_fn=step, device=dev)

                run(8)  # warm-up (kernels, allocator)
                _sync(dev)
                start = time.perf_counter()
                out = run(args.gen_length)
                _sync(dev)
                seconds = time.perf_counter() - start
                outputs[cache] = out.sequences
                tokens = batch * args.gen_length
                results.append({"kv_cache": cache, "batch": batch, "seconds": seconds, "forward_passes": out.forward_passes,
                                "tokens": tokens, "tokens_per_second": tokens / seconds})
                print(f"AR {'KV cache' if cache else 'full recompute':15s} batch {batch:3d} {tokens / seconds:10.1f} tok/s")
            same[str(batch)] = float((outputs[True] == outputs[False]).float().mean())
        fallback = model.kv_cache_fallback
        model.close()
    speedup = {str(b): next(r["tokens_per_second"] for r in results if r["batch"] == b and r["kv_cache"])
               / next(r["tokens_per_second"] for r in results if r["batch"] == b and not r["kv_cache"])
               for b in args.batches}
    _write(args.ar_out, {"checkpoint": args.ar_ckpt or args.ckpt, "model": source, "device": str(dev),
                         "dtype": "fp32" if dev.type == "cpu" else "the run's precision.dtype",
                         "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
                         "settings": {"gen_length": args.gen_length, "temperature": 0.0, "eos": None,
                                      "prompt_tokens": len(base[0])},
                         "kv_cache_fallback": fallback, "results": results, "speedup_kv_cache": speedup,
                         "same_tokens_fraction": same,
                         "note": "KV cache: megatron-core StaticInferenceContext through GPTModel.forward("
                                 "inference_context=...) (backends/generate/models.py GPTKVCacheStep); full recompute: "
                                 "the whole sequence per token. Greedy tokens agree exactly in fp32 (tests); in bf16 "
                                 "the two orders of summation may flip a near-tie (same_tokens_fraction)."})


# --------------------------------------------------------------------------- summary


def summary(args: argparse.Namespace) -> None:
    out = {}
    for name in args.evals:
        env = json.loads(Path(name).read_text())
        r = env["result"]
        e = r["elbo"]["count"]
        lo, hi = e["nll_per_token"] - 1.96 * e["stderr_per_token"], e["nll_per_token"] + 1.96 * e["stderr_per_token"]
        out[r["model"]["iteration"]] = {"file": name, "nll_per_token": e["nll_per_token"],
                                        "stderr_per_token": e["stderr_per_token"], "interval_95": [lo, hi],
                                        "time_estimator": r["elbo"].get("time")}
    its = sorted(out)
    early, late = out[its[0]], out[its[-1]]
    _write(args.out, {"elbo_by_iteration": out, "early": its[0], "late": its[-1],
                      "improves": late["nll_per_token"] < early["nll_per_token"],
                      "intervals_overlap": late["interval_95"][1] >= early["interval_95"][0],
                      "estimator": "count (LLaDA Eq. 6), 95 % = 1.96 standard errors"})


# --------------------------------------------------------------------------- the dry run's inputs


def make_tiny(args: argparse.Namespace) -> None:
    """A tiny run with checkpoints 100/200/300 and a dataset, on CPU (the tests' builders)."""
    root = Path(__file__).resolve().parents[2]
    sys.path[:0] = [str(root / "tests" / "kits")]
    import pytest
    from cpu_world_kit import megatron_cpu_world
    from tiny_ckpt import TEXTS, write_dataset, write_runtime_checkpoint

    out = Path(args.out)

    class _Tmp:
        def mktemp(self, name: str) -> Path:
            path = out / name
            path.mkdir(parents=True, exist_ok=True)
            return path

    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(_Tmp(), mp):
        for it in (100, 200, 300):
            write_runtime_checkpoint(out / "run", "mdm", iteration=it, seed=0, perturb=0.01 * it / 100)
        (out / "data").mkdir(exist_ok=True)
        write_dataset(out / "data" / "valid_text_document", TEXTS * 4)
    print(f"wrote {out}/run and {out}/data")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prompts")
    p.add_argument("--data", required=True)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--vocab-file")
    p.add_argument("--merge-file")
    p.add_argument("--out", required=True)
    s = sub.add_parser("speed")
    s.add_argument("--ckpt", required=True)
    s.add_argument("--prompts", required=True)
    s.add_argument("--device", default="auto")
    s.add_argument("--gen-length", type=int, default=128)
    s.add_argument("--steps", type=int, default=128)
    s.add_argument("--block-length", type=int, default=32)
    s.add_argument("--batches", type=lambda v: [int(x) for x in v.split(",")], default=[1, 32])
    s.add_argument("--cache", choices=["none", "prefix", "dual"], default="none",
                   help="[generate] cache of dlmspec's runs (Fast-dLLM's block KV caches)")
    s.add_argument("--remasking", type=lambda v: v.split(","), default=["low_confidence", "threshold"],
                   help="comma-separated rules: low_confidence, threshold, factor (factor: dlmspec only)")
    s.add_argument("--factor", type=float, default=1.0, help="f of remasking factor (Fast-dLLM)")
    s.add_argument("--out", required=True)
    s.add_argument("--ar-out", help="also time AR decoding, KV cache on / off (speed_ar), into this JSON")
    s.add_argument("--ar-ckpt", help="a trained AR checkpoint for --ar-out (default: --ckpt run causally)")
    a = sub.add_parser("speed-ar")
    a.add_argument("--ckpt", required=True)
    a.add_argument("--ar-ckpt")
    a.add_argument("--prompts", required=True)
    a.add_argument("--device", default="auto")
    a.add_argument("--gen-length", type=int, default=128)
    a.add_argument("--batches", type=lambda v: [int(x) for x in v.split(",")], default=[1, 32])
    a.add_argument("--ar-out", required=True)
    m = sub.add_parser("summary")
    m.add_argument("evals", nargs="+")
    m.add_argument("--out", required=True)
    t = sub.add_parser("make-tiny")
    t.add_argument("--out", required=True)
    args = parser.parse_args()
    {"prompts": prompts, "speed": speed, "speed-ar": speed_ar, "summary": summary, "make-tiny": make_tiny}[args.step](args)


if __name__ == "__main__":
    main()
