"""How much does a launch-bound step time vary between processes, and why?

The planner's misses are launch-bound runs of the 153M demo whose repeated measurements differ by
14-32% (docs/planner.md). This probe separates the causes on the device in ~2 minutes, with a
launch-bound PyTorch workload that starts in seconds (no megatron-core start-up):

    python3 bench/gpu/host_variance.py OUT.json [--steps 40]

Workload (one process, one GPU): 12 pre-norm transformer layers of hidden 256 on 2,048 tokens
(LayerNorm, QKV Linear, SDPA, projection, residual add, LayerNorm, fc1, GELU, fc2, residual add),
forward, backward and a per-tensor AdamW step (``foreach=False``: one launch chain per tensor,
like megatron-core's local optimizer fallbacks). The GPU needs well under a millisecond per
layer, so the step time is the host's. Each process reports the median step time after 10
warm-up steps, :func:`dlmspec.backends.megatron.hostbench.measure_host_launch` before and after, its CPU
affinity and the CPU it ended on.

Scenarios, one after another (each a fresh process, as each calibration run is):
  solo          one process on GPU 0, nothing else running (3 times)
  solo_pinned   the same, bound to one physical core (``os.sched_setaffinity``, 3 times)
  pair          two processes at once, GPU 0 and GPU 1, unbound (2 times)
  pair_pinned   two at once, each bound to its own physical core (2 times)
  pair_siblings two at once, bound to the two hardware threads of one core (once; only where the
                host has SMT siblings)
Writes OUT.json: the host's CPU topology and every process's numbers, with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORKER = r"""
import json, os, statistics, sys, time
cpus = sys.argv[2]
if cpus:
    os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
import torch
from dlmspec.backends.megatron.hostbench import measure_host_launch
steps = int(sys.argv[1])
torch.manual_seed(0)
dev = torch.device("cuda", 0)
h, tokens, layers = 256, 2048, 12
class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.n1 = torch.nn.LayerNorm(h); self.qkv = torch.nn.Linear(h, 3 * h); self.proj = torch.nn.Linear(h, h)
        self.n2 = torch.nn.LayerNorm(h); self.fc1 = torch.nn.Linear(h, 4 * h); self.fc2 = torch.nn.Linear(4 * h, h)
    def forward(self, x):
        q, k, v = self.qkv(self.n1(x)).view(8, tokens // 8, 3, 4, h // 4).unbind(2)
        a = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.proj(a.transpose(1, 2).reshape(8, tokens // 8, h))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.n2(x))))
model = torch.nn.Sequential(*[Layer() for _ in range(layers)]).to(dev, torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False, fused=False)
x = torch.randn(8, tokens // 8, h, device=dev, dtype=torch.bfloat16)
before = measure_host_launch()
times = []
for i in range(steps):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    loss = model(x).float().pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
after = measure_host_launch()
stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
print(json.dumps({"step_ms": statistics.median(times[10:]) * 1e3, "step_ms_all": [round(t * 1e3, 3) for t in times[10:]],
                  "host_launch_us_before": before.seconds_per_launch * 1e6, "host_launch_us_after": after.seconds_per_launch * 1e6,
                  "affinity": sorted(os.sched_getaffinity(0)), "last_cpu": int(stat[36])}))
"""


def topology():
    """Allowed CPUs and their SMT siblings, from /sys (Linux)."""
    allowed = sorted(os.sched_getaffinity(0))
    siblings = {}
    for cpu in allowed:
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        siblings[cpu] = path.read_text().strip() if path.exists() else str(cpu)
    return allowed, siblings


def parse_list(text):
    out = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def launch(gpu, cpus, steps):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-c", WORKER, str(steps), cpus], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def collect(procs):
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        try:
            out.append(json.loads(stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            out.append({"error": (stderr or stdout)[-800:]})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    allowed, siblings = topology()
    groups = []
    for cpu in allowed:
        group = tuple(c for c in parse_list(siblings[cpu]) if c in allowed)
        if group not in groups:
            groups.append(group)
    # two physical cores away from CPU 0 (where the system's own work tends to land)
    core_a, core_b = groups[len(groups) // 2], groups[len(groups) // 2 + 1]
    import torch  # noqa: F401  (only to count GPUs)
    gpus = torch.cuda.device_count()
    plan = [("solo", [(0, "")])] * 3 + [("solo_pinned", [(0, str(core_a[0]))])] * 3
    if gpus >= 2:
        plan += [("pair", [(0, ""), (1, "")])] * 2
        plan += [("pair_pinned", [(0, str(core_a[0])), (1, str(core_b[0]))])] * 2
        if len(core_a) >= 2:
            plan += [("pair_siblings", [(0, str(core_a[0])), (1, str(core_a[1]))])]
    runs = []
    for name, members in plan:
        t0 = time.time()
        results = collect([launch(gpu, cpus, args.steps) for gpu, cpus in members])
        for (gpu, cpus), res in zip(members, results):
            runs.append({"scenario": name, "gpu": gpu, "pinned_to": cpus or None, **res})
            print(name, gpu, cpus or "-", {k: (round(v, 3) if isinstance(v, float) else v)
                                            for k, v in res.items() if k != "step_ms_all"}, flush=True)
        print(f"  ({time.time() - t0:.1f} s)", flush=True)
    summary = {}
    for name in dict.fromkeys(r["scenario"] for r in runs):
        vals = [r["step_ms"] for r in runs if r["scenario"] == name and "step_ms" in r]
        if vals:
            summary[name] = {"median_step_ms": statistics.median(vals), "min": min(vals), "max": max(vals),
                             "spread": (max(vals) - min(vals)) / min(vals)}
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": "python3 bench/gpu/host_variance.py OUT.json --steps %d" % args.steps,
              "cpus_allowed": allowed, "smt_groups": [list(g) for g in groups], "gpus": gpus,
              "summary": summary, "runs": runs}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
