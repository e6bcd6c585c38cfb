"""Compile the GEMM kernels for a few configurations and print the compiler's resource report and
instruction mix (registers, spills, MMA kind, layout conversions). Run on the GPU; costs no timing."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402


PATTERNS = {
    "wgmma": r"wgmma\.mma_async", "mma.sync": r"mma\.sync", "ldmatrix": r"ldmatrix", "cp.async": r"cp\.async",
    "lop3": r"lop3", "shr/shf": r"\bshr\.|\bshf\.", "cvt": r"\bcvt\.", "fma": r"\bfma\.", "ld.global": r"ld\.global",
    "st.shared": r"st\.shared", "ld.shared": r"ld\.shared",
}


def main() -> None:
    kernel = timing.load_kernel()
    n, k, g = 8192, 8192, 128
    w = kernel.W4A16Weight(
        qweight=torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32, device="cuda"),
        scales=torch.rand(k // g, n, device="cuda").half(), zeros=torch.rand(k // g, n, device="cuda").half(),
        perm=None, in_features=k, out_features=n, group_size=g)
    configs = [
        ("splitk", {"BLOCK_N": 64, "BLOCK_M": 16, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4}),
        ("splitk", {"BLOCK_N": 128, "BLOCK_M": 16, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4}),
        ("tiled", {"BLOCK_N": 128, "BLOCK_M": 128, "SPLIT_K": 1, "num_warps": 8, "num_stages": 3}),
        ("gemv", {"BLOCK_N": 128, "BLOCK_M": 1, "SPLIT_K": 4, "num_warps": 4, "num_stages": 3}),
    ]
    for path, cfg in configs:
        m = max(1, cfg["BLOCK_M"])
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        plan = kernel.dispatch.Plan(path, cfg, "inspect")
        kernel.gemm._launch_matmul_kernel(x, w.qweight, w.scales, w.zeros, k, g, plan)
    out = Path(os.environ.get("OUT", "/tmp"))
    for name, fn in (("tc", kernel.gemm._w4a16_tc_kernel), ("gemv", kernel.gemm._w4a16_gemv_kernel)):
        for dev_cache in fn.device_caches.values():
            for i, compiled in enumerate(dev_cache[0].values()):
                if i == 0:
                    (out / f"{name}.ttgir").write_text(compiled.asm.get("ttgir", ""))
                ptx, ttgir = compiled.asm.get("ptx", ""), compiled.asm.get("ttgir", "")
                counts = {key: len(re.findall(pat, ptx)) for key, pat in PATTERNS.items()}
                consts = {k: v for k, v in getattr(compiled.src, "constants", {}).items() if isinstance(v, (int, bool))}
                print(f"{name} {consts} warps={compiled.metadata.num_warps} stages={compiled.metadata.num_stages} "
                      f"regs={compiled.n_regs} spills={compiled.n_spills} shared={compiled.metadata.shared} "
                      f"convert_layout={ttgir.count('convert_layout')} {counts}")


if __name__ == "__main__":
    main()
