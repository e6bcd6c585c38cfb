"""Session 28 probe (throwaway).
A: x traffic at decode. The table's plan (and two decode alternatives) timed with real x [M, K] and with x = one row
   expanded to M rows (stride 0: every token reads the same addresses, so x's L2 -> SM traffic is one token's).
B: 70B.gate_up M = 1, base / symmetric / group 64 in 5 interleaved rounds while nvidia-smi logs clocks and power."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path("benchmarks").resolve()))
import timing  # noqa: E402
import tune  # noqa: E402

kernel = timing.load_kernel()
OUT = Path(os.environ["OUT"])
rows_out = []
part = os.environ.get("PROBE_PART", "AB")

if "A" in part:
    alts = [{"num_warps": 4, "ROWS": 16, "AHEAD": 1, "maxnreg": 128}, {"num_warps": 4, "ROWS": 32, "AHEAD": 1, "maxnreg": 128},
            {"num_warps": 8, "ROWS": 32, "AHEAD": 1, "maxnreg": 128}]
    for shape in timing.select_shapes("8B.qkv,8B.o,8B.down,70B.qkv,70B.o,8B.gate_up"):
        n, k = shape["N"], shape["K"]
        copies = timing.copies_needed(timing.w4_bytes(n, k, 1, 128, False))
        weights = timing.random_w4_weights(kernel, n, k, 128, copies, False, False, torch.float16)
        w0 = weights[0]
        for m in (1, 4, 8, 16):
            xr = torch.randn(m, k, device="cuda", dtype=torch.float16)
            xs = torch.randn(1, k, device="cuda", dtype=torch.float16).expand(m, k)
            plan = kernel.plan_for(w0, m, torch.float16)
            cands = [(plan.path, dict(plan.config))] + [("decode", a) for a in alts]
            line = f"{shape['name']:11s} M={m:2d}"
            for ci, (path, cfg) in enumerate(cands):
                res = {}
                for label, x in (("real", xr), ("same", xs)):
                    ref = kernel.matmul.w4a16_matmul(x.contiguous(), w0.qweight, w0.scales, w0.zeros, None, k, 128, path="dense").float()
                    try:
                        res[label] = min(tune.time_candidate(kernel, weights, x, k, 128, path, cfg, ref) for _ in range(2))
                    except Exception as exc:
                        res[label] = float("nan")
                        print("ERR", shape["name"], m, cfg, repr(exc)[:200], flush=True)
                rows_out.append(dict(part="A", shape=shape["name"], M=m, path=path, config=cfg, table=ci == 0, **res))
                tag = "table" if ci == 0 else f"R{cfg['ROWS']}W{cfg['num_warps']}"
                line += f" | {tag} {res['real']:6.2f}/{res['same']:6.2f}"
            print(line, flush=True)
        del weights
        torch.cuda.empty_cache()
    (OUT / "probe_s28_A.json").write_text(json.dumps(rows_out, indent=1))

if "B" in part:
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,"
                            "temperature.memory,clocks_event_reasons.active", "--format=csv", "-lms", "100"],
                           stdout=open(OUT / "smi.csv", "w"), stderr=subprocess.STDOUT)
    t0 = time.time()
    n, k = 57344, 8192
    sets = {}
    for name in ("base", "sym", "g64"):
        dt, g, sym, ao = timing.VARIANTS[name]
        copies = timing.copies_needed(timing.w4_bytes(n, k, 1, g, sym))
        sets[name] = timing.random_w4_weights(kernel, n, k, g, copies, sym, ao, torch.float16)
    x = torch.randn(1, k, device="cuda", dtype=torch.float16)
    fp16 = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(2)]
    def call_for(w):
        return lambda: kernel.matmul.w4a16_matmul(x, w.qweight, w.scales, w.zeros, w.perm, w.in_features, w.group_size)
    for rnd in range(5):
        for name in ("fp16", "base", "sym", "g64"):
            if name == "fp16":
                fns = [lambda w=w: torch.nn.functional.linear(x, w) for w in fp16]
            else:
                fns = [call_for(w) for w in sets[name]]
            ts = time.time() - t0
            us = timing.gpu_time_us(fns, replays=15)
            rows_out.append(dict(part="B", round=rnd, impl=name, us=us, t_start=ts, t_end=time.time() - t0))
            print(f"round {rnd} {name:5s} {us:7.2f} us  (t {ts:6.2f}-{time.time() - t0:6.2f} s)", flush=True)
    smi.terminate()
    (OUT / "probe_s28_B.json").write_text(json.dumps(rows_out, indent=1))
