"""``dlmspec convert``: Hugging Face <-> megatron-core checkpoints from the command line.

The conversion itself is :mod:`dlmspec.backends.convert` (torch, safetensors, megatron-core), imported
inside the commands so that the compiler stays light. This module adds what a spec knows: with
``--spec`` the Hugging Face ``config.json`` is checked against the spec's ``[model]`` (every
disagreeing dimension is reported at once, with the spec's file and line, exit code 2) and the
vocabulary is padded as the spec's training run pads it (``make_vocab_size_divisible_by`` x TP,
:func:`dlmspec.resolve.padded_vocab_size`).

Commands: ``hf-to-mcore SRC DST``, ``mcore-to-hf SRC DST``, ``verify HF MCORE``.

Nothing a user wrote is lost: a DST that is, holds or sits inside SRC is refused (symbolic links
resolved); an existing DST needs ``--force``, which replaces only the files convert writes and
keeps the others. A broken input (corrupt or truncated files, a ``config.json`` or sidecar with
wrong types or values, non-float or non-finite weights) gets exit code 2 and a message naming the
file and the problem; Ctrl-C or SIGTERM exits 130/143 without leaving a temporary folder. With
``--json`` every outcome is the envelope of :func:`dlmspec.cli.output.envelope` on stdout.
"""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Any, Optional

import typer

from dlmspec.cli.help import MARKUP_MODE, Command, Group
from dlmspec.cli.output import command_name, print_envelope, use_json
from dlmspec.errors import EXIT_USAGE, SpecError, SpecIssue

#: The running convert command's name and whether it was given ``--json`` (set by :func:`_start`),
#: so :func:`_fail` prints the envelope instead of a line.
_JSON: ContextVar[tuple[str, bool]] = ContextVar("dlmspec_convert_json", default=("convert", False))
_JSON_HELP = "Print the result as JSON on stdout."

app = typer.Typer(
    cls=Group,
    help="Convert checkpoints between Hugging Face (safetensors) and megatron-core (dist checkpoint).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=MARKUP_MODE,
)

_FORCE_HELP = ("Write into an existing DST, replacing only the files convert writes there (other files are "
               "kept). DST may not be, hold or sit inside SRC.")

#: ``[model]`` key -> ``dlmspec.backends.convert.ModelDims`` field, for the spec check.
_SPEC_TO_DIMS = {
    "num_layers": "num_layers",
    "hidden_size": "hidden_size",
    "ffn_hidden_size": "ffn_hidden_size",
    "num_attention_heads": "num_attention_heads",
    "num_query_groups": "num_query_groups",
    "kv_channels": "kv_channels",
    "vocab_size": "vocab_size",
    "qk_layernorm": "qk_layernorm",
    "add_qkv_bias": "add_qkv_bias",
}


def spec_dims_issues(loaded: Any, resolved: Any, dims: Any) -> list[SpecIssue]:
    """Where the spec's ``[model]`` disagrees with a checkpoint's dimensions.

    Args:
        loaded: :class:`dlmspec.spec.load.LoadedSpec` (for file and line).
        resolved: its :class:`dlmspec.resolve.Resolved` (defaults filled).
        dims: ``dlmspec.backends.convert.ModelDims`` read from the checkpoint's ``config.json``.

    Returns:
        One error per disagreeing key, naming the checkpoint's value as the fix.
    """
    model = resolved.spec.model
    ours = {
        **{key: getattr(model, key) for key in _SPEC_TO_DIMS},
        "num_query_groups": resolved.num_query_groups,
        "kv_channels": resolved.kv_channels,
    }
    issues = []
    for key, field in _SPEC_TO_DIMS.items():
        theirs = getattr(dims, field)
        if ours[key] != theirs:
            file, line = loaded.locate(f"model.{key}")
            issues.append(SpecIssue(
                key=f"model.{key}", value=ours[key], rule="convert-dims", file=file, line=line,
                message=f"the checkpoint has {field} = {theirs!r}",
                hint=f"set model.{key} = {theirs!r}, or convert a checkpoint of this spec's model",
                source="dlmspec.backends.convert.hf_config.dims_from_hf_config"))
    tied = not model.untie_embeddings_and_output_weights
    if tied != dims.tied:
        file, line = loaded.locate("model.untie_embeddings_and_output_weights")
        issues.append(SpecIssue(
            key="model.untie_embeddings_and_output_weights", value=not tied, rule="convert-dims", file=file,
            line=line, message=f"the checkpoint's tie_word_embeddings is {dims.tied}",
            hint=f"set model.untie_embeddings_and_output_weights = {str(not dims.tied).lower()}"))
    return issues


def _start(ctx: typer.Context, json_output: bool) -> None:
    """Record the command's ``--json`` for the error handlers (the group's and :func:`_fail`)."""
    use_json(ctx, json_output)
    _JSON.set((command_name(ctx), json_output))


