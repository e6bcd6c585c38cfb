"""Compile the kernels the dispatcher would launch for sm_90 on any machine (no GPU) and summarise their
hot loop: registers, spills, instructions, block-wide barriers, MMAs and where the first MMA sits. Covers gemm.py's
Triton kernels and the Gluon decode kernel (`gemm_decode.compile_for_sm90`); pingpong plans print "-".

    python benchmarks/sass_report.py --shapes 8B.gate_up,70B.qkv --m 2,128 [--variant base]

Why: ptxas's instruction schedule is fragile. Deriving K / G inside the kernel instead of taking it as an
argument (c09e34c) moved every dequantization instruction of the scale-in-operand loop ahead of the first
MMA, and the gate_up shapes ran 12-18% slower on the H200 with the same plan (NOTES v9). This report shows such
a change before any GPU time is spent. Use a Triton of the GPU machine's version (3.6 on the H200): another
version schedules differently.

How: the package's own `gemm._launch_arguments` (what `launch_gemm` hands the kernel) runs on CPU tensors,
so the specialisation (dtypes, 16-byte alignment, ints equal to 1 or divisible by 16) is the one Triton's
launcher would compute for the same call on a GPU.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)  # H100 / H200
NVIDIA_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def tuned_call(kernel, m: int, n: int, k: int, variant: str, overrides: dict | None = None):
    """(plan, configuration) of the H200 table's entry for this call (with `overrides` replacing entries of the
    configuration: a candidate compiled before it is timed). The configuration is the entry's own: planning on the
    CPU drops the options that need a GPU (GATHER_PDL), which the decode kernel's compile must still see."""
    dtype, group_size, symmetric, act_order = timing.VARIANTS[variant]
    g = timing.effective_group_size(group_size, k)
    dispatch = kernel.dispatch
    _, table, by_format, _ = dispatch.load_tuned_table("NVIDIA H200")
    row = dispatch.tuned_row(table, by_format, dispatch.m_bucket(m), n, k, dispatch.format_key(dtype, g, symmetric, act_order))
    if row is None:
        raise SystemExit(f"no tuned entry for N={n} K={k} M={m} {variant}")
    config = {**dispatch.row_config(row), **(overrides or {})}
    return dispatch.plan_gemm(m, n, k, g, dtype, torch.device("cpu"), path=row["path"], config=config), config


def compile_decode_for_sm90(kernel, m: int, n: int, k: int, variant: str, config: dict):
    """The Gluon decode kernel a call of a decode plan launches, compiled for sm_90 (`gemm_decode.compile_for_sm90`,
    which takes the plan's options through the launcher's own `_launch_config`), and its warp count."""
    dtype, group_size, symmetric, _ = timing.VARIANTS[variant]
    decode = kernel.gemm_decode
    compiled = decode.compile_for_sm90(config, dtype, decode.decode_block_m(m, config), symmetric,
                                       group_size=timing.effective_group_size(group_size, k), in_features=k, out_features=n)
    return compiled, config.get("num_warps", 4)


