"""Session 28: one decode call for ncu (table plan), x real or one row expanded (PROF_X=same)."""
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path("benchmarks").resolve()))
import timing  # noqa: E402

kernel = timing.load_kernel()
shape = next(s for s in timing.load_shapes()["shapes"] if s["name"] == os.environ["PROF_SHAPE"])
n, k = shape["N"], shape["K"]
m = int(os.environ["PROF_M"])
w = timing.random_w4_weights(kernel, n, k, 128, 1)[0]
x = torch.randn(m, k, device="cuda", dtype=torch.float16)
if os.environ.get("PROF_X") == "same":
    x = torch.randn(1, k, device="cuda", dtype=torch.float16).expand(m, k)
plan = kernel.plan_for(w, m)
config = dict(plan.config, **timing.config_overrides(os.environ.get("PROF_SET", ""), kernel))
print(shape["name"], m, plan.path, config, os.environ.get("PROF_X", "real"), flush=True)
for _ in range(3):
    kernel.matmul.w4a16_matmul(x, w.qweight, w.scales, w.zeros, None, k, 128, path=plan.path, config=config)
torch.cuda.synchronize()
