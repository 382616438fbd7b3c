"""Helpers shared by tests (moved from test_runtime_checks.py): DEMO, MOCK, ROOT, _fake_checkpoint, _load, _meta_of, _parts, _record."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import warnings
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]


DEMO = ROOT / "specs" / "demo-dlm.toml"


#: demo-dlm with megatron's mock data (no files needed).
MOCK = ["data.mock=true", "data.train=[]", "data.valid=[]", "data.tokenizer.type=\"NullTokenizer\"",
        "data.tokenizer.vocab_size=50256"]


def _load(out: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, out / "train.py")
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec.loader.exec_module(module)
    return module


def _parts(module):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tc, model_kwargs, ddp, opt = module.build_configs()
        return module.build_run(), tc, model_kwargs, ddp, opt, module.build_layer()


def _record(module):
    """The record train() would write for this compiled train.py (world of one)."""
    from dlmspec.backends.megatron import spec_record as sr
    from dlmspec.backends.megatron.layers import layer_spec_attention

    run, tc, model_kwargs, _, opt, layer = _parts(module)
    lock = sr.read_spec_lock(run.spec_lock_file, run.spec_hash)
    record = sr.spec_record(run, transformer_config=tc, model_kwargs=model_kwargs, optimizer_config=opt,
                            attention=layer_spec_attention(layer), block_size=None,
                            parallel_sizes=module.PARALLEL_SIZES, world_size=module.WORLD_SIZE,
                            tokenizer=lock.tokenizer)
    return lock, record


def _fake_checkpoint(root: Path, iteration: int, meta: dict) -> Path:
    """A checkpoint folder as save_checkpoint leaves it (only dlmspec.json matters before loading)."""
    path = root / f"iter_{iteration:07d}"
    path.mkdir(parents=True)
    (path / "dlmspec.json").write_text(json.dumps(meta))
    (root / "latest").write_text(path.name + "\n")
    return path


def _meta_of(module, iteration=100) -> dict:
    from dlmspec.backends.megatron import spec_record as sr

    lock, record = _record(module)
    run = module.build_run()
    return {"iteration": iteration, "seed": run.seed, "objective": dataclasses.asdict(run.objective),
            "spec": sr.spec_metadata(lock, record)}
