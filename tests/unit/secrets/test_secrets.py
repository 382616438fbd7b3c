"""Secrets never reach a generated file or the screen (dlmspec.credentials).

Environment names that hold secrets (``DB_PASS``, ``GH_PAT``, ``*_AUTH``, ...), token-shaped
values (``hf_...``, ``ghp_...``, ``sk-...``, AWS key ids, JWTs, ...; whole tokens only, so
``/data/hf_cache`` is a path) and credentials inside URLs (``https://user:pass@host``) are
refused by ``validate``, ``plan`` and ``compile`` (exit 2, the key named, the value shown as
``<hidden>``, the fix "pass it through the environment") and hidden by ``dlmspec show``.

Every token below is assembled at run time from pieces, so no token-shaped literal sits in the
repository (secret scanners would flag it); none of them is a real credential.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.check import issues_for
from dlmspec.cli.commands import app
from dlmspec.errors import EXIT_USAGE, SpecIssue
from dlmspec.spec.load import load, load_text
from dlmspec.resolve import resolve
from small_spec import SMALL_SPEC

BASE = SMALL_SPEC


def _cat(*parts: str) -> str:
    return "".join(parts)


#: Token-shaped values, by what they are (fake, assembled).
TOKENS = {
    "huggingface": _cat("hf", "_", "AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh"),
    "github": _cat("gh", "p_", "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"),
    "github-oauth": _cat("gh", "o_", "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2"),
    "github-fine-grained": _cat("github", "_pat_", "11ABCDEFG0aBcDeFgHiJkL", "_",
                                "MnOpQrStUvWxYz0123456789aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"),
    "openai": _cat("sk", "-", "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2Yz3Ab4Cd5Ef6Gh"),
    "openai-project": _cat("sk", "-proj-", "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2Yz3_x-Yz0AbCdEf"),
    "anthropic": _cat("sk", "-ant-api03-", "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2Yz3Ab4Cd5Ef6Gh7-Ij8Kl9"),
    "slack-bot": _cat("xo", "xb-", "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"),
    "slack-user": _cat("xo", "xp-", "123456789012-1234567890123-1234567890123-0a1b2c3d4e5f6a7b8c9d"),
    "slack-app": _cat("xo", "xa-", "2-123456789012-AbCdEfGhIjKlMnOp"),
    "aws-key-id": _cat("AK", "IA", "IOSFODNN7EXAMPLE"),
    "aws-session-key-id": _cat("AS", "IA", "Y34FZKBOKMUTVV7A"),
    "jwt": _cat("ey", "JhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9", ".", "ey",
                "JzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ", ".", "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"),
    "google-api-key": _cat("AI", "za", "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q"),
    "gitlab": _cat("gl", "pat-", "Ab1Cd2Ef3Gh4Ij5Kl6Mn"),
    "stripe": _cat("sk", "_live_", "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr"),
    "npm": _cat("np", "m_", "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2Y"),
    "pypi": _cat("py", "pi-", "AgEIcHlwaS5vcmcCJDAwMDAwMDAwLTAwMDAtMDAwMC0wMDAwLTAwMDAwMDAwMDAwMAAC"),
    "private-key": _cat("-----BEGIN ", "OPENSSH PRIVATE", " KEY-----"),
    "bearer": _cat("Bear", "er ", "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8"),
}

#: Credentials inside URLs.
URLS = {
    "https-user-password": _cat("https://alice:", "s3cr3tPassw0rd", "@models.example.com/llada-8b"),
    "s3-key-secret": _cat("s3://", "AKIDEXAMPLEKEY", ":", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                          "@bucket/data/x_text_document"),
    "docker-login": _cat("docker://bob:", "hunter2hunter2", "@registry.example.com/team/pytorch:25.01"),
    "empty-user": _cat("https://:", "tok3nTok3n", "@example.com/x"),
    "presigned-s3": _cat("https://bucket.s3.amazonaws.com/tok.json?X-Amz-Expires=3600&X-Amz-Sig",
                         "nature=0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9"),
    "azure-sas": _cat("https://acct.blob.core.windows.net/c/x?sv=2022-11-02&s", "ig=AbCdEf0123456789%2Bxyz%3D"),
    "query-token": _cat("https://example.com/data?to", "ken=Ab1Cd2Ef3Gh4Ij5Kl6"),
}

#: Values that look a little like the above and are not secrets.
NOT_SECRETS = [
    "/data/hf_cache",
    "/data/hf_cache/models--gpt2",
    "/home/sk-lab/data/x_text_document",
    "/home/sk-lab-experiments-2024-diffusion-models/ckpt",
    "runs/ghp_notes/checkpoints",
    "hf:/models/llada-8b",
    "hf:GSAI-ML/LLaDA-8B-Base",
    "mcore:/lustre/ckpt/iter_0001000",
    "nvcr.io#nvidia/pytorch:25.01-py3",
    "docker://nvcr.io/nvidia/pytorch:25.01-py3",
    "https://huggingface.co/meta-llama/Llama-3.1-8B",
    "https://host.example.com:8443/models/repo@v1.0",
    "ssh://git@github.com/org/repo",
    "git+https://github.com/org/repo@v1.0",
    "s3://bucket/path/x_text_document",
    "s3://bucket/path@v2",
    "https://user:${HF_TOKEN}@example.com/x",
    "/lustre:/lustre",
    "slurm-%x-%j.out",
    "99,1,0",
    "gpt2",
    "exact_match",
    "sha256:" + "0123456789abcdef" * 4,
    "0123456789abcdef0123456789abcdef01234567",  # a git commit
    "AKIA",
    "mask_token_id=126336",
    "tokenizers-parallelism=false",
    "the eyJ-shaped prefix of a JWT",
    "Bearer tokens are read from the environment",
    "hf_AbCdEfGhIj",  # too short to be a token
]

SECRET_NAMES = [
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY",
    "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "GITHUB_TOKEN", "NGROK_AUTHTOKEN", "MY_PASSWORD", "PGPASSWORD",
    "DB_PASSWD", "DB_PASS", "DB_PWD", "SMTP_PASSPHRASE", "GH_PAT", "GITLAB_PAT", "NPM_AUTH", "BASIC_AUTH",
    "HTTP_AUTH", "AUTH", "OAUTH_CLIENT", "AUTHORIZATION", "BEARER", "API_BEARER", "COOKIE", "SESSION_COOKIE",
    "SESSION", "SESSION_ID", "SSH_PRIVATE_KEY", "PRIVATEKEY", "MY_PRIVATE_REGISTRY", "NETRC", "NETRC_FILE",
    "CLIENT_SECRET", "SECRETS", "GOOGLE_APPLICATION_CREDENTIALS", "DOCKER_CREDS", "APIKEY", "SIGNING_KEY",
    "hf_token", "hfToken", "ghPat", "TOKEN", "API_TOKEN_2",
]

NOT_SECRET_NAMES = [
    "TOKENIZERS_PARALLELISM", "TOKENIZER_PATH", "MAX_TOKENS", "NUM_TOKENS", "MASK_TOKEN_ID", "PAD_TOKEN_ID",
    "NCCL_DEBUG", "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "PATH", "PWD", "OLDPWD", "HF_HOME", "HF_HUB_CACHE",
    "HF_HUB_ENABLE_HF_TRANSFER", "TRANSFORMERS_CACHE", "OMP_NUM_THREADS", "BYPASS_CACHE", "PASSTHROUGH", "AUTHOR",
    "WANDB_PROJECT", "PYTORCH_CUDA_ALLOC_CONF", "NCCL_SOCKET_IFNAME", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "KEYBOARD_LAYOUT", "PATCH_LEVEL", "CALCULATE_PER_TOKEN_LOSS", "MOE_TOKEN_DISPATCHER_TYPE", "TOKEN_DROPPING",
]


def credentials():
    """The module under test (imported here so the command tests fail on their behaviour, not
    on an import error, where it does not exist)."""
    import dlmspec.credentials as module

    return module


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def spec_file(tmp_path: Path, extra: str = "") -> Path:
    """BASE + ``extra`` as a spec file that loads (whatever validate says is about the secret);
    the top-level keys of ``extra`` (the lines before its first table) go first."""
    lines = extra.splitlines(keepends=True)
    first_table = next((i for i, line in enumerate(lines) if line.startswith("[")), len(lines))
    path = tmp_path / "spec.toml"
    path.write_text("".join(lines[:first_table]) + BASE + "".join(lines[first_table:]), encoding="utf-8")
    load(path)
    return path


def toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string of printable ASCII is a TOML basic string


# --------------------------------------------------------------------------------------------
# Detection


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names_are_recognised(name: str) -> None:
    assert credentials().is_secret_name(name)


@pytest.mark.parametrize("name", NOT_SECRET_NAMES)
def test_ordinary_names_are_not_secrets(name: str) -> None:
    assert not credentials().is_secret_name(name)


@pytest.mark.parametrize("kind", sorted(TOKENS))
def test_token_shapes_are_found_alone_and_inside_strings(kind: str) -> None:
    find = credentials().find_secret
    token = TOKENS[kind]
    for value in (token, f"hf:/models/{token}/x", f"{token}:rest", f"prefix {token} suffix", f"a={token}"):
        what = find(value)
        assert what, (kind, value)
        assert token not in what and "<hidden>" not in what


@pytest.mark.parametrize("kind", sorted(URLS))
def test_credentials_in_urls_are_found(kind: str) -> None:
    for value in (URLS[kind], "hf:" + URLS[kind]):
        what = credentials().find_secret(value)
        assert what, value


@pytest.mark.parametrize("value", NOT_SECRETS)
def test_paths_and_names_that_merely_look_alike_are_not_secrets(value: str) -> None:
    assert credentials().find_secret(value) is None


def test_a_token_glued_to_other_word_characters_is_not_a_whole_token() -> None:
    token = TOKENS["huggingface"]
    find = credentials().find_secret
    assert find("x" + token) is None and find(token + "_cache") is None and find("my-" + token) is None


def test_a_finding_never_holds_a_secret() -> None:
    token = TOKENS["github"]
    issue = SpecIssue("cluster.gpu", f"'{token}' is not in the GPU catalog", value=token, hint=f"not {token}")
    assert issue.value == "<hidden>"
    assert token not in issue.message and token not in (issue.hint or "") and token not in str(issue)
    assert token not in json.dumps(issue.to_dict())
    listed = SpecIssue("data.train", "missing", value=[URLS["s3-key-secret"], "/data/x"])
    assert listed.value == ["<hidden>", "/data/x"]
    named = SpecIssue("cluster.slurm.env.DB_PASS", "bad", value="plain words")
    assert named.value == "<hidden>"


# --------------------------------------------------------------------------------------------
# [cluster.slurm] env names (the slurm-secret rule)


@pytest.mark.parametrize("name", ["DB_PASS", "GH_PAT", "NPM_AUTH", "BEARER", "COOKIE", "SESSION", "SSH_PRIVATE_KEY",
                                  "NETRC", "HF_TOKEN"])
def test_secret_env_names_are_refused_by_the_slurm_settings(name: str) -> None:
    loaded = load_text(BASE + f'[cluster.slurm]\nenv = {{ {name} = "plain-value-1234" }}\n')
    found = [i for i in issues_for("sbatch", loaded) if i.severity == "error"]
    assert [(i.rule, i.key, i.value) for i in found] == [("slurm-secret", f"cluster.slurm.env.{name}", "<hidden>")]
    assert "plain-value-1234" not in str(found[0])


def test_tokenizers_parallelism_is_an_ordinary_env_name() -> None:
    loaded = load_text(BASE + '[cluster.slurm]\nenv = { TOKENIZERS_PARALLELISM = "false", HF_HOME = "/data/hf_cache" }\n')
    assert not [i for i in issues_for("sbatch", loaded) if i.severity == "error"]


# --------------------------------------------------------------------------------------------
# validate / plan / compile refuse; show hides

#: (TOML to append to BASE, the key the error names, the secret that must not be printed).
IN_FIELDS = [
    (f"[checkpoint]\ninit_from = {toml_str('hf:' + URLS['https-user-password'])}\n", "checkpoint.init_from",
     "s3cr3tPassw0rd"),
    (f"[checkpoint]\ninit_from = {toml_str('mcore:/ckpt/' + TOKENS['huggingface'])}\n", "checkpoint.init_from",
     TOKENS["huggingface"]),
    (f"[checkpoint]\nsave = {toml_str('runs/' + TOKENS['github'] + '/ckpt')}\n", "checkpoint.save", TOKENS["github"]),
    (f"description = {toml_str('token ' + TOKENS['openai'])}\n", "description", TOKENS["openai"]),
    (f"[logging]\nwandb_project = \"p\"\nwandb_exp_name = {toml_str(TOKENS['jwt'])}\n", "logging.wandb_exp_name",
     TOKENS["jwt"]),
    (f"[cluster.slurm]\ncontainer_image = {toml_str(URLS['docker-login'])}\n", "cluster.slurm.container_image",
     "hunter2hunter2"),
    (f"[cluster.slurm]\ncontainer_image = \"nvcr.io#nvidia/pytorch:25.01-py3\"\n"
     f"container_mounts = [\"/lustre:/lustre\", {toml_str('/x:/y:' + TOKENS['aws-key-id'])}]\n",
     "cluster.slurm.container_mounts.1", TOKENS["aws-key-id"]),
    (f"[cluster.slurm]\nenv = {{ MY_SETTING = {toml_str(TOKENS['slack-bot'])} }}\n", "cluster.slurm.env.MY_SETTING",
     TOKENS["slack-bot"]),
    (f"[cluster.slurm]\nenv = {{ HF_HUB_URL = {toml_str(URLS['query-token'])} }}\n", "cluster.slurm.env.HF_HUB_URL",
     "Ab1Cd2Ef3Gh4Ij5Kl6"),
]


def _spec_with_data_secret(tmp_path: Path) -> tuple[Path, str, str]:
    """A spec with an S3 key in a data prefix and a Hugging Face token as the tokenizer path."""
    text = BASE.replace("mock = true", f"mock = false\ntrain = [{toml_str(URLS['s3-key-secret'])}]")
    text = text.replace('type = "NullTokenizer"\nvocab_size = 1000',
                        f'type = "HuggingFaceTokenizer"\nmodel = {toml_str(TOKENS["huggingface"])}')
    path = tmp_path / "data.toml"
    path.write_text(text, encoding="utf-8")
    return path, "wJalrXUtnFEMI", TOKENS["huggingface"]


@pytest.mark.parametrize(("extra", "key", "secret"), IN_FIELDS, ids=[c[1] for c in IN_FIELDS])
def test_validate_refuses_a_secret_in_any_string_field(tmp_path: Path, extra: str, key: str, secret: str) -> None:
    path = spec_file(tmp_path, extra)
    result = run("validate", str(path))
    assert result.exit_code == EXIT_USAGE, result.stdout + result.stderr
    assert secret not in result.stdout + result.stderr
    assert "[secret-in-spec]" in result.stderr and key in result.stderr
    assert "<hidden>" in result.stderr and "environment" in result.stderr
    as_json = run("validate", str(path), "--json")
    assert as_json.exit_code == EXIT_USAGE and secret not in as_json.stdout
    found = [i for i in json.loads(as_json.stdout)["issues"] if i["rule"] == "secret-in-spec"]
    assert [(i["key"], i["value"], i["severity"]) for i in found] == [(key, "<hidden>", "error")]
    assert found[0]["line"] is not None  # points at the line to edit
    assert "export" in found[0]["hint"] and "inherits" in found[0]["hint"]


def test_validate_refuses_secrets_in_data_prefixes_and_tokenizer_paths(tmp_path: Path) -> None:
    path, *secrets = _spec_with_data_secret(tmp_path)
    result = run("validate", str(path), "--json")
    assert result.exit_code == EXIT_USAGE
    assert not any(s in result.stdout for s in secrets)  # not even in the path-not-found warnings
    keys = {i["key"] for i in json.loads(result.stdout)["issues"] if i["rule"] == "secret-in-spec"}
    assert keys == {"data.train.0.prefix", "data.tokenizer.model"}


def test_a_secret_given_with_set_is_refused(tmp_path: Path) -> None:
    path = spec_file(tmp_path)
    result = run("validate", str(path), "--set", f"name={TOKENS['github-fine-grained']}")
    assert result.exit_code == EXIT_USAGE
    assert TOKENS["github-fine-grained"] not in result.stdout + result.stderr and "[secret-in-spec]" in result.stderr


def test_other_rules_echo_no_secret(tmp_path: Path) -> None:
    """An unknown GPU id is echoed by the unknown-gpu rule: hidden there too."""
    path = tmp_path / "spec.toml"
    path.write_text(BASE.replace('gpu = "h100"', f"gpu = {toml_str(TOKENS['npm'])}"), encoding="utf-8")
    result = run("validate", str(path))
    assert result.exit_code == EXIT_USAGE
    assert TOKENS["npm"] not in result.stdout + result.stderr and "[unknown-gpu]" in result.stderr


@pytest.mark.parametrize("case", [0, 2, 5, 7], ids=[IN_FIELDS[i][1] for i in (0, 2, 5, 7)])
def test_compile_and_plan_refuse_and_write_nothing(tmp_path: Path, case: int) -> None:
    extra, key, secret = IN_FIELDS[case]
    path = spec_file(tmp_path, extra)
    out = tmp_path / "out"
    result = run("compile", str(path), "-o", str(out))
    assert result.exit_code == EXIT_USAGE, result.stdout + result.stderr
    assert secret not in result.stdout + result.stderr and key in result.stderr
    assert not out.exists() or not any(out.iterdir())
    planned = run("plan", str(path))
    assert planned.exit_code == EXIT_USAGE and secret not in planned.stdout + planned.stderr


def test_compile_of_clean_lookalikes_still_works(tmp_path: Path) -> None:
    """Paths that look like tokens (hf_cache, sk-lab) and ordinary env names compile."""
    extra = ('[checkpoint]\nsave = "/home/sk-lab/runs/hf_cache/ckpt"\n'
             '[cluster.slurm]\nenv = { TOKENIZERS_PARALLELISM = "false", HF_HOME = "/data/hf_cache" }\n')
    path = spec_file(tmp_path, extra)
    out = tmp_path / "out"
    result = run("compile", str(path), "-o", str(out))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "TOKENIZERS_PARALLELISM=false" in (out / "launch.sbatch").read_text()


def test_rendering_refuses_a_secret_that_bypassed_validation(tmp_path: Path) -> None:
    """compile.render (the files' text) is the last gate: a caller that skipped validation
    still gets no file holding a token."""
    from dlmspec.render.compile import render
    from dlmspec.errors import SpecError

    spec = load_text(BASE).spec.replace(**{"checkpoint.save": f"runs/{TOKENS['huggingface']}"})
    with pytest.raises(SpecError) as info:
        render(resolve(spec), "spec.toml")
    assert TOKENS["huggingface"] not in str(info.value)
    assert [i.rule for i in info.value.issues] == ["secret-in-spec"]


def _show_case(tmp_path: Path) -> tuple[Path, list[str]]:
    extra = (f"description = {toml_str('see ' + URLS['https-user-password'])}\n"
             f"[checkpoint]\ninit_from = {toml_str('hf:/models/' + TOKENS['huggingface'])}\n"
             f"[cluster.slurm]\ncontainer_image = {toml_str(URLS['docker-login'])}\n"
             f"env = {{ DB_PASS = \"plain-words-pw\", GH_PAT = {toml_str(TOKENS['github'])}, "
             f"OTHER = {toml_str(TOKENS['aws-key-id'])}, TOKENIZERS_PARALLELISM = \"false\" }}\n")
    return spec_file(tmp_path, extra), ["s3cr3tPassw0rd", TOKENS["huggingface"], "hunter2hunter2", "plain-words-pw", TOKENS["github"],
                  TOKENS["aws-key-id"]]


def test_show_hides_secrets(tmp_path: Path) -> None:
    path, secrets = _show_case(tmp_path)
    result = run("show", str(path))
    assert result.exit_code == 0, result.stderr
    assert not [s for s in secrets if s in result.stdout + result.stderr]
    assert 'DB_PASS = "<hidden>"' in result.stdout and 'init_from = "<hidden>"' in result.stdout
    assert 'TOKENIZERS_PARALLELISM = "false"' in result.stdout
    shown = tmp_path / "shown.toml"
    shown.write_text(result.stdout, encoding="utf-8")
    load(shown)  # still a spec that loads


def test_show_json_hides_secrets(tmp_path: Path) -> None:
    path, secrets = _show_case(tmp_path)
    result = run("show", str(path), "--json")
    assert result.exit_code == 0, result.stderr
    assert not [s for s in secrets if s in result.stdout]
    data = json.loads(result.stdout)["result"]["spec"]
    env = data["cluster"]["slurm"]["env"]
    assert env == {"DB_PASS": "<hidden>", "GH_PAT": "<hidden>", "OTHER": "<hidden>", "TOKENIZERS_PARALLELISM": "false"}
    assert data["checkpoint"]["init_from"] == "<hidden>" and data["cluster"]["slurm"]["container_image"] == "<hidden>"
    assert data["description"] == "<hidden>"


def test_a_token_used_as_a_key_is_refused_and_hidden(tmp_path: Path) -> None:
    token = TOKENS["github"]
    path = spec_file(tmp_path, f'[cluster.slurm]\nenv = {{ {token} = "1" }}\n')
    for args in (("validate", str(path)), ("validate", str(path), "--json"), ("show", str(path)),
                 ("show", str(path), "--json")):
        result = run(*args)
        assert token not in result.stdout + result.stderr, args
        assert result.exit_code == (EXIT_USAGE if args[0] == "validate" else 0), args
    issues = json.loads(run("validate", str(path), "--json").stdout)["issues"]
    assert [(i["rule"], i["key"]) for i in issues if i["severity"] == "error"] == [
        ("secret-in-spec", "cluster.slurm.env.ghp_<hidden>")]  # the prefix says what it was
