"""Session 28 probe (throwaway): the decode kernel's words loaded past L1 (ld.global.cg: WORDS_CG), so that L1 keeps
x's blocks for the other programs on the SM, against the table's plan (and with EVICT_FIRST / X_AT_USE flipped)."""
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
ms = [int(v) for v in os.environ.get("PROBE_M", "1,2,4,8,16").split(",")]
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
            cands.append(("decode", dict(plan.config, WORDS_CG=True), "table+CG"))
            cands.append(("decode", dict(plan.config, EVICT_FIRST=not plan.config.get("EVICT_FIRST", False)), "t~EF"))
            cands.append(("decode", dict(plan.config, WORDS_CG=True, X_AT_USE=not plan.config.get("X_AT_USE", False)), "t+CG~XU"))
        line = f"{shape['name']:11s} M={m:2d}"
        for path, cfg, tag in cands:
            try:
                us = min(tune.time_candidate(kernel, weights, x, k, 128, path, cfg, ref) for _ in range(3))
            except Exception as exc:
                us = float("nan")
                print("ERR", shape["name"], m, cfg, repr(exc)[:200], flush=True)
            rows_out.append(dict(shape=shape["name"], M=m, path=path, config=cfg, tag=tag, us=us))
            line += f" | {tag} {us:6.2f}"
        print(line, flush=True)
    del weights
    torch.cuda.empty_cache()
(OUT / "probe_s28b.json").write_text(json.dumps(rows_out, indent=1))
