"""``dlmspec.backends.checkpoint_safety``: real checkpoints (tests/fixtures/checkpoints, written
by bench/checkpoint/write_metadata_fixtures.py) load through the safe readers; a ``.metadata``,
a stored byte object or a ``common.pt`` holding a pickle payload is refused naming the file and
the global, and the payload never runs."""

from __future__ import annotations

import importlib.util
import os
import pickle
import random
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from hostile import (  # noqa: E402
    SystemPayload,
    payloads,
    plant_byte_object,
    torch_saved,
    write_common_payload,
    write_metadata_payload,
)

from dlmspec.backends import checkpoint_safety as cs  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "checkpoints"
REAL = sorted(p for p in FIXTURES.glob("*/*") if (p / ".metadata").is_file())
HERE = FIXTURES / "torch-2.13.0_mcore-0.16.1"


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


def _load_everything(ckpt: Path) -> dict:
    """Every entry of the checkpoint, by ``dcp_load`` of a state dict of its index's keys
    (tensors of the stored global shape and dtype, byte objects as ``None``)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    metadata = cs.read_metadata(ckpt)
    state = {}
    for key, meta in metadata.state_dict_metadata.items():
        if isinstance(meta, BytesStorageMetadata):
            state[key] = None
        else:
            state[key] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
    cs.dcp_load(state, ckpt)
    return state


def test_the_fixtures_of_this_machines_versions_are_there() -> None:
    assert {p.name for p in HERE.iterdir()} == {"torch_dist", "fsdp_dtensor"}
    assert REAL, FIXTURES


def test_the_index_allow_list_resolves_exact_module_and_name_pairs_only() -> None:
    import io

    from torch.distributed.checkpoint.metadata import Metadata

    unpickler = cs._MetadataUnpickler(io.BytesIO(b""), "x/.metadata")
    assert unpickler.find_class("torch.distributed.checkpoint.metadata", "Metadata") is Metadata
    assert unpickler.find_class("torch", "bfloat16") is torch.bfloat16
    for module, name in [("torch.distributed.checkpoint.filesystem", "os.system"), ("os", "system"),
                         ("posix", "system"), ("builtins", "getattr"), ("builtins", "exec"),
                         ("torch.distributed.checkpoint.metadata", "Metadata.__init__"),
                         ("torch.distributed.checkpoint", "metadata"), ("torch", "load")]:
        with pytest.raises(cs.CheckpointRefused) as refused:
            unpickler.find_class(module, name)
        assert refused.value.global_name == (module, name)
        assert "x/.metadata" in str(refused.value)
    assert all("." not in name for _, name in cs.METADATA_GLOBALS)


@pytest.mark.parametrize("ckpt", REAL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_real_checkpoint_loads_through_the_safe_readers(ckpt: Path) -> None:
    metadata = cs.check_checkpoint(ckpt)
    state = _load_everything(ckpt)
    assert set(state) == set(metadata.state_dict_metadata)
    tensors = [v for v in state.values() if isinstance(v, torch.Tensor)]
    assert tensors and any(t.abs().sum() > 0 for t in tensors)
    rng = [k for k in state if k.startswith("rng_state")]
    assert len(rng) == 1, sorted(state)
    if ckpt.name == "torch_dist":
        value = state[rng[0]]
        value = value[0] if isinstance(value, list) else value  # megatron-core wraps a ShardedObject's data
        assert set(value) >= {"random", "numpy", "torch", "interval_loss"}
        random.Random().setstate(value["random"])
        common = cs.check_common_file(ckpt)  # megatron-core before 0.19 writes common.pt
        if common is None:  # 0.19 stores the common state as a byte object of the index
            (key,) = [k for k in state if k.startswith("common_state")]
            common = state[key][0] if isinstance(state[key], list) else state[key]
        assert common["iteration"] == 3
    else:
        from dlmspec.backends.megatron import fsdp

        run_state = fsdp._read_run_state(state[fsdp.RUN_STATE_KEY], str(ckpt))
        assert run_state["iteration"] == 3 and run_state["seed"] == 7
        value = fsdp.decode_state(state[rng[0]])
        random.Random().setstate(value["random"])
        assert value["interval_loss"] == [4.5, 12.0, 0.0]


@pytest.mark.parametrize("kind", ["os.system", "exec", "dotted-name"])
def test_an_index_holding_a_payload_is_refused_naming_the_global_and_runs_nothing(tmp_path, kind) -> None:
    canary = tmp_path / "canary"
    ckpt = _copy(HERE / "torch_dist", tmp_path)
    index = write_metadata_payload(ckpt, payloads(canary)[kind])
    with pytest.raises(cs.CheckpointRefused) as refused:
        cs.check_checkpoint(ckpt)
    assert refused.value.path == str(index)
    want = {"os.system": ("posix", "system"), "exec": ("builtins", "exec"),
            "dotted-name": ("torch.distributed.checkpoint.filesystem", "os.system")}[kind]
    assert refused.value.global_name == want and repr(want) in str(refused.value)
    with pytest.raises(cs.CheckpointRefused):
        _load_everything(ckpt)
    assert not canary.exists()
    pickle.loads(payloads(canary)[kind])  # the same bytes do run under plain pickle
    assert canary.exists()


def test_a_stored_object_holding_a_payload_is_refused_before_and_during_a_load(tmp_path, monkeypatch) -> None:
    canary = tmp_path / "canary"
    ckpt = _copy(HERE / "torch_dist", tmp_path)
    fqn = next(k for k in cs.read_metadata(ckpt).state_dict_metadata if k.startswith("rng_state"))
    distcp = plant_byte_object(ckpt, fqn, torch_saved(SystemPayload(canary)))
    with pytest.raises(cs.CheckpointRefused) as refused:
        cs.check_checkpoint(ckpt)
    assert refused.value.path == str(distcp) and refused.value.global_name == ("posix", "system")
    assert fqn in str(refused.value)
    # an object larger than the pre-load scan's cap is refused by the swapped load_bytes
    monkeypatch.setattr(cs, "MAX_SCANNED_OBJECT_BYTES", 0)
    with pytest.raises(cs.CheckpointRefused) as refused:
        with cs._refusals_unwrapped(), cs.guarded(ckpt, precheck=False):
            _load_everything_unchecked(ckpt)
    assert refused.value.path == str(distcp) and refused.value.global_name == ("posix", "system")
    assert not canary.exists()


def _load_everything_unchecked(ckpt: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    metadata = cs.read_metadata(ckpt)
    state = {k: None if isinstance(m, BytesStorageMetadata) else torch.empty(tuple(m.size), dtype=m.properties.dtype)
             for k, m in metadata.state_dict_metadata.items()}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(ckpt)), planner=DefaultLoadPlanner())


def test_a_common_pt_holding_a_payload_is_refused_and_runs_nothing(tmp_path) -> None:
    canary = tmp_path / "canary"
    ckpt = _copy(HERE / "torch_dist", tmp_path)
    common = write_common_payload(ckpt, canary)
    with pytest.raises(cs.CheckpointRefused) as refused:
        cs.check_checkpoint(ckpt)
    assert refused.value.path == str(common) and refused.value.global_name == ("posix", "system")
    assert not canary.exists()


def test_an_index_placing_data_outside_its_folder_is_refused(tmp_path) -> None:
    ckpt = _copy(HERE / "torch_dist", tmp_path)
    with open(ckpt / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    index = next(iter(metadata.storage_data))
    metadata.storage_data[index].relative_path = "../../etc/passwd"
    with open(ckpt / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    with pytest.raises(cs.CheckpointRefused, match="not a file of the checkpoint's own folder"):
        cs.read_metadata(ckpt)


def test_another_megatron_backend_is_refused(tmp_path) -> None:
    ckpt = _copy(HERE / "torch_dist", tmp_path)
    (ckpt / "metadata.json").write_text('{"sharded_backend": "zarr", "common_backend": "torch"}')
    with pytest.raises(cs.CheckpointRefused, match="sharded_backend is 'zarr'"):
        cs.check_checkpoint(ckpt)


def test_the_safe_readers_replace_torchs_and_megatrons_only_inside_guarded() -> None:
    """Inside ``guarded`` torch's index reader and byte loader and megatron-core's common-state
    loader (0.16: ``TorchCommonLoadStrategy.load_common``; 0.19: ``serialization.load_common``)
    are the safe ones; outside, the originals are back."""
    from megatron.core.dist_checkpointing import serialization
    from megatron.core.dist_checkpointing.strategies import common
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    strategy = getattr(common, "TorchCommonLoadStrategy", None)
    module_level = getattr(serialization, "load_common", None)
    assert strategy is not None or module_level is not None, "no common-state loader of megatron-core is covered"

    def current():
        return (FileSystemReader.read_metadata, DefaultLoadPlanner.load_bytes,
                strategy.load_common if strategy is not None else None, getattr(serialization, "load_common", None))

    before = current()
    with cs.guarded(HERE / "torch_dist"):
        with cs.guarded(HERE / "fsdp_dtensor"):
            assert FileSystemReader.read_metadata is cs._safe_read_metadata
        assert DefaultLoadPlanner.load_bytes is cs._safe_load_bytes
        if strategy is not None:
            assert strategy.load_common is cs._safe_load_common
        if module_level is not None:
            assert serialization.load_common is cs._safe_load_common_function
    assert current() == before


def test_fsdp_run_and_rng_state_are_json_text_that_restores_the_generators() -> None:
    import numpy as np

    from dlmspec.backends.megatron import fsdp

    state = {"random": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "tracker": {"model-parallel-rng": torch.get_rng_state()}, "interval_loss": [1.5, 3.0, 0.0]}
    text = fsdp.encode_state(state)
    assert isinstance(text, str) and b"\x80" not in text.encode()  # JSON, no pickle opcode
    back = fsdp.decode_state(text)
    random.setstate(back["random"])
    np.random.set_state(back["numpy"])
    torch.set_rng_state(back["torch"])
    assert back["random"] == state["random"] and torch.equal(back["tracker"]["model-parallel-rng"], state["torch"])
    with pytest.raises(TypeError, match="not JSON"):
        fsdp.encode_state({"x": object()})
    with pytest.raises(ValueError, match="not a run/RNG state"):
        fsdp.decode_state('{"__tensor__": "AAAA", "dtype": "torch.complex64", "shape": [1]}')


def test_an_older_fsdp_run_state_of_plain_data_reads_and_a_pickled_payload_is_refused(tmp_path) -> None:
    from dlmspec.backends.megatron import fsdp

    run_state = {"iteration": 5, "consumed_train_samples": 40, "seed": 1, "opt_param_scheduler": {"max_lr": 1e-3}}
    assert fsdp._read_run_state(pickle.dumps(run_state), str(tmp_path)) == run_state
    canary = tmp_path / "canary"
    with pytest.raises(cs.CheckpointRefused) as refused:
        fsdp._read_run_state(pickle.dumps({"iteration": SystemPayload(canary)}), str(tmp_path))
    assert refused.value.global_name == ("posix", "system")
    assert not canary.exists()


def _fixture_writer():
    spec = importlib.util.spec_from_file_location("write_metadata_fixtures",
                                                  ROOT / "bench" / "checkpoint" / "write_metadata_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_resume_reads_the_real_checkpoint_and_refuses_a_payload_in_its_rng_state(tmp_path_factory, tmp_path,
                                                                                monkeypatch) -> None:
    from cpu_world_kit import megatron_cpu_world

    from dlmspec.backends.megatron.checkpointing import load_checkpoint

    with megatron_cpu_world(tmp_path_factory, monkeypatch):
        model = _fixture_writer()._tiny_model()
        loaded = load_checkpoint(str(HERE / "torch_dist"), model=model, seed=7, restore_rng=False)
        assert (loaded.iteration, loaded.consumed_train_samples) == (3, 12)
        assert loaded.rank_state["interval_loss"] == [4.5, 12.0, 0.0]

        canary = tmp_path / "canary"
        ckpt = _copy(HERE / "torch_dist", tmp_path)
        fqn = next(k for k in cs.read_metadata(ckpt).state_dict_metadata if k.startswith("rng_state"))
        plant_byte_object(ckpt, fqn, torch_saved(SystemPayload(canary)))
        for cap in (cs.MAX_SCANNED_OBJECT_BYTES, 0):  # refused by the pre-check, then inside megatron's load
            monkeypatch.setattr(cs, "MAX_SCANNED_OBJECT_BYTES", cap)
            with pytest.raises(cs.CheckpointRefused) as refused:
                load_checkpoint(str(ckpt), model=model, seed=7, restore_rng=False)
            assert refused.value.global_name == ("posix", "system") and ".distcp" in refused.value.path
        assert not canary.exists()
    assert not os.path.exists(canary)


@pytest.mark.parametrize("damage", ["payload", "truncated"])
def test_train_py_check_refuses_to_resume_from_a_hostile_or_truncated_index_with_exit_2(tmp_path, monkeypatch,
                                                                                      capsys, damage) -> None:
    import warnings

    from dlmspec.backends.megatron import checks, training
    from dlmspec.render.compile import compile_spec

    out = tmp_path / "compiled"
    compile_spec(ROOT / "specs" / "demo-dlm.toml", out, force=True,
                 overrides=["data.mock=true", "data.train=[]", "data.valid=[]",
                            "data.tokenizer.type=\"NullTokenizer\"", "data.tokenizer.vocab_size=50256"])
    spec = importlib.util.spec_from_file_location("hostile_resume_train", out / "train.py")
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec.loader.exec_module(module)
    canary = tmp_path / "canary"
    ckpt = _copy(HERE / "torch_dist", tmp_path)
    if damage == "payload":
        index = write_metadata_payload(ckpt, payloads(canary)["os.system"])
    else:
        index = ckpt / ".metadata"
        index.write_bytes(index.read_bytes()[:100])
    monkeypatch.setattr(checks, "start_point", lambda config: (str(ckpt), None))
    monkeypatch.setattr(checks, "check_resume", lambda *a, **k: None)  # the spec record is another test's

    def started(*args, **kwargs):
        raise AssertionError("megatron-core was started")

    monkeypatch.setattr(training, "initialize_distributed", started)
    monkeypatch.setattr("sys.argv", ["train.py", "--check"])
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(SystemExit) as exit_, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert f"train.py: cannot resume: {index}" in err and "Traceback" not in err
    if damage == "payload":
        assert "('posix', 'system')" in err
    else:
        assert "truncated or corrupt" in err
    assert not canary.exists()


def test_a_truncated_index_is_named_as_such_not_as_a_refused_global(tmp_path) -> None:
    ckpt = _copy(HERE / "torch_dist", tmp_path)
    data = (ckpt / ".metadata").read_bytes()
    (ckpt / ".metadata").write_bytes(data[: len(data) // 2])
    with pytest.raises((pickle.UnpicklingError, EOFError)):
        cs.read_metadata(ckpt)


@pytest.mark.parametrize("kind", ["index", "stored-object"])
def test_init_from_refuses_a_hostile_megatron_checkpoint_on_every_rank(tmp_path_factory, tmp_path, monkeypatch,
                                                                       kind) -> None:
    from cpu_world_kit import megatron_cpu_world

    from dlmspec.backends.megatron.init_from import InitFromError, initialize_from

    canary = tmp_path / "canary"
    ckpt = _copy(HERE / "torch_dist", tmp_path)
    if kind == "index":
        bad = write_metadata_payload(ckpt, payloads(canary)["os.system"])
    else:
        fqn = next(k for k in cs.read_metadata(ckpt).state_dict_metadata if k.startswith("rng_state"))
        bad = plant_byte_object(ckpt, fqn, torch_saved(SystemPayload(canary)))
    with megatron_cpu_world(tmp_path_factory, monkeypatch):
        model = _fixture_writer()._tiny_model()
        with pytest.raises(InitFromError) as refused:
            initialize_from(f"mcore:{ckpt}", model=model, cache_dir=str(tmp_path / "cache"),
                            transformer_config=model[0].config, model_kwargs={})
    assert str(bad) in str(refused.value) and "('posix', 'system')" in str(refused.value)
    assert not canary.exists()
