"""Session 19 probe: does the decode kernel's M = 1 -> 2 step come from the x loads' distinct cache lines?
Times the tuned decode plan with x as M distinct rows and with x as one row broadcast (stride 0: every token's loads hit
one line, as at M = 1), plus M = 1 itself."""
import sys, json, os
from pathlib import Path
sys.path.insert(0, str(Path("benchmarks").resolve()))
import torch, timing
kernel = timing.load_kernel()
shapes = {s["name"]: s for s in timing.load_shapes()["shapes"]}
rows = []
for name in sys.argv[1].split(","):
    n, k = shapes[name]["N"], shapes[name]["K"]
    copies = timing.copies_needed(timing.w4_bytes(n, k, 1, 128))
    ws = timing.random_w4_weights(kernel, n, k, 128, copies)
    launch = kernel.matmul.launcher_for("decode")
    for m in (1, 2, 4, 8, 16):
        plan = kernel.plan_for(ws[0], m)
        if plan.path != "decode":
            continue
        xs = {"rows": torch.randn(m, k, device="cuda", dtype=torch.float16),
              "bcast": torch.randn(1, k, device="cuda", dtype=torch.float16).expand(m, k)}
        ref = None
        for form, x in xs.items():
            if m == 1 and form == "bcast":
                continue
            calls = [lambda w=w, x=x: launch(x, w.qweight, w.scales, w.zeros, k, 128, plan) for w in ws]
            y = calls[0]()
            want = kernel.matmul.w4a16_matmul(x.contiguous(), ws[0].qweight, ws[0].scales, ws[0].zeros, None, k, 128, path="splitk")
            err = (y.float() - want.float()).abs().max().item() / want.float().abs().max().item()
            us = timing.gpu_time_us(calls)
            rows.append(dict(shape=name, M=m, form=form, us=us, rel_err=err, config=plan.config))
            print(f"{name:12s} M={m:2d} {form:6s} {us:7.2f} us  err {err:.1e}  {plan.config}", flush=True)
out = os.environ.get("OUT", "/tmp")
json.dump({"machine": timing.machine_info(), "rows": rows}, open(f"{out}/probe_x.json", "w"), indent=1)
