"""Where the eager (no CUDA graph) time of one call goes: host wall time per call of each layer of the call
stack, at M = 1 on 6144 x 4096 by default (run on the GPU).

    python benchmarks/eager_overhead.py [--m 128 --n 4096 --k 4096] [--out results.json]

Each line times loops of calls with one synchronisation at the end (timing.eager_wall_us), so a
line is max(host time, GPU time) per call; the differences between lines locate the host cost.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="")
    ap.add_argument("--n", type=int, default=6144)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    kernel = timing.load_kernel()
    m, n, k, g = args.m, args.n, args.k, 128
    weight = timing.random_w4_weights(kernel, n, k, g, 1)[0]
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w16 = torch.randn(n, k, device="cuda", dtype=torch.float16)
    layer = kernel.W4A16Linear.from_weight(weight, dtype=torch.float16)
    plan = kernel.plan_for(weight, m)
    x2 = x.reshape(-1, k)
    # the launcher of the plan's kernel, below the dispatch
    launch = kernel.matmul.launcher_for(plan.path)
    args_op = (x, weight.qweight, weight.scales, weight.zeros, weight.perm, k, g)
    calls = {
        "fp16 F.linear": lambda: F.linear(x, w16),
        "W4A16Linear forward (module)": lambda: layer(x),
        "w4a16_linear (eager API)": lambda: kernel.w4a16_linear(x, weight),
        "ops.gemm (custom op dispatch)": lambda: kernel.ops.gemm(*args_op, "auto", False),
        "w4a16_matmul (validate + plan + launch)": lambda: kernel.matmul.w4a16_matmul(*args_op),
        f"{launch.__name__} (launch only)": lambda: launch(x2, weight.qweight, weight.scales, weight.zeros, k, g, plan),
        "validate_gemm_inputs": lambda: kernel.matmul.validate_gemm_inputs(*args_op),
        "plan_gemm": lambda: kernel.plan_gemm(m, n, k, g, x.dtype, x.device),
        "torch.empty([M, N])": lambda: torch.empty((m, n), device="cuda", dtype=torch.float16),
    }
    # Rounds interleave the calls (one loop of each per round) and each keeps its best loop: the
    # host's speed drifts over seconds (earlier runs timed each call's loops back to back and saw
    # the same call 20 us apart from one run to the next).
    best = {name: float("inf") for name in calls}
    for _ in range(args.rounds):
        for name, fn in calls.items():
            best[name] = min(best[name], timing.eager_wall_us(fn, iters=100, repeats=1))
    rows = []
    print(f"eager wall time per call, M={m}, {n}x{k}, plan: {plan}; best of {args.rounds} interleaved rounds of 100 calls")
    for name, us in best.items():
        rows.append({"call": name, "us": round(us, 2)})
        print(f"  {name:42s} {us:8.2f} us")
    if args.out:
        Path(args.out).write_text(json.dumps({**timing.machine_info(), "M": m, "N": n, "K": k, "plan": str(plan), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
