"""Secret values that carry no secret-looking name: webhook URLs, DSNs, URL fragments, AWS
secret keys by their shape, credentials in a run name (whose fix rewrites ``/``) and in an
``extends`` path. Each is refused (exit 2) and appears in no output and no written file.

The values are assembled from pieces at run time (no credential-shaped literal in the
repository); none is real.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.cli.commands import app
from dlmspec.credentials import find_secret, redact_text
from dlmspec.errors import EXIT_USAGE
from small_spec import SMALL_SPEC


def _cat(*parts: str) -> str:
    return "".join(parts)


#: What must never be printed or written, and the spec text that holds it.
SLACK = _cat("T0A1B2C3D", "/B0E4F5G6H/", "q8W7e6R5t4Y3u2I1o0P9a8S7")
SENTRY = _cat("3f1c9a7b5d", "2e4f6a8b0c", "1d3e5f7a9b0c")
FRAGMENT = _cat("ya29", ".a0AfH6SMBx", "Kq7Zr2Lp9Wm")
AWS = _cat("wJalrXUtnF", "EMI/K7MDENG", "/bPxRfiCYzq3Fk7Lm2N")
PASSWORD = _cat("Hunter", "2Pass", "word77")
ENV_CASES = {
    "slack-webhook": (SLACK, _cat("https://hooks.slack", ".com/services/", SLACK)),
    "sentry-dsn": (SENTRY, _cat("https://", SENTRY, "@o123.ingest.sentry.io/1")),
    "url-fragment-token": (FRAGMENT, _cat("https://auth.example.com/cb#access_token=", FRAGMENT, "&state=x")),
    "aws-secret-key": (AWS, AWS),
}


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def _written(folder: Path) -> str:
    if not folder.exists():
        return ""
    return "".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


def _all_outputs(tmp_path: Path, spec: Path) -> str:
    """stdout and stderr of validate, plan, show and compile (tables and --json), and every
    file compile wrote; each command but show (which prints the spec, secrets hidden) must
    refuse the spec."""
    text = []
    for args in (["validate"], ["plan"], ["show"], ["compile", "-o", str(tmp_path / "out")]):
        for extra in ([], ["--json"]):
            result = run(args[0], str(spec), *args[1:], *extra)
            assert result.exit_code == (0 if args == ["show"] else EXIT_USAGE), (args, extra, result.stdout
                                                                                   + result.stderr)
            text += [result.stdout, result.stderr]
            if extra:
                json.loads(result.stdout)
    return "".join(text) + _written(tmp_path / "out")


@pytest.mark.parametrize("case", list(ENV_CASES))
def test_secret_shaped_env_values_are_refused_and_never_written(tmp_path: Path, case: str) -> None:
    secret, value = ENV_CASES[case]
    spec = tmp_path / "spec.toml"
    spec.write_text(SMALL_SPEC + f'[cluster.slurm]\npartition = "gpu"\nenv = {{ AWS_SAK = {json.dumps(value)} }}\n')
    out = _all_outputs(tmp_path, spec)
    assert secret not in out and "cluster.slurm.env.AWS_SAK" in out


@pytest.mark.parametrize("key", ["name", "cluster.slurm.job_name"])
def test_a_url_password_in_the_job_name_is_hidden_in_the_slash_free_remedy(tmp_path: Path, key: str) -> None:
    url = _cat("https://alice:", PASSWORD, "@host/x")
    spec = tmp_path / "spec.toml"
    if key == "name":
        spec.write_text(SMALL_SPEC.replace('name = "t"', f"name = {json.dumps(url)}"))
    else:
        spec.write_text(SMALL_SPEC + f'[cluster.slurm]\npartition = "gpu"\njob_name = {json.dumps(url)}\n')
    out = _all_outputs(tmp_path, spec)
    assert PASSWORD not in out and "job name with '/'" in out


def test_a_url_password_in_extends_is_hidden_in_file_not_found(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(f"extends = {json.dumps(_cat('https://alice:', PASSWORD, '@host/base.toml'))}\n" + SMALL_SPEC)
    result = run("validate", str(spec))
    assert result.exit_code == EXIT_USAGE and "file not found" in result.stderr
    assert PASSWORD not in result.stdout + result.stderr
    result = run("validate", str(spec), "--json")
    assert PASSWORD not in result.stdout and json.loads(result.stdout)["issues"][0]["key"] == "extends"


@pytest.mark.parametrize("value", [
    "/data/Models/Llama3/8B/Instruct/v2/ckpt1",  # a path with mixed case and digits
    "0123456789abcdef0123456789abcdef01234567",  # a git commit (40 hex digits)
    "runs/Llama3-8B/Instruct/v2/checkpoints/A1",
    "ssh://git@github.com/org/repo.git",
    "git+https://ci-builder-2024@example.com/x",
    "https://host:8443/repo@v1",
])
def test_paths_hashes_and_plain_urls_are_not_secrets(value: str) -> None:
    assert find_secret(value) is None and redact_text(value) == value
