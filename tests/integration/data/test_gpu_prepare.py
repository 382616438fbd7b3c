"""bench/gpu/prepare.py makes what the demo spec reads from the offline kit (../shared/data): the
GPU machine has no network, so README's `hf download` and `data prepare --hf-dataset` cannot run
there; the GPT-2 files are copied to the spec's tokenizer paths and the Python docs corpus is
prepared into the spec's data prefixes."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

from bench_scripts import load_script

from dlmspec.data.prepare import prepare
import pytest  # noqa: E402
from shared_kit import SHARED_DATA  # noqa: E402

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)

ROOT = Path(__file__).resolve().parents[3]
SHARED = SHARED_DATA
DEMO = ROOT / "specs" / "demo-dlm.toml"


def _kit(root: Path) -> Path:
    """A copy of the shared kit with a 3-document corpus per split."""
    shared = root / "shared" / "data"
    shutil.copytree(SHARED / "tokenizers" / "gpt2", shared / "tokenizers" / "gpt2")
    (shared / "corpus").mkdir(parents=True)
    for split in ("train", "valid"):
        with (SHARED / "corpus" / f"pydocs-{split}.jsonl").open(encoding="utf-8") as src:
            lines = [next(src) for _ in range(3)]
        (shared / "corpus" / f"pydocs-{split}.jsonl").write_text("".join(lines), encoding="utf-8")
    return shared


def test_gpu_prepare_makes_the_demo_inputs_from_the_offline_kit(tmp_path):
    gpu = load_script(ROOT / "bench" / "gpu" / "prepare.py", "bench_gpu_prepare")
    shared = _kit(tmp_path)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    done = gpu.demo_inputs(root=checkout, shared=shared, spec=DEMO, workers=1)
    assert len(done) == 4, done  # two tokenizer files, two datasets

    spec = tomllib.loads(DEMO.read_text(encoding="utf-8"))
    tok = spec["data"]["tokenizer"]
    for key, name in (("vocab_file", "vocab.json"), ("merge_file", "merges.txt")):
        assert (checkout / tok[key]).read_bytes() == (SHARED / "tokenizers" / "gpt2" / name).read_bytes()
    for split in ("train", "valid"):
        (entry,) = spec["data"][split]
        reference = tmp_path / f"ref-{split}"
        prepare(shared / "corpus" / f"pydocs-{split}.jsonl", reference, tokenizer_type="GPT2BPETokenizer",
                vocab_file=str(shared / "tokenizers" / "gpt2" / "vocab.json"),
                merge_file=str(shared / "tokenizers" / "gpt2" / "merges.txt"), append_eod=True)
        for ext in (".bin", ".idx"):
            made = (checkout / (entry["prefix"] + ext)).read_bytes()
            assert made == Path(f"{reference}_text_document{ext}").read_bytes(), (split, ext)

    assert gpu.demo_inputs(root=checkout, shared=shared, spec=DEMO, workers=1) == []  # all there
    (checkout / tok["vocab_file"]).write_text(json.dumps({"stale": 0}))
    assert gpu.demo_inputs(root=checkout, shared=shared, spec=DEMO, workers=1) == [
        f"copied {shared / 'tokenizers' / 'gpt2' / 'vocab.json'} -> {checkout / tok['vocab_file']}"]
