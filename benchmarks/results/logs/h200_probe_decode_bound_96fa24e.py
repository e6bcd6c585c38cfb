"""Session 18 diagnostic: what bounds the decode kernel at M = 8 / 16 (and group 64)? Times the experimental
package (.ab/exp: NO_XSUM, NO_UNPACK, FORCE_BM constexprs; wrong outputs by design for the first two)."""
import json, os, sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
import torch
import timing

kernel = timing.load_kernel()
out = []
CASES = {
    "70B.gate_up": (57344, 8192, {"num_warps": 4, "ROWS": 32, "AHEAD": 1, "maxnreg": 128}),
    "70B.down": (8192, 28672, {"num_warps": 8, "ROWS": 32, "AHEAD": 1, "maxnreg": 128}),
    "8B.o": (4096, 4096, {"num_warps": 8, "ROWS": 16, "AHEAD": 1, "maxnreg": 128}),
}
VARIANTS = [  # (label, M, group, extra config)
    ("base", 1, 128, {}), ("no_xsum", 1, 128, {"NO_XSUM": 1}), ("no_unpack", 1, 128, {"NO_UNPACK": 1}),
    ("bm16", 1, 128, {"FORCE_BM": 16}), ("bm16_no_xsum", 1, 128, {"FORCE_BM": 16, "NO_XSUM": 1}),
    ("base", 8, 128, {}), ("no_xsum", 8, 128, {"NO_XSUM": 1}), ("no_unpack", 8, 128, {"NO_UNPACK": 1}),
    ("base", 16, 128, {}), ("no_xsum", 16, 128, {"NO_XSUM": 1}), ("no_unpack", 16, 128, {"NO_UNPACK": 1}),
    ("no_xsum_no_unpack", 16, 128, {"NO_XSUM": 1, "NO_UNPACK": 1}), ("regs_free", 16, 128, {"maxnreg": None}),
    ("base", 1, 64, {}), ("no_xsum", 1, 64, {"NO_XSUM": 1}), ("r16", 1, 64, {"ROWS": 16}),
]
for name, (n, k, cfg) in CASES.items():
    for group in (128, 64):
        copies = timing.copies_needed(timing.w4_bytes(n, k, 1, group, False))
        weights = timing.random_w4_weights(kernel, n, k, group, copies)
        for label, m, g, extra in VARIANTS:
            if g != group:
                continue
            config = {key: v for key, v in {**cfg, **extra}.items() if v is not None}
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            def call(w, x=x, config=config):
                return kernel.matmul.w4a16_matmul(x, w.qweight, w.scales, w.zeros, None, k, g, path="decode", config=config)
            try:
                us = timing.gpu_time_us([lambda w=w: call(w) for w in weights], replays=7)
            except Exception as exc:
                print(name, label, m, g, "ERROR", repr(exc)[:300], flush=True)
                continue
            out.append({"shape": name, "label": label, "M": m, "group": g, "config": config, "us": us})
            print(f"{name:12s} g{g:<4d} M={m:<3d} {label:20s} {us:8.2f} us", flush=True)
        del weights
        torch.cuda.empty_cache()
Path(os.environ.get("OUT", "."), "probe.json").write_text(json.dumps({**timing.machine_info(), "rows": out}, indent=1))