def _fail(message: str, code: int = EXIT_USAGE, rule: str = "convert", hint: str | None = None,
          key: str = "<convert>") -> None:
    """Report a refused conversion (``error: MESSAGE`` and, with a ``hint``, ``fix: HINT`` on
    stderr, or with ``--json`` the envelope) and exit with ``code``."""
    command, as_json = _JSON.get()
    if as_json:
        print_envelope(command, ok=False, issues=[SpecIssue(key, message, rule=rule, hint=hint,
                                                            source="dlmspec.backends.convert")])
    else:
        typer.secho(f"error: {message}" + (f"\n  fix: {hint}" if hint else ""), fg="red", err=True)
    raise typer.Exit(code)


def _run(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a conversion function; its ``ConversionError`` becomes a message and exit code 2, an
    interruption (Ctrl-C, SIGTERM) a line and exit code 130 (143 for SIGTERM)."""
    from dlmspec.backends.convert import ConversionError
    from dlmspec.backends.convert.errors import Interrupted

    try:
        return fn(*args, **kwargs)
    except ConversionError as exc:
        _fail(str(exc), hint=getattr(exc, "hint", None))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError) as exc:
        _fail(f"{exc.strerror or exc}: {exc.filename}", hint="check the path and its permissions")
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else 2
        outcome = ("the destination was complete when it came" if getattr(exc, "written", False) else
                   "the destination is as it was; the temporary folder was removed")
        _fail(f"interrupted (signal {signum}): {outcome}", 128 + signum, rule="interrupted")


def _check_paths(src: Path, dst: Path, force: bool) -> None:
    """Refuse a DST that is, holds or sits inside SRC, and an existing DST without ``--force``
    (messages name the command line's ``SRC``, ``DST`` and ``--force``)."""
    from dlmspec.backends.convert._atomic import check_separate

    _run(check_separate, src, dst, src_name="SRC", dst_name="DST")
    if (dst.exists() or dst.is_symlink()) and not force:
        _fail(f"DST {str(dst)!r} already exists. Fix: pass --force to replace the files convert writes there "
              "(other files are kept), or choose another DST")


@app.command(cls=Command, name="hf-to-mcore")
def hf_to_mcore_command(
    ctx: typer.Context,
    src: Path = typer.Argument(..., help="Hugging Face checkpoint folder (config.json + *.safetensors)."),
    dst: Path = typer.Argument(..., help="megatron-core dist-checkpoint folder to create."),
    spec: Optional[str] = typer.Option(None, "--spec", help="Check the checkpoint against this spec and pad "
                                       "the vocabulary as its run does."),
    set_: list[str] = typer.Option([], "--set", "-s", help="Override a spec key (with --spec)."),
    tp: int = typer.Option(1, "--tp", min=1, help="TP size to pad the vocabulary for (without --spec)."),
    force: bool = typer.Option(False, "--force", help=_FORCE_HELP),
    json_output: bool = typer.Option(False, "--json", help=_JSON_HELP),
) -> None:
    """Convert a Hugging Face checkpoint into megatron-core's dist-checkpoint format (loadable at
    any TP/PP); with --spec, a checkpoint that does not match the spec's model is refused."""
    _start(ctx, json_output)
    from dlmspec.backends.convert import dims_from_hf_config, hf_to_mcore
    from dlmspec.backends.convert.hf_io import read_hf_config

    config_path = src / "config.json"
    if not config_path.is_file():
        _fail(f"{config_path}: no config.json, so {src} is not a Hugging Face checkpoint folder", key="SRC",
              hint="give the folder that holds the checkpoint's config.json and *.safetensors "
                   "(e.g. what `hf download ORG/MODEL --local-dir DIR` writes)")
    _check_paths(src, dst, force)
    config = _run(read_hf_config, src)
    divisible_by = 128
    if spec:
        from dlmspec.spec.load import load
        from dlmspec.resolve import resolve

        loaded = load(spec, set_)
        resolved = resolve(loaded.spec)
        tp = resolved.tp
        divisible_by = loaded.spec.model.make_vocab_size_divisible_by
        dims = _run(dims_from_hf_config, config, make_vocab_size_divisible_by=divisible_by, tp=tp,
                    source=str(config_path))
        issues = spec_dims_issues(loaded, resolved, dims)
        if issues:
            raise SpecError(issues)
    dims = _run(hf_to_mcore, src, dst, make_vocab_size_divisible_by=divisible_by, tp=tp, overwrite=force)
    if json_output:
        print_envelope("convert hf-to-mcore", ok=True, result={
            "output": str(dst), "family": dims.family, "num_layers": dims.num_layers, "vocab_size": dims.vocab_size,
            "padded_vocab_size": dims.padded_vocab_size})
        return
    typer.echo(f"wrote {dst} ({dims.family}, {dims.num_layers} layers, vocabulary {dims.vocab_size} padded "
               f"to {dims.padded_vocab_size})")


@app.command(cls=Command, name="mcore-to-hf")
def mcore_to_hf_command(
    ctx: typer.Context,
    src: Path = typer.Argument(..., help="megatron-core checkpoint (a folder written by hf-to-mcore, "
                               "an iter_* folder, or a run's checkpoint root with a latest tracker)."),
    dst: Path = typer.Argument(..., help="Hugging Face folder to create."),
    objective: Optional[str] = typer.Option(
        None, "--objective", help="What the model was trained for: mdm (a diffusion LM: written with "
        "is_causal false, so transformers runs it bidirectionally) or ar. Default: the checkpoint's "
        "record (a training checkpoint's dlmspec.json, else the converted config), else ar."),
    mask_token_id: Optional[int] = typer.Option(None, "--mask-token-id", help="The diffusion LM's mask token, "
                                                "recorded in config.json (default: the checkpoint's)."),
    block_size: Optional[int] = typer.Option(None, "--block-size", help="A block-diffusion LM's block "
                                             "(--objective bd3lm; default: the checkpoint's record)."),
    force: bool = typer.Option(False, "--force", help=_FORCE_HELP),
    json_output: bool = typer.Option(False, "--json", help=_JSON_HELP),
) -> None:
    """Convert a megatron-core dist checkpoint into a Hugging Face folder that
    transformers' AutoModelForCausalLM loads (config.json, sharded safetensors with an index); a
    diffusion LM loads with bidirectional attention."""
    _start(ctx, json_output)
    from dlmspec.backends.convert import mcore_to_hf
    from dlmspec.backends.convert.mcore_io import resolve_checkpoint_dir
    from dlmspec import objectives
    from dlmspec.backends.convert.objective import hf_objective

    if objective is not None and objective not in objectives.kinds():
        _fail(f"--objective {objective!r} is not an objective", key="--objective",
              hint="--objective mdm (a diffusion LM) or --objective ar")
    if mask_token_id is not None and mask_token_id < 0:
        _fail(f"--mask-token-id {mask_token_id} is not a token id", key="--mask-token-id",
              hint="the run's [objective] mask_token_id, an integer >= 0")
    if block_size is not None and block_size < 1:
        _fail(f"--block-size {block_size} is not a block length", key="--block-size",
              hint="the run's [objective] block_size, an integer >= 1")
    _check_paths(src, dst, force)
    _check_paths(_run(resolve_checkpoint_dir, src), dst, force)
    dims = _run(mcore_to_hf, src, dst, overwrite=force, objective=objective, mask_token_id=mask_token_id,
                block_size=block_size)
    written = hf_objective(_run(_read_config, dst))
    attention = "bidirectional" if written.is_diffusion else "causal"
    if written.is_block_diffusion:
        attention = f"block-diffusion (blocks of {written.block_size}, input x_t + x_0)"
    if json_output:
        print_envelope("convert mcore-to-hf", ok=True, result={
            "output": str(dst), "family": dims.family, "num_layers": dims.num_layers, "vocab_size": dims.vocab_size,
            "objective": written.kind, "attention": attention, "mask_token_id": written.mask_token_id,
            **({"block_size": written.block_size} if written.is_block_diffusion else {})})
        return
    typer.echo(f"wrote {dst} ({dims.family}, {dims.num_layers} layers, vocabulary {dims.vocab_size}, "
               f"{written.kind}: {attention} attention)")


def _read_config(path: Path) -> dict:
    from dlmspec.backends.convert.hf_io import read_hf_config

    return read_hf_config(path)


@app.command(cls=Command, name="verify")
def verify_command(
    ctx: typer.Context,
    hf: Path = typer.Argument(..., help="Hugging Face checkpoint folder."),
    mcore: Path = typer.Argument(..., help="Its converted megatron-core checkpoint."),
    atol: float = typer.Option(1e-4, "--atol", help="Largest allowed absolute logit difference (fp32)."),
    json_output: bool = typer.Option(False, "--json", help=_JSON_HELP),
) -> None:
    """Run the same tokens through both checkpoints (fp32, CPU) and compare the logits; exit code
    1 when they differ by more than --atol."""
    _start(ctx, json_output)
    from dlmspec.backends.convert import verify

    result = _run(verify, hf, mcore, atol=atol)
    if json_output:
        differ = [] if result.ok else [SpecIssue(
            "--atol", f"the logits differ by up to {float(result.max_abs_diff):.3g}", value=atol, rule="convert-verify",
            hint="convert the checkpoint again (hf-to-mcore), or check that both folders hold the same model",
            source="dlmspec.backends.convert.verify")]
        print_envelope("convert verify", ok=bool(result.ok), issues=differ,
                       result={"match": bool(result.ok), "max_abs_diff": float(result.max_abs_diff), "atol": atol})
    else:
        verdict = "match" if result.ok else "DIFFER"
        typer.echo(f"logits {verdict}: max |difference| {result.max_abs_diff:.3g} (atol {atol:g})")
    if not result.ok:
        raise typer.Exit(1)
