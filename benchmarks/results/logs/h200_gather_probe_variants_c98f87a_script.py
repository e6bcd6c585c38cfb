"""Session 26 probe: act-order gather variants (perm int64 vs int32, grid, multi-row, chunked staged)."""
import json, os, sys, itertools
from pathlib import Path
import torch, triton, triton.language as tl
sys.path.insert(0, "benchmarks")
import timing

@triton.jit
def multirow_kernel(x_ptr, perm_ptr, out_ptr, M, K, stride_xm, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    offs = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    kmask = offs < K
    src = tl.load(perm_ptr + offs, mask=kmask, other=0, cache_modifier=".cg")
    mask = (rows[:, None] < M) & kmask[None, :]
    v = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + src[None, :], mask=mask)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * K + offs[None, :], v, mask=mask)

@triton.jit
def chunk_staged_kernel(x_ptr, perm_ptr, out_ptr, M, K, stride_xm, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    row = tl.load(x_ptr + m * stride_xm + offs, mask=offs < K, other=0.0)
    c = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    cmask = c < K
    src = tl.load(perm_ptr + c, mask=cmask, other=0).to(tl.int32)
    tl.store(out_ptr + m * K + c, tl.gather(row, src, 0), mask=cmask)

def main():
    kernel = timing.load_kernel()
    g = kernel.gather
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    ms = [int(v) for v in os.environ.get("PM", "1,2,16,32,64,128,256,512,1024").split(",")]
    for k in (4096, 8192, 14336, 28672):
        pow2 = 1 << (k - 1).bit_length()
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            p64 = torch.randperm(k, device="cuda")
            p32 = p64.to(torch.int32)
            ref = x.index_select(1, p64)
            V = {"copy": lambda: x.clone(), "cur64": lambda: g.gather_columns(x, p64), "cur32": lambda: g.gather_columns(x, p32)}
            for form in ("columns", "rows", "staged"):
                if form == "staged" and k > g._STAGED_MAX_K:
                    continue
                V[f"{form}32"] = lambda f=form: g.gather_columns(x, p32, form=f)
            if k <= g._STAGED_MAX_K:
                block = max(512, pow2)
                L = g._gather_staged[(block, False)]
                for grid in (sms, 2 * sms):
                    def st(grid=grid, L=L):
                        out = torch.empty_like(x)
                        L((min(m, grid),), (x, p32, out), (m, k, x.stride(0)), g.current_stream(x.device))
                        return out
                    V[f"staged32_g{grid}"] = st
            if m <= 256:
                for R, BK, W in ((1, 1024, 4), (2, 1024, 4), (4, 1024, 4), (8, 512, 4), (4, 512, 4), (16, 256, 4)):
                    if R > 1 and R > 2 * m:
                        continue
                    def mr(R=R, BK=BK, W=W):
                        out = torch.empty_like(x)
                        multirow_kernel[(triton.cdiv(m, R), triton.cdiv(k, BK))](x, p32, out, m, k, x.stride(0), ROWS=R, BLOCK_K=BK, num_warps=W)
                        return out
                    V[f"multirow_r{R}_b{BK}"] = mr
            for CH, W in ((1024, 8), (2048, 8), (4096, 16), (pow2, 16), (2048, 16)):
                if CH > pow2:
                    continue
                def cs(CH=CH, W=W):
                    out = torch.empty_like(x)
                    chunk_staged_kernel[(m, triton.cdiv(k, CH))](x, p32, out, m, k, x.stride(0), BLOCK_K=pow2, CHUNK=CH, num_warps=W)
                    return out
                V[f"chunk_c{CH}_w{W}"] = cs
            line = []
            for name, fn in V.items():
                try:
                    o = fn()
                    ok = name == "copy" or torch.equal(o, ref)
                    us = timing.gpu_time_us([fn] * 4)
                except Exception as e:  # noqa
                    print("ERR", k, m, name, repr(e)[:200], flush=True)
                    continue
                rows.append({"K": k, "M": m, "v": name, "us": us, "ok": ok})
                line.append(f"{name}={us:.2f}{'' if ok else '!BAD'}")
            print(k, m, " ".join(line), flush=True)
    Path(os.environ["OUT"], "gather_probe.json").write_text(json.dumps({**timing.machine_info(), "rows": rows}, indent=1))

main()
