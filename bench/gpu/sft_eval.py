"""Per-sample response loss of two megatron-core checkpoints on held-out SFT data, with fixed masks.

Builds the model from a compiled SFT ``train.py`` (its ``build_configs()``, ``build_layer()``,
``build_run()``, ``build_sft()``), loads each checkpoint's weights through the runtime
(``resolve_checkpoint_dir`` + ``load_model_weights``), and scores the same held-out samples with
the same masks for both: sample ``k``'s draw ``d`` is masked by
:class:`~dlmspec.backends.megatron.sft.SftForwardStep` from ``(seed, d, batch index)`` on the
validation stream, so the two models see identical inputs. A sample's ``"sft"`` loss is its SFT
loss: the masked response tokens' cross entropy weighted ``1/t`` and divided by the response
length (``"sequence"``; the padding EOS count as response, as in training), averaged over the
``--draws`` draws (AR: the response tokens' mean next-token loss); its ``"answer"`` loss is the
same over the answer and its EOD only (the padding EOS left out). Reported for each: each
model's mean with its 95% confidence interval (1.96 standard errors over samples), and the
paired difference (base - tuned) with its interval.

``--dry`` stops before megatron-core needs CUDA: it builds the samples and the masks and reports
their counts (runs on CPU).

Usage: ``python bench/gpu/sft_eval.py --train-py DIR/train.py --data PREFIX --base CKPT --tuned CKPT
--out FILE.json [--draws 4] [--max-samples 512] [--seed 1234] [--dry]``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from typing import Any, Dict, List

import torch

from dlmspec.backends.megatron.microbatches import MicrobatchItem
from dlmspec.backends.megatron.objective import build_objective
from dlmspec.backends.megatron.rng import VALID_STREAM
from dlmspec.backends.megatron.sft import SftDataset, SftForwardStep


def load_train_py(path: str):
    """The compiled train.py as a module (its builders; ``main()`` is not run)."""
    spec = importlib.util.spec_from_file_location("compiled_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def batches(ds: SftDataset, n: int, batch_size: int) -> List[Dict[str, torch.Tensor]]:
    """The first ``n`` distinct samples of ``ds`` in batches of ``batch_size`` (file order)."""
    out = []
    for start in range(0, n, batch_size):
        rows = [ds.sample(k) for k in range(start, min(n, start + batch_size))]
        out.append({key: torch.stack([r[key] for r in rows]) for key in rows[0]})
    return out


def interval(values: List[float]) -> Dict[str, float]:
    """Mean, standard deviation and the 95% normal interval of the mean."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / max(1, n - 1))
    half = 1.96 * sd / math.sqrt(n)
    return {"mean": mean, "sd": sd, "n": n, "ci95": [mean - half, mean + half]}


def answer_mask(tokens: torch.Tensor, loss_mask: torch.Tensor, eod_id: int) -> torch.Tensor:
    """``[b, s]`` bool: the supervised positions up to and including each row's first EOD (the answer
    and its end, without the padding EOS after it)."""
    is_eod = tokens == eod_id
    before = torch.cumsum(is_eod.to(torch.int64), dim=1) - is_eod.to(torch.int64) == 0
    return (loss_mask > 0) & before


def score(model, step: SftForwardStep, feed: List[Dict[str, torch.Tensor]], draws: int,
          eod_id: int) -> Dict[str, List[float]]:
    """Per-sample losses of ``model``, each the mean over ``draws`` fixed mask draws:
    ``"sft"`` the SFT loss (the weights of ``step``: every supervised position, the padding EOS
    included, divided by their count) and ``"answer"`` the same restricted to :func:`answer_mask`
    (divided by the answer's length)."""
    out: Dict[str, List[float]] = {"sft": [], "answer": []}
    with torch.no_grad():
        for index, batch in enumerate(feed):
            b = batch["tokens"].shape[0]
            total, answer = torch.zeros(b, dtype=torch.float64), torch.zeros(b, dtype=torch.float64)
            for d in range(draws):
                ob, position_ids, mask = step.prepare(MicrobatchItem(VALID_STREAM, d, index, batch))
                ce = model(ob.input_ids, position_ids, mask, labels=ob.labels).float()  # [b, s] cross entropy
                total += (ce * ob.loss_weights).sum(dim=1).double().cpu()
                keep = answer_mask(batch["tokens"], batch["loss_mask"], eod_id).to(ce.device)
                n_all = ob.token_mask.sum(dim=1).clamp(min=1).float()
                n_answer = keep.sum(dim=1).clamp(min=1).float()
                # the step's weights are 1[masked] / (t * n_all): rescaled to the answer's own length
                answer += ((ce * ob.loss_weights * keep).sum(dim=1) * n_all / n_answer).double().cpu()
            out["sft"] += (total / draws).tolist()
            out["answer"] += (answer / draws).tolist()
    return out


