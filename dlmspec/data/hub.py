"""Reading a Hugging Face dataset for ``dlmspec data prepare --hf-dataset`` (instead of ``--input``).

The flags are ``datasets.load_dataset``'s arguments with an ``hf-`` prefix: ``--hf-dataset``
(its ``path``: a hub name such as ``Salesforce/wikitext``, or a local folder of ``.jsonl``,
``.parquet``, ``.csv`` or ``.txt`` files), ``--hf-config`` (``name``, the hub's "subset", as
``--dataset_config_name`` in transformers' ``run_clm.py``), ``--hf-split`` (default ``train``),
``--hf-revision`` (a branch, tag or commit of the dataset repository: pin one for data that does
not change under a rerun) and ``--hf-streaming/--no-hf-streaming``. ``--json-keys`` names the
columns, as it names JSONL keys. The ``datasets`` library is the ``hf`` extra
(``pip install "dlmspec[hf]"``), imported only when ``--hf-dataset`` is given.

Rows are streamed by default (``streaming=True``: read from the hub's files as they are
tokenized, nothing downloaded whole and nothing kept); ``--no-hf-streaming`` downloads the split
into the Hugging Face cache first (kept for later runs, offline ones too; split slices such as
``train[:10%]`` need it). Either way the rows come in the dataset's order, and a row is a
document exactly as a JSONL line with the same values is: the same ``.bin``/``.idx`` bytes.
Every problem the library reports (offline, unknown name, gated, missing split or config,
missing or non-text column, a row that fails to read) becomes a
:class:`~dlmspec.data.errors.DataPrepareError` naming the flag, its value and a fix.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from typing import Any, Iterator, Optional, Sequence

from dlmspec.data.errors import DataPrepareError, add_secret, hide_secrets
from dlmspec.data.read import Chunk

#: ``--hf-split`` when not given.
DEFAULT_SPLIT = "train"
#: The distribution to install for ``--hf-dataset``, and the extra that installs it.
INSTALL_HINT = 'pip install "dlmspec[hf]" (the datasets library)'
#: Builder names of the ``datasets`` library (its ``packaged_modules``; the library's own list is
#: added when it has one): ``load_dataset("json")`` with no data files reads the working directory.
BUILDER_NAMES = frozenset({"arrow", "csv", "json", "pandas", "parquet", "sql", "text", "webdataset", "xml"})


@dataclass(frozen=True)
class HubSource:
    """What ``--hf-dataset`` and its flags name: ``datasets.load_dataset(dataset, config,
    split=split, revision=revision, streaming=streaming)``."""

    dataset: str
    config: Optional[str] = None
    split: str = DEFAULT_SPLIT
    revision: Optional[str] = None
    streaming: bool = True

    def __post_init__(self) -> None:
        if "@" in self.dataset:  # https://user:password@host/...: never printed, in any form
            from urllib.parse import urlsplit

            try:
                parts = urlsplit(self.dataset)
                password = parts.password
            except ValueError:
                password = None
            if password:
                add_secret(password)

    def describe(self) -> str:
        """The source as the flags that name it, for messages and the summary's ``input``:
        ``--hf-dataset Salesforce/wikitext --hf-config wikitext-2-raw-v1 --hf-split train``."""
        parts = [f"--hf-dataset {hide_secrets(self.dataset)}"]
        if self.config is not None:
            parts.append(f"--hf-config {self.config}")
        if self.revision is not None:
            parts.append(f"--hf-revision {self.revision}")
        parts.append(f"--hf-split {self.split}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The summary's ``hf_dataset`` entry (a password inside the dataset's URL redacted)."""
        return {**asdict(self), "dataset": hide_secrets(self.dataset)}


