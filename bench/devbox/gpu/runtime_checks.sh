#!/usr/bin/env bash
# train.py's checks before the first step and on resume, on one GPU, unattended.
# Prepare (CPU machine): .venv/bin/python bench/gpu/prepare_checks.py   (-> .device/checks/*)
# Device (repository root; carry .data .device .whl/mc):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#     .whl/mc/megatron_core*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 && \
#     bash bench/devbox/gpu/runtime_checks.sh $OUT                                          (~5 minutes)
# Steps, all in one run directory (.device/runs/checks), each resuming from the one before:
#   base    train 0 -> 40, checkpoints at 20 and 40 (each with spec.lock.toml and the spec record)
#   shape   num_layers 12 -> 6: must refuse (exit 2, names model.num_layers) before megatron-core
#   full    train_iters 60, lr 5e-4, saving on a tmpfs that holds 1.5 checkpoints (copy of iter 40):
#           the save at 60 meets a full disk: exit 2 naming the folder and free space, latest still
#           iter_0000040, no iter_0000060 left (skipped, and said so, if tmpfs cannot be mounted)
#   fsize   the same on the real folder under `ulimit -f` (files over 50 MiB cannot be written)
#   longer  train_iters 60, lr 5e-4, no limit: resumes from iter 40 (latest unchanged by the two
#           failures), reports the allowed changes, the schedule follows the new values (no
#           megatron-core AssertionError), saves at 60
#   badbin  the train .bin truncated by 1000 bytes: must refuse (exit 2 naming the .bin)
#   nocuda  CUDA_VISIBLE_DEVICES= python3 train.py: one line "no CUDA device", exit 2
# launch.sh runs `train.py --check` before torchrun, so a start refusal is launch.sh's exit code 2;
# a failed save happens inside torchrun, which exits 1 and reports the worker's "exitcode  : 2".
# Writes OUT_DIR/runtime_checks.json ("ok" and each step's expected/actual result and evidence)
# and OUT_DIR/runtime_checks_logs.tgz (each step's log and checkpoint listing).
set -u
dest=${1:?usage: runtime_checks.sh OUT_DIR}
mkdir -p "$dest"
out=$(mktemp -d /tmp/dlmspec-checks.XXXXXX)
C=.device/checks
CK=.device/runs/checks/ckpt
rm -rf .device/runs/checks .device/runs/checks-badbin "$C/data"

step() {  # NAME COMMAND...: the command's output in $out/NAME.log, its exit code in $out/NAME.rc
  local name=$1 t0
  shift
  t0=$(date +%s)
  "$@" > "$out/$name.log" 2>&1
  echo $? > "$out/$name.rc"
  echo "$name: exit $(cat "$out/$name.rc") after $(( $(date +%s) - t0 ))s"
}
state() {  # NAME [DIR]: what the checkpoint folder holds after step NAME
  local dir=${2:-$CK}
  { echo "latest=$(cat "$dir/latest" 2>/dev/null)"; ls -a "$dir" 2>&1; ls -la "$dir"/iter_0000060 2>&1; } > "$out/$1.ckpt"
}

step base timeout -s KILL 300 bash "$C/base/launch.sh"
state base
cp "$CK/iter_0000040/dlmspec.json" "$out/base_dlmspec.json" 2>/dev/null
cmp -s "$C/base/spec.lock.toml" "$CK/iter_0000040/spec.lock.toml" && echo same > "$out/base_lock.cmp"

step shape timeout -s KILL 180 bash "$C/shape/launch.sh"
state shape

small=/tmp/dlmspec-small
mkdir -p "$small"
size=$(du -sb "$CK/iter_0000040" | cut -f1)
if mount -t tmpfs -o size=$(( size * 3 / 2 )) tmpfs "$small" 2> "$out/full_mount.err"; then
  mkdir -p "$small/ckpt" && cp -a "$CK/iter_0000040" "$small/ckpt/" && echo iter_0000040 > "$small/ckpt/latest"
  step full timeout -s KILL 300 bash "$C/full/launch.sh"
  state full "$small/ckpt"
  df -B1 "$small" >> "$out/full.ckpt"
  umount "$small"
else
  echo "full: skipped, tmpfs not mountable: $(cat "$out/full_mount.err")"
fi

step fsize bash -c "ulimit -f 51200; exec timeout -s KILL 300 bash $C/longer/launch.sh"
state fsize

step longer timeout -s KILL 300 bash "$C/longer/launch.sh"
state longer
cp .device/runs/checks/metrics.jsonl "$out/metrics.jsonl" 2>/dev/null

mkdir -p "$C/data"
bin=.data/demo-train_text_document.bin
head -c $(( $(stat -c %s "$bin") - 1000 )) "$bin" > "$C/data/cut_text_document.bin"
cp .data/demo-train_text_document.idx "$C/data/cut_text_document.idx"
step badbin timeout -s KILL 180 bash "$C/badbin/launch.sh"

step nocuda env CUDA_VISIBLE_DEVICES= timeout -s KILL 180 python3 "$C/base/train.py"

