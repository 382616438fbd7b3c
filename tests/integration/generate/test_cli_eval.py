"""`dlmspec eval` (dlmspec/cli/generate.py) on tiny runtime checkpoints: the ELBO bound (both
estimators), the AR perplexity and the multiple-choice accuracy equal the library functions' for the
same seed; every bad input is exit code 2 naming the flag, the value and a fix."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dlmspec.cli import main
from tiny_ckpt import TEXTS, tiny_runs, write_dataset  # noqa: F401 (a fixture)

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)

SEQ, N, SAMPLES = 16, 4, 6


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return write_dataset(root / "valid_text_document", TEXTS)


@pytest.fixture(scope="module")
def choices(tmp_path_factory):
    path = tmp_path_factory.mktemp("choices") / "mc.jsonl"
    items = [{"context": "The sky is", "choices": [" blue", " green today"], "label": 0},
             {"context": "One, two,", "choices": [" three", " dog", " x"], "label": 2},
             {"context": "", "choices": [" Hello", " world"], "label": 1}]
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path, items


def run_json(capsys, *args: str):
    capsys.readouterr()
    code = main(["eval", *args, "--device", "cpu", "--json"])
    return code, json.loads(capsys.readouterr().out)


def windows(prefix):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    data = IndexedDataset(str(prefix))
    flat = torch.cat([torch.from_numpy(data[i].astype("int64")) for i in range(len(data))])
    return flat[: N * SEQ].view(N, SEQ)


def test_the_elbo_of_both_estimators_is_the_librarys(tiny_runs, data, capsys):
    from dlmspec.backends.generate.likelihood import elbo_nll, merge_elbo_results
    from dlmspec.backends.generate.load import load_model

    run_dir = tiny_runs["mdm"][0]
    prefix = str(data).removesuffix("_text_document")  # the prefix given to data prepare is accepted too
    code, env = run_json(capsys, str(run_dir), "--data", prefix, "--seq-length", str(SEQ), "--num-sequences", str(N),
                         "--num-samples", str(SAMPLES), "--samples-per-forward", "4", "--estimator", "both",
                         "--batch-size", "2", "--seed", "7")
    assert code == 0, env
    r = env["result"]
    assert r["data"]["prefix"] == str(data) and r["data"]["num_sequences"] == N
    assert r["settings"]["default_estimator"] == "count"
    model = load_model(str(run_dir), device="cpu")
    try:
        x = windows(data)
        for estimator in ("count", "time"):
            gen = torch.Generator().manual_seed(7)
            parts = [elbo_nll(model.logits_fn, x[i:i + 2], mask_token_id=model.mask_token_id, generator=gen,
                              estimator=estimator, num_samples=SAMPLES, samples_per_forward=4) for i in range(0, N, 2)]
            want = merge_elbo_results(parts).total()
            got = r["elbo"][estimator]
            assert got["nll_per_token"] == pytest.approx(want["nll_per_token"], rel=1e-9)
            assert got["stderr_per_token"] == pytest.approx(want["stderr_per_token"], rel=1e-9)
            assert (got["num_samples"], got["num_sequences"], got["num_tokens"]) == (SAMPLES, N, N * SEQ)
            assert got["stderr_per_token"] > 0
            # an untrained model is near uniform over GPT-2's 50257 ids
            assert abs(got["nll_per_token"] - math.log(50257)) < 3
    finally:
        model.close()


def test_the_ar_perplexity_is_the_librarys(tiny_runs, data, capsys):
    from dlmspec.backends.generate.likelihood import ar_nll
    from dlmspec.backends.generate.load import load_model

    run_dir = tiny_runs["ar"][0]
    code, env = run_json(capsys, str(run_dir), "--data", str(data), "--seq-length", str(SEQ), "--num-sequences", str(N))
    assert code == 0, env
    model = load_model(str(run_dir), device="cpu")
    try:
        want = ar_nll(model.logits_fn, windows(data)).total()
    finally:
        model.close()
    got = env["result"]["ar"]
    assert got["nll_per_token"] == pytest.approx(want["nll_per_token"], rel=1e-6)
    assert got["perplexity"] == pytest.approx(want["perplexity"], rel=1e-6) and got["num_tokens"] == want["num_tokens"]


@pytest.mark.parametrize("kind", ["mdm", "ar"])
def test_multiple_choice_is_the_librarys_with_a_wilson_interval(tiny_runs, choices, capsys, kind):
    from dlmspec.backends.generate.likelihood import multiple_choice, wilson_interval
    from dlmspec.backends.generate.load import load_model

    path, items = choices
    run_dir = tiny_runs[kind][0]
    code, env = run_json(capsys, str(run_dir), "--choices", str(path), "--num-samples", "4", "--seed", "1")
    assert code == 0, env
    got = env["result"]["choices"]
    model = load_model(str(run_dir), device="cpu")
    try:
        tokenized = []
        for i in items:  # lm-eval's split: the continuation is encode(context + choice) after encode(context)
            context = model.encode(i["context"])
            choices = [model.encode(i["context"] + c)[len(context):] for c in i["choices"]]
            tokenized.append({"context": context or ([model.eos_token_id] if kind == "ar" else []),
                              "choices": choices, "label": i["label"]})
        extra = dict(num_samples=4) if kind == "mdm" else {}
        want = multiple_choice(model.logits_fn, tokenized, kind=kind, mask_token_id=model.mask_token_id,
                               seed=1, **extra)  # a generator seeded with 1 for every choice
    finally:
        model.close()
    assert got["predictions"] == want.predictions and got["accuracy"] == want.accuracy
    assert [x for row in got["nll"] for x in row] == pytest.approx([x for row in want.nll for x in row], abs=1e-9)
    assert "every choice" in got["seeding"]
    correct = sum(p == y for p, y in zip(want.predictions, want.labels))
    assert got["interval_95"] == pytest.approx(list(wilson_interval(correct, 3))) and got["interval_method"] == "wilson"


def test_every_bad_input_exits_2_naming_the_flag_the_value_and_a_remedy(tiny_runs, data, choices, capsys, tmp_path):
    from tiny_ckpt import write_dataset as write

    run = str(tiny_runs["mdm"][0])
    nolabel = tmp_path / "nolabel.jsonl"
    nolabel.write_text('{"context": "a", "choices": [" b", " c"], "label": 5}\n')
    onechoice = tmp_path / "one.jsonl"
    onechoice.write_text('{"context": "a", "choices": [" b"], "label": 0}\n')
    tiny = write(tmp_path / "tiny", ["Hi"])
    cases = [
        ([run], "--data", "nothing to score"),
        ([run, "--data", str(tmp_path / "nope")], "--data", "no "),
        ([run, "--data", str(data), "--num-samples", "1"], "--num-samples", "out of range"),
        ([run, "--data", str(data), "--estimator", "best"], "--estimator", "not one of count, time, both"),
        ([run, "--data", str(data), "--eps", "1.0"], "--eps", "out of range"),
        ([run, "--data", str(data), "--seq-length", "1"], "--seq-length", "out of range"),
        ([run, "--data", str(data), "--seq-length", "256"], "--seq-length", "max_position_embeddings = 128"),
        ([run, "--data", str(tiny), "--seq-length", "16"], "--seq-length", "less than one window"),
        ([run, "--choices", str(nolabel)], "--choices", "\"label\" = 5"),
        ([run, "--choices", str(onechoice)], "--choices", "line 1 is not"),
        ([run, "--choices", str(tmp_path / "missing.jsonl")], "--choices", "does not exist"),
        ([str(tmp_path), "--data", str(data)], "RUN_OR_CHECKPOINT", "is not a checkpoint"),
    ]
    for args, key, why in cases:
        code, env = run_json(capsys, *args)
        assert code == 2 and env["ok"] is False, (args, env)
        (issue,) = env["issues"]
        assert issue["key"] == key and why in issue["message"] and issue["hint"], (args, issue)


def _recording_bars(monkeypatch):
    """Record every progress bar `eval` makes, its stderr a terminal writing into a buffer."""
    import io

    from rich.console import Console

    from dlmspec.cli import generate as cli

    bars = []
    real = cli._progress

    def recording(total, label):
        bar, task = real(total, label)
        bars.append((label, bar, task, total))
        return bar, task

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    monkeypatch.setattr(cli, "_progress", recording)
    monkeypatch.setattr(cli, "stderr", lambda: console)
    monkeypatch.setattr(cli.sys.stderr, "isatty", lambda: True, raising=False)
    return bars, buf, cli


def test_long_evaluations_show_progress_bars_on_a_terminal(tiny_runs, data, choices, capsys, monkeypatch):
    """the "progress bars on long evaluation": on a terminal (stderr) each ELBO estimator and
    the multiple choice get a bar that reaches its total (batches, items); off a terminal none is drawn."""
    bars, buf, cli = _recording_bars(monkeypatch)
    code, env = run_json(capsys, str(tiny_runs["mdm"][0]), "--data", str(data), "--seq-length", str(SEQ),
                         "--num-sequences", str(N), "--num-samples", "2", "--batch-size", "2", "--estimator", "both",
                         "--choices", str(choices[0]))
    assert code == 0, env
    assert [(label, total) for label, _, _, total in bars] == [("ELBO (count)", 2), ("ELBO (time)", 2), ("choices", 3)]
    assert all(bar.tasks[0].completed == total for _, bar, _, total in bars)
    drawn = buf.getvalue()
    assert "ELBO (count)" in drawn and "choices" in drawn
    # off a terminal: nothing drawn
    bars.clear()
    buf.truncate(0)
    buf.seek(0)
    monkeypatch.setattr(cli.sys.stderr, "isatty", lambda: False, raising=False)
    code, env = run_json(capsys, str(tiny_runs["mdm"][0]), "--choices", str(choices[0]), "--num-samples", "2")
    assert code == 0 and bars and buf.getvalue() == ""


def test_the_ar_perplexity_shows_a_progress_bar_over_its_batches(tiny_runs, data, capsys, monkeypatch):
    bars, buf, _ = _recording_bars(monkeypatch)
    code, env = run_json(capsys, str(tiny_runs["ar"][0]), "--data", str(data), "--seq-length", str(SEQ),
                         "--num-sequences", str(N), "--batch-size", "2")
    assert code == 0, env
    assert [(label, total) for label, _, _, total in bars] == [("perplexity (AR)", 2)]
    assert bars[0][1].tasks[0].completed == 2 and "perplexity (AR)" in buf.getvalue()


def test_data_naming_a_sharded_output_says_to_pass_one_shard(capsys, tmp_path):
    """`--data` of a sharded `data prepare` output (its manifest, the manifest's prefix or the
    --output-prefix) is refused naming its first shard, not with "no PREFIX.bin"."""
    shard = tmp_path / "web-00000_text_document"
    for ext in (".bin", ".idx"):
        (tmp_path / f"web-00000_text_document{ext}").write_bytes(b"")
    manifest = tmp_path / "web_text_document.manifest.json"
    manifest.write_text(json.dumps({"kind": "dlmspec-dataset-manifest", "version": 1,
                                    "shards": [{"path": shard.name, "documents": 1, "tokens": 4}]}))
    for data in (str(manifest), str(tmp_path / "web_text_document"), str(tmp_path / "web")):
        code = main(["eval", str(tmp_path), "--data", data, "--json"])
        (issue,) = json.loads(capsys.readouterr().out)["issues"]
        assert code == 2 and issue["key"] == "--data" and "sharded" in issue["message"], (data, issue)
        assert f"--data {shard}" in issue["hint"], (data, issue)


def test_every_bad_flag_is_reported_at_once_and_a_choice_says_its_choices(capsys, tmp_path):
    """Several bad eval flags are reported together (before any checkpoint is read), and a flag
    that takes one of a few words says so instead of "out of range" (a new user's finding); a --data
    prefix that does not exist is in the same table."""
    code = main(["eval", str(tmp_path), "--data", "x", "--estimator", "foo", "--num-samples", "1",
                 "--normalize", "median", "--json"])
    issues = json.loads(capsys.readouterr().out)["issues"]
    assert code == 2
    by_key = {i["key"]: i for i in issues}
    assert set(by_key) == {"--estimator", "--num-samples", "--normalize", "--data"}, issues
    assert "not one of count, time, both" in by_key["--estimator"]["message"]
    assert "not one of sum, mean" in by_key["--normalize"]["message"]
    assert by_key["--num-samples"]["message"] == "out of range"


def test_data_whose_index_contradicts_itself_is_refused_naming_the_entry(tiny_runs, data, capsys, tmp_path):
    """`eval --data` checks the index before scoring it: a negative sequence length is exit 2
    naming the entry, never a score of nonsense."""
    import shutil
    import struct

    forged = tmp_path / "forged_text_document"
    shutil.copy(f"{data}.bin", f"{forged}.bin")
    idx = bytearray(open(f"{data}.idx", "rb").read())
    header = 9 + 8 + 1 + 8 + 8  # magic, version, dtype code, sequence count, document count
    idx[header:header + 4] = struct.pack("<i", -20)
    open(f"{forged}.idx", "wb").write(bytes(idx))
    code, env = run_json(capsys, str(tiny_runs["mdm"][0]), "--data", str(forged), "--seq-length", str(SEQ),
                         "--num-sequences", str(N))
    assert code == 2, env
    (issue,) = env["issues"]
    assert issue["key"] == "--data" and "-20" in issue["message"] and issue["hint"], issue


def test_a_gpu_out_of_memory_while_scoring_exits_2_naming_the_batch_size(tiny_runs, data, capsys, monkeypatch):
    """The GPU filling up (other processes, a batch too large) is exit code 2 on ``--batch-size`` with a
    smaller one, never a traceback or a damaged-checkpoint hint."""
    import dlmspec.backends.generate.likelihood as likelihood

    def full(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 786.00 MiB. GPU 0 has a total capacity "
                                     "of 79.18 GiB of which 718.94 MiB is free.")

    monkeypatch.setattr(likelihood, "ar_nll", full)
    code, env = run_json(capsys, str(tiny_runs["ar"][0]), "--data", str(data), "--seq-length", str(SEQ),
                         "--num-sequences", str(N), "--batch-size", "8")
    assert code == 2 and env["ok"] is False
    (issue,) = env["issues"]
    assert issue["key"] == "--batch-size" and issue["value"] == 8
    assert "ran out of memory" in issue["message"] and "786.00 MiB" in issue["message"]
    assert "--batch-size 4" in issue["hint"] and "--device cpu" in issue["hint"]


@pytest.mark.parametrize("exc, expected", [
    (RuntimeError("CUDA error: out of memory\nSearch for `cudaErrorMemoryAllocation'"), True),
    (RuntimeError("NCCL error ... ncclUnhandledCudaError: Call to CUDA function failed. Last error: Failed to CUDA "
                  "calloc async 24 bytes"), True),
    (RuntimeError("Error(s) in loading state_dict: size mismatch for embedding"), False),
    (OSError("No such file or directory: 'common.pt'"), False),
])
def test_out_of_memory_is_told_from_a_damaged_checkpoint(exc, expected):
    from dlmspec.backends.generate.checkpoint import is_out_of_memory

    assert is_out_of_memory(exc) is expected
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory.")) is True


def test_a_gpu_out_of_memory_while_loading_says_so_not_that_the_checkpoint_is_damaged(tiny_runs, data, capsys,
                                                                                     monkeypatch):
    import dlmspec.backends.megatron.init_from as init_from

    def full(*args, **kwargs):
        raise RuntimeError("NCCL error in: NCCLUtils.cpp:93, unhandled cuda error, ncclUnhandledCudaError: Call to "
                           "CUDA function failed. Last error: Failed to CUDA calloc async 24 bytes")

    monkeypatch.setattr(init_from, "load_model_weights", full)
    code, env = run_json(capsys, str(tiny_runs["ar"][0]), "--data", str(data))
    assert code == 2
    issue = next(i for i in env["issues"] if i["rule"] == "generate-load")
    assert "ran out of memory" in issue["message"] and "damaged" not in issue["hint"]
    assert "--device cpu" in issue["hint"]


def test_every_input_problem_before_loading_is_reported_at_once(capsys, tmp_path):
    """As `generate` does: the --task generation flags, --spec's [generate] table and a run that does not
    exist, in one table before a checkpoint is read."""
    task = tmp_path / "task.jsonl"
    task.write_text(json.dumps({"prompt": " 1 + 2 =", "answer": " 3"}) + "\n")
    spec = tmp_path / "gen.toml"
    spec.write_text('name = "x"\n[model]\npreset = "qwen3-0.6b"\n[train]\nseq_length = 64\n'
                    '[generate]\ncache = "duel"\n')
    code, env = run_json(capsys, str(tmp_path / "nowhere"), "--task", str(task), "--remasking", "bogus",
                         "--gen-length", "0", "--spec", str(spec))
    assert code == 2
    keys = {i["key"] for i in env["issues"]}
    assert {"--remasking", "--gen-length", "generate.cache", "RUN_OR_CHECKPOINT"} <= keys, env["issues"]
