"""Act-order's permutation of x: out = x[:, perm] as a contiguous tensor, by one small Triton kernel launched
before the GEMM (whose weight rows `layout.prepare_weight` permuted once at load, so that groups are contiguous).

    x    [M, K]  fp16 / bf16, unit stride along K (any row stride)
    perm int32 [K] (int64 accepted), a permutation of 0..K-1 (`W4A16Weight.perm`)
    out  [M, K]  contiguous, x's dtype

Every program reads one row of x whole, with coalesced loads, and permutes it inside the SM (`tl.gather`, through
shared memory) into one chunk of the output row. A perm of act-order is random, so any chunk of the output needs
elements from all over its row: reading them one by one fetches a 32-byte sector per 2-byte element behind a
dependent load of perm (the earlier forms, NOTES v15 / v20); the whole row costs one coalesced read that does not
wait for perm. Chunks split a row between programs when M alone gives too few programs for the GPU (decode).
With `launch_dependents` the GEMM that follows may start at once (programmatic dependent launch, sm_90+; the
tuned option GATHER_PDL of gemm.py).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from .dispatch import sm_count
from .launch import PreparedLaunch, current_stream

__all__ = ["gather_columns", "gather_chunk"]


@triton.jit
def _gather_columns_kernel(x_ptr, perm_ptr, out_ptr, K, stride_xm, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr,
                           LAUNCH_DEPENDENTS: tl.constexpr):
    """out[m, k] = x[m, perm[k]]: x [M, K] (row stride stride_xm, unit column stride), perm integer [K] (a
    permutation of 0..K-1), out contiguous [M, K] in x's dtype. BLOCK_K >= K and CHUNK <= BLOCK_K are powers of 2.
    Grid (M, cdiv(K, CHUNK)): program (m, c) reads row m of x whole (BLOCK_K columns, those past K masked) and
    writes out[m, c * CHUNK: (c + 1) * CHUNK].

    The row load and the chunk's perm load do not depend on each other, so one memory latency precedes the
    permutation (the scattered form waited for perm, then for the elements). LAUNCH_DEPENDENTS (NVIDIA,
    programmatic dependent launch): the GEMM launched after it may start its programs at once; they wait
    (`WAIT_PRIOR`) for this kernel's writes before reading x."""
    if LAUNCH_DEPENDENTS:
        gdc_launch_dependents()
    m = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    row = tl.load(x_ptr + m * stride_xm + offs, mask=offs < K, other=0.0)
    cols = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    in_row = cols < K
    src = tl.load(perm_ptr + cols, mask=in_row, other=0).to(tl.int32)
    tl.store(out_ptr + m * K + cols, tl.gather(row, src, 0), mask=in_row)


_MIN_CHUNK = 1024  # the smallest chunk `gather_chunk` picks (NOTES v36: smaller chunks re-read the row more often)
_MAX_BLOCK_K = 1 << 16  # rows up to 65536 columns (the row lives in registers: 64 per thread at 32 warps)
_BLOCKS = tuple(1 << i for i in range(10, 17))  # row blocks: 1024 .. _MAX_BLOCK_K columns
_CHUNKS = tuple(1 << i for i in range(7, 17))  # chunks a caller may ask for: 128 .. _MAX_BLOCK_K columns


def _warps(block_k: int, chunk: int) -> int:
    """Warps of a program holding a row of `block_k` elements (NOTES v36's probe: 8 up to 8192-column rows with
    small chunks, 16 above; 32 only past 32768 columns, where 16 would hold 128 elements per thread)."""
    if block_k > 32768:
        return 32
    return 8 if block_k <= 8192 and chunk <= 2048 else 16


# One prepared launch per (row block, chunk, dependents): constexprs and options never vary per call; what each
# keeps per specialisation, the compiled kernel, is a cache like Triton's own.
_launches = {(block, chunk, dependents): PreparedLaunch(
    _gather_columns_kernel, {"BLOCK_K": block, "CHUNK": chunk, "LAUNCH_DEPENDENTS": dependents},
    {"num_warps": _warps(block, chunk)}, ("x_ptr", "perm_ptr", "out_ptr"), ("K", "stride_xm"))
    for block in _BLOCKS for chunk in _CHUNKS if chunk <= block for dependents in (False, True)}


def _row_block(k: int) -> int:
    """The kernel's BLOCK_K for rows of k columns: the power of two at or above k, at least _MIN_CHUNK."""
    return max(_MIN_CHUNK, 1 << (k - 1).bit_length())


@functools.lru_cache(maxsize=4096)
def gather_chunk(m: int, k: int, programs: int) -> int:
    """The output columns per program for x [m, k] on a GPU of `programs` SMs: the smallest power of two from
    1024 (at most the row block) for which m rows give no more programs than SMs (one wave; NOTES v36). Memoised:
    every act-order call asks."""
    block = _row_block(k)
    chunk = _MIN_CHUNK
    while chunk < block and m * -(-k // chunk) > programs:
        chunk *= 2
    return min(chunk, block)


def gather_columns(x2: torch.Tensor, perm: torch.Tensor, launch_dependents: bool = False,
                   chunk: int | None = None) -> torch.Tensor:
    """x2[:, perm] as a new contiguous [M, K] tensor (act-order), by one small Triton kernel;
    `launch_dependents`: the next launch (a GEMM of a plan with GATHER_PDL) may start before this one ends;
    `chunk` (a power of two from 128 to 65536) overrides `gather_chunk`'s output columns per program
    (benchmarks/probe_gather.py, tests). Rows past 65536 columns (no such layer is known) take torch's
    index_select: correct, not tuned."""
    m, k = x2.shape
    if chunk is not None and chunk not in _CHUNKS:
        raise ValueError(f"chunk must be None or a power of two from {_CHUNKS[0]} to {_CHUNKS[-1]}, got {chunk!r}")
    if k > _MAX_BLOCK_K:
        return x2.index_select(1, perm)
    if chunk is None:
        chunk = gather_chunk(m, k, sm_count(x2.device))
    block = max(_row_block(k), chunk)
    out = torch.empty((m, k), device=x2.device, dtype=x2.dtype)
    _launches[(block, chunk, launch_dependents)]((m, -(-k // chunk)), (x2, perm, out), (k, x2.stride(0)), current_stream(x2.device))
    return out
