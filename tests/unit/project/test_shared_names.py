"""The names both sides use (file names, kinds, the tokenizer table, shared defaults) are
spelled once, in dlmspec.names, and the compiler and the runtime read them from there."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from dlmspec import names

ROOT = Path(__file__).resolve().parents[3]

#: The checkpoint / dataset record's file name as a string literal.
RECORD_LITERAL = re.compile(r"""["'](?:\.)?dlmspec\.json["']""")
#: Files where that text is not the record's name: the CLI's ``ctx.meta`` key for ``--json``.
NOT_A_FILE_NAME = {"dlmspec/cli/output.py"}


def test_the_record_file_name_is_spelled_once() -> None:
    found = []
    for folder in ("dlmspec", "backends"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "dlmspec/names.py" or rel in NOT_A_FILE_NAME:
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if RECORD_LITERAL.search(line.split("#", 1)[0]):
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert found == [], "use dlmspec.names.CHECKPOINT_RECORD / DATASET_RECORD_SUFFIX:\n" + "\n".join(found)


def test_the_tokenizer_tables_name_every_type_the_schema_takes() -> None:
    from dlmspec.check import tokenizer as check_tokenizer
    from dlmspec.resolve import FILE_FACT_TYPES, TOKENIZER_READS
    from dlmspec.spec.models import TokenizerSpec
    from dlmspec.tokenizers import TOKENIZER_TYPES

    schema = set(typing.get_args(TokenizerSpec.model_fields["type"].annotation))
    assert set(names.TOKENIZER_TYPES) == schema
    assert set(names.TOKENIZER_READS) == set(names.TOKENIZER_NEEDS) == schema
    assert set(names.FILE_FACT_TYPES) <= schema
    assert TOKENIZER_TYPES is names.TOKENIZER_TYPES
    assert TOKENIZER_READS is names.TOKENIZER_READS
    assert FILE_FACT_TYPES is names.FILE_FACT_TYPES
    assert check_tokenizer.TOKENIZER_NEEDS is names.TOKENIZER_NEEDS


def test_the_compiler_reads_the_shared_names() -> None:
    from dlmspec.data.record import record_path
    from dlmspec.generate_settings import KINDS
    from dlmspec.resolve.runtime import CART_P_DEFAULT

    assert CART_P_DEFAULT is names.CART_P_DEFAULT
    assert record_path("data/x") == "data/x" + names.DATASET_RECORD_SUFFIX == "data/x.dlmspec.json"
    from dlmspec import objectives

    assert KINDS == objectives.kinds() and objectives.kinds()[:2] == (names.MDM, names.AR)
    assert {objectives.get(k).attention for k in objectives.kinds()} <= set(names.ATTENTION_KINDS)


def test_the_runtime_reads_the_shared_names() -> None:
    pytest.importorskip("megatron.core")
    from dlmspec.backends.convert import objective as convert_objective
    from dlmspec.backends.generate import load as generate_load
    from dlmspec.backends.megatron import checkpointing, objective, spec_record

    for module, attr in ((checkpointing, "METADATA_FILENAME"), (spec_record, "METADATA_FILENAME"),
                         (generate_load, "METADATA_FILENAME"), (convert_objective, "TRAINING_METADATA")):
        assert getattr(module, attr) is names.CHECKPOINT_RECORD, (module.__name__, attr)
    assert checkpointing.TRACKER_FILENAME is names.CHECKPOINT_TRACKER
    from dlmspec.backends.generate import checkpoint as generate_checkpoint

    assert generate_checkpoint.TRACKER_FILENAME is names.CHECKPOINT_TRACKER
    from dlmspec import objectives

    assert convert_objective.OBJECTIVES == objectives.kinds()
    assert objective.CART_P_DEFAULT == names.CART_P_DEFAULT
