"""Probe (NOTES v41): the decode kernel as one-warp worker partitions with a warp-private cp.async ring for x
(`gemm_decode._decode_ws_kernel`: NOTES v40 lead 0's prototype, widened to 8 workers and with the option X_MASKED),
against the tuned table's plans. Needs the kernel diff beside this file applied to the tree at c92c3be:

    git apply benchmarks/results/logs/decode_ws_worker_forms_c92c3be.diff
    python benchmarks/results/logs/probe_decode_ws_c92c3be.py --out probe.json [--shapes ...] [--m 8,16,4,1]
        [--set ROWS=16,X_MASKED=True] [--forms 4x2r80,4x2r64] [--no-check] [--budget-s 420]

1. Timing (bench_gemm's method, timing.gpu_time_us over weight copies > 3x L2): the table's plan through the
   package's entry point, and the worker-partition kernel with the table plan's options (or the decode defaults where
   the table's plan is another path), with --set's options on top, in each form of WS_FORMS; with --set, also the
   one-program decode kernel at 4 warps with the same options ("table+set"). Each form's output is checked against
   the dense path first.
2. Correctness (unless --no-check): its output against the dense path (dequantize + cuBLAS) at M = 1 / 3 / 8 / 9 / 16
   for fp16 / bf16, group 128 / 64 / per-channel, asymmetric / symmetric, on two shapes, in two of the forms; a form
   more than 1% off (relative norm) is reported.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import timing  # noqa: E402

# (workers, X_RING, launch maxnreg, worker registers): the idle default partition (4 warps) drops to 24 registers,
# so 4 workers at 128 fit 80 per thread of the launch (3 CTAs per SM) and 8 workers at 104 fit 80 (2 CTAs per SM).
# 4 workers at 104 fit 64 (4 CTAs per SM; ROWS 32 then spills).
# A fifth element "s": `_decode_ws_staged_kernel` (words through the ring too; NOTES v42).
WS_FORMS = [(4, 2, 80, 128), (4, 3, 80, 128), (4, 4, 80, 128), (8, 2, 80, 104), (8, 3, 80, 104), (4, 2, 64, 104),
            (4, 3, 64, 104), (4, 2, 64, 104, "s"), (4, 3, 64, 104, "s"), (4, 2, 80, 128, "s")]


def ws_call(kernel, x, w, y, cfg, m, form):
    gd = kernel.gemm_decode
    warps, ring, maxnreg, regs = form[:4]
    staged = form[4:] == ("s",)
    cfg = {**cfg, "num_warps": warps}
    block_m = gd.decode_block_m(m, cfg)
    constexprs, _ = gd._launch_config({k: v for k, v in cfg.items() if k != "X_MASKED"}, block_m, w.in_features, w.out_features, w.group_size, w.zeros is None)
    constexprs.pop("TOKENS_FIRST")
    tokens_first = bool(cfg.get("TOKENS_FIRST", False))
    tiles, blocks = -(-w.out_features // constexprs["ROWS"]), -(-m // block_m)
    grid = (blocks, tiles) if tokens_first else (tiles, blocks)
    z = w.scales if w.zeros is None else w.zeros

    def call():
        if staged:
            gd._decode_ws_staged_kernel[grid](x, w.qweight, w.scales, z, y, m, w.out_features, w.in_features,
                                              x.stride(0), y.stride(0), **constexprs, TOKENS_FIRST=tokens_first,
                                              X_RING=ring, WORKER_REGS=regs, num_warps=4, maxnreg=maxnreg)
        else:
            gd._decode_ws_kernel[grid](x, w.qweight, w.scales, z, y, m, w.out_features, w.in_features, x.stride(0),
                                       y.stride(0), **constexprs, TOKENS_FIRST=tokens_first, X_RING=ring,
                                       WORKER_REGS=regs, X_MASKED=bool(cfg.get("X_MASKED", False)), num_warps=4,
                                       maxnreg=maxnreg)
        return y
    return call


def decode_cfg(plan) -> dict:
    if plan.path == "decode":
        return dict(plan.config)
    return {"ROWS": 16, "AHEAD": 1}


def rel_err(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="")
    ap.add_argument("--m", default="8,16,4,1")
    ap.add_argument("--check-m", default="1,3,8,9,16", type=lambda v: [int(i) for i in v.split(",")])
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--forms", default="", help="e.g. 4x2r80,4x3r64s: workers x X_RING r launch maxnreg, s: staged words (default: all of WS_FORMS)")
    ap.add_argument("--set", default="", help="plan options forced on every call, e.g. ROWS=16,ZEROS_BY_X_SUM=True, X_MASKED=True (rows past M zero-filled); "
                    "the table's plan is then timed as a decode plan with them too ('table+set')")
    ap.add_argument("--no-check", action="store_true", help="skip the other formats' correctness pass")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    forced = {k: (v == "True") if v in ("True", "False") else int(v)
              for k, v in (kv.split("=") for kv in args.set.split(",") if kv)}
    forms = [f for f in WS_FORMS if not args.forms or f"{f[0]}x{f[1]}r{f[2]}{''.join(f[4:])}" in args.forms.split(",")]
    t0 = time.perf_counter()
    kernel = timing.load_kernel()
    shapes = timing.select_shapes(args.shapes)
    out = {**timing.machine_info(), "correctness": [], "rows": []}
    bad_forms = set()

    # 1. timing, base format (each form's output checked against the dense path first)
    print(f"{'shape':12s} {'M':>3s} {'table us':>9s} {'best ws':>9s} {'ratio':>6s}  best form / plan", flush=True)
    for shape in shapes:
        n, k = shape["N"], shape["K"]
        copies = timing.copies_needed(timing.w4_bytes(n, k, 1, 128))
        weights = timing.random_w4_weights(kernel, n, k, 128, copies)
        for m in (int(v) for v in args.m.split(",")):
            if time.perf_counter() - t0 > args.budget_s:
                print("budget spent", flush=True)
                break
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            plan = kernel.plan_for(weights[0], m)
            table_us = timing.gpu_time_us([lambda w=w: kernel.matmul.w4a16_matmul(
                x, w.qweight, w.scales, w.zeros, None, k, 128, path=plan.path, config=plan.config) for w in weights])
            ref = kernel.matmul.w4a16_matmul(x, weights[0].qweight, weights[0].scales, weights[0].zeros, None, k, 128,
                                             path="dense")
            times = {}
            cfg = {**decode_cfg(plan), **forced}
            if forced:  # the one-program decode kernel with the same options, 4 warps: the structure's own cost
                same = {**{k: v for k, v in cfg.items() if k != "X_MASKED"}, "num_warps": 4}
                times["table+set"] = timing.gpu_time_us([lambda w=w: kernel.matmul.w4a16_matmul(
                    x, w.qweight, w.scales, w.zeros, None, k, 128, path="decode", config=same) for w in weights])
            for form in forms:
                try:
                    ys = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in weights]
                    err = rel_err(ws_call(kernel, x, weights[0], ys[0], cfg, m, form)(), ref)
                    if not err < 1e-2:
                        raise ValueError(f"wrong output: relative error {err:.2e} against the dense path")
                    times[str(form)] = timing.gpu_time_us([ws_call(kernel, x, w, y, cfg, m, form)
                                                           for w, y in zip(weights, ys)])
                except Exception as e:  # noqa: BLE001
                    times[str(form)] = f"{type(e).__name__}: {str(e)[:200]}"
            ok = {f: t for f, t in times.items() if isinstance(t, float) and f != "table+set"}
            best = min(ok, key=ok.get) if ok else None
            out["rows"].append(dict(shape=shape["name"], N=n, K=k, M=m, table_plan=str(plan), table_us=table_us,
                                    ws_us=times))
            print(f"{shape['name']:12s} {m:3d} {table_us:9.2f} {ok.get(best, float('nan')):9.2f} "
                  f"{table_us / ok[best] if best else float('nan'):6.3f}  {best} / {plan}", flush=True)
            print("    " + "  ".join(f"{f}: {t:.2f}" if isinstance(t, float) else f"{f}: {t[:60]}" for f, t in times.items()),
                  flush=True)
        del weights
        torch.cuda.empty_cache()
        if args.out:
            Path(args.out).write_text(json.dumps(out, indent=1))
    # 2. correctness against the dense path, other formats (after the timing: a compile abort then loses less)
    formats = [] if args.no_check else [("fp16", 128, False), ("bf16", 128, False), ("fp16", 128, True), ("fp16", 64, False),
               ("bf16", 64, True), ("fp16", -1, False)]
    check_forms = [f for f in forms if f[4:] == ("s",)] or [WS_FORMS[1], WS_FORMS[3]]
    for name, n, k in (("8B.o", 4096, 4096), ("70B.down", 8192, 28672)):
        for dname, g, sym in formats:
            dtype = getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[dname])
            w = timing.random_w4_weights(kernel, n, k, g, 1, symmetric=sym, scale_dtype=dtype)[0]
            gk = w.group_size
            for m in args.check_m:
                x = torch.randn(m, k, device="cuda", dtype=dtype)
                ref = kernel.matmul.w4a16_matmul(x, w.qweight, w.scales, w.zeros, None, k, gk, path="dense")
                plan = kernel.plan_for(w, m, dtype)
                table = kernel.matmul.w4a16_matmul(x, w.qweight, w.scales, w.zeros, None, k, gk, path=plan.path,
                                                   config=plan.config)
                errs = {"table": rel_err(table, ref)}
                for form in check_forms:
                    y = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
                    try:
                        errs[str(form)] = rel_err(ws_call(kernel, x, w, y, decode_cfg(plan), m, form)(), ref)
                    except Exception as e:  # noqa: BLE001 - a probe reports and goes on
                        errs[str(form)] = f"{type(e).__name__}: {str(e)[:200]}"
                bad = {f: e for f, e in errs.items() if not (isinstance(e, float) and e < 1e-2)}
                for f in bad:
                    if f != "table":
                        bad_forms.add((dname, g, sym, f))
                out["correctness"].append(dict(shape=name, N=n, K=k, M=m, dtype=dname, group_size=g, symmetric=sym,
                                               errors=errs))
                if bad:
                    print(f"WRONG {name} M={m} {dname} g{g} sym={sym}: {bad}", flush=True)
            worst = max((max(v for v in r["errors"].values() if isinstance(v, float))
                         for r in out["correctness"] if r["shape"] == name and r["dtype"] == dname
                         and r["group_size"] == g and r["symmetric"] == sym), default=None)
            print(f"correct {name} {dname} g{g} sym={sym}: worst rel err {worst:.2e}", flush=True)
    print(f"correctness done at {time.perf_counter() - t0:.0f} s; wrong forms: {sorted(bad_forms)}", flush=True)

    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"done at {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