def source_from_flags(
    input_path: Optional[str],
    hf_dataset: Optional[str],
    hf_config: Optional[str],
    hf_split: Optional[str],
    hf_revision: Optional[str],
    hf_streaming: Optional[bool],
) -> Optional[HubSource]:
    """The :class:`HubSource` the command's flags name, or None for ``--input``.

    Raises:
        DataPrepareError: both ``--input`` and ``--hf-dataset``, neither, an ``--hf-*`` flag
            without ``--hf-dataset``, or an empty value.
    """
    if input_path is not None and hf_dataset is not None:
        raise DataPrepareError(
            f"--input {input_path} and --hf-dataset {hf_dataset}: data prepare reads one source, "
            "not both. Keep --input for a JSONL file or --hf-dataset for a Hugging Face dataset"
        )
    if hf_dataset is None:
        given = [
            (flag, value)
            for flag, value in (
                ("--hf-config", hf_config),
                ("--hf-split", hf_split),
                ("--hf-revision", hf_revision),
            )
            if value is not None
        ]
        if hf_streaming is not None:
            given.append(("--hf-streaming" if hf_streaming else "--no-hf-streaming", None))
        if given:
            flag, value = given[0]
            shown = flag if value is None else f"{flag} {value}"
            raise DataPrepareError(
                f"{shown}: only a Hugging Face dataset has it; pass --hf-dataset NAME with it "
                "(e.g. --hf-dataset Salesforce/wikitext), or drop it to read --input"
            )
        if input_path is None:
            raise DataPrepareError(
                "no input: pass --input FILE.jsonl (one JSON object a line) or --hf-dataset NAME "
                "(a Hugging Face dataset, e.g. --hf-dataset Salesforce/wikitext --hf-config "
                "wikitext-2-raw-v1)"
            )
        return None
    for flag, value in (
        ("--hf-dataset", hf_dataset),
        ("--hf-config", hf_config),
        ("--hf-split", hf_split),
        ("--hf-revision", hf_revision),
    ):
        if value is not None and not value.strip():
            raise DataPrepareError(
                f"{flag} {value!r}: empty; give a value (e.g. --hf-split {DEFAULT_SPLIT}) or "
                "leave the flag out"
            )
    return HubSource(
        dataset=hf_dataset,
        config=hf_config,
        split=DEFAULT_SPLIT if hf_split is None else hf_split,
        revision=hf_revision,
        streaming=True if hf_streaming is None else bool(hf_streaming),
    )


# --------------------------------------------------------------------------- opening


def _import_datasets(source: HubSource) -> Any:
    try:  # here, not at the top: pyarrow and pandas under it take seconds, and only --hf-dataset needs it
        import datasets
    except ImportError as exc:
        raise DataPrepareError(
            f"--hf-dataset {source.dataset}: reading a Hugging Face dataset needs the datasets "
            f"library, which cannot be imported ({exc}). Install it: {INSTALL_HINT}; or pass "
            "--input FILE.jsonl"
        ) from None
    return datasets


