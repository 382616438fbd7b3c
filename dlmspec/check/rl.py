"""Rules of the RL stage (``[stage] kind = "rl"``, ``[stage.rl]``): the algorithm against the
objective, prompts per step against the batch and the data-parallel ranks, the reference model,
the rollout sampler, the prompts file and the reward files.

A reward file is checked by reading and parsing it (:mod:`ast`), never by importing it: a TOML spec
executes nothing at validate time, and importing a dotted module name would run its parents'
``__init__``. Only the compiled job imports it (backends/rl/rewards.py, in worker processes).
"""

from __future__ import annotations

import ast
import os
from typing import Any, Iterator

from dlmspec import objectives
from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.rl import ALGORITHMS, BUILTIN_REWARDS, DIFFUSION_ESTIMATORS, estimator_of, rewards_of  # noqa: F401
from dlmspec.rl import rollout_values as rl_values

#: ``stage.rl.algorithm`` -> (trains a masked-diffusion model?, its estimator, its source).
#: Largest reward file validate parses (a reward module is small; a larger file is refused unread).
REWARD_FILE_LIMIT = 4 * 1024 * 1024


def rl_files(spec: Any) -> list[tuple[str, str]]:
    """``(key, path)`` of the files an RL stage reads: the prompts and each reward file."""
    rl = rl_table(spec)
    files = [("stage.rl.prompts", rl.prompts)] if rl.prompts else []
    for i, entry in enumerate(rl.rewards):
        where, sep, _ = entry.function.rpartition(":")
        if sep and where and where != "builtin" and where.endswith(".py"):
            files.append((f"stage.rl.rewards.{i}.function", where))
    return files


def rl_table(spec: Any) -> Any:
    """``[stage.rl]`` with its defaults filled (``RLSpec()`` where the spec has no such table)."""
    from dlmspec.spec.fast import section_defaults

    rl = spec.stage.rl
    return rl if rl is not None else section_defaults(spec, "RLSpec")


def _is_rl(ctx: Context) -> bool:
    return ctx.spec.stage.kind == "rl"


@rule(
    "rl-objective",
    "error",
    "d1 (Zhao et al. 2025) and DiffuCoder (Gong et al. 2025): diffu-GRPO and coupled-GRPO score masked "
    "diffusion models; GRPO (Shao et al. 2024) needs autoregressive token log-probabilities",
    "the RL algorithm (and estimator) matches the objective",
)
def _rl_objective(ctx: Context) -> Iterator[Finding]:
    if not _is_rl(ctx):
        return
    rl, kind = rl_table(ctx.spec), ctx.spec.objective.kind
    diffusion = ALGORITHMS[rl.algorithm][0]
    fit = objectives.get(kind).rl_algorithm
    # the objective kind each algorithm trains: the first registered one of its family with an algorithm
    want = next((k for k in objectives.kinds() if objectives.get(k).rl_algorithm
                 and objectives.get(k).diffusion == diffusion), None)
    if not fit or objectives.get(kind).diffusion != diffusion:
        yield Finding(
            "stage.rl.algorithm", f"{rl.algorithm} is for {want} models, and objective.kind = '{kind}'",
            f"use algorithm = '{fit}'" if fit else f"no RL algorithm trains objective.kind = '{kind}'",
            value=rl.algorithm, fix=Fix({"stage.rl.algorithm": fit}) if fit else None)
        return
    if rl.estimator is not None and (rl.estimator in DIFFUSION_ESTIMATORS) != diffusion:
        own = ALGORITHMS[rl.algorithm][1]
        yield Finding("stage.rl.estimator", f"the {rl.estimator!r} estimator does not score a '{kind}' model",
                      f"use estimator = '{own}' (or remove it: the algorithm's own)", value=rl.estimator,
                      fix=Fix({"stage.rl.estimator": own}))


@rule(
    "rl-table-missing",
    "error",
    "dlmspec.spec.models.RLSpec (an RL stage needs its prompts file)",
    "stage.kind = 'rl' comes with [stage.rl] and its prompts",
)
def _rl_table(ctx: Context) -> Iterator[Finding]:
    if _is_rl(ctx) and rl_table(ctx.spec).prompts is None:
        yield Finding("stage.rl.prompts", "an RL stage needs the prompts it rolls out",
                      'set stage.rl.prompts = "data/prompts.jsonl" (JSONL rows {"prompt": ..., "answer": ...})',
                      value=None)


