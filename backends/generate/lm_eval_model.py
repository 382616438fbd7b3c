"""lm-evaluation-harness model ``dlmspec``: a dlmspec checkpoint (diffusion or AR) under ``lm_eval``.

Importing this module registers :class:`DlmspecLM` as ``dlmspec`` in lm-eval's model registry
(``lm_eval.api.registry.register_model``). lm-eval 0.4.13 finds models only in its registry, filled
by its own ``lm_eval.models`` (no entry-point group, and ``--include_path`` is for tasks), so the
plain ``lm_eval`` command cannot see a third-party model; :func:`main` is ``lm_eval``'s command line
with this module imported first: ``python -m dlmspec.backends.generate.lm_eval_model --model dlmspec
--model_args path=RUN ...`` or the console script ``dlmspec-lm-eval`` (pyproject). From Python:
``import dlmspec.backends.generate.lm_eval_model`` then ``lm_eval.simple_evaluate(model="dlmspec",
model_args="path=RUN")``, or pass a :class:`DlmspecLM` built on any logits function.

The three request types (docs/generate.md, "lm-eval-harness"):

- ``loglikelihood``: ``log p(continuation | context)``: for a diffusion LM minus the Monte-Carlo
  ELBO bound (:func:`~dlmspec.backends.generate.likelihood.continuation_nll`, ``mc_samples`` samples,
  a generator seeded with ``seed`` for every request, so a request's number does not depend on the
  order lm-eval sends them in and the choices of a question share their random numbers); exact for AR.
  ``is_greedy``: AR, every continuation token is the argmax; diffusion, greedy low-confidence
  decoding of the continuation's length from the context reproduces it (LLaDA eval_llada.py's check).
- ``generate_until``: the sampler (:func:`~dlmspec.backends.generate.sampler.generate` /
  ``generate_ar``), the output cut at the first stop string.
- ``loglikelihood_rolling``: lm-eval's disjoint rolling windows of ``max_length`` (the first
  conditioned on EOS when the model has one), each window's continuation scored as above: exact for
  AR; for a diffusion LM the sum of the windows' conditional ELBO bounds, a bound on ``-log p``.

Text is split as LLaDA's ``_encode_pair``: trailing spaces of the context go to the continuation,
and the continuation's ids are those of ``encode(context + continuation)`` after the context's.
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import lm_eval.models  # noqa: F401  lm-eval's own models first: its registry imports them only when empty
from lm_eval import utils as lm_utils
from lm_eval.api.model import LM
from lm_eval.api.registry import model_registry, register_model

from dlmspec import objectives
from dlmspec.backends.generate.config import GenerateConfig
from dlmspec.generate_settings import GenerateConfigError, follow_gen_length
from dlmspec.backends.generate.likelihood import (DEFAULT_NUM_SAMPLES, DEFAULT_SAMPLES_PER_FORWARD, ESTIMATORS,
                                                  continuation_nll, split_pair)
from dlmspec.backends.generate.sampler import call_logits_fn, generate, generate_ar

#: The generation settings a ``--model_args`` string may set (``GenerateConfig`` fields).
GENERATE_ARGS = ("gen_length", "steps", "block_length", "remasking", "threshold", "temperature", "top_k", "top_p",
                 "cfg_scale")
#: Every ``--model_args`` key (the constructor's keywords that a string can carry).
MODEL_ARGS = ("path", "kind", "mask_token_id", "eos_token_id", "pad_token_id", "seed", "mc_samples",
              "samples_per_forward", "estimator", "eps", "greedy_check", "max_length", "device", "batch_size",
              "max_batch_size", "dtype", "preset") + GENERATE_ARGS


class ModelArgsError(ValueError):
    """A ``--model_args`` key or value :class:`DlmspecLM` cannot take (the message names the
    key, the value and a fix); ``dlmspec-lm-eval`` exits with code 2 on it."""


class TextCodec:
    """Text <-> ids over a dlmspec tokenizer (``tokenize`` / ``detokenize``) or a Hugging Face one
    (``encode(text, add_special_tokens=False)`` / ``decode``)."""

    def __init__(self, tokenizer: Any) -> None:
        if tokenizer is None:
            raise ModelArgsError("tokenizer: none; lm-eval sends text, so the model needs a tokenizer "
                             "(run from the folder the training ran in, so its tokenizer files are found)")
        self.tokenizer = tokenizer

    def encode(self, text: str) -> List[int]:
        """Token ids of ``text``, without BOS/EOS."""
        if not text:
            return []
        if hasattr(self.tokenizer, "tokenize") and hasattr(self.tokenizer, "detokenize"):
            return [int(i) for i in self.tokenizer.tokenize(text)]
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``."""
        ids = [int(i) for i in ids]
        if hasattr(self.tokenizer, "detokenize"):
            return self.tokenizer.detokenize(ids)
        return self.tokenizer.decode(ids)


