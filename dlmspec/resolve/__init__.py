"""The resolved spec: every value a later stage needs, derived once.

``spec -> Resolved -> plan -> rendered files``: :func:`resolve` fills what the user may leave
unset (query groups, head dimension, expert TP, attention mask, mask token, train_iters, the
layer path of ``transformer_impl = "auto"``) and
derives what the user never writes (data-parallel size, microbatches per step, padded
vocabulary, parameter counts). Later stages read a :class:`Resolved`, never the raw spec's
defaults, so each rule about a default lives here only.

:func:`resolve` never raises for cross-field problems (it clamps with ``max(1, ...)`` so the
validator can still run on a broken spec); the rules of :mod:`dlmspec.check` report them.
Derived values the runtime and the launch scripts read (the run directory, the end-of-document
id, the SLURM job name and settings) are functions of the spec here too.

Every default and every disk read of the compiler happens here: the tokenizer files (its size,
its end-of-document id) and the data blends' manifests and indexes are read by :func:`resolve`
and kept on the :class:`Resolved`, so :func:`dlmspec.render.compile.render` and the planner
read values only. The layout (data-parallel sizes, microbatches, divisibility) is
:mod:`dlmspec.layout`'s.

Modules, by concern: :mod:`~dlmspec.resolve.model` (:func:`resolve`), :mod:`~dlmspec.resolve.resolved`
(:class:`Resolved`), :mod:`~dlmspec.resolve.values` (:class:`RuntimeValues`, ``Resolved.runtime``:
what train.py and the launch scripts pass beyond the spec's own values),
:mod:`~dlmspec.resolve.runtime` (their derivation, the schedule, the lock file's filled keys),
:mod:`~dlmspec.resolve.tokenizer` (tokenizer keys, padded vocabulary, end-of-document id),
:mod:`~dlmspec.resolve.blend` (data blends), :mod:`~dlmspec.resolve.layers` (layer path, cross
entropy), :mod:`~dlmspec.resolve.stage` (the stage's defaults).
"""

from __future__ import annotations

from dlmspec.resolve.stage import (  # noqa: F401
    sft_section,
    sft_pad_eos_tokens,
    sft_attention_mask,
    default_loss_normalization,
)
from dlmspec.resolve.layers import (  # noqa: F401
    effective_cross_entropy,
    LOCAL_CP_COMM_TYPES,
    layer_path_needs,
    layer_path_prefers,
    layer_path,
)
from dlmspec.resolve.tokenizer import (  # noqa: F401
    TOKENIZER_KEYS,
    GPT2_VOCAB_SIZE,
    padded_vocab_size,
    EodChoice,
    GPT2_EOD,
    gpt2_eod_id,
    spec_tokenizer_facts,
    eod_choice,
    eod_used_by,
    FILE_FACT_TYPES,
    TOKENIZER_READS,
)
from dlmspec.resolve.blend import (  # noqa: F401
    MANIFEST_KIND,
    MANIFEST_VERSIONS,
    MANIFEST_SUFFIX,
    GLOB_CHARS,
    blend_kind,
    BlendProblem,
    Shard,
    BlendResolution,
    index_counts,
    resolve_blend,
    mixed_tokenizers,
    record_mean,
    record_means,
)
from dlmspec.resolve.values import (  # noqa: F401
    RuntimeValues,
)
from dlmspec.resolve.resolved import (  # noqa: F401
    Resolved,
)
from dlmspec.resolve.runtime import (  # noqa: F401
    run_dir,
    slurm_settings,
    job_name,
    schedule,
    LOCK_FILLED_KEYS,
    lock_filled,
    locked_spec,
    init_cache_dir,
    runtime_values,
    CART_P_DEFAULT,
)
from dlmspec.resolve.model import (  # noqa: F401
    resolve,
)

__all__ = [
    "BlendProblem",
    "BlendResolution",
    "CART_P_DEFAULT",
    "EodChoice",
    "FILE_FACT_TYPES",
    "GLOB_CHARS",
    "GPT2_EOD",
    "GPT2_VOCAB_SIZE",
    "LOCAL_CP_COMM_TYPES",
    "LOCK_FILLED_KEYS",
    "MANIFEST_KIND",
    "MANIFEST_SUFFIX",
    "MANIFEST_VERSIONS",
    "Resolved",
    "RuntimeValues",
    "Shard",
    "TOKENIZER_KEYS",
    "TOKENIZER_READS",
    "blend_kind",
    "default_loss_normalization",
    "effective_cross_entropy",
    "eod_choice",
    "eod_used_by",
    "gpt2_eod_id",
    "index_counts",
    "init_cache_dir",
    "job_name",
    "layer_path",
    "layer_path_needs",
    "layer_path_prefers",
    "lock_filled",
    "locked_spec",
    "mixed_tokenizers",
    "padded_vocab_size",
    "record_mean",
    "record_means",
    "resolve",
    "resolve_blend",
    "run_dir",
    "runtime_values",
    "schedule",
    "sft_attention_mask",
    "sft_pad_eos_tokens",
    "sft_section",
    "slurm_settings",
    "spec_tokenizer_facts",
]


def locked_form(data: dict) -> str:
    """The canonical JSON of ``locked_spec(resolve(Spec(data)))`` for the spec data ``data``:
    what :func:`dlmspec.render.compile.content_hash` hashes, so two data with the same form
    compile to the same run. Raises pydantic's ValidationError for data that does not validate.
    The loader's check (:func:`dlmspec.spec.show.use_locked_form`) before it leaves out the
    defaults a ``spec.lock.toml`` or ``dlmspec show`` file wrote."""
    import json

    from dlmspec.spec.models import Spec

    out = locked_spec(resolve(Spec.model_validate(data)))
    return json.dumps(out.model_dump(mode="json", exclude_none=True, exclude={"lock"}), sort_keys=True)


def _wire_loader() -> None:
    """Hand the loader (below this layer) the content-hash check of show/lock round trips."""
    from dlmspec.spec.show import use_locked_form

    use_locked_form(locked_form, LOCK_FILLED_KEYS)


_wire_loader()
