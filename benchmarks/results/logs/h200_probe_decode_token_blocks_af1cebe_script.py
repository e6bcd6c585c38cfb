"""Session 27 probe (throwaway): the decode kernel at M = 16 / 32 / 64 with several token blocks per weight tile
(BLOCK_M 8 or 16 programs along M; TOKENS_FIRST: those programs adjacent in launch order, sharing the words through
L2), against the table's plan. Prints a table; JSON under $OUT."""
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path("benchmarks").resolve()))
import timing  # noqa: E402
import tune  # noqa: E402

kernel = timing.load_kernel()
ms = [int(v) for v in os.environ.get("PROBE_M", "16,32,64").split(",")]
shapes = os.environ.get("PROBE_SHAPES", "")
forms = []
for rows in (16, 32):
    for warps in (4, 8):
        for bm in (8, 16):
            for first in (False, True):
                forms.append({"num_warps": warps, "ROWS": rows, "AHEAD": 1, "maxnreg": 128, "BLOCK_M": bm, "TOKENS_FIRST": first})
rows_out = []
for shape in timing.select_shapes(shapes):
    n, k = shape["N"], shape["K"]
    copies = timing.copies_needed(timing.w4_bytes(n, k, 1, 128, False))
    weights = timing.random_w4_weights(kernel, n, k, 128, copies, False, False, torch.float16)
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w0 = weights[0]
        ref = kernel.matmul.w4a16_matmul(x, w0.qweight, w0.scales, w0.zeros, w0.perm, k, 128, path="dense").float()
        plan = kernel.plan_for(w0, m, torch.float16)
        cands = [(plan.path, dict(plan.config))] + [("decode", f) for f in forms]
        res = []
        for path, cfg in cands:
            try:
                us = min(tune.time_candidate(kernel, weights, x, k, 128, path, cfg, ref) for _ in range(2))
            except Exception as exc:
                rows_out.append(dict(shape=shape["name"], M=m, path=path, config=cfg, error=repr(exc)[:300]))
                print(f"{shape['name']:11s} M={m:4d} ERROR {cfg} {repr(exc)[:160]}", flush=True)
                continue
            rows_out.append(dict(shape=shape["name"], M=m, path=path, config=cfg, us=us))
            res.append((us, path, cfg))
        table_us = res[0][0] if res and res[0][1] == plan.path else float("nan")
        dec = sorted(res[1:], key=lambda r: r[0])
        best = dec[0] if dec else (float("nan"), "", {})
        cfgs = {(c["ROWS"], c["num_warps"], c["BLOCK_M"], c["TOKENS_FIRST"]): u for u, _, c in dec}
        tf = min((u for (r, w, b, t), u in cfgs.items() if t), default=float("nan"))
        nf = min((u for (r, w, b, t), u in cfgs.items() if not t), default=float("nan"))
        print(f"{shape['name']:11s} M={m:3d} table {table_us:7.2f} ({plan.path:8s}) decode best {best[0]:7.2f} "
              f"R{best[2].get('ROWS')} W{best[2].get('num_warps')} BM{best[2].get('BLOCK_M')} TF{int(bool(best[2].get('TOKENS_FIRST')))}"
              f"  tokens-first best {tf:7.2f} n-first best {nf:7.2f}  table/decode {table_us / best[0]:.3f}", flush=True)
    del weights
    torch.cuda.empty_cache()
Path(os.environ["OUT"], "probe_s27.json").write_text(json.dumps(rows_out, indent=1))