def _parse(name: str, value: Any, kind: type) -> Any:
    """A ``--model_args`` value (lm-eval's parser gives ints, floats, bools or strings) as ``kind``."""
    if value is None or value == "None":
        return None
    try:
        if kind is bool:
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                return value.lower() in ("true", "1")
            return bool(value)
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        return kind(value)
    except (TypeError, ValueError):
        what = {int: "a whole number", float: "a number", bool: "true or false"}.get(kind, kind.__name__)
        example = {int: f"{name}=4", float: f"{name}=0.001", bool: f"{name}=false"}.get(kind, f"{name}=VALUE")
        raise ModelArgsError(f"--model_args {name}={value!r}: not {what}; e.g. {example}") from None


#: ``--model_args`` numbers: ``name -> (type, lowest, highest or None, an example that works)``.
#: ``mc_samples`` past a million (a day per request on a GPU) is taken as a typo.
_RANGES: Dict[str, Tuple[type, Any, Any, str]] = {
    "seed": (int, 0, (1 << 62) - 1, "seed=0"), "mc_samples": (int, 2, 1 << 20, "mc_samples=128"),
    "samples_per_forward": (int, 1, 1 << 20, "samples_per_forward=16"), "eps": (float, 0.0, 0.999999, "eps=0.001"),
    "greedy_check": (bool, None, None, "greedy_check=false"), "max_length": (int, 2, 1 << 24, "max_length=2048"),
    "eos_token_id": (int, 0, (1 << 63) - 1, "eos_token_id=50256"),
    "pad_token_id": (int, 0, (1 << 63) - 1, "pad_token_id=50256"),
    "mask_token_id": (int, 0, (1 << 63) - 1, "mask_token_id=126336"),
}


def _embedding_rows(loaded: Any) -> Optional[int]:
    """How many token ids a loaded model embeds (its record's ``model.padded_vocab_size``), or
    ``None`` when unknown (a logits function given from Python)."""
    record = getattr(loaded, "record", None)
    rows = record.get("model.padded_vocab_size") if isinstance(record, dict) else None
    return rows if isinstance(rows, int) and not isinstance(rows, bool) else None


def _check_ranges(**values: Any) -> None:
    """Parse each given ``--model_args`` number (:func:`_parse`) and check it against :data:`_RANGES`.

    Raises:
        ModelArgsError: the key, the value, the range and an example that works.
    """
    for name, value in values.items():
        kind, low, high, example = _RANGES[name]
        parsed = _parse(name, value, kind)
        if parsed is None or kind is bool:
            continue
        if not (math.isfinite(parsed) and low <= parsed and (high is None or parsed <= high)):
            raise ModelArgsError(f"--model_args {name}={parsed!r}: out of range {low}..{high}; e.g. {example}")


