"""Probe (GPU): how much bandwidth a weight stream loses to its DRAM access pattern.

A program of the GEMM reads, per 128-row K block, BLOCK_N output rows of 64 bytes (16 words). Stored
row by row (the layout before v7: [N, Kp/8]) those pieces lie K/2 bytes apart; stored as 64-row tiles
(layout.py: each (tile, block) 4 KB contiguous) a program reads whole tiles. This script times a pure
streaming kernel (xor of all words, no unpack) over both address patterns on the eight shapes, with
the benchmark method of timing.py, prints a table and writes the rows to --out (JSON). At fec6090
it also timed the GEMM on both layouts (results/h200_probe_layout.json, NOTES.md v7).
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


def chunked(rows_words: torch.Tensor, rows: int) -> torch.Tensor:
    """[N, K/8] words stored row by row -> the same words stored as `rows`-row tiles per 128-row block."""
    n, words = rows_words.shape
    return rows_words.view(n // rows, rows, words // 16, 16).permute(0, 2, 1, 3).contiguous().view(n, words)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="probe_layout.json")
    args = ap.parse_args()
    info = timing.machine_info()
    shapes = timing.load_shapes()
    G = 128
    rows = []

    def record(**row):
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)

    for shape in shapes["shapes"]:
        n, k = shape["N"], shape["K"]
        copies = timing.copies_needed(timing.w4_bytes(n, k, 1, G))
        words = [torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32, device="cuda") for _ in range(copies)]
        nbytes = n * k // 2
        for bn, warps in ((256, 8), (128, 4)):
            for chunk in (0, 64, bn):
                views = [w if chunk == 0 else chunked(w, chunk) for w in words]
                out = torch.empty(n, device="cuda", dtype=torch.int32)
                for st in (3, 4):
                    def call(q, chunk=chunk, bn=bn, warps=warps, st=st):
                        _stream_words[(n // bn,)](q, out, q.shape[1], q.shape[1] // 16, W_CHUNK_ROWS=chunk, BLOCK_N=bn,
                                                  num_warps=warps, num_stages=st)
                    us = timing.gpu_time_us([lambda q=q: call(q) for q in views], replays=7)
                    record(shape=shape["name"], kind="stream", BLOCK_N=bn, chunk=chunk, stages=st, us=round(us, 2),
                           pct_of_4_2TBs=round(100 * nbytes / us / 4.2e6, 1))
        del words, views
        torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps({**info, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
