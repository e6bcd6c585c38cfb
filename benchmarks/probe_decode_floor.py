"""Probe (GPU): where the decode time goes on each shape, against the floors a kernel of the same grid has.

For each shape at M = 1, with the benchmark method of timing.py (CUDA-graph replay over rotating weight
copies), it times
- `empty`: a one-program kernel that stores one word (the launch and graph-node floor of any kernel);
- `stream`: the tuned plan's grid (BLOCK_N rows x its K range per program, from the shipped table's M = 1
  entry; Stream-K entries as split-K with the same program count) reading its weight words and its scales
  with no unpack, no MMA and no reduction (each program stores one xor);
- `stream+reduce`: the same, then the split-K arrival (each program stores a partial of BLOCK_N floats,
  counts itself in on an atomic counter, and the last one reads the partials back), as the GEMM does;
  `stream+reduce(release)` with a release counter, an acquire fence on the last arrival only, a relaxed reset;
  `stream+unpack+reduce` with every word also dequantized as the scale-in-operand loop does (no MMA, no x);
- `w4a16`: the GEMM itself with its tuned plan.
So `stream` - `empty` is the memory system's time for the plan's bytes and grid, `stream+reduce` adds the
split-K fixup, `stream+unpack+reduce` the dequantization's ALU work, and the GEMM's excess over that is the MMA, x
and pipeline structure of its loop. Prints a table, writes JSON.

    python benchmarks/probe_decode_floor.py [--shapes 8B.o,70B.gate_up] [--out floor.json]
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
def _empty(out_ptr):
    tl.store(out_ptr, 1)


# The package's register-level dequantization (dequant.py), bound in main() once the package is loaded.
magic_pairs = dequantize_pairs = pack_pair = None


@triton.jit
def _stream(w_ptr, s_ptr, out_ptr, part_ptr, lock_ptr, N, blocks, per_split, BLOCK_N: tl.constexpr, REDUCE: tl.constexpr,
            RELEASE_ONLY: tl.constexpr, UNPACK: tl.constexpr):
    """Words of the kernel-native layout [Np/64, blocks, 64, 16] for rows [pid_n * BLOCK_N, +BLOCK_N), K blocks
    [pid_k * per_split, +per_split), and one scale row per block, xor-reduced: the GEMM's reads without its math.
    REDUCE: then the split-K arrival as gemm.py does it (acq_rel counter and reset), or with RELEASE_ONLY a release
    counter, an acquire fence on the last arrival only and a relaxed reset (the next launch is ordered anyway)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tile_rows = (offs_n // 64)[:, None].to(tl.int64) * (blocks * 1024)
    ptrs = w_ptr + tile_rows + (offs_n % 64)[:, None] * 16 + tl.arange(0, 16)[None, :]
    start = pid_k * per_split
    end = tl.minimum(start + per_split, blocks)
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.int32)
    sacc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for b in range(start, end):
        words = tl.load(ptrs + b * 1024, eviction_policy="evict_first")
        scale = tl.load(s_ptr + b * N + offs_n)
        if UNPACK:  # the scale-in-operand dequantization of every word (integer zeros: sub + mul per pair)
            params = (pack_pair(scale, tl.float16)[:, None], pack_pair(scale * 0 + 1032.0, tl.float16)[:, None])
            for q in tl.static_range(4):
                pairs = magic_pairs(words.to(tl.uint32, bitcast=True), q, 0x64006400, True)
                acc ^= dequantize_pairs(pairs, params, 1024.0, tl.float16, True).to(tl.int32, bitcast=True)
        else:
            acc ^= words
            sacc += scale.to(tl.float32)
    value = tl.xor_sum(acc, axis=1).to(tl.float32) + sacc
    if REDUCE:
        tl.store(part_ptr + pid_k * N + offs_n, value)
        tl.debug_barrier()
        if RELEASE_ONLY:  # release on the counter; only the last arrival pays an acquire fence
            last = tl.atomic_add(lock_ptr + pid_n, 1, sem="release") == tl.num_programs(1) - 1
            if last:
                tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
        else:
            last = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel") == tl.num_programs(1) - 1
        if last:
            total = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for s in range(tl.num_programs(1)):
                total += tl.load(part_ptr + s * N + offs_n, cache_modifier=".cg")
            tl.store(out_ptr + offs_n, total)
            tl.atomic_xchg(lock_ptr + pid_n, 0, sem="relaxed" if RELEASE_ONLY else "acq_rel")
    else:
        tl.store(out_ptr + pid_k * N + offs_n, value)