@rule(
    "rl-batch",
    "error",
    "Megatron-LM RL (--grpo-prompts-per-step x --grpo-group-size sequences per rollout batch); "
    "each rollout batch is grpo_iterations optimizer steps over all its sequences",
    "grpo_prompts_per_step x grpo_group_size = train.global_batch_size",
    needs_layout=True,
)
def _rl_batch(ctx: Context) -> Iterator[Finding]:
    if not _is_rl(ctx):
        return
    rl = rl_table(ctx.spec)
    want = rl.grpo_prompts_per_step * rl.grpo_group_size
    gbs = ctx.spec.train.global_batch_size
    if gbs != want:
        fix = Fix({"train.global_batch_size": want, **_micro_batch_for(ctx, want)})
        yield Finding("train.global_batch_size",
                      f"{gbs} sequences, and a rollout batch is grpo_prompts_per_step {rl.grpo_prompts_per_step} x "
                      f"grpo_group_size {rl.grpo_group_size} = {want} completions",
                      f"{fix.text()} (or change grpo_prompts_per_step / grpo_group_size)", value=gbs, fix=fix)


def _micro_batch_for(ctx: Context, global_batch: int) -> dict[str, int]:
    """``{"train.micro_batch_size": m}`` when the spec's micro batch does not divide each data-parallel
    rank's share of ``global_batch`` (``batch-divisible`` would refuse the new global batch): ``m`` the
    largest divisor of that share at most the spec's micro batch (a multiple of the group size with
    ``loss_normalization = "group"``, ``rl-group-microbatch``); ``{}`` when none is needed or the share
    does not split over the ranks (``rl-prompts-per-rank`` says so)."""
    from dlmspec.check.hints import divisors

    rl, dp, mbs = rl_table(ctx.spec), ctx.r.dp, ctx.spec.train.micro_batch_size
    if dp < 1 or global_batch % dp or (global_batch // dp) % mbs == 0:
        return {}
    share, group = global_batch // dp, rl.grpo_group_size
    fits = [d for d in divisors(share) if rl.loss_normalization != "group" or d % group == 0]
    small = [d for d in fits if d <= mbs]
    return {"train.micro_batch_size": max(small) if small else min(fits)} if fits else {}


@rule(
    "rl-prompts-per-rank",
    "error",
    "backends/rl/stage.py (each data-parallel rank rolls out whole groups: group advantages need every "
    "completion of a prompt on one rank)",
    "grpo_prompts_per_step is a multiple of the data-parallel size, and each rank's completions fill whole microbatches",
    needs_layout=True,
)
def _rl_per_rank(ctx: Context) -> Iterator[Finding]:
    if not _is_rl(ctx):
        return
    rl, dp = rl_table(ctx.spec), ctx.r.dp
    if rl.grpo_prompts_per_step % dp:
        up = -(-rl.grpo_prompts_per_step // dp) * dp
        yield Finding("stage.rl.grpo_prompts_per_step",
                      f"{rl.grpo_prompts_per_step} prompts do not split over {dp} data-parallel ranks",
                      f"set stage.rl.grpo_prompts_per_step = {up} (and train.global_batch_size = "
                      f"{up * rl.grpo_group_size})", value=rl.grpo_prompts_per_step,
                      fix=Fix({"stage.rl.grpo_prompts_per_step": up, "train.global_batch_size": up * rl.grpo_group_size}))


@rule(
    "rl-group-microbatch",
    "error",
    "backends/rl/loss.py policy_loss (loss_normalization = 'group' averages each group's tokens, so a microbatch "
    "holds whole groups)",
    "with loss_normalization = 'group', train.micro_batch_size is a multiple of grpo_group_size",
)
def _rl_group_microbatch(ctx: Context) -> Iterator[Finding]:
    if not _is_rl(ctx):
        return
    rl, mbs = rl_table(ctx.spec), ctx.spec.train.micro_batch_size
    if rl.loss_normalization == "group" and mbs % rl.grpo_group_size:
        yield Finding("stage.rl.loss_normalization",
                      f"'group' averages each group of {rl.grpo_group_size} completions, and a microbatch of "
                      f"{mbs} rows cuts groups apart", "set stage.rl.loss_normalization = \"sequence\" (or a "
                      f"micro_batch_size that is a multiple of {rl.grpo_group_size})", value=rl.loss_normalization,
                      fix=Fix({"stage.rl.loss_normalization": "sequence"}))


@rule(
    "rl-pipeline",
    "error",
    "backends/megatron/stage.py StageResources.logits_fn (the sampler needs one chunk holding the embedding and "
    "the output layer: dlmspec generate refuses pipeline parallelism)",
    "an RL stage runs without pipeline parallelism",
    fix="set parallel.pipeline_model_parallel_size = 1",
    fix_keys=Fix({"parallel.pipeline_model_parallel_size": 1}),
)
def _rl_pipeline(ctx: Context) -> Iterator[Finding]:
    if _is_rl(ctx) and ctx.spec.parallel.pipeline_model_parallel_size > 1:
        yield Finding("parallel.pipeline_model_parallel_size",
                      "rollouts sample through one model chunk holding the whole model; the sampler refuses "
                      "pipeline parallelism, so RL does too")


@rule(
    "rl-reference-fsdp",
    "error",
    "backends/megatron/stage.py ModelFactory.frozen_copy (no frozen copy of a Megatron-FSDP model)",
    "a KL penalty (grpo_kl_beta > 0) runs with parallel.fsdp = 'none'",
)
def _rl_reference(ctx: Context) -> Iterator[Finding]:
    if not _is_rl(ctx):
        return
    rl = rl_table(ctx.spec)
    if rl.grpo_kl_beta > 0 and ctx.spec.parallel.fsdp == "megatron":
        yield Finding("parallel.fsdp", "the reference model of grpo_kl_beta > 0 is a frozen copy of the policy, "
                      "which cannot be built from Megatron-FSDP shards",
                      'set parallel.fsdp = "none", or stage.rl.grpo_kl_beta = 0.0 (no reference model)',
                      fix=Fix({"parallel.fsdp": "none"}))


@rule(
    "rl-rollout-sampling",
    "error",
    "GRPO (Shao et al. 2024, sec. 4.1): group advantages need different completions of one prompt; "
    "backends/generate/sampler.py (temperature 0 with low-confidence remasking is deterministic)",
    "rollouts are sampled: generate.temperature > 0 (or random remasking)",
)
def _rl_sampling(ctx: Context) -> Iterator[Finding]:
    if not _is_rl(ctx):
        return
    gen = ctx.spec.generate
    temperature = gen.temperature if gen is not None else 0.0
    remasking = gen.remasking if gen is not None else "low_confidence"
    random_order = objectives.get(ctx.spec.objective.kind).diffusion and remasking == "random"
    if temperature == 0.0 and not random_order:
        yield Finding("generate.temperature",
                      "0 decodes greedily: every completion of a prompt is the same, so every group's rewards are "
                      "equal and no completion gets an advantage", "set generate.temperature = 0.9 (d1's rollout "
                      "temperature)", value=temperature, fix=Fix({"generate.temperature": 0.9}))


@rule(
    "rl-row-length",
    "error",
    "backends/rl/rollout.py (a rollout row is the rendered prompt followed by generate.gen_length positions) and "
    "dlmspec/plan/rl.py (the plan prices rows of train.seq_length positions, also the model's max_sequence_length)",
    "for an RL stage, train.seq_length is longer than generate.gen_length: the prompt needs room in the row",
)
def _rl_row_length(ctx: Context) -> Iterator[Finding]:
    if not _is_rl(ctx):
        return
    gen_length = int(rollout_values(ctx.spec)["generate"]["gen_length"])
    seq = ctx.spec.train.seq_length
    if gen_length >= seq:
        want = gen_length + seq
        yield Finding("train.seq_length",
                      f"{seq} positions, and each rollout row is the prompt followed by generate.gen_length = "
                      f"{gen_length} positions: no room is left for the prompt (the plan prices rows of "
                      "train.seq_length positions)",
                      f"set train.seq_length = {want} (the longest prompt's tokens plus gen_length; the job prints "
                      "its longest row at start)", value=seq, fix=Fix({"train.seq_length": want}))


@rule(
    "rl-reference-sync",
    "warning",
    "d1 / DiffuCoder (TRL's sync_ref_model: the reference is refreshed every ref_model_sync_steps)",
    "ref_model_sync_steps is unset or shorter than the run, and only set with grpo_kl_beta > 0",
)
def _rl_sync(ctx: Context) -> Iterator[Finding]:
    if not _is_rl(ctx):
        return
    rl = rl_table(ctx.spec)
    if rl.grpo_kl_beta == 0 and ctx.is_set("stage.rl.ref_model_sync_steps") and rl.ref_model_sync_steps is not None:
        yield Finding("stage.rl.ref_model_sync_steps", "has no effect: grpo_kl_beta = 0 builds no reference model",
                      "remove stage.rl.ref_model_sync_steps, or set grpo_kl_beta above 0",
                      fix=Fix(unset=("stage.rl.ref_model_sync_steps",)))


@rule(
    "rl-clip-iterations",
    "warning",
    "PPO / GRPO (Schulman et al. 2017; Shao et al. 2024): with one update per rollout batch the ratio is 1 and "
    "the clip never acts",
    "grpo_clamp_eps_* are set only with grpo_iterations > 1",
)
def _rl_clip(ctx: Context) -> Iterator[Finding]:
    if not _is_rl(ctx):
        return
    rl = rl_table(ctx.spec)
    written = [k for k in ("grpo_clamp_eps_lower", "grpo_clamp_eps_upper") if ctx.is_set(f"stage.rl.{k}")]
    if rl.grpo_iterations == 1 and written:
        yield Finding(f"stage.rl.{written[0]}", "has no effect: with grpo_iterations = 1 the policy is scored by "
                      "the weights that sampled it, so the ratio is 1 and never clipped",
                      "set stage.rl.grpo_iterations = 2 (or more) to reuse each rollout batch",
                      fix=Fix({"stage.rl.grpo_iterations": 2}))


def _prompts_path(ctx: Context) -> str | None:
    return rl_table(ctx.spec).prompts if _is_rl(ctx) else None


@rule(
    "rl-prompts-file",
    "error",
    "backends/rl/prompts.py read_prompts (JSONL rows with a string 'prompt'); the job reads the file at start",
    "stage.rl.prompts is a readable JSONL file whose first row has a 'prompt'",
    scope="paths",
)
def _rl_prompts_file(ctx: Context) -> Iterator[Finding]:
    path = _prompts_path(ctx)
    if path is None:
        return
    from dlmspec.files import FileRefused, iter_lines, loads_json

    if not os.path.exists(path):
        return  # rule path-not-found says so
    try:
        for number, line in iter_lines(path, what="prompts file"):
            if not line.strip():
                continue
            try:
                row = loads_json(line, where=path, what="prompts file")
            except FileRefused as exc:
                yield Finding("stage.rl.prompts", f"line {number} is not JSON ({exc.why})",
                              'write one {"prompt": "...", "answer": "..."} object per line')
                return
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                yield Finding("stage.rl.prompts", f"line {number} is not a JSON object with a string \"prompt\"",
                              'write one {"prompt": "...", "answer": "..."} object per line')
            return
        yield Finding("stage.rl.prompts", "holds no prompt", 'write one {"prompt": "...", "answer": "..."} object per line')
    except FileRefused as exc:
        yield Finding("stage.rl.prompts", exc.why, exc.hint)


def defines_function(source: str, name: str) -> bool:
    """Whether the Python ``source`` defines ``name`` at module level: a ``def`` / ``async def`` (not
    async: refused by the caller), a class, or an assignment to the name (``name = other``).
    Parses only (:func:`ast.parse`); nothing runs.

    Raises:
        SyntaxError: ``source`` is not Python.
    """
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
            return True
    return False


def call_problem(source: str, name: str) -> str | None:
    """Why ``name`` in the Python ``source`` cannot be called as a reward,
    ``name(prompt, completion, **row)`` (backends/rl/reward_worker.py ``score_one``: two positional
    arguments, then the prompt row's other fields as keywords), or ``None`` where the source shows
    no reason (a ``def`` or ``lambda`` that takes that call; a class, an import or another name,
    which only the job can tell). Reads the last module-level binding of ``name``; parses only.

    Raises:
        SyntaxError: ``source`` is not Python.
    """
    bound = None
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            bound = node
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            bound = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            bound = node.value
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
            bound = None
    if isinstance(bound, (ast.Constant, ast.JoinedStr, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.ListComp,
                          ast.DictComp, ast.SetComp, ast.BinOp, ast.Compare)):
        return "is not a function (it is bound to a value)"
    if not isinstance(bound, (ast.FunctionDef, ast.Lambda)):
        return None
    args = bound.args
    positional = args.posonlyargs + args.args
    required = len(positional) - len(args.defaults)
    if len(positional) < 2 and args.vararg is None:
        return f"takes {len(positional)} positional argument{'s' * (len(positional) != 1)}"
    if required > 2:
        return f"requires {required} positional arguments"
    if args.kwarg is None:
        return "takes no **keywords"
    return None


def _async_def(source: str, name: str) -> bool:
    return any(isinstance(n, ast.AsyncFunctionDef) and n.name == name for n in ast.parse(source).body)


@rule(
    "rl-reward-function",
    "error",
    "backends/rl/rewards.py (the job imports 'file.py:name' in its reward workers and calls "
    "name(prompt, completion, **row) -> float)",
    "each stage.rl.rewards entry is 'builtin:NAME' or 'FILE.py:NAME' whose file exists and defines NAME",
    scope="paths",
)
def _rl_rewards(ctx: Context) -> Iterator[Finding]:
    if not _is_rl(ctx):
        return
    from dlmspec.files import FileRefused, read_text

    for i, entry in enumerate(rl_table(ctx.spec).rewards):
        key, spec = f"stage.rl.rewards.{i}.function", entry.function
        where, sep, name = spec.rpartition(":")
        if not sep or not where or not name.isidentifier():
            yield Finding(key, "is not 'path/to/file.py:function' or 'builtin:NAME'",
                          "write function = \"builtin:exact_match\", or a file and the function it defines "
                          "(function = \"rewards.py:correct\")", value=spec, fix=Fix({key: "builtin:exact_match"}))
            continue
        if where == "builtin":
            if name not in BUILTIN_REWARDS:
                yield Finding(key, f"no builtin reward {name!r} (builtins: {', '.join(BUILTIN_REWARDS)})",
                              "use function = \"builtin:exact_match\"", value=spec,
                              fix=Fix({key: "builtin:exact_match"}))
            continue
        if not where.endswith(".py"):
            yield Finding(key, f"{where!r} is not a Python file: validate reads the file (a module name would be "
                          "imported, running its package's code)", f"name the file: function = \"{where.replace('.', '/')}.py:{name}\"",
                          value=spec)
            continue
        if not os.path.exists(where):
            continue  # rule path-not-found says so
        try:
            source = read_text(where, limit=REWARD_FILE_LIMIT, what="reward file")
            if _async_def(source, name):
                yield Finding(key, f"{where} defines {name} as 'async def': a reward is called, not awaited",
                              f"make {name} a plain 'def'", value=spec)
            elif not defines_function(source, name):
                found = sorted(n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef))
                yield Finding(key, f"{where} defines no {name!r}",
                              f"use one of its functions ({', '.join(found) or 'none'}), or define "
                              f"def {name}(prompt, completion, **row) -> float there", value=spec)
            elif (why := call_problem(source, name)) is not None:
                yield Finding(key, f"{where}: {name} {why}, and the job calls {name}(prompt, completion, **row) "
                              "(row: the prompt row's other fields, prompt_id among them)",
                              f"define it as def {name}(prompt, completion, **row) -> float", value=spec)
        except FileRefused as exc:
            yield Finding(key, exc.why, exc.hint, value=spec)
        except SyntaxError as exc:
            yield Finding(key, f"{where} is not valid Python (line {exc.lineno}: {exc.msg})",
                          f"fix {where} line {exc.lineno}", value=spec)


def rollout_values(spec: Any) -> dict[str, Any]:
    """:func:`dlmspec.rl.rollout_values` of ``spec``: its ``[stage.rl]`` and ``[generate]`` with defaults filled."""
    from dlmspec.spec.fast import section_defaults

    gen = spec.generate if spec.generate is not None else section_defaults(spec, "GenerateSpec")
    return rl_values(rl_table(spec), gen)