class DlmspecLM(LM):
    """lm-eval's ``LM`` over a logits function and a tokenizer (a dlmspec checkpoint: ``path=...``).

    Args:
        path: a run folder, checkpoint folder or Hugging Face folder, loaded by
            :func:`dlmspec.backends.generate.load.load_model` (give ``path`` or ``logits_fn``).
        logits_fn: the model as :class:`~dlmspec.backends.generate.sampler.LogitsFn` (Python only).
        tokenizer: with ``tokenize``/``detokenize`` (dlmspec) or ``encode``/``decode`` (Hugging Face).
        kind: ``"mdm"`` or ``"ar"`` (default: the loaded model's).
        mask_token_id, eos_token_id, pad_token_id: token ids (default: the loaded model's).
        seed: the Monte-Carlo seed, the same for every request (and the sampler's).
        mc_samples: ELBO samples per request (LLaDA: 128).
        samples_per_forward: ELBO samples per forward pass (a memory setting; changes no number).
        estimator: ``"count"`` (LLaDA Eq. 6, default) or ``"time"``; ``eps``: the time form's bound on ``t``.
        greedy_check: compute ``is_greedy`` of a diffusion LM's ``loglikelihood`` (a greedy decode of
            the continuation's length per request); ``False`` reports ``False`` without the cost.
        max_length: longest sequence sent to the model (default: the loaded model's, else 2048);
            longer inputs lose context tokens on the left.
        gen_length, steps, block_length, remasking, threshold, temperature, top_k, top_p, cfg_scale:
            :class:`GenerateConfig` fields for ``generate_until``. ``gen_length`` defaults to the
            request's ``max_gen_toks``, ``block_length`` to ``gen_length``, ``steps`` to ``gen_length``
            (one token per step).
        device, dtype: for ``path``. batch_size: prompts per ``generate_until`` batch.
        step_fn_factory: AR only (Python): ``() -> ARStepFn`` for a KV cache
            (:class:`~dlmspec.backends.generate.hf_model.HFKVCacheStep`); with ``path``, default:
            megatron-core's cache (``LoadedModel.ar_step_fn``) where the model allows it.
        progress: show a progress bar.

    Raises:
        ValueError: an unknown ``--model_args`` key (with the closest valid one), a value of the wrong
            type, neither ``path`` nor ``logits_fn``, no tokenizer, a diffusion LM without a mask token.
    """

    def __init__(self, path: Optional[str] = None, *, logits_fn: Optional[Callable] = None, tokenizer: Any = None,
                 kind: Optional[str] = None, mask_token_id: Optional[int] = None, eos_token_id: Optional[int] = None,
                 pad_token_id: Optional[int] = None, seed: int = 0, mc_samples: int = DEFAULT_NUM_SAMPLES,
                 samples_per_forward: int = DEFAULT_SAMPLES_PER_FORWARD, estimator: str = "count", eps: float = 1e-3,
                 greedy_check: bool = True, max_length: Optional[int] = None, device: Any = None,
                 dtype: Optional[str] = None, batch_size: Any = 1, max_batch_size: Any = None,
                 step_fn_factory: Optional[Callable[[], Any]] = None, progress: bool = True,
                 preset: Optional[str] = None, **generate_args: Any) -> None:
        super().__init__()
        self.preset = preset
        if preset is not None:  # a pinned protocol (dlmspec.generate_presets): given keys win
            from dlmspec.generate_presets import PRESETS

            if preset not in PRESETS:
                raise ModelArgsError(f"--model_args preset={preset!r}: not a preset; use one of {', '.join(sorted(PRESETS))}")
            filled = {k: v for k, v in PRESETS[preset].settings.items() if k in GENERATE_ARGS}
            generate_args = {**filled, **generate_args}
        unknown = [k for k in generate_args if k not in GENERATE_ARGS]
        if unknown:
            close = difflib.get_close_matches(unknown[0], MODEL_ARGS, n=1)
            hint = f"did you mean {close[0]}?" if close else f"valid keys: {', '.join(MODEL_ARGS)}"
            raise ModelArgsError(f"--model_args {unknown[0]}: not a dlmspec model argument; {hint}")
        if kind is not None and objectives.find(kind) is None:  # before a checkpoint is read
            raise ModelArgsError(f"--model_args kind={kind!r}: not a model kind; use {objectives.kinds_text('kind=')}")
        if estimator not in ESTIMATORS:
            raise ModelArgsError(f"--model_args estimator={estimator!r}: use one of {', '.join(ESTIMATORS)}")
        _check_ranges(seed=seed, mc_samples=mc_samples, samples_per_forward=samples_per_forward, eps=eps,
                      greedy_check=greedy_check, max_length=max_length, eos_token_id=eos_token_id,
                      pad_token_id=pad_token_id, mask_token_id=mask_token_id)  # before a checkpoint is read
        self.loaded = None
        if logits_fn is None:
            if path is None:
                raise ModelArgsError("--model_args path=...: give the run, checkpoint or Hugging Face folder to "
                                     "evaluate, e.g. --model_args path=runs/demo-dlm")
            self.loaded = from_path(path, device=device, dtype=dtype, kind=kind,
                                    mask_token_id=_parse("mask_token_id", mask_token_id, int))
            logits_fn, tokenizer = self.loaded.logits_fn, self.loaded.tokenizer
            kind = kind or self.loaded.kind
            mask_token_id = mask_token_id if mask_token_id is not None else self.loaded.mask_token_id
            eos_token_id = eos_token_id if eos_token_id is not None else self.loaded.eos_token_id
            pad_token_id = pad_token_id if pad_token_id is not None else self.loaded.pad_token_id
            max_length = max_length if max_length is not None else getattr(self.loaded, "max_length", None)
        try:  # a refused setting releases the model loaded for it (its process group)
            self.logits_fn = logits_fn
            self.codec = TextCodec(tokenizer)
            self.kind = kind or "mdm"
            if objectives.find(self.kind) is None:
                raise ModelArgsError(f"--model_args kind={self.kind!r}: use {objectives.kinds_text('kind=')}")
            self.mask_token_id = _parse("mask_token_id", mask_token_id, int)
            if self.objective.diffusion and self.mask_token_id is None:
                raise ModelArgsError("--model_args mask_token_id: a diffusion LM needs its mask token (the run's "
                                     "[objective] mask_token_id)")
            self.eos_token_id = _parse("eos_token_id", eos_token_id, int)
            self.pad_token_id = _parse("pad_token_id", pad_token_id, int)
            self.seed = _parse("seed", seed, int)
            rows = _embedding_rows(self.loaded)
            for name in ("mask_token_id", "eos_token_id", "pad_token_id"):
                value = getattr(self, name)
                if rows is not None and value is not None and value >= rows:
                    raise ModelArgsError(f"--model_args {name}={value}: the model embeds token ids 0..{rows - 1}; "
                                         f"leave {name} out to use the model's own")
            self.elbo_kwargs = {"estimator": estimator, "num_samples": _parse("mc_samples", mc_samples, int),
                                "samples_per_forward": _parse("samples_per_forward", samples_per_forward, int),
                                "eps": _parse("eps", eps, float)}
            self.greedy_check = _parse("greedy_check", greedy_check, bool)
            self._max_length = _parse("max_length", max_length, int) or 2048
            self.batch_size = 1 if batch_size in (None, "auto") else max(1, _parse("batch_size", str(batch_size).split(":")[0], int))
            types = {"gen_length": int, "steps": int, "block_length": int, "remasking": str, "threshold": float,
                     "temperature": float, "top_k": int, "top_p": float, "cfg_scale": float}
            self.generate_args = {k: _parse(k, v, types[k]) for k, v in generate_args.items()}
            gen_length = self.generate_args.get("gen_length")
            if gen_length is not None and not 1 <= gen_length < self._max_length:
                raise ModelArgsError(f"--model_args gen_length={gen_length}: the model takes {self._max_length} positions, "
                                     f"prompt included; e.g. gen_length={min(256, self._max_length // 2)}")
            try:  # every other setting checked now, not at the first generate_until request
                self._config({"max_gen_toks": min(256, self._max_length - 1)})
            except GenerateConfigError as exc:
                raise ModelArgsError(f"--model_args {exc.field}={exc.value!r}: {str(exc).split(': ', 1)[-1]}") from None
            if step_fn_factory is None and self.loaded is not None and getattr(self.loaded, "kv_cache_fallback", 1) is None:
                room = int(self.generate_args.get("gen_length") or 256)  # a longer decode restarts the cache larger
                step_fn_factory = lambda: self.loaded.ar_step_fn(max_new_tokens=room)  # noqa: E731
            self.step_fn_factory = step_fn_factory
            self.progress = progress
        except BaseException:
            if self.loaded is not None and hasattr(self.loaded, "close"):
                self.loaded.close()
            raise

    # ------------------------------------------------------------------ construction from --model_args

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: Optional[dict] = None) -> "DlmspecLM":
        """``--model_args "path=RUN,mc_samples=64"`` as a string (lm-eval's parser), keys checked
        by :meth:`create_from_arg_obj`."""
        return cls.create_from_arg_obj(lm_utils.simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: Dict[str, Any], additional_config: Optional[dict] = None) -> "DlmspecLM":
        """The model of the ``--model_args`` keys (lm-eval's CLI parses them into a dict): only
        :data:`MODEL_ARGS` (``logits_fn``, ``tokenizer``, ``step_fn_factory`` and ``progress`` are
        Python objects, never command-line text).

        Raises:
            ModelArgsError: an unknown key (with the closest valid one).
        """
        for key in arg_dict:
            if key not in MODEL_ARGS:
                close = difflib.get_close_matches(str(key), MODEL_ARGS, n=1)
                hint = f"did you mean {close[0]}?" if close else f"valid keys: {', '.join(MODEL_ARGS)}"
                raise ModelArgsError(f"--model_args {key}: not a dlmspec model argument; {hint}")
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        return cls(**{**arg_dict, **extra})

    # ------------------------------------------------------------------ lm-eval's properties

    @property
    def objective(self) -> objectives.Objective:
        """The registration of :attr:`kind` (:mod:`dlmspec.objectives`): a diffusion LM is scored by
        the ELBO and sampled by unmasking; one that predicts the next token exactly, left to right."""
        return objectives.get(self.kind)

    @property
    def max_length(self) -> int:
        """Longest token sequence sent to the model."""
        return self._max_length

    @property
    def eot_token_id(self) -> Optional[int]:
        """End of text: the model's EOS."""
        return self.eos_token_id

    @property
    def prefix_token_id(self) -> Optional[int]:
        """What an empty context is conditioned on: EOS (document separator in training), if known."""
        return self.eos_token_id

    # ------------------------------------------------------------------ tokenizing

    def encode_pair(self, context: str, continuation: str) -> Tuple[List[int], List[int]]:
        """``(context ids, continuation ids)``: trailing spaces of the context move to the continuation,
        and the continuation is ``encode(context + continuation)`` after ``encode(context)`` (LLaDA
        ``_encode_pair``, lm-eval HFLM ``_encode_pair``), so a word keeps its leading space."""
        return split_pair(self.codec.encode, context, continuation)

    def _fit(self, context: List[int], continuation: List[int]) -> Tuple[List[int], List[int]]:
        """Drop context tokens on the left (then continuation ones) to fit ``max_length``."""
        if len(continuation) >= self.max_length:
            continuation = continuation[-(self.max_length - (1 if self.objective.predicts_next_token else 0)):]
        keep = self.max_length - len(continuation)
        context = context[-keep:] if keep > 0 else []
        if self.objective.predicts_next_token and not context:
            if self.prefix_token_id is None:
                raise ValueError("an AR model scores a continuation after at least one token and this model has no "
                                 "EOS to start from; pass --model_args eos_token_id=ID")
            context = [self.prefix_token_id]
        return context, continuation

    # ------------------------------------------------------------------ scoring

    def score(self, context: List[int], continuation: List[int]) -> Tuple[float, bool]:
        """``(log p(continuation | context), is_greedy)`` of token ids: the ELBO bound for ``"mdm"``
        (a generator seeded with ``seed``), exact for ``"ar"``."""
        context, continuation = self._fit(context, continuation)
        if self.objective.predicts_next_token:
            nll, _, _ = continuation_nll(self.logits_fn, context, continuation, kind="ar")
            seq = torch.tensor([context + continuation])
            logits = call_logits_fn(self.logits_fn, seq, None)[0, len(context) - 1:-1]
            return -nll, bool((logits.argmax(-1) == seq[0, len(context):]).all())
        gen = torch.Generator().manual_seed(self.seed)
        if self.objective.block_diffusion and self.loaded is not None:  # BD3-LM: its NELBO, block-causally
            from dlmspec.backends.generate.block_diffusion import bd3_continuation_nll

            gen = torch.Generator(device=self.loaded.device).manual_seed(self.seed)
            kwargs = {k: v for k, v in self.elbo_kwargs.items() if k in ("num_samples", "samples_per_forward")}
            nll, _, _ = bd3_continuation_nll(self.loaded.model, context, continuation,
                                             block_size=int(self.loaded.record["objective.block_size"]),
                                             mask_token_id=self.mask_token_id, pad_token_id=self.loaded.pad_token_id,
                                             generator=gen, **kwargs)
            return -nll, False
        nll, _, _ = continuation_nll(self.logits_fn, context, continuation, kind="mdm",
                                     mask_token_id=self.mask_token_id, generator=gen, **self.elbo_kwargs,
                                     schedule=getattr(self.loaded, "noise_schedule", None))
        greedy = False
        if self.greedy_check and context:
            n = len(continuation)
            config = GenerateConfig(gen_length=n, steps=n, block_length=n, mask_token_id=self.mask_token_id,
                                    seed=self.seed)
            greedy = generate(self.logits_fn, [context], config).sequences[0, len(context):].tolist() == continuation
        return -nll, greedy

    def _bar(self, total: int, what: str):
        from tqdm import tqdm

        return tqdm(total=total, desc=f"dlmspec {what}", disable=not self.progress or self.rank != 0)

    def loglikelihood(self, requests: List[Any], disable_tqdm: bool = False) -> List[Tuple[float, bool]]:
        """lm-eval ``loglikelihood``: per ``(context, continuation)``, ``(log p, is_greedy)`` (module docstring)."""
        out: List[Tuple[float, bool]] = []
        memo: Dict[Tuple[str, str], Tuple[float, bool]] = {}
        with self._bar(len(requests), "loglikelihood") as bar:
            for request in requests:
                context, continuation = request.args
                if (context, continuation) not in memo:
                    ctx, cont = self.encode_pair(context, continuation)
                    if not cont:
                        raise ValueError(f"loglikelihood: the continuation {continuation!r} has no tokens")
                    memo[(context, continuation)] = self.score(ctx, cont)
                    self.cache_hook.add_partial("loglikelihood", (context, continuation), memo[(context, continuation)])
                out.append(memo[(context, continuation)])
                bar.update(1)
        return out

    def loglikelihood_rolling(self, requests: List[Any], disable_tqdm: bool = False) -> List[float]:
        """lm-eval ``loglikelihood_rolling``: ``log p(string)`` over disjoint rolling windows of
        ``max_length`` (exact for AR; for a diffusion LM the sum of the windows' ELBO bounds)."""
        out: List[float] = []
        with self._bar(len(requests), "loglikelihood_rolling") as bar:
            for request in requests:
                (text,) = request.args
                tokens = self.codec.encode(text)
                if not tokens:
                    raise ValueError("loglikelihood_rolling: a document without tokens")
                prefix = self.prefix_token_id
                if prefix is None and self.objective.predicts_next_token:
                    raise ValueError("loglikelihood_rolling of an AR model starts from EOS; pass "
                                     "--model_args eos_token_id=ID")
                windows = lm_utils.get_rolling_token_windows(token_list=tokens, prefix_token=-1 if prefix is None else prefix,
                                                             max_seq_len=self.max_length, context_len=1)
                total = 0.0
                for ctx, cont in map(lm_utils.make_disjoint_window, windows):
                    ctx = [t for t in ctx if t != -1]  # no EOS to condition on: a diffusion LM's empty context
                    total += self.score(ctx, cont)[0]
                out.append(total)
                self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
                bar.update(1)
        return out

    # ------------------------------------------------------------------ generation

    def _config(self, gen_kwargs: Dict[str, Any]) -> GenerateConfig:
        args = dict(self.generate_args)
        gen_length = args.pop("gen_length", None) or int(gen_kwargs.get("max_gen_toks", 256))
        if self.objective.predicts_next_token:
            args = {k: v for k, v in args.items() if k in ("temperature", "top_k", "top_p")}
        else:  # steps and block_length not given follow gen_length, as in a spec's [generate]
            args = follow_gen_length({**args, "gen_length": gen_length})
            del args["gen_length"]
        if gen_kwargs.get("do_sample") and "temperature" not in self.generate_args:
            args["temperature"] = float(gen_kwargs.get("temperature", 1.0))
        return GenerateConfig(kind=self.kind, gen_length=gen_length, mask_token_id=self.mask_token_id,
                              eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id, seed=self.seed, **args)

    def generate_until(self, requests: List[Any], disable_tqdm: bool = False) -> List[str]:
        """lm-eval ``generate_until``: the sampler from each context, cut at the first stop string
        (``until``) or EOS; ``max_gen_toks`` is the generated length unless ``gen_length`` is set."""
        results: List[Optional[str]] = [None] * len(requests)
        groups: Dict[str, List[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(repr(sorted(request.args[1].items(), key=lambda kv: kv[0])), []).append(i)
        with self._bar(len(requests), "generate_until") as bar:
            for indices in groups.values():
                gen_kwargs = dict(requests[indices[0]].args[1])
                until = gen_kwargs.get("until") or []
                until = [until] if isinstance(until, str) else list(until)
                config = self._config(gen_kwargs)
                for start in range(0, len(indices), self.batch_size):
                    chunk = indices[start:start + self.batch_size]
                    prompts = []
                    for i in chunk:
                        ids = self.codec.encode(requests[i].args[0])
                        ids = ids[-max(1, self.max_length - config.gen_length):]
                        if not ids:
                            if self.prefix_token_id is None:
                                raise ValueError("generate_until: an empty context and no EOS to start from; "
                                                 "pass --model_args eos_token_id=ID")
                            ids = [self.prefix_token_id]
                        prompts.append(ids)
                    if self.objective.predicts_next_token:
                        step_fn = self.step_fn_factory() if self.step_fn_factory is not None else None
                        output = generate_ar(self.logits_fn, prompts, config, step_fn=step_fn)
                    else:
                        output = generate(self.logits_fn, prompts, config)
                    for i, ids in zip(chunk, output.generated):
                        text = self.codec.decode(ids)
                        cuts = [text.index(s) for s in until if s and s in text]
                        results[i] = text[:min(cuts)] if cuts else text
                        self.cache_hook.add_partial("generate_until", requests[i].args, results[i])
                    bar.update(len(chunk))
        return [r if r is not None else "" for r in results]

    def get_model_info(self) -> Dict[str, Any]:
        """Recorded in lm-eval's results ``config``: the settings that make the numbers reproducible."""
        return {"dlmspec_kind": self.kind, "dlmspec_seed": self.seed, "dlmspec_elbo": dict(self.elbo_kwargs),
                "dlmspec_generate": dict(self.generate_args), "dlmspec_max_length": self.max_length,
                "dlmspec_mask_token_id": self.mask_token_id, "dlmspec_eos_token_id": self.eos_token_id,
                "dlmspec_preset": self.preset}


def from_path(path: str, *, device: Any = None, dtype: Optional[str] = None, kind: Optional[str] = None,
              mask_token_id: Optional[int] = None) -> Any:
    """The model at ``path`` through :func:`dlmspec.backends.generate.load.load_model` (imported here:
    loading needs megatron-core / transformers, scoring a logits function does not).

    Returns:
        Its ``LoadedModel`` (``logits_fn``, ``tokenizer``, ``kind``, ``mask_token_id``, ``eos_token_id``,
        ``pad_token_id``, ``max_length``).
    """
    from dlmspec.backends.generate.load import load_model

    return load_model(path, device=device, dtype=dtype, kind=kind, mask_token_id=mask_token_id)


#: The name lm-eval knows :class:`DlmspecLM` by (``--model dlmspec``).
MODEL_NAME = "dlmspec"


def register() -> None:
    """Register :class:`DlmspecLM` as ``dlmspec`` (done on import; a second call does nothing)."""
    if MODEL_NAME not in model_registry:
        register_model(MODEL_NAME)(DlmspecLM)


if __name__ != "__main__":  # run as a script, the import in the block at the end registers the module's class
    register()


#: lm-eval 0.4.13's ``ValueError`` messages that refuse what the user typed (its flags), and their fix.
LM_EVAL_INPUT_ERRORS = {
    "Tasks not found": "list the tasks with `dlmspec-lm-eval ls tasks`, or give --include_path FOLDER for a task "
                       "folder of your own",
}


def _one_line(exc: BaseException, width: int = 600) -> str:
    """``str(exc)`` on one line, control characters escaped, at most ``width`` characters."""
    from dlmspec.cli.output import printable

    text = printable(" ".join(str(exc).split()))
    return text if len(text) <= width else text[: width - 3] + "..."


def main(argv: Optional[List[str]] = None) -> None:
    """``lm_eval``'s command line with the ``dlmspec`` model registered (``dlmspec-lm-eval``).

    Raises:
        SystemExit: 2, with one line on stderr naming the flag, the value, why and a fix, when
            ``--model_args path=`` names no loadable checkpoint
            (:class:`~dlmspec.backends.generate.load.LoadError`), a ``--model_args`` key or value is
            refused (:class:`ModelArgsError`), or lm-eval refuses a flag of its own
            (:data:`LM_EVAL_INPUT_ERRORS`: an unknown task).
    """
    import sys

    from lm_eval.__main__ import cli_evaluate

    saved = list(sys.argv)
    if argv is not None:
        sys.argv = [saved[0] if saved else "dlmspec-lm-eval", *argv]
    from dlmspec.files import FileRefused

    from .load import LoadError

    try:
        cli_evaluate()
    except LoadError as exc:  # a path= that is no checkpoint: the user's input, not a crash
        print(f"dlmspec-lm-eval: error: --model_args path=...: {_one_line(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    except (ModelArgsError, FileRefused) as exc:
        print(f"dlmspec-lm-eval: error: {_one_line(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    except ValueError as exc:  # lm-eval's own refusals of its flags (an unknown task, ...)
        fix = next((f for prefix, f in LM_EVAL_INPUT_ERRORS.items() if str(exc).startswith(prefix)), None)
        if fix is None:
            raise
        print(f"dlmspec-lm-eval: error: {_one_line(exc)}; fix: {fix}", file=sys.stderr)
        raise SystemExit(2) from None
    finally:
        sys.argv = saved


if __name__ == "__main__":
    from dlmspec.backends.generate.lm_eval_model import main as _main  # registers the importable class

    _main()
