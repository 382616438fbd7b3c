"""launch.sbatch without a cluster: rendering, shell safety, the script's behaviour, submit.

The script is run by bash here with fake ``srun``/``scontrol``/``apptainer`` and a fake Python
on PATH (tests/slurm/fakebin), so quoting, the rendezvous variables, the per-task wrappers,
the signal trap and the requeue are exercised for real, and hostile spec values are shown to
arrive intact with no side effect. ``shellcheck`` runs when installed (``apt-get install -y
shellcheck``). The real SLURM tests are in tests/integration/render/test_slurm_cluster.py.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bundled_specs_kit import single_specs

from dlmspec.check import issues_for
from dlmspec.check.slurm import time_limit_seconds
from dlmspec.errors import REQUEUE_EXIT_CODE, SpecError
from dlmspec.escape import sbatch_value
from dlmspec.spec.load import load, load_text
from dlmspec.resolve import resolve
from dlmspec.render.sbatch import (
    PORT_BASE,
    PORT_SPAN,
    rendezvous_port,
    render_sbatch,
    shell_word,
)
from dlmspec.cli.submit import dry_run_script, plan_submission, submit
from dlmspec.spec.models import Spec
from small_spec import SMALL, SMALL_SPEC
from spec_kit import spec_file

from slurm_kit import (  # noqa: F401 (fixtures among them)
    BASE,
    FAKEBIN,
    ROOT,
    env_dict,
    nul_list,
    render,
    run_script,
    spec_with,
)

SPECS = single_specs()  # a sweep is several specs: tests/integration/cli/test_sweep.py compiles each member
SHELLCHECK = shutil.which("shellcheck")


#: Values that would run a command (or break the script) if a shell ever evaluated them.
HOSTILE = [
    "$(touch pwned-1)",
    "`touch pwned-2`",
    "a; touch pwned-3",
    "it's \"quoted\" $HOME ${PATH} \\n",
    "'$(touch pwned-4)'",
    '"$(touch pwned-5)"',
    "sp aces\ttab && touch pwned-6 | cat # hash",
    "line1\ntouch pwned-7\n#SBATCH --partition=evil",
]






def shellcheck(path: Path) -> None:
    """Fail with shellcheck's findings (any severity)."""
    result = subprocess.run([SHELLCHECK, "--norc", "--shell=bash", str(path)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def bash_n(path: Path) -> None:
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def directives(text: str) -> list[list[str]]:
    """The arguments of each ``#SBATCH`` line, read the way sbatch does: only the lines before
    the first command count (sbatch(1)), and each is split as src/sbatch/opt.c
    ``_get_argument`` does (whitespace separates, single/double quotes group, backslash
    escapes, an unquoted # ends the line)."""
    lines = []
    for line in text.splitlines()[1:]:
        if line.strip() and not line.lstrip().startswith("#"):
            break
        if not line.startswith("#SBATCH"):
            continue
        args, cur, quote, escape, started = [], "", None, False, False
        for ch in line[len("#SBATCH"):]:
            if escape:
                cur, escape, started = cur + ch, False, True
            elif ch == "\\":
                escape = True
            elif quote:
                if ch == quote:
                    quote = None
                else:
                    cur += ch
            elif ch in "\"'":
                quote, started = ch, True
            elif ch == "#":
                break
            elif ch.isspace():
                if started:
                    args.append(cur)
                cur, started = "", False
            else:
                cur, started = cur + ch, True
        if started:
            args.append(cur)
        lines.append(args)
    return lines


def options(text: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for args in directives(text):
        assert len(args) == 1, args
        name, _, value = args[0].partition("=")
        out[name] = value if _ else None
    return out


# --------------------------------------------------------------------------------------------
# Rendering the specs of specs/ and variants


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_every_spec_renders_valid_bash(path: Path, tmp_path: Path) -> None:
    spec = load(path).spec
    text = render_sbatch(resolve(spec))
    assert text == render_sbatch(resolve(load(path).spec)), "not deterministic"
    assert text.startswith("#!/bin/bash\n") and text.endswith("\n")
    opts = options(text)
    assert opts["--nodes"] == str(spec.cluster.nodes)
    slurm = spec.cluster.slurm
    if slurm is None or slurm.gpu_request == "gpus-per-node":
        assert opts["--gpus-per-node"].split(":")[-1] == str(spec.cluster.gpus_per_node)
    assert opts["--signal"].startswith("B:USR1@")
    script = tmp_path / "launch.sbatch"
    script.write_text(text)
    bash_n(script)
    if SHELLCHECK:
        shellcheck(script)


VARIANTS = [
    {"cluster.nodes": 4, "cluster.gpus_per_node": 8},
    {"cluster.nodes": 2, "cluster.slurm": {"launcher": "srun", "gpu_request": "gres", "gpu_type": "h100"}},
    {"cluster.nodes": 16, "cluster.slurm": {"gpu_request": "none", "exclusive": False, "requeue": False}},
    {"cluster.nodes": 2, "cluster.slurm": {"container_image": "nvcr.io#nvidia/pytorch:25.01-py3",
                                           "container_mounts": ["/lustre:/lustre", "/home/u/data:/data:ro"],
                                           "cpus_per_task": 64, "mem": "480G"}},
    {"cluster.nodes": 2, "cluster.slurm": {"launcher": "srun", "container_runtime": "apptainer",
                                           "container_image": "/images/torch.sif", "container_mounts": ["/scratch"]}},
    {"cluster.slurm": {"partition": "gpu,gpu-long", "account": "proj_1", "qos": "high", "time": "2-00:00:00",
                       "constraint": "h100&ib", "exclude": "node[01-03],node7", "output": "logs/%x-%j.out",
                       "env": {"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5_0,mlx5_1"}}},
    {"logging.wandb_project": "dlm", "cluster.slurm": {"signal_seconds_before_end": 600}},
]


@pytest.mark.parametrize("changes", VARIANTS, ids=[f"variant{i}" for i in range(len(VARIANTS))])
def test_variants_render_valid_bash(changes: dict, tmp_path: Path) -> None:
    text = render(**changes)
    script = tmp_path / "launch.sbatch"
    script.write_text(text)
    bash_n(script)
    if SHELLCHECK:
        shellcheck(script)


def test_directives_follow_the_spec() -> None:
    opts = options(render(**{"cluster.nodes": 4, "cluster.gpus_per_node": 8, "cluster.slurm": {
        "partition": "gpu", "account": "acct", "qos": "q", "time": "1-02:03:04", "cpus_per_task": 32,
        "mem": "400G", "constraint": "a100", "exclude": "n[1-2]", "output": "logs/%j.out",
        "signal_seconds_before_end": 120, "job_name": "pre train"}}))
    assert opts == {
        "--job-name": "pre train", "--nodes": "4", "--ntasks-per-node": "1", "--gpus-per-node": "8",
        "--cpus-per-task": "32", "--mem": "400G", "--time": "1-02:03:04", "--partition": "gpu",
        "--account": "acct", "--qos": "q", "--output": "logs/%j.out", "--open-mode": "append",
        "--exclusive": None, "--constraint": "a100", "--exclude": "n[1-2]", "--signal": "B:USR1@120",
        "--requeue": None,
    }


def test_gpu_request_and_launcher() -> None:
    srun = options(render(**{"cluster.gpus_per_node": 4, "cluster.slurm": {"launcher": "srun", "gpu_request": "gres",
                                                                           "gpu_type": "a100"}}))
    assert srun["--ntasks-per-node"] == "4" and srun["--gres"] == "gpu:a100:4" and "--gpus-per-node" not in srun
    typed = options(render(**{"cluster.slurm": {"gpu_type": "h100"}}))
    assert typed["--gpus-per-node"] == "h100:2"
    none = options(render(**{"cluster.slurm": {"gpu_request": "none", "requeue": False, "exclusive": False}}))
    assert "--gpus-per-node" not in none and "--gres" not in none and "--exclusive" not in none
    assert "--no-requeue" in none and "--requeue" not in none


def test_job_name_defaults_to_the_spec_name() -> None:
    assert options(render(name="my-run"))["--job-name"] == "my-run"
    assert options(render(**{"name": "my-run", "cluster.slurm": {"job_name": "other"}}))["--job-name"] == "other"


def test_helpers() -> None:
    assert time_limit_seconds("90") == 5400
    assert time_limit_seconds("10:30") == 630
    assert time_limit_seconds("01:00:05") == 3605
    assert time_limit_seconds("2-03") == 2 * 86400 + 3 * 3600
    assert time_limit_seconds("1-00:10") == 86400 + 600
    assert time_limit_seconds("UNLIMITED") is None
    with pytest.raises(ValueError):
        time_limit_seconds("4h")
    assert rendezvous_port(1) == PORT_BASE + 1
    assert rendezvous_port(PORT_SPAN + 7) == PORT_BASE + 7
    assert all(1024 < rendezvous_port(j) < 32768 for j in (0, 1, 19999, 20000, 123456789))
    assert sbatch_value("plain-name_1.2") == "plain-name_1.2"
    assert sbatch_value('a "b" \\c') == '"a \\"b\\" \\\\c"'
    with pytest.raises(ValueError):
        sbatch_value("a\nb")


def test_shell_words_expand_to_the_value_in_bash(tmp_path: Path) -> None:
    values = HOSTILE + ["", "a,b", "ünï©ødé", "tab\there", "bell\x07\x1b[31m", "\\x41", "it's", "\u2028sep", "-n"]
    script = tmp_path / "words.sh"
    script.write_text("".join(f"printf '%s\\0' {shell_word(v)}\n" for v in values))
    out = subprocess.run(["bash", str(script)], capture_output=True, cwd=tmp_path, timeout=30,
                         env={"PATH": os.environ["PATH"], "LC_ALL": "C"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(b"\0")[:-1] == [v.encode() for v in values]
    assert not list(tmp_path.glob("pwned*"))
    assert all("\n" not in shell_word(v) for v in values)
    with pytest.raises(ValueError):
        shell_word("a\x00b")


def test_constants_agree_with_the_runtimes() -> None:
    from dlmspec.backends.launch import check

    assert check.REQUEUE_EXIT_CODE == REQUEUE_EXIT_CODE
    assert (check.PORT_BASE, check.PORT_SPAN) == (PORT_BASE, PORT_SPAN)
    runtime = (ROOT / "backends" / "megatron" / "config.py").read_text()
    assert "from dlmspec.errors import REQUEUE_EXIT_CODE" in runtime, \
        "backends/megatron/config.py must exit with dlmspec.errors.REQUEUE_EXIT_CODE after a signal"
    assert not re.search(r"^REQUEUE_EXIT_CODE\s*=", runtime, re.M), "one definition: dlmspec.errors.REQUEUE_EXIT_CODE"


# --------------------------------------------------------------------------------------------
# Refused values: clear errors, never a broken or leaking script


@pytest.mark.parametrize("changes, key", [
    ({"cluster.slurm": {"partition": "gpu; rm -rf ~"}}, "cluster.slurm.partition"),
    ({"cluster.slurm": {"account": "a b"}}, "cluster.slurm.account"),
    ({"cluster.slurm": {"qos": "$(id)"}}, "cluster.slurm.qos"),
    ({"cluster.slurm": {"exclude": "n1 n2"}}, "cluster.slurm.exclude"),
    ({"cluster.slurm": {"gpu_type": "a100:2"}}, "cluster.slurm.gpu_type"),
    ({"cluster.slurm": {"mem": "400 GB"}}, "cluster.slurm.mem"),
    ({"cluster.slurm": {"time": "4h"}}, "cluster.slurm.time"),
    ({"cluster.slurm": {"time": "00:05:00", "signal_seconds_before_end": 300}}, "cluster.slurm.signal_seconds_before_end"),
    ({"cluster.slurm": {"signal_seconds_before_end": 70000, "time": "UNLIMITED"}}, "cluster.slurm.signal_seconds_before_end"),
    ({"cluster.slurm": {"job_name": "a\nb"}}, "cluster.slurm.job_name"),
    ({"name": "a\n#SBATCH --x"}, "name"),
    ({"cluster.slurm": {"job_name": "a/b"}}, "cluster.slurm.job_name"),
    ({"cluster.slurm": {"output": "x\r.out"}}, "cluster.slurm.output"),
    ({"cluster.slurm": {"constraint": "a\x00"}}, "cluster.slurm.constraint"),
    ({"cluster.slurm": {"env": {"BAD NAME": "1"}}}, "cluster.slurm.env.BAD NAME"),
    ({"cluster.slurm": {"env": {"MASTER_PORT": "1234"}}}, "cluster.slurm.env.MASTER_PORT"),
    ({"cluster.slurm": {"env": {"DLMSPEC_CHECK_MODE": "env"}}}, "cluster.slurm.env.DLMSPEC_CHECK_MODE"),
    ({"cluster.slurm": {"container_image": "img", "container_mounts": ["/a:/b,/c:/d"]}}, "cluster.slurm.container_mounts"),
    ({"cluster.slurm": {"container_mounts": ["/a:/b"]}}, "cluster.slurm.container_mounts"),
    ({"cluster.slurm": {"container_image": "img\nx"}}, "cluster.slurm.container_image"),
])
def test_bad_values_are_refused_with_the_key(changes: dict, key: str) -> None:
    with pytest.raises(SpecError) as info:
        render(**changes)
    assert key in [i.key for i in info.value.errors], str(info.value)
    assert all(i.hint and i.message for i in info.value.errors)


def test_all_problems_reported_at_once_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    text = BASE + '[cluster.slurm]\npartition = "a b"\ntime = "soon"\n'
    path.write_text(text)
    lines = text.splitlines()
    loaded = load(path)
    issues = issues_for("sbatch", loaded)
    assert {(i.key, i.line) for i in issues} == {
        ("cluster.slurm.partition", lines.index('partition = "a b"') + 1),
        ("cluster.slurm.time", lines.index('time = "soon"') + 1),
    }
    assert all(i.file == str(path.resolve()) or i.file == str(path) for i in issues)


@pytest.mark.parametrize("name", ["WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY",
                                  "MY_PASSWORD", "OPENAI_API_KEY"])
def test_secrets_in_the_spec_are_refused_and_never_echoed(name: str) -> None:
    secret = "sk-very-secret-0123456789"
    with pytest.raises(SpecError) as info:
        render(**{"cluster.slurm": {"env": {name: secret}}})
    assert [i.rule for i in info.value.errors] == ["slurm-secret"]
    assert secret not in str(info.value) and secret not in repr(info.value.issues[0].to_dict())


def test_secrets_in_the_environment_never_reach_the_script(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret-value-42")
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_42")
    text = render(**{"logging.wandb_project": "proj", "logging.wandb_exp_name": "exp"})
    assert "secret-value-42" not in text and "secret_value_42" not in text
    assert '"${WANDB_API_KEY:-}"' in text  # checked at run time, by name


# --------------------------------------------------------------------------------------------
# Running the script with fake SLURM tools








def test_torchrun_launch_gets_rendezvous_and_node_rank(tmp_path: Path) -> None:
    text = render(**{"cluster.nodes": 2, "cluster.gpus_per_node": 4, "cluster.slurm": {"cpus_per_task": 16}})
    result, log, _ = run_script(text, tmp_path)
    assert result.returncode == 0, result.stderr
    srun = nul_list(log / "srun.argv")
    assert srun[:4] == ["--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--cpus-per-task=16"]
    argv = nul_list(log / "python.argv")
    assert argv[:4] == ["-m", "torch.distributed.run", "--node-rank=1", "--nnodes=2"]
    assert "--nproc-per-node=4" in argv and "--master-addr=node07" in argv
    assert f"--master-port={rendezvous_port(4242)}" in argv
    # fakebin's torchrun --help lists no option: the optional signal options are left out
    # (tests/integration/render/test_torchrun_options.py passes each torch version's list).
    assert not [a for a in argv if a.startswith(("--signals-to-handle", "--shutdown-timeout"))]
    assert argv[-1] == str(tmp_path / "train.py")
    env = env_dict(log / "python.env")
    assert env["MASTER_ADDR"] == "node07" and env["MASTER_PORT"] == str(rendezvous_port(4242))


def test_srun_launch_sets_ranks_from_slurm(tmp_path: Path) -> None:
    text = render(**{"cluster.nodes": 2, "cluster.gpus_per_node": 4, "cluster.slurm": {"launcher": "srun"}})
    result, log, _ = run_script(text, tmp_path)
    assert result.returncode == 0, result.stderr
    assert nul_list(log / "srun.argv")[:2] == ["--nodes=2", "--ntasks-per-node=4"]
    assert nul_list(log / "python.argv") == [str(tmp_path / "train.py")]
    env = env_dict(log / "python.env")
    # fakebin/srun runs the task as SLURM would for task 5: node 1, local id 1, of 8.
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == (
        "5", "1", "8", "4", "1")


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_container_launch(runtime: str, tmp_path: Path) -> None:
    image = "nvcr.io#nvidia/pytorch:25.01-py3 $(touch pwned-img)"
    mounts = ["/lus tre:/lustre", "/d:/data:ro"]
    text = render(**{"cluster.slurm": {"container_runtime": runtime, "container_image": image,
                                       "container_mounts": mounts}})
    result, log, work = run_script(text, tmp_path)
    assert result.returncode == 0, result.stderr
    srun = nul_list(log / "srun.argv")
    if runtime == "pyxis":
        assert f"--container-image={image}" in srun
        assert "--container-mounts=/lus tre:/lustre,/d:/data:ro" in srun
        assert f"--container-workdir={work}" in srun
    else:
        apptainer = nul_list(log / "apptainer.argv")
        assert apptainer[:7] == ["exec", "--nv", "--bind", mounts[0], "--bind", mounts[1], image]
    assert not list(work.glob("pwned*")) and not list(tmp_path.glob("pwned*"))


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_hostile_values_arrive_intact_and_run_nothing(launcher: str, tmp_path: Path) -> None:
    env = {f"V{i}": value for i, value in enumerate(HOSTILE)}
    name = "n $(touch pwned-n) `touch pwned-m` \"x\" 'y' # z \\"
    text = render(**{"name": name, "cluster.slurm": {
        "launcher": launcher, "env": env, "job_name": name, "constraint": "a&b|$(touch pwned-c)",
        "output": "slurm $(touch pwned-o) %j.out"}})
    opts = options(text)
    assert opts["--job-name"] == name
    assert opts["--constraint"] == "a&b|$(touch pwned-c)"
    assert opts["--output"] == "slurm $(touch pwned-o) %j.out"
    assert "--partition" not in opts  # the newline in V7 did not start an #SBATCH line
    for mode, expect_program in (("0", None), ("env", "dlmspec.backends.launch.check")):
        result, log, work = run_script(text, tmp_path, env={"DLMSPEC_CHECK_MODE": mode})
        assert result.returncode == 0, result.stderr
        seen = env_dict(log / "python.env")
        for key, value in env.items():
            assert seen[key] == value, key
        argv = nul_list(log / "python.argv")
        if expect_program:
            expected = [a for key, value in sorted(env.items()) for a in ("--expect-env", f"{key}={value}")]
            got = argv[argv.index("dlmspec.backends.launch.check") + 1:]
            assert got[got.index("--expect-env"):] == expected
        assert not list(work.glob("pwned*")) and not list(tmp_path.glob("pwned*")) and not list(log.glob("pwned*"))
    if SHELLCHECK:
        shellcheck(tmp_path / "launch.sbatch")


def test_check_modes_and_outside_slurm(tmp_path: Path) -> None:
    text = render()
    result, log, _ = run_script(text, tmp_path, env={"DLMSPEC_CHECK_MODE": "train", "DLMSPEC_CHECK_DIR": "st"})
    assert result.returncode == 0, result.stderr
    argv = nul_list(log / "python.argv")
    assert argv[argv.index("-m", 2):][:5] == ["-m", "dlmspec.backends.launch.check", "--train", "--state-dir", "st"]
    result, _, _ = run_script(text, tmp_path, env={"DLMSPEC_CHECK_MODE": "bogus"})
    assert result.returncode == 2 and "DLMSPEC_CHECK_MODE=bogus" in result.stderr
    result, _, _ = run_script(text, tmp_path, env={"SLURM_JOB_ID": ""})
    assert result.returncode == 2 and "not inside a SLURM job" in result.stderr
    result, _, _ = run_script(text, tmp_path, env={"DLMSPEC_COMPILED_DIR": str(tmp_path / "nowhere")})
    assert result.returncode == 2 and "train.py not found" in result.stderr


def test_compiled_dir_from_the_job_command(tmp_path: Path) -> None:
    """Without DLMSPEC_COMPILED_DIR the script finds train.py next to the script sbatch was
    given (scontrol's Command=), not in SLURM's spool copy."""
    text = render()
    compiled = tmp_path / "comp iled"
    compiled.mkdir()
    (compiled / "launch.sbatch").write_text(text)
    (compiled / "train.py").write_text("")
    result, log, _ = run_script(text, tmp_path, env={"DLMSPEC_COMPILED_DIR": "",
                                                     "FAKE_COMMAND": str(compiled / "launch.sbatch")})
    assert result.returncode == 0, result.stderr
    assert nul_list(log / "python.argv")[-1] == str(compiled / "train.py")


@pytest.mark.parametrize("requeue", [True, False])
def test_usr1_is_forwarded_then_the_job_requeues(requeue: bool, tmp_path: Path) -> None:
    text = render(**{"cluster.slurm": {"requeue": requeue}})
    proc, log, _ = run_script(text, tmp_path, env={"FAKE_SRUN_WAIT": "1"}, background=True)
    try:
        deadline = time.monotonic() + 30
        while not (log / "srun.started").exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (log / "srun.usr1").exists(), stderr
    assert proc.returncode == REQUEUE_EXIT_CODE, stderr
    if requeue:
        assert (log / "requeue").read_text().split() == ["4242"], stderr
    else:
        assert not (log / "requeue").exists() and "submit again to resume" in stderr


def test_plain_exit_codes_pass_through_without_requeue(tmp_path: Path) -> None:
    for code in ("0", "3"):
        result, log, _ = run_script(render(), tmp_path, env={"FAKE_PY_EXIT": code})
        assert result.returncode == int(code), result.stderr
        assert not (log / "requeue").exists()
    result, log, _ = run_script(render(), tmp_path, env={"FAKE_PY_EXIT": str(REQUEUE_EXIT_CODE)})
    assert result.returncode == REQUEUE_EXIT_CODE and (log / "requeue").exists()


# --------------------------------------------------------------------------------------------
# dlmspec submit with a fake sbatch


@pytest.fixture()
def fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "sbatch-log"
    log.mkdir()
    monkeypatch.setenv("PATH", f"{FAKEBIN}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.chdir(tmp_path)
    return log


def test_submit_chains_stages_with_afterok(fake_sbatch: Path, tmp_path: Path) -> None:
    a = spec_file(tmp_path, SMALL, name="pretrain", file_name="pretrain.toml",
                  cluster={"slurm": {"output": "logs/a/%j.out"}})
    b = spec_file(tmp_path, SMALL, name="sft", file_name="sft.toml")
    lines: list[str] = []
    jobs = submit([str(a), str(b)], check_mode="env", echo=lines.append)
    assert [j.job_id for j in jobs] == ["1001", "1002"]
    calls = (fake_sbatch / "sbatch.calls").read_text().splitlines()
    assert calls == [
        f"--parsable compiled/pretrain/launch.sbatch|{tmp_path}/compiled/pretrain|env",
        f"--parsable --dependency=afterok:1001 compiled/sft/launch.sbatch|{tmp_path}/compiled/sft|env",
    ]
    assert (tmp_path / "compiled" / "sft" / "train.py").is_file()
    assert (tmp_path / "logs" / "a").is_dir(), "the log directory is created before sbatch"
    assert "after job 1001" in lines[-1]
    # Submitting again reuses identical compiles; a compiled directory is submitted as it is.
    submit([str(a)], echo=lines.append)
    submit([str(tmp_path / "compiled" / "sft")], echo=lines.append)
    assert len((fake_sbatch / "sbatch.calls").read_text().splitlines()) == 4


def test_submit_dry_run_prints_and_writes_nothing(fake_sbatch: Path, tmp_path: Path) -> None:
    a = spec_file(tmp_path, SMALL, name="a", file_name="a.toml")
    b = spec_file(tmp_path, SMALL, name="b", file_name="b.toml")
    lines: list[str] = []
    assert submit([str(a), str(b)], dry_run=True, output="out dir", echo=lines.append) == []
    text = "\n".join(lines)
    assert f"dlmspec compile {a} --output 'out dir/a'" in text
    assert '"--dependency=afterok:$job1"' in text and "'out dir/b/launch.sbatch'" in text
    assert not (tmp_path / "out dir").exists() and not (fake_sbatch / "sbatch.calls").exists()
    bash = tmp_path / "dry.sh"
    bash.write_text(text + "\n")
    bash_n(bash)


def test_submit_errors_are_spec_errors(fake_sbatch: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = spec_file(tmp_path, SMALL, name="a", file_name="a.toml")
    with pytest.raises(SpecError, match="no such spec file"):
        submit([str(tmp_path / "missing.toml")])
    with pytest.raises(SpecError, match="unknown check mode"):
        submit([str(a)], check_mode="gpu")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(SpecError, match="another compile"):
        submit([str(a)], output="busy")
    monkeypatch.setenv("FAKE_SBATCH_FAIL", "sbatch: error: invalid partition specified: gpu")
    with pytest.raises(SpecError, match="invalid partition specified") as info:
        submit([str(a)])
    assert info.value.errors[0].key == "sbatch"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(SpecError, match="sbatch is not on PATH"):
        submit([str(a)])


def test_cli_submit_exit_codes(fake_sbatch: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    cli = pytest.importorskip("dlmspec.cli")
    a = spec_file(tmp_path, SMALL, name="a", file_name="a.toml")
    assert cli.main(["submit", str(a), "--dry-run"]) == 0
    assert "sbatch --parsable compiled/a/launch.sbatch" in capsys.readouterr().out
    assert cli.main(["submit", str(a), "--check", "env"]) == 0
    assert "as job 1001" in capsys.readouterr().out
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert cli.main(["submit", str(a)]) == 2
    captured = capsys.readouterr()
    assert "sbatch is not on PATH" in captured.err and "Traceback" not in captured.err + captured.out


def test_plan_submission_refuses_set_on_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    a = spec_file(tmp_path, SMALL, name="a", file_name="a.toml")
    steps = plan_submission([str(a)])
    assert steps[0].compile_command == ["dlmspec", "compile", str(a), "--output", "compiled/a"]
    script = dry_run_script(steps, check_mode="train")
    assert "DLMSPEC_CHECK_MODE=train" in script
    directory = tmp_path / "d"
    directory.mkdir()
    (directory / "launch.sbatch").write_text(render())
    with pytest.raises(SpecError, match="--set applies to spec files"):
        plan_submission([str(directory)], overrides=["train.seed=1"])
