"""The comments of a compiled train.py say what the resolved spec holds: after ``--set``
changes the tokenizer, the GPU count, the recomputation or the seed, every comment that prints
a spec value prints the new one, and the vocabulary comment names where its number comes from
(``model.vocab_size``; the tokenizer's own count only where the spec says it)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dlmspec.check import load_for
from dlmspec.cli import main
from dlmspec.cli.commands import app
from dlmspec.spec.load import load


def _starter(tmp_path: Path) -> Path:
    spec = tmp_path / "q.toml"
    result = CliRunner().invoke(app, ["new", str(spec), "--preset", "qwen3-0.6b"])
    assert result.exit_code == 0, result.output
    return spec


def _compile(tmp_path: Path, spec: Path, *sets: str) -> str:
    out = tmp_path / "out"
    args = [a for s in sets for a in ("--set", s)]
    assert main(["compile", str(spec), "-o", str(out), "--force", *args]) == 0
    return (out / "train.py").read_text(encoding="utf-8")


def _comment(train: str, code: str) -> str:
    """The comment at the end of the line of train.py that starts (indentation aside) with ``code``."""
    (line,) = [ln for ln in train.splitlines() if ln.strip().startswith(code) and "  # " in ln]
    return line.partition("  # ")[2]


def test_comments_follow_a_tokenizer_set_on_the_command_line(tmp_path: Path) -> None:
    spec = _starter(tmp_path)
    plain = _compile(tmp_path, spec)
    # the starter's mock NullTokenizer(vocab_size = 151934): 151935 ids, one row left for [MASK]
    assert _comment(plain, "vocab_size=151936,") == (
        "model.vocab_size 151936 (NullTokenizer: 151935 ids), padded to a multiple of 128 x TP 1")
    assert "# tokenizer: NullTokenizer, vocab_size = 151934" in plain

    sets = ('data.tokenizer.type="GPT2BPETokenizer"', 'data.tokenizer.vocab_file="v.json"',
            'data.tokenizer.merge_file="m.txt"', "data.mock=false", 'data.train=["d/x_text_document"]',
            "cluster.nodes=2", 'recompute.granularity="selective"', "train.seed=7", 'cluster.gpu="h200"',
            "model.num_layers=24")
    train = _compile(tmp_path, spec, *sets)
    # GPT-2's BPE has 50257 ids; the embedding keeps model.vocab_size's 151936 rows
    assert _comment(train, "vocab_size=151936,") == (
        "model.vocab_size 151936 (GPT2BPETokenizer: 50257 ids), padded to a multiple of 128 x TP 1")
    assert "tokenizer 151936" not in train
    # the tokenizer comment lists what GPT-2's BPE reads, not the NullTokenizer size left behind
    (tokenizer,) = [ln.strip() for ln in train.splitlines() if ln.strip().startswith("# tokenizer:")]
    assert tokenizer == "# tokenizer: GPT2BPETokenizer, vocab_file = 'v.json', merge_file = 'm.txt'"
    assert _comment(train, "eod_id=50256,") == "<|endoftext|> of the GPT-2 BPE vocabulary"
    # every other comment that prints a spec value prints the --set one
    assert "[cluster] nodes 2 x gpus_per_node 8." in train
    assert "Data parallel = 16 / (TP 1 x PP 1 x CP 1) = 16; expert data parallel = 16." in train
    mb = load(spec).spec.train.micro_batch_size  # the starter's (dlmspec new picks the fastest)
    assert _comment(train, "global_batch_size=256,") == f"{256 // (16 * mb)} microbatch(es) per step per data-parallel rank"
    assert "# [recompute] granularity = 'selective'" in train
    assert _comment(train, "init_from=None,") == "random initialisation (seed 7)"
    assert "H200" in _comment(train, "peak_tflops_per_gpu=")
    params = load_for("validate", spec, list(sets))[1].params
    assert f"# [model]: {params.total:,} parameters ({params.non_embedding:,} outside the embeddings)" in train
    assert f"{params.total:,} parameters" not in plain


def test_a_null_tokenizer_smaller_than_the_embedding_says_both(tmp_path: Path) -> None:
    spec = _starter(tmp_path)
    train = _compile(tmp_path, spec, "data.tokenizer.vocab_size=50000")
    assert _comment(train, "vocab_size=151936,") == (
        "model.vocab_size 151936 (NullTokenizer: 50001 ids), padded to a multiple of 128 x TP 1")
    assert "# tokenizer: NullTokenizer, vocab_size = 50000" in train


def test_a_tokenizer_whose_size_the_spec_does_not_say_names_the_model_key(tmp_path: Path) -> None:
    spec = _starter(tmp_path)
    train = _compile(tmp_path, spec, 'data.tokenizer.type="HuggingFaceTokenizer"', 'data.tokenizer.model="org/tok"',
                     "data.tokenizer.eod_id=151643")
    assert _comment(train, "vocab_size=151936,") == "model.vocab_size 151936, padded to a multiple of 128 x TP 1"
    (tokenizer,) = [ln.strip() for ln in train.splitlines() if ln.strip().startswith("# tokenizer:")]
    assert tokenizer == "# tokenizer: HuggingFaceTokenizer, model = 'org/tok'"