def captured_launch(kernel, plan, m: int, n: int, k: int, variant: str):
    """(PreparedLaunch, tensors, ints) of the gemm.py kernel one call of `plan` (`tuned_call`'s) would launch; None
    for the dense path and the Gluon kernels."""
    dtype, group_size, symmetric, _ = timing.VARIANTS[variant]
    g = timing.effective_group_size(group_size, k)
    if plan.path in ("dense", "reference") or plan.path in kernel.dispatch.GLUON_PATHS:
        # no Triton kernel of gemm.py: cuBLAS / torch, or a Gluon kernel (its module's compile_for_sm90 compiles it)
        return None
    qweight = torch.empty(kernel.layout.native_qweight_shape(n, k), dtype=torch.int32)
    scales = torch.empty(k // g, n, dtype=dtype)
    zeros = None if symmetric else timing.stored_zeros(kernel, torch.zeros(k // g, n, dtype=dtype))  # integer zeros
    # the launch's arguments prepared as for a GPU (inline assembly, the GPU's dot dtype) on CPU tensors
    run, _, tensors, ints, _ = kernel.gemm._launch_arguments(torch.empty(m, k, dtype=dtype), qweight, scales, zeros, k, g, plan,
                                                             None, 0, "cuda")
    return run.kernel, tensors, ints


def compile_for_sm90(prepared, tensors, ints):
    """The compiled kernel for exactly this call's specialisation."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    fn = prepared.kernel
    values = {**dict(zip(prepared.tensor_names, tensors)), **dict(zip(prepared.int_names, ints))}
    signature, constexprs, attrs = {}, {}, {}
    for index, param in enumerate(fn.params):
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[(index,)] = prepared.constexprs[param.name]
            continue
        kind, key = native_specialize_impl(CUDABackend, values[param.name], False, True, True)
        if kind == "constexpr":  # an int equal to 1
            signature[param.name] = "constexpr"
            constexprs[(index,)] = key
            continue
        signature[param.name] = kind
        if key == "D":
            attrs[(index,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET, options=prepared.options)


def hot_loop_summary(cubin: bytes) -> dict:
    """Registers, stack and the largest loop's instruction mix of a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([str(NVIDIA_BIN / "nvdisasm"), "-c", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([str(NVIDIA_BIN / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True).stdout
    instructions, labels = [], {}
    for line in sass.splitlines():
        label = re.match(r"\.(L_x_\d+):", line.strip())
        if label:
            labels[label.group(1)] = len(instructions)
            continue
        found = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if found:
            instructions.append(re.sub(r"^@!?U?P\w+\s+", "", found.group(1).strip()))
    loops = []
    for end, text in enumerate(instructions):
        branch = re.search(r"BRA\s+(?:`\()?\.?(L_x_\d+)", text)
        if branch and branch.group(1) in labels and labels[branch.group(1)] <= end:
            loops.append((end - labels[branch.group(1)] + 1, labels[branch.group(1)], end))
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    summary = {"regs": int(regs.group(1)) if regs else None, "stack": int(stack.group(1)) if stack else None,
               "instructions": len(instructions), "digest": hashlib.sha1("\n".join(instructions).encode()).hexdigest()[:8]}
    if loops:
        length, start, end = max(loops)
        ops = [text.split()[0] for text in instructions[start:end + 1]]
        counts = collections.Counter(ops)
        mma = [i for i, op in enumerate(ops) if op.startswith(("HGMMA", "HMMA"))]
        # instructions issued while a wgmma is in flight: from each wgmma to the next wait on it
        # (WARPGROUP.DEPBAR), the ALU work the schedule overlaps with the tensor cores
        overlap, in_flight = 0, False
        for op in ops:
            if op.startswith("HGMMA"):
                in_flight = True
            elif op.startswith("WARPGROUP.DEPBAR"):
                in_flight = False
            elif in_flight and not op.startswith("WARPGROUP"):
                overlap += 1
        summary.update(loop=length, barriers=counts.get("BAR.SYNC.DEFER_BLOCKING", 0) + counts.get("BAR.SYNC", 0),
                       mmas=len(mma), first_mma=mma[0] if mma else None, mma_positions=mma, overlap=overlap,
                       spill_ops=sum(v for op, v in counts.items() if op.startswith(("LDL", "STL"))))
    return summary


# sm_90 per-SM limits: 64K registers (allocated per warp in units of 256), 228 KB shared memory (227 KB usable per
# CTA, 1 KB reserved per CTA), 64 warps, 32 CTAs
SM90_REGS, SM90_SMEM, SM90_WARPS, SM90_CTAS = 65536, 228 * 1024, 64, 32


def resident_ctas(regs: int | None, shared: int, num_warps: int) -> int | None:
    """CTAs of this kernel one sm_90 SM holds at once (the occupancy calculator's three limits)."""
    if regs is None:
        return None
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = SM90_REGS // (per_warp * num_warps)
    by_smem = SM90_SMEM // (shared + 1024) if shared else SM90_CTAS
    return min(by_regs, by_smem, SM90_WARPS // num_warps, SM90_CTAS)


# (summary key, column title, width) of the printed table
COLUMNS = (("regs", "regs", 4), ("stack", "stack", 5), ("smem_kb", "smem", 5), ("ctas", "ctas", 4), ("loop", "loop", 5),
           ("barriers", "bars", 4), ("mmas", "mmas", 4), ("first_mma", "1st mma", 7), ("overlap", "overlap", 7),
           ("spill_ops", "spill", 5), ("digest", "sass", 8))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="", help="comma list of shape names or name=NxK (default: all)")
    ap.add_argument("--m", default="1,16,128")
    ap.add_argument("--variant", default="base", choices=list(timing.VARIANTS))
    ap.add_argument("--set", default="", help="KEY=INT,... replacing the tuned plans' configuration entries (e.g. DOT_PARTS=2; 0 / 1 for options)")
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    kernel = timing.load_kernel()
    overrides = timing.config_overrides(args.set, kernel)
    print(f"Triton {triton.__version__}, sm_90; loop = the largest loop's instructions, 1st mma = its position in the loop,")
    print("overlap = loop instructions issued while a wgmma is in flight (before the wait on it), sass = digest of the whole")
    print("kernel's instruction text (equal digests: identical machine code, e.g. after a refactor)")
    print("smem = shared memory per CTA (KB), ctas = CTAs per SM that fit (registers, shared memory, warps; sm_90 limits)")
    print(f"{'shape':12s} {'M':>5s}  " + " ".join(f"{title:>{width}s}" for _, title, width in COLUMNS) + "  plan")
    for shape in timing.select_shapes(args.shapes):
        for m in (int(v) for v in args.m.split(",")):
            plan, config = tuned_call(kernel, m, shape["N"], shape["K"], args.variant, overrides)
            launch = captured_launch(kernel, plan, m, shape["N"], shape["K"], args.variant)
            s = {}  # dense / reference / pingpong plans: every column "-"
            compiled = warps = None
            if launch is not None:
                prepared, tensors, ints = launch
                compiled, warps = compile_for_sm90(prepared, tensors, ints), prepared.options.get("num_warps", 4)
            elif plan.path == "decode":
                compiled, warps = compile_decode_for_sm90(kernel, m, shape["N"], shape["K"], args.variant, config)
            if compiled is not None:
                s = hot_loop_summary(compiled.asm["cubin"])
                s["smem_kb"] = round(compiled.metadata.shared / 1024, 1)
                s["ctas"] = resident_ctas(s["regs"], compiled.metadata.shared, warps)
            print(f"{shape['name']:12s} {m:5d}  " + " ".join(f"{'-' if s.get(key) is None else s[key]:>{width}}" for key, _, width in COLUMNS)
                  + f"  {plan.path} " + " ".join(f"{k}={v}" for k, v in sorted(plan.config.items())), flush=True)


if __name__ == "__main__":
    main()