def compare(model, roots: Dict[str, str], step: SftForwardStep, feed: List[Dict[str, torch.Tensor]], draws: int,
            eod_id: int) -> Dict[str, Any]:
    """Load each checkpoint of ``roots`` (``{"base": ..., "tuned": ...}``: a root or an ``iter_``
    folder) into ``model`` (its chunks) through the runtime and :func:`score` it on ``feed``.

    Returns:
        Per model ``{"checkpoint", "seconds", "sft": interval, "answer": interval}``; for each
        metric the paired ``base_minus_tuned_<metric>`` interval and whether the intervals are
        apart (``tuned_below_base_non_overlapping_<metric>``); ``per_sample`` the losses.
    """
    from dlmspec.backends.convert.mcore_io import resolve_checkpoint_dir
    from dlmspec.backends.megatron.init_from import load_model_weights

    result: Dict[str, Any] = {}
    losses = {}
    for name, root in roots.items():
        path = str(resolve_checkpoint_dir(root))
        t0 = time.perf_counter()
        load_model_weights(path, model)
        model[0].eval()
        losses[name] = score(model[0], step, feed, draws, eod_id)
        result[name] = {"checkpoint": path, "seconds": time.perf_counter() - t0,
                        **{metric: interval(values) for metric, values in losses[name].items()}}
    for metric in ("sft", "answer"):
        diff = [b - t for b, t in zip(losses["base"][metric], losses["tuned"][metric])]
        result[f"base_minus_tuned_{metric}"] = interval(diff)
        result[f"tuned_below_base_non_overlapping_{metric}"] = (
            result["tuned"][metric]["ci95"][1] < result["base"][metric]["ci95"][0])
    result["per_sample"] = losses
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-py", required=True, help="the compiled SFT train.py")
    parser.add_argument("--data", required=True, help="held-out SFT dataset prefix")
    parser.add_argument("--base", help="checkpoint root (or iter_ folder) of the base model")
    parser.add_argument("--tuned", help="checkpoint root (or iter_ folder) of the fine-tuned model")
    parser.add_argument("--out", required=True, help="the JSON to write")
    parser.add_argument("--draws", type=int, default=4, help="fixed mask draws per sample")
    parser.add_argument("--max-samples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1234, help="the masks' seed (the same for both models)")
    parser.add_argument("--dry", action="store_true", help="samples and masks only, no model (CPU)")
    args = parser.parse_args()
    if not args.dry and not (args.base and args.tuned):
        sys.exit("sft_eval.py: --base and --tuned are needed (or --dry)")

    module = load_train_py(args.train_py)
    run, sft = module.build_run(), module.build_sft()
    transformer_config, model_kwargs, _, _ = module.build_configs()
    o = run.objective
    objective = build_objective(o.kind, mask_token_id=o.mask_token_id, eps=o.eps, loss_weighting=o.loss_weighting,
                                min_masked_tokens=o.min_masked_tokens)
    ds = SftDataset.from_prefixes([args.data], seq_length=run.data.seq_length, eod_id=run.data.eod_id,
                                  autoregressive=(o.kind == "ar"), config=sft, seed=run.seed)
    n = min(args.max_samples, ds.stats.samples)
    feed = batches(ds, n, args.batch_size)
    result: Dict[str, Any] = {
        "benchmark": "SFT response loss on held-out conversations, base vs fine-tuned, fixed masks",
        "command": " ".join(["python"] + sys.argv),
        "data": args.data, "samples": n, "draws": args.draws, "mask_seed": args.seed,
        "objective": o.kind, "loss_normalization": o.loss_normalization, "sft": sft.__dict__,
        "data_stats": ds.stats.__dict__,
    }
    if args.dry:
        device = torch.device("cpu")
        step = SftForwardStep(objective, seed=args.seed, data_parallel_rank=0, eod_id=run.data.eod_id, device=device,
                              loss_normalization="sequence")
        masked = sum(int(step.prepare(MicrobatchItem(VALID_STREAM, d, i, b))[0].masked.sum())
                     for i, b in enumerate(feed) for d in range(args.draws)) if o.kind == "mdm" else 0
        result.update(dry=True, masked_positions=masked)
    else:
        from megatron.core import parallel_state

        from dlmspec.backends.megatron.distributed import initialize_distributed, seed_like_megatron
        from dlmspec.backends.megatron.layers import build_model

        initialize_distributed()
        parallel_state.initialize_model_parallel()
        seed_like_megatron(run.seed)
        device = torch.device("cuda", torch.cuda.current_device())
        model = build_model(transformer_config, layer_spec=module.build_layer(), **model_kwargs)
        # always "sequence": a sample's loss is its mean over its response, whatever the run trained with
        step = SftForwardStep(objective, seed=args.seed, data_parallel_rank=0, eod_id=run.data.eod_id, device=device,
                              loss_normalization="sequence")
        result.update(compare(model, {"base": args.base, "tuned": args.tuned}, step, feed, args.draws,
                              run.data.eod_id))
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "per_sample"}, indent=1))


if __name__ == "__main__":
    main()