def _short(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _names(call: Any) -> list[str]:
    """``call()``'s list of names (splits, configs), or [] when the library cannot tell."""
    try:
        return [str(n) for n in call() or []]
    except Exception:
        return []


def _without_split(source: HubSource) -> str:
    return " ".join(
        f"{flag} {value}"
        for flag, value in (
            ("--hf-dataset", source.dataset),
            ("--hf-config", source.config),
            ("--hf-revision", source.revision),
        )
        if value is not None
    )


def _load_error(datasets: Any, source: HubSource, exc: Exception) -> DataPrepareError:
    """A :class:`DataPrepareError` for what ``load_dataset`` raised, naming the flag to change."""
    where = source.describe()
    text = _short(exc)
    not_found = getattr(getattr(datasets, "exceptions", None), "DatasetNotFoundError", ())
    if isinstance(exc, ConnectionError):  # offline mode (OfflineModeIsEnabled) or no network
        if "offline" in text.lower():
            why = (
                "the Hugging Face libraries are in offline mode (HF_HUB_OFFLINE=1 or "
                "HF_DATASETS_OFFLINE=1)"
            )
            fix = "unset HF_HUB_OFFLINE and HF_DATASETS_OFFLINE and rerun online"
        else:
            why = "cannot reach the Hugging Face Hub"
            fix = "check the network (and HTTPS_PROXY) and rerun"
        return DataPrepareError(
            f"{where}: {why}, and the dataset is not in the local cache ({text}). Fix: {fix}; "
            "to run offline later, load it once online with --no-hf-streaming (it stays in the "
            f"cache), or download its files (hf download {source.dataset} --repo-type dataset "
            "--local-dir DIR) and pass --hf-dataset DIR; or pass --input FILE.jsonl"
        )
    if (not_found and isinstance(exc, not_found)) or isinstance(exc, FileNotFoundError):
        if os.path.isdir(source.dataset):
            return DataPrepareError(
                f"--hf-dataset {source.dataset}: the folder has no .jsonl, .parquet, .csv or "
                f".txt files the datasets library reads ({text}); put the data files there, "
                "or pass --input FILE.jsonl"
            )
        hub_name = re.fullmatch(r"[\w.-]+/[\w.-]+|[\w.-]+", source.dataset) is not None
        where_to_look = (
            f"check the name at https://huggingface.co/datasets/{source.dataset}; a gated or "
            "private dataset needs a login (hf auth login, or export HF_TOKEN)"
            if hub_name
            else "a local --hf-dataset is a folder of .jsonl, .parquet, .csv or .txt files"
        )
        return DataPrepareError(f"--hf-dataset {source.dataset}: not found ({text}); {where_to_look}")
    if isinstance(exc, ValueError) and "split" in text.lower():
        splits = _names(
            lambda: datasets.get_dataset_split_names(
                source.dataset, source.config, revision=source.revision
            )
        )
        fix = ", ".join(f"--hf-split {s}" for s in splits) or "a split the dataset card lists"
        if "[" in source.split and source.streaming:
            fix += " (a slice such as train[:10%] needs --no-hf-streaming)"
        return DataPrepareError(
            f"--hf-split {source.split}: {_without_split(source)} has no such split ({text}); "
            f"use one of: {fix}"
        )
    if isinstance(exc, ValueError) and "config" in text.lower():
        configs = _names(
            lambda: datasets.get_dataset_config_names(source.dataset, revision=source.revision)
        )
        fix = ", ".join(f"--hf-config {c}" for c in configs) or "a subset the dataset card lists"
        if source.config is not None:
            shown, what = f"--hf-config {source.config}", "has no such config (subset)"
        else:
            shown, what = "--hf-config", "needs a config (subset)"
        return DataPrepareError(
            f"{shown}: --hf-dataset {source.dataset} {what} ({text}); use one of: {fix}"
        )
    return DataPrepareError(
        f"{where}: the datasets library cannot load it ({type(exc).__name__}: {text}); check "
        "--hf-dataset, --hf-config, --hf-split and --hf-revision, or pass --input FILE.jsonl"
    )


def _is_text(feature: Any) -> bool:
    """Whether a ``datasets`` feature holds a string or a list of strings."""
    dtype = getattr(feature, "dtype", None)
    if isinstance(dtype, str) and type(feature).__name__ == "Value":
        return dtype in ("string", "large_string")
    inner = getattr(feature, "feature", None)  # Sequence / List / LargeList
    if inner is not None:
        return getattr(inner, "dtype", None) in ("string", "large_string")
    if isinstance(feature, list) and len(feature) == 1:
        return getattr(feature[0], "dtype", None) in ("string", "large_string")
    return False


def _feature_text(feature: Any) -> str:
    dtype = getattr(feature, "dtype", None)
    return str(dtype) if isinstance(dtype, str) else type(feature).__name__


def _check_columns(source: HubSource, ds: Any, keys: Sequence[str]) -> None:
    """Refuse a ``--json-keys`` key that is not a text column (when the dataset declares them)."""
    columns = list(getattr(ds, "column_names", None) or [])
    features = getattr(ds, "features", None) or {}
    text_columns = [c for c in columns if c in features and _is_text(features[c])]
    fix = (
        " or ".join(f"--json-keys {c}" for c in text_columns[:3])
        or "--json-keys with a text column"
    )
    for key in keys:
        if columns and key not in columns:
            present = ", ".join(repr(c) for c in columns)
            raise DataPrepareError(
                f"--json-keys {key}: {source.describe()} has no column {key!r} (its columns: "
                f"{present}); use {fix}"
            )
        if key in features and not _is_text(features[key]):
            raise DataPrepareError(
                f"--json-keys {key}: column {key!r} of {source.describe()} is "
                f"{_feature_text(features[key])}, not text (a string or a list of strings); "
                f"use {fix}"
            )


def _num_rows(source: HubSource, ds: Any) -> Optional[int]:
    """Rows in the split when the dataset says (a loaded split always; a streamed one when its
    card has ``num_examples``), else None."""
    try:
        return len(ds)
    except TypeError:
        pass
    splits = getattr(getattr(ds, "info", None), "splits", None)
    try:
        info = splits[source.split] if splits else None
    except (KeyError, TypeError):
        return None
    rows = getattr(info, "num_examples", None)
    return int(rows) if rows else None


@dataclass
class OpenedDataset:
    """A split of a Hugging Face dataset, ready to be read as chunks of rows."""

    source: HubSource
    dataset: Any  # datasets.Dataset or datasets.IterableDataset, only the --json-keys columns
    keys: tuple[str, ...]
    num_rows: Optional[int]

    def chunks(self, chunk_docs: int, chunk_bytes: int) -> Iterator[Chunk]:
        """The rows in order, as :class:`~dlmspec.data.read.Chunk`s of ``(row index, row
        dict)`` (0-based index); a chunk ends after ``chunk_docs`` rows or about
        ``chunk_bytes`` characters of text.

        Raises:
            DataPrepareError: a row cannot be read (a network error mid-stream, a corrupt file),
                naming the row.
        """
        lines: list[tuple[int, Any]] = []
        size = 0
        index = -1
        rows = iter(self.dataset)
        while True:
            try:
                row = next(rows)
            except StopIteration:
                break
            except Exception as exc:
                raise DataPrepareError(
                    f"{self.source.describe()}, row {index + 1}: cannot read it "
                    f"({type(exc).__name__}: {_short(exc)}). A network error: rerun (the "
                    "dataset is written from the start), or use --no-hf-streaming to download "
                    "the split first; a malformed data file: fix or remove it"
                ) from None
            index += 1
            if all(key in row for key in self.keys):  # else the row, for "missing key"
                row = {key: row[key] for key in self.keys}
            else:
                row = dict(row)
            lines.append((index, row))
            size += sum(_text_size(value) for value in row.values())
            if len(lines) >= chunk_docs or size >= chunk_bytes:
                yield Chunk(lines, size)
                lines, size = [], 0
        if lines:
            yield Chunk(lines, size)


def _text_size(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(len(v) for v in value if isinstance(v, str))
    return 0


def open_dataset(source: HubSource, keys: Sequence[str], show_progress: bool = False) -> OpenedDataset:
    """Open ``source``'s split with the ``datasets`` library and check ``keys`` against its
    columns. Streams unless ``source.streaming`` is False (then the split is downloaded into
    the Hugging Face cache, with the library's progress bars when ``show_progress``).

    Raises:
        DataPrepareError: the library is not installed, the hub cannot be reached (offline),
            the dataset, split or config does not exist, or a key is not a text column.
    """
    datasets = _import_datasets(source)
    packaged = getattr(getattr(datasets, "packaged_modules", None), "_PACKAGED_DATASETS_MODULES", {})
    if (source.dataset in BUILDER_NAMES or source.dataset in packaged) and not os.path.isdir(
        source.dataset
    ):
        raise DataPrepareError(
            f"--hf-dataset {source.dataset}: that is a builder of the datasets library (it reads "
            "data files it is given, or else the working directory), not a dataset. For a JSONL "
            "file pass --input FILE.jsonl; for files of another format pass --hf-dataset FOLDER "
            "(a folder holding them); for a hub dataset pass its name (e.g. Salesforce/wikitext)"
        )
    progress_off = getattr(datasets, "disable_progress_bars", None)
    progress_on = getattr(datasets, "enable_progress_bars", None)
    were_off = bool(getattr(datasets, "are_progress_bars_disabled", lambda: False)())
    if not show_progress and progress_off is not None:
        progress_off()
    try:
        ds = datasets.load_dataset(
            source.dataset,
            source.config,
            split=source.split,
            revision=source.revision,
            streaming=source.streaming,
        )
    except DataPrepareError:
        raise
    except Exception as exc:
        raise _load_error(datasets, source, exc) from None
    finally:
        if not show_progress and progress_on is not None and not were_off:
            progress_on()
    _check_columns(source, ds, keys)
    columns = list(getattr(ds, "column_names", None) or [])
    if columns and set(columns) != set(keys) and hasattr(ds, "select_columns"):
        ds = ds.select_columns(list(keys))
    return OpenedDataset(source=source, dataset=ds, keys=tuple(keys), num_rows=_num_rows(source, ds))
