"""Session 28 probe (throwaway): the decode kernel with its warps in ROW_GROUPS groups over adjacent weight rows
(the groups read the same x blocks at about the same time, the later ones from L1), against the table's plan."""
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path("benchmarks").resolve()))
import timing  # noqa: E402
import tune  # noqa: E402

kernel = timing.load_kernel()
OUT = Path(os.environ["OUT"])
rows_out = []
ms = [int(v) for v in os.environ.get("PROBE_M", "1,4,8,16").split(",")]
alts = {}
for shape in timing.select_shapes(os.environ.get("PROBE_SHAPES", "")):
    n, k = shape["N"], shape["K"]
    copies = timing.copies_needed(timing.w4_bytes(n, k, 1, 128, False))
    weights = timing.random_w4_weights(kernel, n, k, 128, copies, False, False, torch.float16)
    w0 = weights[0]
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        ref = kernel.matmul.w4a16_matmul(x, w0.qweight, w0.scales, w0.zeros, None, k, 128, path="dense").float()
        plan = kernel.plan_for(w0, m, torch.float16)
        cands = [(plan.path, dict(plan.config), "table")]
        if plan.path == "decode":
            for rg in (2, 4):
                c = dict(plan.config, ROW_GROUPS=rg)
                if c.get("num_warps", 4) % rg == 0 and c.get("ROWS", 16) * rg <= 64:
                    cands.append(("decode", c, f"t+RG{rg}"))
        for w, rg in ((8, 2), (8, 4), (4, 2), (4, 4)):
            c = {"num_warps": w, "ROWS": 16, "AHEAD": 1, "maxnreg": 128, "ROW_GROUPS": rg}
            if m > 8:
                c.update(BLOCK_M=8, TOKENS_FIRST=True)
            cands.append(("decode", c, f"W{w}RG{rg}"))
        line = f"{shape['name']:11s} M={m:2d}"
        for path, cfg, tag in cands:
            try:
                y = kernel.matmul.w4a16_matmul(x, w0.qweight, w0.scales, w0.zeros, None, k, 128, path=path, config=cfg).float()
                err = float((y - ref).norm() / ref.norm())
                if not err < 2e-3:
                    raise ValueError(f"relative error {err:.2e}")
                us = min(tune.time_candidate(kernel, weights, x, k, 128, path, cfg, ref) for _ in range(2))
            except Exception as exc:
                us = float("nan")
                print("ERR", shape["name"], m, cfg, repr(exc)[:200], flush=True)
            rows_out.append(dict(shape=shape["name"], M=m, path=path, config=cfg, tag=tag, us=us))
            line += f" | {tag} {us:6.2f}"
        print(line, flush=True)
    del weights
    torch.cuda.empty_cache()
(OUT / "probe_s28b.json").write_text(json.dumps(rows_out, indent=1))
