"""Where does a pingpong program's time go on the small-N shapes (NOTES v24 lead 2)?

    python benchmarks/probe_pingpong_k.py --n 4096 --m 128,256 --k 512,1024,2048,4096,8192 --out probe.json

Times one pingpong plan (BLOCK_M 128, two consumers, 3 stages; whole tiles, and the same split two ways) and, for
comparison, a Triton split-K plan, at a fixed N and M over K, so that the K blocks each program walks vary and nothing else does, with the bench's method (CUDA
graph over rotating weight copies), cuBLAS fp16 alongside. A least-squares line time = fixed + per_block * blocks per
program separates the per-block cost of the loop from what a program pays once (launch, first loads, epilogue,
split-K fixup). The per-block floor of the tensor cores: two consumers x 64 rows x BLOCK_M tokens x 128 K MACs at
2048 MACs per cycle per SM (dense fp16 on sm_90), printed at 1.98 GHz.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402


# the kernels compared: the pingpong plan (two consumers of 64 rows, 128 tokens per program) and, for its split-K
# fixup's cost against another's, the Triton scale-in-operand kernel on 128-row x 64-token tiles
KERNELS = {"pingpong": ("pingpong", {"BLOCK_M": 128, "num_stages": 3}),
           "triton": ("splitk", {"BLOCK_N": 128, "BLOCK_M": 64, "num_warps": 4, "num_stages": 4, "SCALE_IN_OPERAND": True})}


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (xs, ys)."""
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return mean_y - slope * mean_x, slope


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--m", default="128,256")
    ap.add_argument("--k", default="512,1024,2048,4096,8192")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    kernel = timing.load_kernel()
    n, block_m = args.n, 128
    rows = []
    for k in (int(v) for v in args.k.split(",")):
        copies = timing.copies_needed(timing.w4_bytes(n, k, 1, 128))
        weights = timing.random_w4_weights(kernel, n, k, 128, copies)
        dense = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(timing.copies_needed(2 * n * k))]
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            fp16 = timing.gpu_time_us([lambda w=w: F.linear(x, w) for w in dense])
            for kernel_name, split in itertools.product(KERNELS, (1, 2)):
                path, config = KERNELS[kernel_name]
                config = {**config, "SPLIT_K": split}
                calls = [lambda w=w: kernel.matmul.w4a16_matmul(x, w.qweight, w.scales, w.zeros, None, k, 128, path=path,
                                                               config=config) for w in weights]
                us = timing.gpu_time_us(calls)
                blocks = k // 128 / split
                rows.append(dict(N=n, K=k, M=m, kernel=kernel_name, split=split, blocks_per_program=blocks, us=us, fp16_us=fp16))
                print(f"N={n} K={k:5d} M={m:4d} {kernel_name:8s} split {split}: {blocks:5.1f} blocks per program {us:8.2f} us "
                      f"(fp16 {fp16:7.2f})", flush=True)
        del weights, dense
        torch.cuda.empty_cache()
    floor_us = 2 * 64 * block_m * 128 / 2048 / 1.98e3
    for m, kernel_name, split in itertools.product(sorted({r["M"] for r in rows}), KERNELS, (1, 2)):
        pts = [r for r in rows if r["M"] == m and r["kernel"] == kernel_name and r["split"] == split]
        fixed, per_block = line_fit([r["blocks_per_program"] for r in pts], [r["us"] for r in pts])
        print(f"M={m:4d} {kernel_name:8s} split {split}: time = {fixed:6.2f} us + {per_block:6.3f} us per block"
              + (f" (tensor floor {floor_us:.3f} us per block: {floor_us / per_block:.0%} of the slope)"
                 if kernel_name == "pingpong" else ""))
    if args.out:
        Path(args.out).write_text(json.dumps({**timing.machine_info(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