def plan_grid(kernel, n: int, k: int) -> tuple[int, int]:
    """(BLOCK_N, split) of the shipped M = 1 plan; a Stream-K plan as the split giving its program count."""
    plan = kernel.dispatch.plan_gemm(1, n, k, 128, torch.float16, torch.device("cuda"))
    cfg = plan.config
    block_n = cfg.get("BLOCK_N", 128)
    tiles = -(-n // block_n)
    if plan.path == "streamk":
        return block_n, max(1, round(cfg["PROGRAMS"] / tiles))
    return block_n, cfg.get("SPLIT_K", 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="", help="comma list of shape names or name=NxK (default: all)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    kernel = timing.load_kernel()
    global magic_pairs, dequantize_pairs, pack_pair
    magic_pairs, dequantize_pairs, pack_pair = kernel.dequant.magic_pairs, kernel.dequant.dequantize_pairs, kernel.dequant.pack_pair
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    empty_us = timing.gpu_time_us([lambda: _empty[(1,)](flag)])
    rows = [{"shape": "-", "impl": "empty", "us": empty_us}]
    print(f"empty kernel: {empty_us:.2f} us")
    print(f"{'shape':12s} {'grid':>12s} {'stream':>8s} {'+reduce':>8s} {'+rel':>8s} {'+unpack':>8s} {'w4a16':>8s}")
    for shape in timing.select_shapes(args.shapes):
        n, k = shape["N"], shape["K"]
        copies = timing.copies_needed(timing.w4_bytes(n, k, 1, 128))
        weights = timing.random_w4_weights(kernel, n, k, 128, copies)
        block_n, split = plan_grid(kernel, n, k)
        blocks = -(-k // 128)
        per_split = -(-blocks // split)
        grid = (-(-n // block_n), split)
        out = torch.empty(split * n, device="cuda", dtype=torch.float32)
        part = torch.empty(split * n, device="cuda", dtype=torch.float32)
        lock = torch.zeros(grid[0], device="cuda", dtype=torch.int32)
        times = {}
        for name, reduce, release_only, unpack in (("stream", False, False, False), ("stream+reduce", True, False, False),
                                                   ("stream+reduce(release)", True, True, False),
                                                   ("stream+unpack+reduce", True, False, True)):
            times[name] = timing.gpu_time_us([
                lambda w=w, r=reduce, ro=release_only, u=unpack: _stream[grid](
                    w.qweight, w.scales, out, part, lock, n, blocks, per_split, BLOCK_N=block_n, REDUCE=r, RELEASE_ONLY=ro,
                    UNPACK=u, num_warps=4)
                for w in weights])
        x = torch.randn(1, k, device="cuda", dtype=torch.float16)
        times["w4a16"] = timing.gpu_time_us([lambda w=w: kernel.w4a16_linear(x, w) for w in weights])
        for name, us in times.items():
            rows.append({"shape": shape["name"], "N": n, "K": k, "M": 1, "BLOCK_N": block_n, "split": split, "impl": name, "us": us})
        print(f"{shape['name']:12s} {f'{block_n}x{split}':>12s} {times['stream']:8.2f} {times['stream+reduce']:8.2f} "
              f"{times['stream+reduce(release)']:8.2f} {times['stream+unpack+reduce']:8.2f} {times['w4a16']:8.2f}", flush=True)
        del weights
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps({**timing.machine_info(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
