"""Probe (GPU): does the weight stream lose bandwidth to its DRAM access pattern?

Today each 128-row K block of an output row is 64 contiguous bytes and rows are K/2 bytes apart, so
one program iteration reads BLOCK_N scattered 64-byte pieces. A "chunked" layout stores the words of
W_CHUNK_ROWS consecutive rows of one K block next to each other (16 * W_CHUNK_ROWS words
contiguous). This script times, with the benchmark method of timing.py:
  1. a pure streaming kernel (xor of all words) over both address patterns, and
  2. the tensor-core GEMM with the tuned configuration, on both layouts (same codes, bit-equal output),
     plus a few Stream-K configurations.
It prints a table and writes the rows to --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402


@triton.jit
def _stream_words(w_ptr, out_ptr, words_per_row, num_blocks, W_CHUNK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_w = tl.arange(0, 16)
    if W_CHUNK_ROWS == 0:
        ptrs = w_ptr + offs_n[:, None].to(tl.int64) * words_per_row + offs_w[None, :]
        step = 16
    else:
        ptrs = (w_ptr + (offs_n // W_CHUNK_ROWS)[:, None].to(tl.int64) * (words_per_row * W_CHUNK_ROWS)
                + (offs_n % W_CHUNK_ROWS)[:, None] * 16 + offs_w[None, :])
        step = 16 * W_CHUNK_ROWS
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.int32)
    for b in range(num_blocks):
        acc ^= tl.load(ptrs + b * step, eviction_policy="evict_first")
    tl.store(out_ptr + offs_n, tl.xor_sum(acc, axis=1))


def chunked(qweight: torch.Tensor, rows: int) -> torch.Tensor:
    n, words = qweight.shape
    return qweight.view(n // rows, rows, words // 16, 16).permute(0, 2, 1, 3).contiguous().view(n, words)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="probe_layout.json")
    ap.add_argument("--m", default="1,16")
    args = ap.parse_args()
    kernel = timing.load_kernel()
    gemm = kernel.gemm
    info = timing.machine_info()
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = timing.load_shapes()
    G = 128
    rows = []

    def record(**row):
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)

    for shape in shapes["shapes"]:
        n, k = shape["N"], shape["K"]
        copies = timing.copies_needed(timing.w4_bytes(n, k, 1, G))
        weights = timing.random_w4_weights(kernel, n, k, G, copies)
        nbytes = n * k // 2
        # 1. pure streaming
        for bn, warps in ((256, 8), (128, 4)):
            for chunk in (0, 64, bn):
                views = [w.qweight if chunk == 0 else chunked(w.qweight, chunk) for w in weights]
                out = torch.empty(n, device="cuda", dtype=torch.int32)
                for st in (3, 4):
                    def call(q, chunk=chunk, bn=bn, warps=warps, st=st):
                        _stream_words[(n // bn,)](q, out, q.shape[1], q.shape[1] // 16, W_CHUNK_ROWS=chunk, BLOCK_N=bn,
                                                  num_warps=warps, num_stages=st)
                    us = timing.gpu_time_us([lambda q=q: call(q) for q in views], replays=7)
                    record(shape=shape["name"], kind="stream", BLOCK_N=bn, chunk=chunk, stages=st, us=round(us, 2),
                           pct_of_4_2TBs=round(100 * nbytes / us / 4.2e6, 1))
        # 2. the GEMM on both layouts
        for m in [int(v) for v in args.m.split(",")]:
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            plan = gemm.plan_gemm(m, n, k, G, torch.float16, x.device)
            configs = [(plan.path, dict(plan.config))]
            for bn, w, st, per_sm in ((256, 8, 3, 1), (128, 4, 4, 2), (128, 4, 4, 3)):
                configs.append(("streamk", {"BLOCK_N": bn, "BLOCK_M": 16, "num_warps": w, "num_stages": st,
                                            "SCALE_IN_OPERAND": False, "PROGRAMS": per_sm * sm}))
            ref = None
            for path, cfg in configs:
                if path not in ("tiled", "splitk", "streamk"):
                    continue
                for chunk in (0, 64, cfg["BLOCK_N"]):
                    views = [w.qweight if chunk == 0 else chunked(w.qweight, chunk) for w in weights]
                    c = {**cfg, "W_CHUNK_ROWS": chunk}

                    def call(i, c=c, path=path, views=views):
                        w = weights[i]
                        return gemm.w4a16_matmul(x, views[i], w.scales, w.zeros, w.perm, k, G, path=path, config=c)
                    try:
                        y = call(0).float()
                        if ref is None:
                            ref = gemm.w4a16_matmul(x, weights[0].qweight, weights[0].scales, weights[0].zeros, None, k, G,
                                                    path="dense").float()
                        err = float((y - ref).norm() / ref.norm())
                        us = timing.gpu_time_us([lambda i=i: call(i) for i in range(len(views))], replays=7)
                    except Exception as exc:  # noqa: BLE001 - a probe row records the failure
                        record(shape=shape["name"], kind="gemm", M=m, path=path, chunk=chunk, error=repr(exc)[:200])
                        continue
                    record(shape=shape["name"], kind="gemm", M=m, path=path, chunk=chunk, err=f"{err:.1e}",
                           us=round(us, 2), pct_of_4_2TBs=round(100 * timing.w4_bytes(n, k, m, G) / us / 4.2e6, 1),
                           config={kk: v for kk, v in cfg.items() if kk != "W_CHUNK_ROWS"})
        del weights
        torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps({**info, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
