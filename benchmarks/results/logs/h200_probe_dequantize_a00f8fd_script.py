"""Session 28 probe (throwaway): the dense path's dequantize kernel alone (gemm.dequantize_native) on the eight shapes,
BLOCK_N 32 / 64 / 128, against a plain fp16 copy of the same output size (the achievable write bandwidth)."""
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path("benchmarks").resolve()))
import timing  # noqa: E402

kernel = timing.load_kernel()
OUT = Path(os.environ["OUT"])
rows = []
for shape in timing.select_shapes(""):
    n, k = shape["N"], shape["K"]
    copies = timing.copies_needed(timing.w4_bytes(n, k, 1, 128, False) + n * k * 2)
    weights = timing.random_w4_weights(kernel, n, k, 128, copies)
    moved = n * k // 2 + n * (k // 128) * 3 + n * k * 2
    line = f"{shape['name']:11s}"
    for bn in (32, 64, 128):
        fns = [lambda w=w, bn=bn: kernel.gemm.dequantize_native(w.qweight, w.scales, w.zeros, k, 128, torch.float16, block_n=bn)
               for w in weights]
        us = timing.gpu_time_us(fns, replays=9)
        rows.append(dict(shape=shape["name"], N=n, K=k, block_n=bn, us=us, TBps=moved / us / 1e6))
        line += f" | BN{bn} {us:7.1f} us {moved / us / 1e6:4.2f} TB/s"
    src = [torch.empty(n, k, device="cuda", dtype=torch.float16) for _ in range(2)]
    us = timing.gpu_time_us([lambda s=s: s.clone() for s in src], replays=9)
    rows.append(dict(shape=shape["name"], N=n, K=k, impl="clone", us=us, TBps=2 * n * k * 2 / us / 1e6))
    line += f" | clone {us:7.1f} us ({2 * n * k * 2 / us / 1e6:4.2f} TB/s r+w)"
    print(line, flush=True)
    del weights, src
    torch.cuda.empty_cache()
(OUT / "probe_s28_dequant.json").write_text(json.dumps(rows, indent=1))
