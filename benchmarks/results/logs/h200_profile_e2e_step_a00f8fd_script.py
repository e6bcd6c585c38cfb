"""Session 28 probe (throwaway): where a compiled decode step's GPU time goes (fp16 and W4A16, batch 1 / 16), by kernel
(torch.profiler over eager compiled steps), against the CUDA-graph step time."""
import collections
import copy
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path("benchmarks").resolve()))
import bench_e2e as e2e  # noqa: E402
import timing  # noqa: E402

kernel = timing.load_kernel()
cfg = dict(e2e.LLAMA3_8B)
out = Path(os.environ["OUT"])


def category(name: str) -> str:
    n = name.lower()
    if "decode_kernel" in n or "w4a16" in n or "gather_columns" in n or "pingpong" in n:
        return "w4a16 gemm"
    if "nvjet" in n or "gemm" in n or "xmma" in n or "cutlass" in n or "sm90" in n:
        return "cublas"
    if "flash" in n or "fmha" in n or "attention" in n or "softmax" in n or "efficient" in n:
        return "attention"
    if "triton_" in n:
        return "inductor triton"
    if "index" in n or "scatter" in n:
        return "index_copy"
    return "other"


for batch in (1, 16):
    torch.manual_seed(0)
    with torch.device("cuda"):
        fp16 = e2e.Decoder(cfg, batch, 136).half()
    for p in fp16.parameters():
        if p.dim() == 2:
            p.data.normal_(0, 0.02)
    for b in fp16.blocks:
        b.k_cache.normal_()
        b.v_cache.normal_()
    tokens = torch.randint(0, cfg["vocab"], (batch, 1), device="cuda")
    pos = torch.tensor([128], device="cuda")
    w4 = copy.deepcopy(fp16)
    kernel.layers.convert_to_w4a16(w4, group_size=128, skip=("lm_head",))
    for impl, model in (("fp16", fp16), ("w4a16", w4)):
        for blk in model.blocks:
            blk.compile(fullgraph=True)
        graph_ms = e2e.graph_step_ms(model, tokens, pos)
        with torch.inference_mode():
            for _ in range(3):
                model(tokens, pos)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof, torch.inference_mode():
            for _ in range(3):
                model(tokens, pos)
            torch.cuda.synchronize()
        totals, counts, names = collections.Counter(), collections.Counter(), collections.Counter()
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                c = category(ev.name)
                totals[c] += ev.device_time / 3
                counts[c] += 1 / 3
                names[ev.name[:90]] += ev.device_time / 3
        kern_ms = sum(totals.values()) / 1000
        print(f"batch {batch} {impl}: graph step {graph_ms:.3f} ms, kernels {kern_ms:.3f} ms "
              f"({sum(counts.values()):.0f} kernels/step)", flush=True)
        for c, t in totals.most_common():
            print(f"   {c:16s} {t / 1000:7.3f} ms  {counts[c]:6.0f} kernels  {t / max(counts[c], 1):7.2f} us each", flush=True)
        with open(out / f"kernels_b{batch}_{impl}.txt", "w") as f:
            for nm, t in names.most_common(40):
                f.write(f"{t:9.1f} us  {nm}\n")
    del fp16, w4
    torch.cuda.empty_cache()