bench=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)  # bench/: common.py read_metrics, the one metrics.jsonl reader
BENCH="$bench" python3 - "$out" "$dest" <<'EOF'
import json, math, os, sys
sys.path.insert(0, os.environ["BENCH"])
import common
out = sys.argv[1]
def read(name, default=""):
    try:
        return open(os.path.join(out, name)).read()
    except OSError:
        return default
def rc(name):
    text = read(name + ".rc").strip()
    return int(text) if text else None
def latest(name):
    for line in read(name + ".ckpt").splitlines():
        if line.startswith("latest="):
            return line[len("latest="):]
def child_exit(name):  # the worker's exit code in torchrun's failure report
    for line in read(name + ".log").splitlines():
        if line.strip().startswith("exitcode") and ":" in line:
            return int(line.split(":", 1)[1].split()[0])
def lines(name, *needles):
    return [l for l in read(name + ".log").splitlines() if any(n in l for n in needles)][:12]
steps = {}
def check(name, expect_rc, conditions, evidence):
    ran = os.path.exists(os.path.join(out, name + ".rc"))
    steps[name] = {"ran": ran, "exit": rc(name), "expected_exit": expect_rc,
                   "ok": ran and rc(name) == expect_rc and all(conditions.values()),
                   "conditions": conditions, "evidence": evidence}
meta = json.loads(read("base_dlmspec.json", "{}") or "{}")
check("base", 0, {"latest is iter_0000040": latest("base") == "iter_0000040",
                  "dlmspec.json has the spec record": bool(meta.get("spec", {}).get("record")),
                  "spec.lock.toml copied": read("base_lock.cmp").strip() == "same"},
      {"spec": {k: v for k, v in meta.get("spec", {}).items() if k != "record"}})
check("shape", 2, {"names model.num_layers": bool(lines("shape", "model.num_layers")),
                   "latest unchanged": latest("shape") == "iter_0000040"},
      lines("shape", "train.py:", "model.", "Fix:", "Traceback"))
full_ckpt = read("full.ckpt")
check("full", 1, {"the worker exited 2": child_exit("full") == 2,
                  "names the folder and free space": bool(lines("full", "GiB free")),
                  "latest still iter_0000040": latest("full") == "iter_0000040",
                  "no iter_0000060 left": "iter_0000060" not in full_ckpt.splitlines()},
      lines("full", "saving checkpoint", "GiB free", "Fix:", "Traceback") + full_ckpt.splitlines()[-3:])
check("fsize", 1, {"the worker exited 2": child_exit("fsize") == 2,
                   "names the folder and free space": bool(lines("fsize", "GiB free")),
                   "latest still iter_0000040": latest("fsize") == "iter_0000040",
                   "no iter_0000060 left": "iter_0000060" not in read("fsize.ckpt").splitlines()},
      lines("fsize", "saving checkpoint", "GiB free", "Fix:", "Traceback"))
# the lr the resumed run logged against megatron-core's cosine formula with the new values
records = common.read_metrics(os.path.join(out, "metrics.jsonl"))
train = {r["iteration"]: r["lr"] for r in records if r.get("event") == "train"}
def cosine(step, max_lr=5e-4, min_lr=1e-4, warmup=5, decay=60):
    ratio = (step - warmup) / (decay - warmup)
    return min_lr + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (max_lr - min_lr)
lr = {str(i): {"logged": train.get(i), "expected": cosine(i)} for i in (50, 60)}
check("longer", 0, {"resumed from iter_0000040": bool(lines("longer", "resumed from") and
                                                      any("iter_0000040" in l for l in lines("longer", "resumed from"))),
                    "allowed changes reported": bool(lines("longer", "train.train_iters: 40 -> 60")),
                    "no scheduler AssertionError": not lines("longer", "do not match"),
                    "lr follows the new schedule": all(v["logged"] is not None and
                                                       abs(v["logged"] - v["expected"]) < 1e-9 for v in lr.values()),
                    "latest is iter_0000060": latest("longer") == "iter_0000060"},
      {"lines": lines("longer", "resumed from", "[dlmspec] resume", "->", "learning-rate"), "lr": lr})
check("badbin", 2, {"names the .bin": bool(lines("badbin", "cut_text_document.bin"))},
      lines("badbin", "train.py:", "cut_text_document", "Traceback"))
nocuda = [l for l in read("nocuda.log").splitlines() if l.startswith("train.py:")]
check("nocuda", 2, {"one line naming no CUDA device": len(nocuda) == 1 and "no CUDA device" in nocuda[0]},
      read("nocuda.log").splitlines()[-6:])
result = {"ok": all(s["ok"] for s in steps.values() if s["ran"]) and steps["base"]["ran"], "steps": steps}
json.dump(result, open(os.path.join(sys.argv[2], "runtime_checks.json"), "w"), indent=2)
print(json.dumps({k: (v["ok"] if v["ran"] else "not run") for k, v in steps.items()}), "ok" if result["ok"] else "FAILED")
EOF
tar czf "$dest/runtime_checks_logs.tgz" -C "$out" .
rm -rf "$out"
