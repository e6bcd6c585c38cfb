"""Act-order's permutation of x: out = x[:, perm] as a contiguous tensor, by one small Triton kernel launched
before the GEMM (whose weight rows `layout.prepare_weight` permuted once at load, so that groups are contiguous).

    x    [M, K]  fp16 / bf16, unit stride along K (any row stride)
    perm int64 [K], a permutation of 0..K-1 (`W4A16Weight.perm`)
    out  [M, K]  contiguous, x's dtype

Three forms, chosen by M (`gather_columns`): programs of 1024 columns at small M (latency-bound), one program per
whole row from M = 64 (bound by the scattered sector fetches: the row stays in L1), and from M = 128 with K <= 16384
each row read whole and permuted inside the SM (`_gather_rows_staged_kernel`). With `launch_dependents` the GEMM
that follows may start at once (programmatic dependent launch, sm_90+; the tuned option GATHER_PDL of gemm.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from .dispatch import sm_count
from .launch import PreparedLaunch, current_stream

__all__ = ["gather_columns"]


@triton.jit
def _gather_columns_kernel(x_ptr, perm_ptr, out_ptr, K, stride_xm, cols_per_program, BLOCK_K: tl.constexpr,
                           LAUNCH_DEPENDENTS: tl.constexpr):
    """out[m, k] = x[m, perm[k]]: x [M, K] (row stride stride_xm, unit column stride), perm int64 [K]
    (a permutation of 0..K-1), out contiguous [M, K] in x's dtype. Grid (M, cdiv(K, cols_per_program)),
    cols_per_program a multiple of BLOCK_K: program (m, j) gathers row m over columns
    [j * cols_per_program, (j + 1) * cols_per_program) in BLOCK_K steps.

    The reads are scattered over the whole row, 2 bytes of each 32-byte sector. Small M (decode) is
    latency-bound: one program per 1024 columns (1.7-2.1 us per call at M = 1 in a CUDA graph on the H200,
    against 4.3-4.9 for torch's index_select). Large M is bound by those sector fetches: one program
    per whole row with many warps (few programs per SM), so the row (8-56 KB) stays in the SM's L1
    and each sector comes from L2 about once; perm is read past L1 (.cg) so that it does not evict
    the row (NOTES v15). LAUNCH_DEPENDENTS (NVIDIA, programmatic dependent launch): the GEMM launched after it
    may start its programs at once; they wait (`WAIT_PRIOR`) for this kernel's writes before reading x."""
    if LAUNCH_DEPENDENTS:
        gdc_launch_dependents()
    m = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * cols_per_program
    end = tl.minimum(start + cols_per_program, K)
    for k0 in range(start, end, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        mask = offs < end
        src = tl.load(perm_ptr + offs, mask=mask, other=0, cache_modifier=".cg")
        tl.store(out_ptr + m * K + offs, tl.load(x_ptr + m * stride_xm + src, mask=mask), mask=mask)


@triton.jit
def _gather_rows_staged_kernel(x_ptr, perm_ptr, out_ptr, M, K, stride_xm, BLOCK_K: tl.constexpr, LAUNCH_DEPENDENTS: tl.constexpr):
    """out[m, k] = x[m, perm[k]], same contract as `_gather_columns_kernel` with K <= BLOCK_K (a power of 2).
    Grid (P,): program p gathers rows p, p + P, p + 2P, ...

    Each row is read whole with coalesced loads, permuted inside the SM (`tl.gather`, through shared memory)
    and written whole: 2 bytes of x read per element, where the scattered form fetches a 32-byte sector per
    element from L1 / L2. perm is loaded once per program; the next row's load is issued before this row's
    permutation (one row in flight while the SM permutes)."""
    if LAUNCH_DEPENDENTS:
        gdc_launch_dependents()
    offs = tl.arange(0, BLOCK_K)
    mask = offs < K
    src = tl.load(perm_ptr + offs, mask=mask, other=0).to(tl.int32)
    step = tl.num_programs(0).to(tl.int64)
    x_row = x_ptr + tl.program_id(0).to(tl.int64) * stride_xm
    out_row = out_ptr + tl.program_id(0).to(tl.int64) * K
    row = tl.load(x_row + offs, mask=mask & ((offs * 0 + tl.program_id(0)) < M), other=0.0)
    for m in range(tl.program_id(0), M, tl.num_programs(0)):
        x_row += step * stride_xm
        following = tl.load(x_row + offs, mask=mask & ((offs * 0 + m + tl.num_programs(0)) < M), other=0.0)
        tl.store(out_row + offs, tl.gather(row, src, 0), mask=mask)
        out_row += step * K
        row = following


_GATHER_WHOLE_ROWS_M = 64  # from this M one program per whole row (NOTES v15; v17: faster from M = 64 on the H200)
_GATHER_STAGED_M = 128  # from this M the staged form where K allows (NOTES v20: 1.1-2.2x the whole-row form from M = 256)
# One prepared launch per form (constexprs and options never vary; what each keeps per specialisation,
# the compiled kernel, is a cache like Triton's own): 1024-column programs of 4 warps for small M;
# whole-row programs of 32 warps (two per SM: at most two rows of x in an SM's L1) for large M.
_GATHER_BLOCKS = {"columns": (1024, 4), "rows": (4096, 32)}
_gather_columns = {(form, dependents): PreparedLaunch(_gather_columns_kernel, {"BLOCK_K": block, "LAUNCH_DEPENDENTS": dependents},
                                                      {"num_warps": warps}, ("x_ptr", "perm_ptr", "out_ptr"),
                                                      ("K", "stride_xm", "cols_per_program"))
                   for form, (block, warps) in _GATHER_BLOCKS.items() for dependents in (False, True)}
# The staged form: rows up to _STAGED_MAX_K columns (the row, its permutation and perm in registers), one prepared
# launch per power-of-two row block of 512..16384 columns, with a warp per 512 columns (16 elements per thread).
_STAGED_MAX_K = 16384
_gather_staged = {(block, dependents): PreparedLaunch(_gather_rows_staged_kernel,
                                                      {"BLOCK_K": block, "LAUNCH_DEPENDENTS": dependents},
                                                      {"num_warps": max(4, block // 512)}, ("x_ptr", "perm_ptr", "out_ptr"),
                                                      ("M", "K", "stride_xm"))
                  for block in (512 << i for i in range(6)) for dependents in (False, True)}
_GATHER_FORMS = ("columns", "rows", "staged")


def gather_columns(x2: torch.Tensor, perm: torch.Tensor, launch_dependents: bool = False, form: str | None = None) -> torch.Tensor:
    """x2[:, perm] as a new contiguous [M, K] tensor (act-order), by one small Triton kernel;
    `launch_dependents`: the next launch (a GEMM of a plan with GATHER_PDL) may start before this one ends;
    `form` ("columns", "rows" or "staged" (K <= 16384), see `_GATHER_BLOCKS` and `_gather_rows_staged_kernel`)
    overrides the choice by M (benchmarks/probe_gather.py)."""
    m, k = x2.shape
    out = torch.empty((m, k), device=x2.device, dtype=x2.dtype)
    if form is None:
        form = "columns" if m < _GATHER_WHOLE_ROWS_M else ("staged" if m >= _GATHER_STAGED_M and k <= _STAGED_MAX_K else "rows")
    elif form not in _GATHER_FORMS:
        raise ValueError(f"form must be None or one of {_GATHER_FORMS}, got {form!r}")
    if form == "staged":
        if k > _STAGED_MAX_K:
            raise ValueError(f"form 'staged' needs K <= {_STAGED_MAX_K}, got K = {k}")
        block = max(512, 1 << (k - 1).bit_length())
        launch = _gather_staged[(block, launch_dependents)]
        # at most the programs an SM's warp slots hold (registers may allow fewer: the others start later and
        # each program takes fewer rows; the grid-stride loop is correct for any grid)
        per_sm = 64 // launch.options["num_warps"]
        launch((min(m, per_sm * sm_count(x2.device)),), (x2, perm, out), (m, k, x2.stride(0)), current_stream(x2.device))
        return out
    block = _GATHER_BLOCKS[form][0]
    cols_per_program = -(-k // block) * block if form == "rows" else block
    launch = _gather_columns[(form, launch_dependents)]
    launch((m, -(-k // cols_per_program)), (x2, perm, out), (k, x2.stride(0), cols_per_program), current_stream(x2.device))
    return out
