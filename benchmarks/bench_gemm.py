"""W4A16 against cuBLAS fp16 / bf16 and torch's int4 GEMM, one process, one method (run on the GPU).

    python benchmarks/bench_gemm.py [--m 1,2,4,8,16] [--variants base,bf16,sym,g64,act_order]
                                    [--out benchmarks/results/h200.json]

GPU time per call: CUDA-graph replay over rotating weight copies (> 3x L2), median of replays; every (M,
implementation) of a shape is timed --rounds times (default 3), interleaved, the implementations' order rotated
from round to round, and a row keeps the median.
Eager wall time per call at M = 1 (`<impl>_eager`). Prints a table (us, x fp16, GB/s, % of 4.2 TB/s)
and writes JSON {gpu, torch, triton, commit, date, rows}; rows carry shape, N, K, M, impl, us and,
for w4a16, dtype, group_size, symmetric, act_order and the plan; where nvidia-smi runs, also each round's mean SM
clock (`sm_mhz_rounds`) and share of clock samples under a power or thermal limit (`clock_limited_rounds`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402

VARIANTS = timing.VARIANTS


def torch_int4_weights(n, k, group_size, copies):
    """torch's tinygemm layout (bf16 only), or None where this torch cannot pack it."""
    out = []
    for _ in range(copies):
        codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
        packed = torch.ops.aten._convert_weight_to_int4pack(codes, 8)
        sz = (torch.rand(k // group_size, n, 2, device="cuda") * 0.02).to(torch.bfloat16)
        out.append((packed, sz))
    return out


def check_w4a16(kernel, weight, dtype) -> float:
    """Relative error of the kernel against a float64 reference on fresh random data (M = 5)."""
    x = torch.randn(5, weight.in_features, device="cuda", dtype=dtype)
    y = kernel.w4a16_linear(x, weight).double()
    ref = x.double() @ weight.dequantize(torch.float64)
    return float((y - ref).norm() / ref.norm())


@dataclass
class Timed:
    """One implementation of a shape: its weight copies, activation dtype, call, row fields and the M it runs at."""
    impl: str
    dtype: torch.dtype
    weights: list
    call: Callable  # call(x, w) -> y
    fields: dict = field(default_factory=dict)
    max_m: int = 1 << 30
    eager_m1: bool = False  # also an `<impl>_eager` row (host wall time per call) at M = 1
    rel_err: float | None = None  # ours: against a float64 reference (check_w4a16)


def bench_shape(kernel, shape, ms, variants, rows, rounds=3, eager_m1=True, ours_only=False, clocks=None):
    """Every implementation on `shape` at every M, `rounds` times over: a round times each (M, implementation) once,
    back to back, each round in a rotated order of the implementations, and a row's `us` is the median of its rounds
    (all of them in `us_rounds`, in round order). The GPU runs a shape up to
    10-20% slower for a while in some runs (NOTES v30): timed interleaved, cuBLAS and ours share that state, and one
    slow stretch moves one round, not the median. With `clocks` (a timing.ClockLog) each row also says at what SM
    clock its rounds ran (`sm_mhz_rounds`) and what share of the samples had the clock held down by a power or thermal
    limit (`clock_limited_rounds`): the H200 reaches its power cap under these replays (NOTES v38)."""
    n, k, name = shape["N"], shape["K"], shape["name"]
    timed = ([] if ours_only else baselines(shape, eager_m1)) + ours(kernel, shape, variants, eager_m1 and not ours_only)
    timings: dict = {}  # (i, m) -> [(us, start, end)] per round, start / end on the host clock (time.time())
    for r in range(rounds):
        for m in ms:
            for i, t in timing.round_order(list(enumerate(timed)), r, rounds):
                if m <= t.max_m:
                    x = torch.randn(m, k, device="cuda", dtype=t.dtype)
                    start = time.time()
                    us = timing.gpu_time_us([lambda w=w: t.call(x, w) for w in t.weights])
                    timings.setdefault((i, m), []).append((us, start, time.time()))
    if clocks is not None:
        clocks.settle()
    base = dict(shape=name, N=n, K=k)
    for m in ms:
        for i, t in enumerate(timed):
            if m > t.max_m:
                continue
            us_rounds = [us for us, _, _ in timings[(i, m)]]
            extra = ({"plan": str(kernel.plan_for(t.weights[0], m, t.dtype)), "rel_err": t.rel_err} if t.impl == "w4a16" else {})
            if clocks is not None:
                seen = [clocks.window(start, end) for _, start, end in timings[(i, m)]]
                if all(seen):
                    extra.update(sm_mhz_rounds=[c["sm_mhz"] for c in seen],
                                 clock_limited_rounds=[c["limited"] for c in seen])
            rows.append(dict(base, M=m, impl=t.impl, us=statistics.median(us_rounds), us_rounds=us_rounds, order="rotated",
                             **t.fields, **extra))
            if m == 1 and t.eager_m1:
                x = torch.randn(m, k, device="cuda", dtype=t.dtype)
                rows.append(dict(base, M=m, impl=f"{t.impl}_eager", us=timing.eager_wall_us(lambda: t.call(x, t.weights[0])),
                                 **t.fields))
    del timed
    torch.cuda.empty_cache()


def baselines(shape, eager_m1) -> list[Timed]:
    """cuBLAS fp16 and bf16, and torch's int4 GEMM (M <= 256, where this torch can pack it) on `shape`."""
    n, k = shape["N"], shape["K"]
    w_f16 = [torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02 for _ in range(timing.copies_needed(timing.f16_bytes(n, k, 1)))]
    out = [Timed("fp16", torch.float16, w_f16, F.linear, eager_m1=eager_m1),
           Timed("bf16", torch.bfloat16, [w.to(torch.bfloat16) for w in w_f16], F.linear)]
    try:
        w_int4 = torch_int4_weights(n, k, 128, timing.copies_needed(timing.w4_bytes(n, k, 1, 128)))
    except Exception as exc:  # noqa: BLE001 - torch builds without tinygemm
        print(f"torch_int4 unavailable: {exc!r}"[:200])
        return out
    int4_mm = lambda x, w: torch.ops.aten._weight_int4pack_mm(x, w[0], 128, w[1])  # noqa: E731
    return out + [Timed("torch_int4", torch.bfloat16, w_int4, int4_mm, max_m=256, eager_m1=eager_m1)]


def ours(kernel, shape, variants, eager_m1) -> list[Timed]:
    """The package's GEMM on `shape`, one entry per weight format (its relative error checked once, in `rel_err`)."""
    n, k = shape["N"], shape["K"]
    out = []
    for vname in variants:
        dtype, group_size, symmetric, act_order = VARIANTS[vname]
        fields = dict(dtype="fp16" if dtype == torch.float16 else "bf16", group_size=group_size, symmetric=symmetric, act_order=act_order)
        copies = timing.copies_needed(timing.w4_bytes(n, k, 1, group_size, symmetric))
        weights = timing.random_w4_weights(kernel, n, k, group_size, copies, symmetric, act_order, dtype)
        out.append(Timed("w4a16", dtype, weights, kernel.w4a16_linear, fields, eager_m1=eager_m1 and vname == "base",
                         rel_err=check_w4a16(kernel, weights[0], dtype)))
    return out


def print_table(rows, gpu: str, group_size=128):
    """One line per GPU-time row: time, ratio to fp16, GB/s and, where `gpu` has a measured read ceiling, its share."""
    fp16 = {(r["shape"], r["M"]): r["us"] for r in rows if r["impl"] == "fp16"}
    read_tbps = (timing.measured_ceilings(gpu) or (None, None))[0]
    print(f"{'shape':12s} {'M':>5s} {'impl':24s} {'us':>9s} {'x fp16':>7s} {'GB/s':>7s} {f'%{read_tbps}TB/s' if read_tbps else '':>8s}")
    for r in rows:
        if r["impl"].endswith("_eager"):
            continue
        m, n, k = r["M"], r["N"], r["K"]
        if r["impl"] in ("fp16", "bf16"):
            nbytes = timing.f16_bytes(n, k, m)
        else:
            nbytes = timing.w4_bytes(n, k, m, r.get("group_size", group_size), r.get("symmetric", False))
        gbps = nbytes / (r["us"] * 1e-6) / 1e9
        label = r["impl"] if r["impl"] != "w4a16" else f"w4a16[{timing.format_label(r)}]"
        ratio = f"{fp16[(r['shape'], m)] / r['us']:7.2f}" if (r["shape"], m) in fp16 else f"{'-':>7s}"
        share = f"{100 * gbps / (read_tbps * 1e3):7.1f}%" if read_tbps else ""
        print(f"{r['shape']:12s} {m:5d} {label:24s} {r['us']:9.2f} {ratio} {gbps:7.0f} {share}")


def summary(rows):
    """Geometric mean over shapes of fp16 time / our time, per M and variant."""
    fp16 = {(r["shape"], r["M"]): r["us"] for r in rows if r["impl"] == "fp16"}
    groups: dict = {}
    for r in rows:
        if r["impl"] in ("w4a16", "torch_int4") and (r["shape"], r["M"]) in fp16:
            key = (r["impl"] if r["impl"] == "torch_int4" else f"w4a16 {timing.format_label(r)}", r["M"])
            groups.setdefault(key, []).append(fp16[(r["shape"], r["M"])] / r["us"])
    print("\ngeometric mean of fp16/impl over shapes:")
    for (impl, m), vals in sorted(groups.items()):
        print(f"  {impl:28s} M={m:5d}  {statistics.geometric_mean(vals):5.2f}x  (min {min(vals):.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    shapes_data = timing.load_shapes()
    ap.add_argument("--m", default=",".join(map(str, shapes_data["decode_M"])))
    ap.add_argument("--variants", default="base")
    ap.add_argument("--shapes", default="", help="comma list of shape names or name=NxK (default: all)")
    ap.add_argument("--out", default="")
    ap.add_argument("--merge", action="store_true", help="add rows to an existing --out file (replacing equal keys)")
    ap.add_argument("--ours-only", action="store_true", help="time only the package's GEMM (an A/B of trees: gpu_session.sh ab)")
    ap.add_argument("--rounds", type=int, default=3, help="time every (M, implementation) this many times, interleaved; rows keep the median")
    args = ap.parse_args()
    if args.ours_only and args.merge:
        raise SystemExit("--ours-only rows carry no fp16 time of their run: do not --merge them into a results file")

    gpu = timing.machine_info()["gpu"]
    old = timing.load_for_merge(args.out, args.merge, gpu, {"rows": []})
    kernel = timing.load_kernel()
    ms = [int(v) for v in args.m.split(",")]
    variants = args.variants.split(",")
    rows: list = []
    old_rows, old_commit = old["rows"], old.get("commit", "unknown")
    with timing.ClockLog() as clocks:
        for shape in timing.select_shapes(args.shapes, shapes_data):
            bench_shape(kernel, shape, ms, variants, rows, args.rounds, ours_only=args.ours_only, clocks=clocks)
            if args.out:  # after every shape, so a run cut short keeps what it measured
                write_results(Path(args.out), rows, old_rows, old_commit)
    print_table(rows, gpu)
    summary(rows)


def _with_fp16_time(rows: list) -> list:
    """`rows` (one run's) with `fp16_us`, that run's fp16 time for the row's shape and M, on every GPU-time
    row other than fp16's own that does not carry one yet."""
    fp16 = {(r["shape"], r["M"]): r["us"] for r in rows if r["impl"] == "fp16"}
    for r in rows:
        if r["impl"] != "fp16" and not r["impl"].endswith("_eager") and "fp16_us" not in r and (r["shape"], r["M"]) in fp16:
            r["fp16_us"] = fp16[(r["shape"], r["M"])]
    return rows


def write_results(out: Path, rows: list, old_rows: list, old_commit: str = "unknown") -> None:
    """Merge `rows` into the results file; every row carries the commit it was measured at and every
    GPU-time row (not fp16 itself, not *_eager) `fp16_us`, the cuBLAS fp16 time of the same run: a merge
    replaces the fp16 rows, and cuBLAS moves up to ~10% between runs, so ratios must not mix runs."""
    key = lambda r: (r["shape"], r["M"], r["impl"], r.get("dtype"), r.get("group_size"), r.get("symmetric"), r.get("act_order"))  # noqa: E731
    info = timing.machine_info()
    new_keys = {key(r) for r in rows}
    rows = _with_fp16_time([dict(r, commit=r.get("commit", info["commit"])) for r in rows])
    kept = _with_fp16_time([dict(r, commit=r.get("commit", old_commit)) for r in old_rows])
    kept = [r for r in kept if key(r) not in new_keys]
    result = {
        **info,
        "method": "CUDA-graph replay over rotating weight copies (>3x L2), median; rows with us_rounds: median of that many interleaved rounds (with order 'rotated': the implementations' order rotated between rounds); *_eager = host wall time per call (best of 5 loops)",
        "rows": kept + rows,
    }
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
