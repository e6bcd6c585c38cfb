"""Run one GEMM call (a shape of shapes.json at M tokens, the dispatcher's plan) for a profiler:

    ncu --kernel-name regex:_w4a16 --launch-skip 2 --launch-count 1 --section WarpStateStats ... \
        python benchmarks/profile_one.py --shape 70B.gate_up --m 1 [--symmetric] [--set STREAM_PARAMS=0]

Three calls on fresh random weights (the first compiles); nothing is timed here. `--set KEY=INT,...` replaces
entries of the plan's configuration (the plan's path kept), to profile one option against the other.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", default="70B.gate_up")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--symmetric", action="store_true", help="symmetric weights (zero 8, no zeros tensor)")
    ap.add_argument("--set", default="", help="KEY=INT,... replacing entries of the plan's configuration (0 / 1 for options)")
    args = ap.parse_args()
    kernel = timing.load_kernel()
    shape = next(s for s in timing.load_shapes()["shapes"] if s["name"] == args.shape)
    n, k = shape["N"], shape["K"]
    weight = timing.random_w4_weights(kernel, n, k, 128, 1, symmetric=args.symmetric)[0]
    x = torch.randn(args.m, k, device="cuda", dtype=torch.float16)
    plan = kernel.plan_for(weight, args.m)
    config = {**plan.config, **timing.config_overrides(args.set, kernel)}
    print(args.shape, "M =", args.m, "plan:", plan.path, config)
    for _ in range(3):
        kernel.matmul.w4a16_matmul(x, weight.qweight, weight.scales, weight.zeros, weight.perm, k, weight.group_size,
                                   path=plan.path, config=config)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
