"""Session 26 probe 2: the package's gather (old tree: auto form; new tree: picked chunk, perm int64 / int32,
chunk / 2, chunk x 2, the other warp count)."""
import json, os, sys
from pathlib import Path
import torch, triton
sys.path.insert(0, "benchmarks")
import timing

def main(side):
    kernel = timing.load_kernel()
    g = kernel.gather
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for k in (4096, 8192, 14336, 28672):
        block = 1 << (k - 1).bit_length()
        for m in (1, 2, 16, 32, 64, 128, 256, 512, 1024, 4096):
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            p64 = torch.randperm(k, device="cuda")
            p32 = p64.to(torch.int32)
            ref = x.index_select(1, p64)
            V = {"auto32": lambda: g.gather_columns(x, p32)}
            if side == "new":
                c = g.gather_chunk(m, k, sms)
                if c > 1024:
                    V["half"] = lambda: g.gather_columns(x, p32, chunk=c // 2)
                if c < block:
                    V["double"] = lambda: g.gather_columns(x, p32, chunk=c * 2)
                w = g._warps(max(1024, block), c)
                for ow in (8, 16, 32):
                    if ow == w or (max(1024, block) // (32 * ow)) < 1:
                        continue
                    def alt(ow=ow):
                        out = torch.empty_like(x)
                        g._gather_columns_kernel[(m, triton.cdiv(k, c))](x, p32, out, k, x.stride(0), BLOCK_K=max(1024, block),
                                                                         CHUNK=c, LAUNCH_DEPENDENTS=False, num_warps=ow)
                        return out
                    V[f"w{ow}"] = alt
            line = []
            for name, fn in V.items():
                ok = torch.equal(fn(), ref)
                us = timing.gpu_time_us([fn] * 4)
                rows.append({"K": k, "M": m, "v": name, "us": us, "ok": ok})
                line.append(f"{name}={us:.2f}{'' if ok else '!BAD'}")
            print(side, k, m, " ".join(line), flush=True)
    Path(os.environ["OUT"], f"gather3_{side}.json").write_text(json.dumps({**timing.machine_info(), "rows": rows}, indent=1))

main(sys.argv[1])
