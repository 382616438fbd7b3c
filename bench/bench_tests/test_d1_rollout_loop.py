"""d1's rollout loop (bench/sampling/d1_rollout.py) against dlmspec's sampler: the same schedule and
the same greedy tokens on one function; the report's ratio and target; and, on CPU, the whole
measurement on a tiny LLaDA-compatible checkpoint with a compiled RL job's settings (the d1 side where
Fast-dLLM's LLaDA files and the transformers they pin are at hand: bench/devbox/fetch_fast_dllm.sh)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.bench_tests import fast_sampling_kit as kit

ROOT = Path(__file__).resolve().parents[2]
D1 = ROOT / "bench" / "sampling" / "d1_rollout.py"
FAST_DLLM = ROOT / ".bench-peers" / "fast-dllm"
WHEELS = ROOT / ".bench-peers" / "wheels"
sys.path.insert(0, str(ROOT / "bench" / "sampling"))
import d1_rollout  # noqa: E402

pytestmark = pytest.mark.harness  # a harness end to end on CPU: the bench tier (CONTRIBUTING.md)


def test_d1_schedule_is_the_linear_schedule_of_dlmspecs_sampler() -> None:
    from dlmspec.backends.generate.sampler import num_transfer_tokens

    masked = torch.tensor([[True] * 8, [True] * 5 + [False] * 3, [True] * 3 + [False] * 5])
    for steps in (1, 2, 3, 8):
        ours = num_transfer_tokens(masked.sum(dim=1), steps, None)
        assert torch.equal(d1_rollout.d1_num_transfer_tokens(masked, steps), ours), steps


def test_greedy_d1_loop_gives_dlmspecs_low_confidence_tokens_on_one_function() -> None:
    from dlmspec.backends.generate.sampler import generate
    from dlmspec.generate_settings import GenerateConfig

    vocab, mask = 40, 40
    g = torch.Generator().manual_seed(3)
    weights, position = torch.randn(vocab + 1, vocab, generator=g) * 3, torch.randn(32, vocab, generator=g) * 3

    def logits(x: torch.Tensor, attention=None) -> torch.Tensor:
        # a fixed function of each token, its left neighbour, the whole canvas and the position (no ties)
        return (weights[x] + 0.5 * weights[x.roll(1, dims=1)] + weights[x].mean(dim=1, keepdim=True)
                + position[: x.shape[1]])

    prompts = torch.randint(0, vocab, (5, 6), generator=torch.Generator().manual_seed(4))
    for gen_length, steps, block in ((8, 8, 8), (8, 4, 4), (12, 6, 4)):
        theirs = d1_rollout.d1_generate(logits, prompts, steps=steps, gen_length=gen_length, block_length=block,
                                        temperature=0.0, cfg_scale=0.0, remasking="low_confidence", mask_id=mask,
                                        dtype=torch.float64)
        config = GenerateConfig(kind="mdm", gen_length=gen_length, steps=steps, block_length=block, temperature=0.0,
                                mask_token_id=mask, eos_token_id=None, pad_token_id=0)
        ours = generate(logits, prompts, config).sequences
        assert torch.equal(theirs, ours), (gen_length, steps, block)


def test_d1_loop_refuses_what_d1_does_not_run() -> None:
    prompts = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="multiple of block_length"):
        d1_rollout.d1_generate(lambda x: x, prompts, steps=4, gen_length=6, block_length=4, temperature=0.0,
                               cfg_scale=0.0, remasking="low_confidence", mask_id=9, dtype=torch.float32)
    with pytest.raises(ValueError, match="low_confidence and random"):
        d1_rollout.d1_generate(lambda x: x, prompts, steps=4, gen_length=4, block_length=4, temperature=0.0,
                               cfg_scale=0.0, remasking="threshold", mask_id=9, dtype=torch.float32)


def test_compare_takes_the_faster_d1_loop_for_the_target() -> None:
    parts = [{"side": "dlmspec", "loops": {"dlmspec/rl-rollout": {"tokens_per_second": 900.0}}},
             {"side": "d1", "loops": {"d1/whole-batch": {"tokens_per_second": 400.0},
                                      "d1/generation-batch": {"tokens_per_second": 100.0}}}]
    out = d1_rollout.compare(parts)
    assert out["fastest_d1"] == "d1/whole-batch" and out["ratio_over_fastest_d1"] == pytest.approx(2.25)
    assert out["ratios"]["d1/generation-batch"] == pytest.approx(9.0) and out["target_met"] is False
    with pytest.raises(ValueError, match="no dlmspec"):
        d1_rollout.compare(parts[1:])


# --------------------------------------------------------------------------- on a tiny checkpoint

needs_gpt2 = pytest.mark.skipif(kit.shared_gpt2() is None, reason="the offline data kit's GPT-2 tokenizer is not found")


def _rows(n: int) -> list:
    """Addition rows of one prompt length (padded 2-digit operands), as dlmspec task make writes them."""
    digits = lambda x, w: "".join(" " + d for d in str(x).zfill(w))  # noqa: E731
    return [{"id": f"addition-train-{i:06d}", "prompt": f"{digits(10 + 7 * i, 2)} +{digits(3 * i, 2)} =",
             "answer": digits(10 + 10 * i, 3)} for i in range(n)]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """The dlmspec side once on a tiny checkpoint with the compiled RL job's settings."""
    gpt2 = kit.shared_gpt2()
    if gpt2 is None:
        pytest.skip("the offline data kit's GPT-2 tokenizer is not found")
    tmp = tmp_path_factory.mktemp("d1")
    with kit.megatron_cpu_world(tmp):
        ckpt = kit.write_llada_compatible_checkpoint(tmp / "run", gpt2)
    (tmp / ".data" / "task-addition").mkdir(parents=True)
    (tmp / ".data" / "task-addition" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(8)))
    sets = ["stage.rl.grpo_prompts_per_step=2", "stage.rl.grpo_group_size=3", "train.global_batch_size=6",
            "train.micro_batch_size=6", "generate.gen_length=8", "generate.steps=4", "generate.block_length=4"]
    proc = subprocess.run([sys.executable, "-m", "dlmspec.cli", "compile", str(ROOT / "specs" / "task-addition-dlm-rl.toml"),
                           "-o", str(tmp / "job"), "--force", *[a for s in sets for a in ("--set", s)]],
                          capture_output=True, text=True, timeout=300, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    work = tmp / "work"
    proc = subprocess.run([sys.executable, str(D1), "dlmspec", "--ckpt", str(ckpt), "--job", str(tmp / "job"),
                           "--work", str(work), "--out", str(work / "dlmspec.json"), "--llada-out", str(work / "llada"),
                           "--device", "cpu", "--repeats", "1"], capture_output=True, text=True, timeout=600, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, work


@needs_gpt2
def _rendered_length(prompt: str, tmp: Path) -> int:
    """Tokens of ``prompt`` in the compiled RL job's chat template, by GPT-2's BPE (the checkpoint's)."""
    from dlmspec.backends.rl.rollout import render_prompt
    from dlmspec.tokenizers import GPT2BPETokenizer

    template = d1_rollout.load_job(tmp / "job")[0].chat_template
    gpt2 = kit.shared_gpt2()
    return len(GPT2BPETokenizer(str(gpt2 / "vocab.json"), str(gpt2 / "merges.txt")).tokenize(
        render_prompt(prompt, template)))


def test_dlmspec_side_times_the_jobs_first_rollout_batch(bench_run) -> None:
    tmp, work = bench_run
    part = json.loads((work / "dlmspec.json").read_text())
    loop = part["loops"]["dlmspec/rl-rollout"]
    assert loop["rows"] == 6 and loop["tokens"] == 6 * 8 and loop["forward_passes"] == 4 and loop["tokens_per_second"] > 0
    assert part["settings"]["temperature"] == 1.0 and part["settings"]["grpo_group_size"] == 3
    assert len(part["ids"]["sampled"]) == 6 and all(len(r) == 8 for r in part["ids"]["sampled"])
    record = json.loads((work / d1_rollout.ROLLOUT_FILE).read_text())
    # G copies of each prompt, group-major, with its answer
    assert record["prompt_ids"][0] == record["prompt_ids"][2] != record["prompt_ids"][3]
    # the RL spec's chat template ("plain", as the SFT model was tuned) around the 6-token prompt
    assert record["answers"][0] == record["answers"][2]
    assert record["settings"]["prompt_lengths"] == [_rendered_length(_rows(1)[0]["prompt"], tmp)]
    assert json.loads((work / "llada" / "config.json").read_text())["model_type"] == "llada"


def test_a_job_that_is_not_rl_is_refused(tmp_path) -> None:
    (tmp_path / "train.py").write_text("def build_run():\n    return None\n")
    with pytest.raises(ValueError, match="not an RL stage"):
        d1_rollout.load_job(tmp_path)
    with pytest.raises(ValueError, match="no compiled train.py"):
        d1_rollout.load_job(tmp_path / "missing")


@needs_gpt2
@pytest.mark.skipif(not (FAST_DLLM / "llada" / "model" / "modeling_llada.py").is_file()
                    or not any(WHEELS.glob("transformers-4.49.0-*.whl")),
                    reason="Fast-dLLM's LLaDA files / transformers 4.49.0 wheel not fetched (bash bench/devbox/fetch_fast_dllm.sh)")
def test_d1_side_on_the_export_gives_dlmspecs_greedy_tokens_and_the_report_scores_both(bench_run, tmp_path) -> None:
    _, work = bench_run
    site = tmp_path / "peer-site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target",
                    str(site), "--find-links", str(WHEELS), "transformers==4.49.0", "tokenizers<0.22", "huggingface-hub<1.0"],
                   check=True, capture_output=True, timeout=300)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in (str(site), os.environ.get("PYTHONPATH", "")) if x))
    proc = subprocess.run([sys.executable, str(D1), "d1", "--work", str(work), "--llada", str(work / "llada"),
                           "--fast-dllm", str(FAST_DLLM), "--out", str(tmp_path / "d1.json"), "--device", "cpu",
                           "--repeats", "1"], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    d1 = json.loads((tmp_path / "d1.json").read_text())
    assert d1["transformers"] == "4.49.0" and d1["probe"]["max_abs_logit_diff"] < 1e-3
    assert d1["loops"]["d1/generation-batch"]["forward_passes"] == 4 * 2  # chunks of G = 3 rows: 2 calls of 4 steps
    proc = subprocess.run([sys.executable, str(D1), "report", "--work", str(work), "--parts", str(work / "dlmspec.json"),
                           str(tmp_path / "d1.json"), "--out", str(tmp_path / "report.json")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    # the same model (fp32 on CPU) and rule: d1's greedy loop gives dlmspec's greedy tokens
    assert report["greedy_agreement"]["tokens"] == 1.0 and report["greedy_agreement"]["n"] == 6
    assert set(report["tokens_per_second"]) == {"dlmspec/rl-rollout", "dlmspec/rl-rollout-eager", "d1/whole-batch",
                                                "d1/generation-batch"}
    # the rollout timed again with [generate] cuda_graph = false (on the CPU both are eager): the same greedy tokens
    assert report["cuda_graph_greedy_tokens_equal_eager"] is True
    assert report["ratio_over_fastest_d1"] > 0 and isinstance(report["target_met"], bool)
    assert {s: r["n"] for s, r in report["rollout_exact_match"].items()} == {"dlmspec": 6, "d1": 6}
