"""`dlmspec generate` (dlmspec/cli/generate.py) on a tiny runtime checkpoint: --json outputs equal the
sampler's for the same settings, every output records the settings and where each came from
(default < checkpoint lock < --spec < flag), AR runs decode left to right, and every bad input is
exit code 2 naming the flag or key, the value and a fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dlmspec.cli import main
from tiny_ckpt import EOD, MASK, tiny_runs  # noqa: F401 (a fixture)

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)

ROOT = Path(__file__).resolve().parents[3]


def run_json(capsys, *args: str):
    capsys.readouterr()
    code = main(["generate", *args, "--device", "cpu", "--json"])
    return code, json.loads(capsys.readouterr().out)


def library(run_dir, prompts, **settings):
    """What the sampler gives for the same model and settings (the CLI's seed for batch 0)."""
    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.load import load_model
    from dlmspec.backends.generate.sampler import generate, generate_ar

    model = load_model(str(run_dir), device="cpu")
    try:
        config = GenerateConfig(kind=model.kind, mask_token_id=model.mask_token_id, eos_token_id=model.eos_token_id,
                                **settings)
        ids = [model.encode(p) for p in prompts]
        sampler = generate if model.kind == "mdm" else generate_ar
        return sampler(model.logits_fn, ids, config, generator=torch.Generator().manual_seed(config.seed))
    finally:
        model.close()


def test_json_outputs_are_the_samplers_and_record_their_settings(tiny_runs, capsys):
    run_dir = tiny_runs["mdm"][0]
    prompts = ["The quick brown fox", "Hello"]
    code, env = run_json(capsys, str(run_dir), "--prompt", prompts[0], "--prompt", prompts[1], "--steps", "4",
                         "--temperature", "0.7", "--seed", "3")
    assert code == 0 and env["ok"] and env["command"] == "generate", env
    result = env["result"]
    # gen_length 16 and block_length 8 come from the checkpoint's spec.lock.toml [generate]; steps is the flag's
    assert result["origins"]["gen_length"] == "checkpoint" and result["origins"]["block_length"] == "checkpoint"
    assert result["origins"]["steps"] == "flag" and result["origins"]["remasking"] == "default"
    assert result["origins"]["mask_token_id"] == "model" and result["settings"]["mask_token_id"] == MASK
    settings = result["settings"]
    assert (settings["gen_length"], settings["steps"], settings["block_length"], settings["seed"]) == (16, 4, 8, 3)
    assert all(out["settings"] == settings for out in result["outputs"])
    expected = library(run_dir, prompts, gen_length=16, steps=4, block_length=8, temperature=0.7, seed=3)
    assert [o["ids"] for o in result["outputs"]] == expected.generated
    assert [o["finish_reason"] for o in result["outputs"]] == expected.finish_reasons
    assert result["forward_passes"] == expected.forward_passes == 4
    assert result["model"]["iteration"] == 10 and result["model"]["kind"] == "mdm"
    assert all(MASK not in o["ids"] for o in result["outputs"])


def test_a_flag_beats_the_spec_which_beats_the_checkpoint(tiny_runs, capsys, tmp_path):
    spec = tmp_path / "gen.toml"
    spec.write_text(f'extends = "{ROOT / "specs" / "demo-dlm.toml"}"\n[generate]\ngen_length = 8\nblock_length = 4\n'
                    'steps = 8\nremasking = "random"\n')
    code, env = run_json(capsys, str(tiny_runs["mdm"][0]), "--prompt", "Hi", "--spec", str(spec), "--steps", "2")
    assert code == 0, env
    r = env["result"]
    assert (r["settings"]["gen_length"], r["settings"]["block_length"], r["settings"]["steps"]) == (8, 4, 2)
    assert r["settings"]["remasking"] == "random"
    assert (r["origins"]["gen_length"], r["origins"]["steps"], r["origins"]["threshold"]) == ("spec", "flag", "default")
    assert r["sources"] == {"checkpoint": str(tiny_runs["mdm"][1] / "spec.lock.toml"), "spec": str(spec)}


def test_an_ar_run_decodes_left_to_right(tiny_runs, capsys):
    run_dir = tiny_runs["ar"][0]
    code, env = run_json(capsys, str(run_dir), "--prompt", "The quick brown fox", "--gen-length", "6")
    assert code == 0, env
    r = env["result"]
    assert r["model"]["kind"] == "ar" and r["settings"]["mask_token_id"] is None
    # megatron-core's KV cache (GPTKVCacheStep), which gives the full recompute's tokens
    assert r["settings"]["kv_cache"] is True and r["settings"]["kv_cache_fallback"] is None
    assert "KV cache" in r["settings"]["decoding"]
    expected = library(run_dir, ["The quick brown fox"], gen_length=6)
    assert r["outputs"][0]["ids"] == expected.generated[0]
    # --no-kv-cache: the full recompute, said so, the same tokens
    code, env = run_json(capsys, str(run_dir), "--prompt", "The quick brown fox", "--gen-length", "6", "--no-kv-cache")
    assert code == 0, env
    s = env["result"]["settings"]
    assert s["kv_cache"] is False and "--no-kv-cache" in s["kv_cache_fallback"] and "full recompute" in s["decoding"]
    assert env["result"]["outputs"][0]["ids"] == expected.generated[0]


def test_an_mdm_run_records_that_it_has_no_kv_cache(tiny_runs, capsys):
    code, env = run_json(capsys, str(tiny_runs["mdm"][0]), "--prompt", "Hi", "--steps", "4")
    assert code == 0, env
    s = env["result"]["settings"]
    assert s["kv_cache"] is False and "bidirectional" in s["kv_cache_fallback"]


def test_a_prompts_file_of_text_and_ids_is_batched(tiny_runs, capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "One"}\n\n{"prompt_ids": [464, 2068]}\n{"prompt": "Two three"}\n')
    code, env = run_json(capsys, str(tiny_runs["mdm"][0]), "--prompts", str(prompts), "--batch-size", "2",
                         "--gen-length", "4", "--block-length", "4", "--steps", "2")
    assert code == 0, env
    outs = env["result"]["outputs"]
    assert [o["prompt"] for o in outs] == ["One", None, "Two three"]
    assert outs[1]["prompt_ids"] == [464, 2068] and outs[1]["prompt_text"] == "The quick"
    assert [(o["batch"], o["seed"]) for o in outs] == [(0, 0), (0, 0), (1, 2)]  # batch b draws from seed + first row


def test_the_terminal_output_shows_text_and_settings(tiny_runs, capsys):
    code = main(["generate", str(tiny_runs["mdm"][0]), "--prompt", "The", "--device", "cpu", "--no-stream"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("The") and "settings: kind = mdm, gen_length = 16" in out and "forward passes" in out


def _bad(tmp_path: Path, run_dir: Path) -> list[tuple[list[str], str, str]]:
    notjson = tmp_path / "bad.jsonl"
    notjson.write_text('{"prompt": "ok"}\nnot json\n')
    noprompt = tmp_path / "noprompt.jsonl"
    noprompt.write_text('{"text": "wrong key"}\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    badspec = tmp_path / "badgen.toml"
    badspec.write_text(f'extends = "{ROOT / "specs" / "demo-dlm.toml"}"\n[generate]\ngen_length = 16\nblock_length = 5\n')
    typo = tmp_path / "typo.toml"
    typo.write_text(f'extends = "{ROOT / "specs" / "demo-dlm.toml"}"\n[generate]\nsteps = 0\n')
    r = str(run_dir)
    return [
        ([r], "--prompt", "give the prompts one way"),
        ([r, "--prompt", "a", "--prompts", str(notjson)], "--prompt", "both given"),
        ([r, "--prompt", ""], "--prompt", "empty"),
        ([r, "--prompts", str(tmp_path / "missing.jsonl")], "--prompts", "does not exist"),
        ([r, "--prompts", str(notjson)], "--prompts", "line 2 is not JSON"),
        ([r, "--prompts", str(noprompt)], "--prompts", "line 1 has neither"),
        ([r, "--prompts", str(empty)], "--prompts", "holds no prompt"),
        ([r, "--prompt", "a", "--block-length", "3"], "--block-length", "must divide gen_length = 16"),
        ([r, "--prompt", "a", "--remasking", "best"], "--remasking", "not a remasking rule"),
        ([r, "--prompt", "a", "--threshold", "1.5"], "--threshold", "(0, 1]"),
        ([r, "--prompt", "a", "--top-p", "0"], "--top-p", "(0, 1]"),
        ([r, "--prompt", "a", "--steps", "5"], "--steps", "multiple of the number of blocks"),
        ([r, "--prompt", "a", "--spec", str(badspec)], "generate.block_length", "must divide gen_length = 16"),
        ([r, "--prompt", "a", "--spec", str(tmp_path / "missing.toml")], "<file>", "file not found"),
        ([r, "--prompt", "a", "--spec", str(typo)], "generate.steps", "wrong type or out of range"),
        ([r, "--prompt", "a", "--gen-length", "200", "--block-length", "200", "--steps", "200"], "--gen-length",
         "max_position_embeddings = 128"),
        ([r, "--prompt", "a", "--batch-size", "0"], "--batch-size", ">= 1"),
        ([r, "--prompt", "a", "--kind", "gpt"], "--kind", "not a kind the sampler takes"),
        ([r, "--prompt", "a", "--dtype", "fp8"], "--dtype", "not a dtype"),
        ([str(tmp_path), "--prompt", "a"], "RUN_OR_CHECKPOINT", "is not a checkpoint"),
        ([str(tmp_path / "nowhere"), "--prompt", "a"], "RUN_OR_CHECKPOINT", "does not exist"),
    ]


def test_every_bad_input_exits_2_naming_the_flag_the_value_and_a_remedy(tiny_runs, capsys, tmp_path):
    for args, key, why in _bad(tmp_path, tiny_runs["mdm"][0]):
        code, env = run_json(capsys, *args)
        assert code == 2 and env["ok"] is False and env["result"] is None, (args, env)
        (issue,) = env["issues"]
        assert issue["key"] == key and why in issue["message"] and issue["hint"], (args, issue)
        if key == "--block-length":
            assert issue["value"] == 3 and issue["hint"] == "use --block-length 2"
        if key.startswith("generate."):  # the --spec file's line of the key
            assert issue["file"].endswith(("badgen.toml", "typo.toml")) and issue["line"] in (3, 4), issue
    # without --json: the issue table on stderr, nothing on stdout, no traceback
    code = main(["generate", str(tiny_runs["mdm"][0]), "--prompt", "a", "--block-length", "3", "--device", "cpu"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and "--block-length" in captured.err and "Traceback" not in captured.err


def test_streaming_redraws_the_canvas_with_masks_shown(tiny_runs, capsys):
    from dlmspec.cli.generate import render_canvas

    class Decoder:
        def decode(self, ids):
            return "".join(f"<{i}>" for i in ids)

    assert render_canvas(Decoder(), [1, 2, MASK, 3, MASK, MASK], MASK) == "<1><2>\u2591<3>\u2591\u2591"
    code = main(["generate", str(tiny_runs["mdm"][0]), "--prompt", "The", "--device", "cpu", "--stream"])
    assert code == 0 and "settings:" in capsys.readouterr().out


@pytest.mark.parametrize("threshold", [None, 0.3])
def test_the_benchs_peer_loop_is_the_same_algorithm_as_the_sampler(threshold):
    """bench/sampling/generate_demo.py times LLaDA's generate.py loop beside backends/generate: greedy, they
    commit the same tokens (the mask token's logit at -inf in both, as the sampler sets it)."""
    from bench_scripts import load_script
    from tiny_lm import TinyTransformer

    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.sampler import generate

    bench = load_script("bench/sampling/generate_demo.py", "generate_demo_bench")
    vocab, mask = 12, 11
    tiny = TinyTransformer(vocab, seed=4)

    def logits_fn(tokens, attention_mask=None):
        out = tiny(tokens, attention_mask)
        out[..., mask] = float("-inf")
        return out

    prompts = torch.tensor([[1, 2, 3], [4, 5, 6]])
    config = GenerateConfig(gen_length=8, steps=4, block_length=4, mask_token_id=mask,
                            remasking="threshold" if threshold else "low_confidence", threshold=threshold or 0.9)
    ours = generate(logits_fn, prompts, config)
    theirs, passes = bench.peer_generate(logits_fn, prompts, steps=4, gen_length=8, block_length=4, mask_id=mask,
                                         threshold=threshold)
    assert torch.equal(ours.sequences, theirs) and ours.forward_passes == passes


def test_a_cuda_device_without_a_gpu_names_the_device_flag(tiny_runs, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    capsys.readouterr()
    code = main(["generate", str(tiny_runs["mdm"][0]), "--prompt", "a", "--device", "cuda", "--json"])
    (issue,) = json.loads(capsys.readouterr().out)["issues"]
    assert code == 2 and issue["key"] == "--device" and "no CUDA device" in issue["message"] and issue["hint"]


def _terminal(monkeypatch):
    """stdout as a terminal of 120 columns writing into a buffer (what a user's terminal receives)."""
    import io

    from rich.console import Console

    from dlmspec.cli import generate as cli

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120, highlight=False, emoji=False)
    monkeypatch.setattr(cli, "stdout", lambda: console)
    return buf


@pytest.mark.parametrize("kind", ["mdm", "ar"])
def test_streaming_to_a_terminal_redraws_the_text_after_every_step(tiny_runs, capsys, monkeypatch, kind):
    """the "stream to the terminal": with --stream the canvas is redrawn after each step (the
    masks still to decode shown as ░ for MDM, the text growing for AR), then the final text is printed;
    --no-stream draws nothing before it."""
    buf = _terminal(monkeypatch)
    args = ["generate", str(tiny_runs[kind][0]), "--prompt", "The", "--device", "cpu", "--gen-length", "8"]
    args += ["--block-length", "8", "--steps", "4"] if kind == "mdm" else ["--eos-token-id", "-1"]
    assert main([*args, "--stream"]) == 0
    streamed = buf.getvalue()
    redraws = streamed.count("\x1b[2K")  # rich Live erases the previous drawing before each redraw
    assert redraws >= (3 if kind == "mdm" else 7), streamed
    if kind == "mdm":
        assert "\u2591" in streamed  # a canvas with masks left, before the last step
    final = streamed[streamed.rindex("settings:"):]
    assert "forward passes" in final
    buf.truncate(0)
    buf.seek(0)
    assert main([*args, "--no-stream"]) == 0
    assert "\x1b[2K" not in buf.getvalue() and "\u2591" not in buf.getvalue()


def test_a_specs_generate_table_reaches_the_lock_and_becomes_generates_defaults(tmp_path, capsys):
    """The [generate] table of a spec is written into the compiled spec.lock.toml (which the runtime
    copies into every checkpoint), and `generate` reads it back as the checkpoint's settings."""
    from dlmspec.backends.generate.load import _lock_generate_table
    from dlmspec.cli.generate_options import resolve_settings

    spec = tmp_path / "gen.toml"
    spec.write_text(f'extends = "{ROOT / "specs" / "demo-dlm.toml"}"\n[generate]\ngen_length = 64\n'
                    'block_length = 32\nsteps = 32\nremasking = "threshold"\nthreshold = 0.8\n')
    assert main(["compile", str(spec), "--output", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    table = _lock_generate_table(str(tmp_path / "out"))
    assert table is not None
    assert {k: table[k] for k in ("gen_length", "block_length", "steps", "remasking", "threshold")} == {
        "gen_length": 64, "block_length": 32, "steps": 32, "remasking": "threshold", "threshold": 0.8}
    config, settings = resolve_settings(kind="mdm", mask_token_id=MASK, eos_token_id=EOD, pad_token_id=None,
                                        lock_table=table, flags={"steps": 64})
    assert (config.gen_length, config.block_length, config.remasking, config.threshold, config.steps) == (
        64, 32, "threshold", 0.8, 64)
    assert settings.origins["gen_length"] == "checkpoint" and settings.origins["steps"] == "flag"


def test_the_benchs_causal_alias_loads_a_dlm_checkpoint_as_an_ar_model_with_the_kv_cache(tiny_runs, tmp_path):
    """bench/sampling/generate_demo.py times AR decoding on the demo-dlm checkpoint's weights run causally
    (demo-ar's shape) when no AR checkpoint is given: the alias loads as kind ar, causal, with the cache."""
    from bench_scripts import load_script

    from dlmspec.backends.generate.load import load_model

    bench = load_script("bench/sampling/generate_demo.py", "generate_demo_bench")
    alias = bench.causal_alias(str(tiny_runs["mdm"][1]), tmp_path / "ar")
    model = load_model(str(alias), device="cpu")
    try:
        assert (model.kind, model.mask_token_id, model.kv_cache_fallback) == ("ar", None, None)
        tokens = torch.tensor([[464, 2068, 7586, 21831]])
        changed = tokens.clone()
        changed[0, -1] = 11
        assert torch.allclose(model.logits_fn(changed)[0, 0], model.logits_fn(tokens)[0, 0])  # causal
    finally:
        model.close()
    assert (tiny_runs["mdm"][1] / "dlmspec.json").read_text() != (alias / "dlmspec.json").read_text()


def test_the_decoding_plan_says_what_ran_and_why():
    """`generate`'s recorded decoding: the KV cache for an AR model that takes it; full recompute with
    the model's reason (e.g. Transformer Engine layers) or --no-kv-cache; masked diffusion for MDM."""
    from types import SimpleNamespace

    from dlmspec.cli.generate import decoding_plan

    ar = SimpleNamespace(kind="ar")
    assert decoding_plan(SimpleNamespace(kv_cache_fallback=None), ar, True)[:2] == (True, None)
    te = SimpleNamespace(kv_cache_fallback="core attention TEDotProductAttention (Transformer Engine layers)")
    cached, why, decoding = decoding_plan(te, ar, True)
    assert not cached and "Transformer Engine" in why and "full recompute" in decoding
    assert decoding_plan(SimpleNamespace(kv_cache_fallback=None), ar, False)[:2] == (False, "--no-kv-cache")
    cached, why, decoding = decoding_plan(SimpleNamespace(kv_cache_fallback="bidirectional attention"),
                                          SimpleNamespace(kind="mdm"), True)
    assert not cached and decoding == "masked diffusion" and "bidirectional" in why


def test_flag_and_argument_findings_are_placed_on_the_command_line_not_in_a_spec(capsys, tmp_path):
    """Issues of RUN_OR_CHECKPOINT and the flags of `generate` / `eval` say they come from the command
    line (as `--set`'s do), not `<spec>`: no spec is involved; a prompts file's line keeps its file."""
    cases = [
        (["generate", str(tmp_path / "nowhere"), "--prompt", "a"], "RUN_OR_CHECKPOINT"),
        (["generate", str(tmp_path), "--prompt", "a"], "RUN_OR_CHECKPOINT"),
        (["generate", str(tmp_path)], "--prompt"),
        (["generate", str(tmp_path), "--prompts", str(tmp_path / "missing.jsonl")], "--prompts"),
        (["eval", str(tmp_path)], "--data"),
        (["eval", str(tmp_path), "--data", "x", "--estimator", "best"], "--estimator"),
    ]
    for args, key in cases:
        code = main([*args, "--json"])
        issues = json.loads(capsys.readouterr().out)["issues"]
        assert code == 2 and key in {i["key"] for i in issues}, (args, issues)
        assert all(i["file"] == "command line" for i in issues), (args, issues)
    code = main(["generate", str(tmp_path / "nowhere"), "--prompt", "a"])
    err = capsys.readouterr().err
    assert code == 2 and "command line" in err and "<spec>" not in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\nnot json\n')
    code = main(["generate", str(tmp_path), "--prompts", str(bad), "--json"])
    (issue,) = json.loads(capsys.readouterr().out)["issues"]
    assert issue["file"] == str(bad) and issue["line"] == 2


@pytest.mark.parametrize("args, key, hint", [
    (["--top-k", "0"], "--top-k", "leave out --top-k (all tokens), or use --top-k 50"),
    (["--top-p", "2"], "--top-p", "leave out --top-p (all tokens), or use --top-p 0.95"),
    (["--cache-refresh", "0"], "--cache-refresh", "leave out --cache-refresh (recompute at each block's first step"),
])
def test_a_flag_whose_remedy_is_none_says_to_leave_it_out(tiny_runs, capsys, args, key, hint):
    """None is no value a flag takes (`--top-k None` is a usage error): the remedy leaves the flag out."""
    code, env = run_json(capsys, str(tiny_runs["mdm"][0]), "--prompt", "a", *args)
    assert code == 2
    (issue,) = env["issues"]
    assert issue["key"] == key and issue["hint"].startswith(hint), issue
    assert "None" not in issue["hint"] and "None" not in issue["message"], issue


def test_the_load_flags_are_checked_with_the_others_before_loading(capsys, tmp_path):
    """--device, --dtype and --kind join the pre-load table, beside a run that does not exist."""
    code = main(["generate", str(tmp_path / "nowhere"), "--prompt", "a", "--device", "gpu0", "--dtype", "fp8",
                 "--kind", "bd3lm", "--json"])
    issues = json.loads(capsys.readouterr().out)["issues"]
    assert code == 2
    by_key = {i["key"]: i for i in issues}
    assert set(by_key) == {"--device", "--dtype", "--kind", "RUN_OR_CHECKPOINT"}, issues
    assert by_key["--kind"]["hint"] == "--kind mdm or --kind ar"
    assert "cuda:N" in by_key["--device"]["hint"]


def test_a_flag_against_the_checkpoints_generate_table_gets_a_flag_remedy(tiny_runs, capsys):
    """--gen-length 24 against the run's own steps = 8 / block_length = 8 (its lock): the issue is placed
    on the lock's key, and the remedy is a flag (a user does not edit a checkpoint's lock)."""
    code, env = run_json(capsys, str(tiny_runs["mdm"][0]), "--prompt", "a", "--gen-length", "20")
    assert code == 2
    (issue,) = env["issues"]
    assert issue["key"].startswith("generate.") and issue["file"].endswith("spec.lock.toml"), issue
    assert "beside the flags given" in issue["message"]
    assert issue["hint"].startswith("use --") and "a flag overrides the checkpoint's [generate]" in issue["hint"]


def test_a_gpu_out_of_memory_while_sampling_exits_2_naming_the_batch_size(tiny_runs, capsys, monkeypatch):
    import dlmspec.cli.generate as command

    def full(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    monkeypatch.setattr(command, "_run_generate", full)
    code, env = run_json(capsys, str(tiny_runs["mdm"][0]), "--prompt", "a", "--batch-size", "6")
    assert code == 2
    (issue,) = env["issues"]
    assert issue["key"] == "--batch-size" and "while sampling" in issue["message"]
    assert issue["hint"].startswith("--batch-size 3; or free the GPU's memory")
