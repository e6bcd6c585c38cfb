"""Run one GEMM call (a shape of shapes.json at M tokens, the dispatcher's plan) for a profiler:

    ncu --kernel-name regex:_w4a16 --launch-skip 2 --launch-count 1 --section WarpStateStats ... \
        python benchmarks/profile_one.py --shape 70B.gate_up --m 1 [--symmetric]

Three calls on fresh random weights (the first compiles); nothing is timed here.
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
    args = ap.parse_args()
    kernel = timing.load_kernel()
    shape = next(s for s in timing.load_shapes()["shapes"] if s["name"] == args.shape)
    n, k = shape["N"], shape["K"]
    weight = timing.random_w4_weights(kernel, n, k, 128, 1, symmetric=args.symmetric)[0]
    x = torch.randn(args.m, k, device="cuda", dtype=torch.float16)
    print(args.shape, "M =", args.m, "plan:", kernel.plan_for(weight, args.m))
    for _ in range(3):
        kernel.w4a16_linear(x, weight)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
