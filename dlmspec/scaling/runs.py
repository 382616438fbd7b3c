"""The points of a scaling study, read from run folders: what ``dlmspec fit`` fits.

A run folder (``[logging] run_dir``, default ``runs/<name>``) holds what the runtime writes
(``backends/megatron/metrics.py``): ``metrics.jsonl`` with a ``start`` record per launch
(``model_flops_per_token``, the lock file's path ``spec_lock``, ``run_config`` with the data blend
and ``logging.run_dir`` as the spec wrote it), ``train`` records (``tokens_seen``), ``valid``
records (``loss``). :func:`read_point` takes from them, per run:

* D, training tokens: the last ``train`` record's ``tokens_seen`` (iterations x global batch x
  sequence length).
* C, training FLOPs: ``model_flops_per_token`` x D (the planner's count, :mod:`dlmspec.flops`:
  forward + backward matmuls, attention included).
* N, parameters: non-embedding (as Kaplan et al. 2020 and Hoffmann et al. 2022 fit them), counted
  from the run's ``spec.lock.toml`` by :func:`dlmspec.params.count_parameters`; the total beside.
* the final loss, from one of two sources (both read; :func:`select_loss` picks one for all the
  runs of an objective, so one fit never mixes validation sets):

  - ``eval``: ``eval.json`` in the run folder (what ``dlmspec eval RUN --data PREFIX --json >
    RUN/eval.json`` prints: for a masked-diffusion model the ELBO bound on NLL per token of its
    default estimator with its standard error, for AR the exact NLL per token);
  - ``valid``: the last ``valid`` record of ``metrics.jsonl`` (the training's own validation
    loss, on its validation split; no standard error).

  :attr:`RunPoint.loss` is the eval loss when the run has one, else the valid one.
  An ``eval.json`` that is empty or not JSON (an evaluation stopped before it printed, e.g. by a
  study's time budget) or that holds a failed evaluation's envelope (``"ok": false``) counts as
  no evaluation: the run keeps its valid loss and :attr:`RunPoint.notes` says why (``dlmspec
  fit`` prints it as a warning naming the file).
* the objective: the start record's ``objective`` (else, or when it is not a plain name
  (:data:`OBJECTIVE_NAME`), the lock's ``objective.kind``), and the
  configured data caps (``data.train[].max_unique_tokens``): runs pool as replicates only when
  these agree too (:func:`pool_replicates`).
* U, unique tokens, and the epochs D / U: the lock's ``data.train`` (paths from the launch folder)
  counted by :mod:`dlmspec.data.repetition`, the planner's arithmetic: each dataset's training
  split (``data.split`` carved out when there is no ``data.valid``) after its
  ``max_unique_tokens`` cap, ``U_i``, from its ``.idx`` (or its record ``PREFIX.dlmspec.json``
  where neither a split nor a cap needs the documents' lengths); a dataset of weight share
  ``w_i`` gives ``min(w_i D, U_i)`` unique tokens, the run ``U = sum_i`` of them
  (:attr:`~dlmspec.data.repetition.Repetition.seen_tokens`). Unknown (``None``, with why) when a
  count cannot be read, the blend does not resolve, or the run trains on mock data: only the
  data-constrained fit needs them.

A run missing D, N or the loss is skipped (:class:`Skipped`, with why), never guessed. A folder
that is no run folder, or a file that exists and cannot be read (a lock file; an ``eval.json``
that is no regular file (a folder, a FIFO), over the byte cap, unreadable, or JSON that is not the
``dlmspec eval`` envelope or holds no dataset score), is an error
(:class:`~dlmspec.errors.SpecError`, exit 2): such a file was put there by something other than
an interrupted evaluation, and replacing its score by another validation set's loss would hide it.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from dlmspec.errors import SpecError, SpecIssue
from dlmspec.files import FileRefused, loads_json, read_text

#: The file ``dlmspec fit`` reads a run's evaluation from (``dlmspec eval ... --json`` output).
EVAL_FILE = "eval.json"
#: The lock file's name beside train.py and in a run folder.
LOCK_FILE = "spec.lock.toml"
#: The estimator ``dlmspec eval`` reports first (its default; ``dlmspec.cli.generate``).
EVAL_ESTIMATORS = ("count", "time", "bd3")
#: An objective kind as a start record may name it (it goes into ``--plot`` file names and table
#: titles: no path separator, no markup); any other value falls back to the lock's objective.
OBJECTIVE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}")
#: The loss sources of ``dlmspec fit --loss`` (:func:`select_loss`).
LOSS_SOURCES = ("auto", "eval", "valid")


@dataclass
class RunPoint:
    """One run of a study (units: parameters, tokens, FLOPs, nats per token).

    Attributes:
        run_dir, name: The folder and the run's name.
        params: N, non-embedding parameters.
        total_params: All parameters (embeddings counted).
        tokens: D, training tokens.
        flops: C, training FLOPs (the planner's count).
        loss: Final validation loss.
        stderr: Its standard error (``None``: not measured).
        loss_source: Where the loss comes from (``eval.json (ELBO, count)``, ``metrics.jsonl valid``).
        unique_tokens: U (``None``: unknown; ``unique_why`` says why).
        epochs: D / U (``None`` with U).
        objective: The run's objective kind (``mdm``, ``ar``, ...).
        data_caps: The configured ``data.train[].max_unique_tokens`` as sorted ``(prefix, cap)``
            pairs (empty: no cap).
        sources: Every loss the run has, ``{"eval" | "valid": (loss, stderr, source words)}``.
        notes: What the reader found worth a warning (an empty ``eval.json``), one sentence each.
    """

    run_dir: str
    name: str
    params: int
    total_params: int
    tokens: int
    flops: float
    loss: float
    stderr: float | None
    loss_source: str
    unique_tokens: int | None = None
    epochs: float | None = None
    unique_why: str | None = None
    objective: str | None = None
    data_caps: tuple[tuple[str, int], ...] = ()
    sources: dict[str, tuple[float, float | None, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"run_dir": self.run_dir, "name": self.name, "N": self.params, "N_total": self.total_params,
                "D": self.tokens, "C": self.flops, "loss": self.loss, "stderr": self.stderr,
                "loss_source": self.loss_source, "unique_tokens": self.unique_tokens, "epochs": self.epochs,
                "unique_why": self.unique_why, "objective": self.objective,
                "max_unique_tokens": dict(self.data_caps) or None}


@dataclass
class Skipped:
    """A run left out of the fit: its folder, name and why."""

    run_dir: str
    name: str
    why: str

    def as_dict(self) -> dict[str, str]:
        return {"run_dir": self.run_dir, "name": self.name, "why": self.why}


def _issue(run_dir: str, key: str, value: Any, why: str, fix: str, file: str | None = None) -> SpecError:
    return SpecError([SpecIssue(key, why, value=value, hint=fix, rule="fit-input", file=file or run_dir,
                                source="dlmspec.scaling.runs")])


def _number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def launch_dir(run_dir: str, recorded_run_dir: Any) -> str:
    """The folder the run was launched from, which the spec's relative paths refer to: where the
    run folder's recorded relative ``run_dir`` (``runs/NAME``) ends, else the folder's parent's
    parent (``runs/NAME`` under it)."""
    actual = os.path.abspath(run_dir)
    if isinstance(recorded_run_dir, str) and recorded_run_dir and not os.path.isabs(recorded_run_dir):
        parts = os.path.normpath(recorded_run_dir).split(os.sep)
        tail = actual.split(os.sep)
        if len(parts) < len(tail) and tail[-len(parts):] == parts:
            return os.sep.join(tail[:-len(parts)]) or os.sep
    return os.path.dirname(os.path.dirname(actual))


def _resolve(path: str, base: str) -> str:
    return path if os.path.isabs(path) else os.path.join(base, path)


def find_lock(run_dir: str, start: dict[str, Any], base: str) -> str | None:
    """The run's ``spec.lock.toml``: the start record's ``spec_lock`` (relative to the launch
    folder ``base``), else one in the run folder; ``None`` when neither exists."""
    candidates = []
    recorded = start.get("spec_lock")
    if isinstance(recorded, str) and recorded:
        candidates.append(_resolve(recorded, base))
    candidates.append(os.path.join(run_dir, LOCK_FILE))
    for path in candidates:
        if os.path.lexists(path):
            return path
    return None


def read_eval(run_dir: str, notes: list[str] | None = None) -> tuple[float, float | None, str] | None:
    """``(loss, stderr, source)`` from ``<run_dir>/eval.json`` (the ``dlmspec eval --json``
    envelope), or ``None`` when the run folder has none, or has one that records no finished
    evaluation: empty, not JSON (an evaluation stopped before it printed all of it), or the
    envelope of a failed evaluation (``"ok": false``). For those a sentence naming the file and
    why goes to ``notes`` (when given).

    Raises:
        SpecError: the file exists but cannot be read (no regular file, over 16 MiB,
            an I/O error), or is JSON that is not the envelope, or holds no score of a dataset.
    """
    path = os.path.join(run_dir, EVAL_FILE)
    if not os.path.lexists(path):
        return None
    fix = f"write it with: dlmspec eval {run_dir} --data PREFIX --json > {path}"
    try:
        text = read_text(path, limit=16 << 20, what="eval result")
    except FileRefused as exc:
        raise _issue(run_dir, EVAL_FILE, exc.path, exc.why, exc.hint, file=path) from None
    unfinished = None
    if not text.strip():
        unfinished = "is empty (the evaluation was stopped before it printed its result)"
    else:
        try:
            body = loads_json(text, where=path, what="eval result")
        except FileRefused as exc:
            body, unfinished = None, f"is not a whole JSON document ({exc.why}: an evaluation stopped while printing?)"
        if isinstance(body, dict) and body.get("ok") is False:
            issues = body.get("issues") if isinstance(body.get("issues"), list) else []
            first = issues[0] if issues and isinstance(issues[0], dict) else {}
            unfinished = ("records a failed evaluation (\"ok\": false" +
                          (f": {first.get('key')}: {first.get('message')}" if first else "") + ")")
    if unfinished is not None:
        if notes is not None:
            notes.append(f"{path} {unfinished}: its loss is not used; {fix}")
        return None
    result = body.get("result") if isinstance(body, dict) else None
    if not isinstance(result, dict):
        raise _issue(run_dir, EVAL_FILE, path, "is not the JSON `dlmspec eval --json` prints (no 'result' object)",
                     fix, file=path)
    elbo = result.get("elbo")
    if isinstance(elbo, dict):
        for estimator in (*EVAL_ESTIMATORS, *sorted(elbo)):
            entry = elbo.get(estimator)
            if isinstance(entry, dict) and _number(entry.get("nll_per_token")):
                err = entry.get("stderr_per_token")
                return (float(entry["nll_per_token"]), float(err) if _number(err) and err > 0 else None,
                        f"{EVAL_FILE} (ELBO bound, {estimator} estimator)")
    ar = result.get("ar")
    if isinstance(ar, dict) and _number(ar.get("nll_per_token")):
        return float(ar["nll_per_token"]), None, f"{EVAL_FILE} (AR NLL, exact)"
    raise _issue(run_dir, f"{EVAL_FILE}: result", path, "holds no dataset score (no result.elbo or result.ar with "
                 "nll_per_token): the evaluation was run without --data", fix, file=path)


def _unique_tokens(spec: Any, tokens: int, base: str) -> tuple[int | None, str | None]:
    """``(U, None)`` or ``(None, why)``: the unique tokens a run of ``tokens`` training tokens saw,
    ``sum_i min(w_i tokens, U_i)`` by :func:`dlmspec.data.repetition.repeat` over the datasets
    of ``spec.data.train`` (globs and manifests expanded, relative paths from ``base``) counted by
    :func:`dlmspec.data.repetition.dataset_tokens` (the split carve-out, the ``.idx``, the cap)."""
    from dlmspec import objectives
    from dlmspec.data.repetition import dataset_tokens, repeat, split_vector, train_caps
    from dlmspec.resolve.blend import resolve_blend

    data = spec.data
    if getattr(data, "mock", False):
        return None, "the run trains on mock data"
    entries = list(getattr(data, "train", None) or [])
    if not entries:
        return None, "the lock names no data.train dataset"
    located = [entry.model_copy(update={"prefix": _resolve(str(entry.prefix), base)}) for entry in entries]
    blend = resolve_blend(located, "data.train")
    if blend.problems or not blend.shards:
        first = blend.problems[0] if blend.problems else None
        return None, f"data.train does not resolve ({first.message if first else 'no dataset'})"
    split = None if getattr(data, "valid", None) else data.split
    try:
        split_vector(split) if split is not None else None
    except ValueError as exc:
        return None, str(exc)
    caps = train_caps(located)
    written = {_resolve(str(e.prefix), base): str(e.prefix) for e in entries}
    datasets = [(dataset_tokens(shard.prefix, split=split, cap=caps.get(shard.prefix) if shard.prefix == shard.entry
                                else None, entry=written.get(shard.entry, shard.entry)), float(shard.weight))
                for shard in blend.shards]
    try:
        rep = repeat(datasets, int(tokens), diffusion=bool(objectives.get(spec.objective.kind).diffusion))
    except ValueError as exc:
        return None, f"data.train: {exc}"
    if rep.seen_tokens is None:
        return None, "; ".join(rep.unknown) or "a dataset's unique tokens are unknown"
    return int(round(rep.seen_tokens)), None


def read_point(run_dir: str, *, loss: str = "auto") -> RunPoint | Skipped:
    """One run folder's point (the module docstring), or why it is skipped.

    Args:
        run_dir: The run folder.
        loss: ``"valid"`` reads no ``eval.json`` (the fit will not use it); ``"auto"`` and
            ``"eval"`` read both sources (:func:`select_loss` chooses).

    Raises:
        SpecError: ``run_dir`` is no run folder (no ``metrics.jsonl``), or its lock file or
            ``eval.json`` exists and cannot be read (the module docstring).
    """
    from dlmspec.cli.runs import read_run

    log = read_run(run_dir, argument="RUN")
    name = log.name
    start = log.last("start")
    if start is None:
        if log.skipped:  # a start record may be among the lines that did not parse
            return Skipped(run_dir, name, f"metrics.jsonl has no readable start record ({log.skipped} line(s) did not "
                           "parse: a truncated or damaged file; the run's train.log says whether it started)")
        return Skipped(run_dir, name, "metrics.jsonl has no start record (the run never started training)")
    run_config = start.get("run_config") if isinstance(start.get("run_config"), dict) else {}
    logging_config = run_config.get("logging") if isinstance(run_config.get("logging"), dict) else {}
    base = launch_dir(run_dir, logging_config.get("run_dir"))
    train = [r for r in log.events("train") if _number(r.get("tokens_seen")) and r["tokens_seen"] > 0]
    if not train:
        return Skipped(run_dir, name, "no train record with tokens_seen > 0 (the runtime logs the tokens "
                       "trained so far in each train record; a run that logged no step has none)")
    tokens = int(train[-1]["tokens_seen"])
    flops_per_token = start.get("model_flops_per_token")
    if not _number(flops_per_token) or flops_per_token <= 0:
        return Skipped(run_dir, name, "the start record has no model_flops_per_token (a run of an older dlmspec)")
    lock_path = find_lock(run_dir, start, base)
    if lock_path is None:
        return Skipped(run_dir, name, f"no {LOCK_FILE} (the start record's spec_lock, or one in the run folder): "
                       "its parameters cannot be counted")
    try:
        from dlmspec.spec.load import load

        spec = load(lock_path).spec
    except SpecError as exc:
        first = exc.issues[0] if exc.issues else None
        why = f"{first.key}: {first.message}" if first else "does not load"
        raise _issue(run_dir, LOCK_FILE, lock_path, f"the run's lock file cannot be read ({why})",
                     "give the run folder of a run compiled by dlmspec (its spec.lock.toml beside train.py)",
                     file=lock_path) from None
    from dlmspec.params import count_parameters

    counts = count_parameters(spec.model)
    notes: list[str] = []
    sources: dict[str, tuple[float, float | None, str]] = {}
    found = read_eval(run_dir, notes) if loss != "valid" else None
    if found is not None:
        sources["eval"] = found
    valid = [r for r in log.events("valid") if _number(r.get("loss"))]
    if valid:
        sources["valid"] = (float(valid[-1]["loss"]), None,
                            f"metrics.jsonl valid record (iteration {valid[-1].get('iteration')})")
    if not sources:
        why = "; ".join(notes) if notes else f"no {EVAL_FILE}"
        return Skipped(run_dir, name, f"no validation loss: no valid record in metrics.jsonl and {why} "
                       f"(dlmspec eval {run_dir} --data PREFIX --json > {os.path.join(run_dir, EVAL_FILE)})")
    for key, (value, _, source) in list(sources.items()):
        if not value > 0:
            notes.append(f"the loss from {source} is {value}, not a positive number: not used")
            del sources[key]
    if not sources:
        return Skipped(run_dir, name, "; ".join(notes))
    first_loss, stderr, source = sources.get("eval") or sources["valid"]
    unique, why = _unique_tokens(spec, tokens, base)
    objective = start.get("objective")
    if not (isinstance(objective, str) and OBJECTIVE_NAME.fullmatch(objective)):
        objective = str(spec.objective.kind)  # the lock's, which the spec schema checked
    caps = tuple(sorted((str(e.prefix), int(e.max_unique_tokens)) for e in (getattr(spec.data, "train", None) or [])
                        if getattr(e, "max_unique_tokens", None) is not None))
    return RunPoint(run_dir=run_dir, name=name, params=counts.non_embedding, total_params=counts.total, tokens=tokens,
                    flops=float(flops_per_token) * tokens, loss=first_loss, stderr=stderr, loss_source=source,
                    unique_tokens=unique, epochs=(tokens / unique) if unique else None, unique_why=why,
                    objective=objective, data_caps=caps, sources=sources, notes=notes)


def by_objective(points: list[RunPoint]) -> dict[str, list[RunPoint]]:
    """The points grouped by :attr:`RunPoint.objective` (``ar``, ``mdm``, ...), objectives sorted
    by name; each objective is a study of its own (its own law, isoFLOP parabolas and optimum)."""
    groups: dict[str, list[RunPoint]] = {}
    for p in points:
        groups.setdefault(p.objective or "unknown", []).append(p)
    return dict(sorted(groups.items()))


def select_loss(points: list[RunPoint], source: str = "auto") -> tuple[list[RunPoint], list[Skipped], str, str]:
    """One loss source for all ``points`` (the runs of one objective), so their fit compares
    losses on one validation set: ``(points with that loss, runs skipped for lack of it, the
    source used ("eval" or "valid"), why it was used)``.

    ``source``: ``"eval"`` (every run's ``eval.json``; runs without one are skipped), ``"valid"``
    (every run's last ``metrics.jsonl`` valid record; runs without one are skipped), ``"auto"``
    (``eval`` when every run has one, else ``valid`` for all).

    Raises:
        ValueError: ``source`` is none of :data:`LOSS_SOURCES`.
    """
    if source not in LOSS_SOURCES:
        raise ValueError(f"loss source {source!r}: expected one of {', '.join(LOSS_SOURCES)}")
    with_eval = sum(1 for p in points if "eval" in p.sources)
    if source == "auto":
        used = "eval" if points and with_eval == len(points) else "valid"
        why = (f"auto: every one of the {len(points)} runs has an {EVAL_FILE}" if used == "eval" else
               f"auto: {with_eval} of {len(points)} runs have an {EVAL_FILE}, so all use their metrics.jsonl valid record")
    else:
        used, why = source, f"--loss {source}"
    chosen, skipped = [], []
    for p in points:
        found = p.sources.get(used)
        if found is None:
            what = (f"no {EVAL_FILE} with a score" if used == "eval" else "no valid record in metrics.jsonl")
            skipped.append(Skipped(p.run_dir, p.name, f"{what}, and the fit of its objective ({p.objective}) uses "
                                   f"{'eval.json' if used == 'eval' else 'the valid records'} ({why})"))
            continue
        loss, stderr, words = found
        chosen.append(replace(p, loss=loss, stderr=stderr, loss_source=words))
    return chosen, skipped, used, why


def sweep_runs(folder: str) -> list[str]:
    """The run folders directly inside ``folder`` (those holding ``metrics.jsonl``), sorted.

    Raises:
        SpecError: ``folder`` is not a folder, or holds no run folder.
    """
    if not os.path.isdir(folder):
        raise _issue(folder, "--sweep", folder, "is not a folder", "give the folder holding the sweep's run folders "
                     "(e.g. runs/)")
    found = sorted(os.path.join(folder, n) for n in os.listdir(folder)
                   if os.path.isdir(os.path.join(folder, n)) and os.path.lexists(os.path.join(folder, n, "metrics.jsonl")))
    if not found:
        raise _issue(folder, "--sweep", folder, "holds no run folder (no sub-folder with metrics.jsonl)",
                     "give the folder holding the sweep's run folders (e.g. runs/), or the runs themselves")
    return found


def sweep_unstarted(folder: str) -> list[Skipped]:
    """The sub-folders of ``folder`` that hold a run's ``spec.lock.toml`` but no ``metrics.jsonl``
    (runs that never started, e.g. a study's time budget ran out first), each as a
    :class:`Skipped` with why, so a sweep's fit names every run it leaves out."""
    if not os.path.isdir(folder):
        return []
    found = []
    for n in sorted(os.listdir(folder)):
        path = os.path.join(folder, n)
        if (os.path.isdir(path) and not os.path.lexists(os.path.join(path, "metrics.jsonl"))
                and os.path.lexists(os.path.join(path, LOCK_FILE))):
            found.append(Skipped(path, n, f"no metrics.jsonl, only its {LOCK_FILE}: the run never started"))
    return found


@dataclass
class Pooled:
    """Replicates of one (N, D, U) pooled into one point (:func:`pool_replicates`)."""

    point: RunPoint
    replicates: list[str]


def replicate_key(p: RunPoint) -> tuple[Any, ...]:
    """What replicates share: objective, N, D, U and the configured data caps
    (``data.train[].max_unique_tokens``). U alone cannot tell data-constrained runs apart when it
    is unknown (no ``.idx`` to count a cap with), so the caps as configured are part of the key."""
    return (p.objective, p.params, p.tokens, p.unique_tokens, p.data_caps)


def pool_replicates(points: list[RunPoint]) -> list[Pooled]:
    """Runs of the same :func:`replicate_key` (replicates: other seeds) pooled into one point: the
    inverse-variance weighted mean loss with standard error ``1 / sqrt(sum 1/s_i^2)`` when every
    replicate has a standard error; else the plain mean with the replicates' standard error of
    the mean (``std / sqrt(k)``, ``k >= 2``). Runs differing in any part of the key (objective,
    N, D, U, data caps) are distinct points."""
    groups: dict[tuple[Any, ...], list[RunPoint]] = {}
    for p in points:
        groups.setdefault(replicate_key(p), []).append(p)
    pooled = []
    for members in groups.values():
        if len(members) == 1:
            pooled.append(Pooled(members[0], [members[0].run_dir]))
            continue
        losses = [m.loss for m in members]
        if all(m.stderr for m in members):
            w = [1.0 / m.stderr ** 2 for m in members]  # type: ignore[operator]
            loss = sum(wi * li for wi, li in zip(w, losses)) / sum(w)
            err: float | None = 1.0 / math.sqrt(sum(w))
        else:
            k = len(members)
            loss = sum(losses) / k
            var = sum((li - loss) ** 2 for li in losses) / (k - 1)
            err = math.sqrt(var / k) if var > 0 else None
        first = members[0]
        point = RunPoint(run_dir=first.run_dir, name=f"{first.name} (+{len(members) - 1} replicates)",
                         params=first.params, total_params=first.total_params, tokens=first.tokens,
                         flops=sum(m.flops for m in members) / len(members), loss=loss, stderr=err,
                         loss_source=f"pooled over {len(members)} replicates", unique_tokens=first.unique_tokens,
                         epochs=first.epochs, unique_why=first.unique_why, objective=first.objective,
                         data_caps=first.data_caps)
        pooled.append(Pooled(point, [m.run_dir for m in members]))
    return pooled
