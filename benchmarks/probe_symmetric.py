"""Why is the symmetric format slower than the asymmetric one with the same plan (M = 64 / 128 in NOTES v5, 70B.o at
M = 1 in v40 / v46)?

    python benchmarks/probe_symmetric.py --shapes 8B.gate_up,70B.qkv,70B.gate_up --m 64,128 [--rounds 2] --out probe.json

Times, with the asymmetric format's tuned plan forced on all of them (same method as bench_gemm.py):
  asym            the asymmetric kernel, random zeros (what the base rows measure)
  asym_zero8      the asymmetric kernel, every zero 8: the symmetric format's weight values
  sym             the symmetric kernel (no zeros tensor), same codes and scales as asym_zero8
  sym_own_plan    the same, with the symmetric format's own tuned plan (what bench_gemm.py's sym rows run)
If asym_zero8 is as slow as sym, the data (the values reaching the tensor cores) costs the time, not the
symmetric kernel's code; if it is as fast as asym, the symmetric kernel's code does. All of them read the same qweight
and scales tensors (one allocation), so the addresses are not a difference either. Each round times them in a rotated
order (`timing.round_order`), so a clock drift within a round does not favour the variant timed first.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="8B.gate_up,70B.qkv,70B.gate_up")
    ap.add_argument("--m", default="64,128")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    kernel = timing.load_kernel()
    wanted = args.shapes.split(",")
    rows = []
    for shape in (s for s in timing.load_shapes()["shapes"] if s["name"] in wanted):
        n, k = shape["N"], shape["K"]
        copies = timing.copies_needed(timing.w4_bytes(n, k, 1, 128))
        asym = timing.random_w4_weights(kernel, n, k, 128, copies)
        variants = {
            "asym": [(w.qweight, w.scales, w.zeros) for w in asym],
            "asym_zero8": [(w.qweight, w.scales, torch.full_like(w.zeros, 8.0)) for w in asym],
            "sym": [(w.qweight, w.scales, None) for w in asym],
        }
        for m in (int(v) for v in args.m.split(",")):
            plan = kernel.plan_for(asym[0], m)
            sym_weight = kernel.W4A16Weight(qweight=asym[0].qweight, scales=asym[0].scales, zeros=None, perm=None,
                                            in_features=k, out_features=n, group_size=128)
            # name -> (weights, plan)
            timed = {name: (weights, plan) for name, weights in variants.items()}
            timed["sym_own_plan"] = (variants["sym"], kernel.plan_for(sym_weight, m))
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            for r in range(args.rounds):
                for name, (weights, p) in timing.round_order(list(timed.items()), r, args.rounds):
                    calls = [lambda q=q, s=s, z=z, p=p: kernel.matmul.w4a16_matmul(x, q, s, z, None, k, 128, path=p.path,
                                                                                   config=p.config) for q, s, z in weights]
                    us = timing.gpu_time_us(calls)
                    rows.append(dict(shape=shape["name"], N=n, K=k, M=m, variant=name, round=r, us=us, plan=str(p)))
                    print(f"{shape['name']:12s} M={m:4d} {name:12s} {us:8.2f} us   {p}", flush=True)
        del asym, variants
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps({**timing.machine_info(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
