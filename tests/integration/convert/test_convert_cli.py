"""`dlmspec convert` on real files: a tiny random Qwen3 checkpoint goes HF -> megatron-core -> HF
through the command line, `verify` compares logits, and `--spec` refuses a checkpoint whose
dimensions disagree with the spec, naming the key, its line and the checkpoint's value."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from dlmspec.cli.commands import app  # noqa: E402


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


def _spec_for(config: dict, path: Path, **changes) -> Path:
    dims = {
        "num_layers": config["num_hidden_layers"], "hidden_size": config["hidden_size"],
        "ffn_hidden_size": config["intermediate_size"], "num_attention_heads": config["num_attention_heads"],
        "num_query_groups": config["num_key_value_heads"], "kv_channels": config["head_dim"],
        "vocab_size": config["vocab_size"], "qk_layernorm": True,
        "untie_embeddings_and_output_weights": not config.get("tie_word_embeddings", False),
        "max_position_embeddings": config["max_position_embeddings"],
        "make_vocab_size_divisible_by": 16,
    }
    dims.update(changes)
    lines = ["[model]"] + [f"{k} = {json.dumps(v)}" for k, v in dims.items()]
    lines += ["", "[objective]", "kind = \"ar\"", "", "[train]", "global_batch_size = 1", "seq_length = 16",
              "train_iters = 1", "", "[data]", "mock = true", "", "[data.tokenizer]", "type = \"NullTokenizer\"",
              f"vocab_size = {config['vocab_size'] - 1}", "", "[cluster]", "gpus_per_node = 1"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_convert_round_trip_and_verify(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from dlmspec.backends.convert.tiny import make_tiny_hf

    src, _ = make_tiny_hf("qwen3", tmp_path / "hf", seed=3)
    config = json.loads((src / "config.json").read_text())
    spec = _spec_for(config, tmp_path / "spec.toml")

    result = _run("convert", "hf-to-mcore", str(src), str(tmp_path / "mcore"), "--spec", str(spec))
    assert result.exit_code == 0, result.output
    assert "qwen3" in result.output

    result = _run("convert", "verify", str(src), str(tmp_path / "mcore"), "--json")
    assert result.exit_code == 0, result.output
    assert '"schema": "dlmspec.result"' in result.stdout, result.output
    report = json.loads(result.stdout[result.stdout.index("{"):])  # anything a library printed before it
    assert report["ok"] and report["result"]["max_abs_diff"] <= 1e-4

    result = _run("convert", "mcore-to-hf", str(tmp_path / "mcore"), str(tmp_path / "back"))
    assert result.exit_code == 0, result.output
    def tensors(folder: Path) -> dict:
        out = {}
        for f in sorted(folder.glob("*.safetensors")):
            out.update(load_file(f))
        return out
    before, after = tensors(src), tensors(tmp_path / "back")
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)

    # An existing destination is refused without --force.
    result = _run("convert", "mcore-to-hf", str(tmp_path / "mcore"), str(tmp_path / "back"))
    assert result.exit_code == 2


def test_convert_refuses_a_checkpoint_that_disagrees_with_the_spec(tmp_path: Path) -> None:
    from dlmspec.backends.convert.tiny import make_tiny_hf

    src, _ = make_tiny_hf("qwen3", tmp_path / "hf", seed=3)
    config = json.loads((src / "config.json").read_text())
    spec = _spec_for(config, tmp_path / "spec.toml", num_layers=config["num_hidden_layers"] + 1)
    result = _run("convert", "hf-to-mcore", str(src), str(tmp_path / "mcore"), "--spec", str(spec))
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "spec.toml:2" in text and "model.num_layers" in text
    assert f"set model.num_layers = {config['num_hidden_layers']}" in text
    assert not (tmp_path / "mcore").exists()


def test_convert_errors_without_traceback(tmp_path: Path) -> None:
    result = _run("convert", "hf-to-mcore", str(tmp_path / "nothing"), str(tmp_path / "out"))
    assert result.exit_code == 2 and "config.json" in result.output
    assert "Traceback" not in result.output


def test_a_folder_without_config_or_of_an_unknown_family_gets_a_remedy(tmp_path: Path) -> None:
    """README promises a fix on convert's error line (the new-user trial found none)."""
    result = _run("convert", "hf-to-mcore", str(tmp_path / "nonexist"), str(tmp_path / "dst"))
    assert result.exit_code == 2 and "fix: give the folder that holds the checkpoint's config.json" in result.output
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"architectures": ["X"]}')
    result = _run("convert", "hf-to-mcore", str(bad), str(tmp_path / "dst2"), "--json")
    (issue,) = json.loads(result.stdout)["issues"]
    assert result.exit_code == 2 and "model_type one of" in issue["hint"] and "qwen3" in issue["hint"]
