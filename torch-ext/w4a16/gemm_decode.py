"""NVIDIA W4A16 decode kernel (M <= 16), written in Gluon: mma.sync with the K range split over the warps of one
program (the "decode" path of the dispatcher).

Why: at decode the Triton kernels of gemm.py spend ~3.2 instructions per weight (unpack, block-wide barriers, the
shared-memory hop of their pipelined loads) and, to fill the GPU, split K over programs, whose partials meet in a
global workspace through an arrival counter (1.4-1.7 us per call, NOTES v20 / v25). Here no two programs share an
output tile, and nothing is shared inside the loop:

    program   ROWS weight rows (16 or 32), BLOCK_M tokens (8 or 16: `decode_block_m`) and all of K; grid
              (cdiv(N, ROWS), cdiv(M, BLOCK_M)), or with the plan option TOKENS_FIRST (cdiv(M, BLOCK_M), cdiv(N, ROWS)),
              so that the token blocks of one weight tile launch together and share its words through L2 (two
              programs of BLOCK_M 8 at M = 16 beat one of 16 and the Triton plans on the small shapes, NOTES v37). A
              thread holds program rows l + 8 i (i < ROWS / 8) of the MMA layouts; with the plan option ADJACENT_ROWS
              program row l + 8 i is weight row l * ROWS / 8 + i, so a thread's rows are adjacent in memory and its
              scales and zeros of a group come in one vector load each (its word loads then touch 8 lines, not 4)
    warp w    the K blocks w, w + WARPS, w + 2 WARPS, ... of those rows: its words, x's block, the scales and
              zeros go from global memory straight into registers, issued AHEAD blocks before their use (an
              unrolled register ring; x's at its use with the plan option X_AT_USE; the words under L1 and L2
              evict-first policies with EVICT_FIRST); unpacked into mma.sync A
              fragments (one shr + lop3 per word and nibble pair, the layout making the rest register relabelling)
              of q - z (integer or symmetric zeros: one more fma per word, exact), acc += s * ((q - z) . x) per
              scale group; or of C + q, acc += s * ((C + q) . x) - s (z + C) sum(x), the x sums from MMAs on an
              all-ones operand (exact for any zero: fractional zeros, or the plan option ZEROS_BY_X_SUM)
    act-order x gathered by gather.py first; with the plan option GATHER_PDL (sm_90+) the kernel is a programmatic
              dependent of that gather and loads the weights of its first AHEAD blocks before waiting for it
    PDL       (a call's `pdl`, sm_90+) the same wait for whatever kernel ran before (x is read only after it has
              finished; the weights are not: the caller's promise is that kernel does not write them), and the
              kernel after this one is released (griddepcontrol.launch_dependents) as soon as every program started
    end       the warps' fp32 tiles summed once through shared memory, y stored

Operand orders (the MMA's k index is free as long as A and B agree): a warp's lane t (of 4) takes word columns
4t .. 4t + 3 of a row (one 16-byte load); within a half h of the 128-row block (word columns of parity h, block rows
64h ..), operand column kk = 16 q + 8 u + 2 t + b holds block row 64 h + 16 q + 4 t + 2 u + b of word column
4t + 2u + h, nibble q + 4b; x's block is loaded as 32-bit row pairs in the matching order (8 bytes per lane and
16-row slice).

Contract (`launch_decode`): x [M, K] fp16 / bf16, M <= 16, unit stride along K, K a multiple of 128 (x is copied
when its rows are not 4-byte aligned); qweight int32 [ceil(N/64), K/128, 64, 16] (layout.py); scales [K/G, N] (fp16,
bf16 or fp32, contiguous); zeros [K/G, N] uint8 (0..127) or float (fractional zeros exact: the fold is in fp32), or None
(symmetric: zero 8); G any group size `quantize.validate_group_size` accepts (16, 32, 64, a multiple of 128, or K).
y [M, N] in x's dtype; qweight and scales < 2**31 elements (int32 offsets; the launcher checks). Programs past N /
tokens past M read clamped rows (never stored).

Needs Gluon (Triton >= 3.5) and an NVIDIA GPU with mma.sync for 16-bit floats (sm_80+: `available`); elsewhere
the dispatcher runs the entry's FALLBACK plan. Triton's CPU interpreter does not run Gluon: CI compiles the kernel
for sm_90 on the CPU (tests/test_decode.py); the GPU suite checks its results.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from .launch import (TRITON_TYPE_NAMES, PreparedLaunch, RepeatLaunch, compile_gluon_for_sm90, current_stream,
                     programmatic_dependence)
from .layout import K_BLOCK, blocks_per_group, groups_per_block

try:  # Gluon is experimental: absent before Triton 3.5, and its names move between releases
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2

    from .gluon_common import HAVE_GLUON, MAGIC_PAIRS, MAGIC_VALUES, cta_barrier, scale_group
except ImportError:  # pragma: no cover - exercised only with an old Triton
    HAVE_GLUON = False

__all__ = ["HAVE_GLUON", "available", "adjacent_rows_apply", "decode_block_m", "grid_programs", "resident_programs", "takes_shape",
           "launch_decode", "launch_decode_kept",
           "compile_for_sm90", "DECODE_ROWS", "DECODE_BLOCK_M"]

DECODE_ROWS = (16, 32)  # weight rows per program the kernel takes (ROWS)
_GRID_AXIS_LIMIT = 65535  # CUDA's limit on a grid's second axis (TOKENS_FIRST puts the weight tiles there)
DECODE_BLOCK_M = (8, 16)  # tokens per program (BLOCK_M)


@functools.lru_cache(maxsize=None)
def available(device: torch.device) -> bool:
    """Whether the decode kernel can run on `device`: Gluon present, an NVIDIA GPU of compute capability >= 8.0."""
    return (HAVE_GLUON and device.type == "cuda" and torch.version.hip is None
            and torch.cuda.get_device_capability(device)[0] >= 8)


if HAVE_GLUON:

    @gluon.constexpr_function
    def _words_layout(WARPS, ROWS):
        # words [WARPS, ROWS, 16], warp w on dim 0. Word column c = 4 t + 2 u + h: c bits 0-1 in registers (one
        # 16-byte load per row), bits 2-3 on lanes 0-1; row bits 0-2 on lanes 2-4, row bit 3 and the 16-row tile in
        # registers: the mma.sync m16n8k16 A fragment once the operand columns are ordered as `_unpack_half` says.
        reg = [[0, 0, 1], [0, 0, 2], [0, 8, 0]] + [[0, 16 << i, 0] for i in range(int(math.log2(ROWS // 16)))]
        lane = [[0, 0, 4], [0, 0, 8], [0, 1, 0], [0, 2, 0], [0, 4, 0]]
        warp = [[1 << i, 0, 0] for i in range(int(math.log2(WARPS)))]
        return gl.DistributedLinearLayout(reg, lane, warp, [], [WARPS, ROWS, 16])

    @gluon.constexpr_function
    def _x_layout(WARPS, BLOCK_M):
        # x^T block as 32-bit row pairs [WARPS, 64, BLOCK_M]: pair j = 32 h + 8 s + 2 t + u holds block rows
        # 64 h + 16 s + 4 t + 2 u + (0, 1): u in registers (one 8-byte load), t on lanes 0-1, s and h in registers;
        # tokens on lanes 2-4 (a second 8 in registers). Kept as 32-bit words until used: carried across the loop
        # as 16-bit halves they cost a byte permute each.
        reg = [[0, 1, 0], [0, 8, 0], [0, 16, 0], [0, 32, 0]] + ([[0, 0, 8]] if BLOCK_M == 16 else [])
        lane = [[0, 2, 0], [0, 4, 0], [0, 0, 1], [0, 0, 2], [0, 0, 4]]
        warp = [[1 << i, 0, 0] for i in range(int(math.log2(WARPS)))]
        return gl.DistributedLinearLayout(reg, lane, warp, [], [WARPS, 64, BLOCK_M])

    @gluon.constexpr_function
    def _params_layout(WARPS, ROWS):
        # scales / zeros [WARPS, 8, ROWS / 8]: program row 8 i + l (`_weight_row`), i in registers (with ADJACENT_ROWS a
        # thread's rows are adjacent in memory: one vector load), l on lanes 2-4 (lanes 0-1 hold copies), warp w on dim 0
        reg = [[0, 0, 1 << i] for i in range(int(math.log2(ROWS // 8)))]
        lane = [[0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 2, 0], [0, 4, 0]]
        warp = [[1 << i, 0, 0] for i in range(int(math.log2(WARPS)))]
        return gl.DistributedLinearLayout(reg, lane, warp, [], [WARPS, 8, ROWS // 8])

    @gluon.jit
    def _weight_row(lane_row, reg_row, ROWS: gl.constexpr, ADJACENT_ROWS: gl.constexpr):
        """The weight row (from the program's first) that program row r = 8 i + l holds (l = r % 8 on lanes 2-4 and i =
        r // 8 in registers in the MMA layouts): r itself, or with ADJACENT_ROWS l * ROWS / 8 + i, which puts a
        thread's ROWS / 8 rows next to each other in memory (its scales and zeros of a group: one vector load each)."""
        if ADJACENT_ROWS:
            row = lane_row * (ROWS // 8) + reg_row
        else:
            row = lane_row + 8 * reg_row
        return row

    @gluon.jit
    def _program_order(t, layout: gl.constexpr):
        """[W, 8, ROWS / 8] values of program rows 8 i + l (`_params_layout`) -> [W, ROWS] in program row order, in
        `layout` (one of the MMA row layouts: the same registers, relabelled)."""
        W: gl.constexpr = t.shape[0]
        RB: gl.constexpr = t.shape[2]
        return gl.convert_layout(gl.reshape(gl.permute(t, (0, 2, 1)), [W, RB * 8]), layout)

    @gluon.jit
    def _last_dim_pieces(t, PIECES: gl.constexpr):
        """t [W, R, C] -> PIECES tensors [W, R, C / PIECES], columns in order (PIECES 1, 2 or 4)."""
        W: gl.constexpr = t.shape[0]
        R: gl.constexpr = t.shape[1]
        C: gl.constexpr = t.shape[2]
        if PIECES == 1:
            pieces = (t,)
        else:
            lo, hi = gl.split(gl.permute(gl.reshape(t, [W, R, 2, C // 2]), (0, 1, 3, 2)))
            if PIECES == 2:
                pieces = (lo, hi)
            else:
                a, b = gl.split(gl.permute(gl.reshape(lo, [W, R, 2, C // 4]), (0, 1, 3, 2)))
                c, d = gl.split(gl.permute(gl.reshape(hi, [W, R, 2, C // 4]), (0, 1, 3, 2)))
                pieces = (a, b, c, d)
        return pieces

    @gluon.jit
    def _unpack_half(words, a_layout: gl.constexpr, dtype: gl.constexpr, MAGIC: gl.constexpr, PIECES: gl.constexpr,
                     neg_zeros, ZERO_IN_OPERAND: gl.constexpr):
        """Half h of a block: words [W, R, 8] uint32 (the word columns 4 t + 2 u + h of one parity h) -> A operands for
        PIECES consecutive column ranges of [W, R, 64], operand column kk = 16 q + 8 u + 2 t + b = block row
        64 h + 16 q + 4 t + 2 u + b (nibble q + 4 b). The operands are C + q, or with ZERO_IN_OPERAND q - z: piece i's
        -(C + z) pair (`_neg_zero_pair`, [W, R] in the words' row layout) added by one fma.rn per word, exact
        (small integers)."""
        FMA: gl.constexpr = "fma.rn.f16x2" if dtype == gl.float16 else "fma.rn.bf16x2"
        ONE: gl.constexpr = "0x3C003C00" if dtype == gl.float16 else "0x3F803F80"  # 1.0 in both halves
        pairs = ()
        for q in gl.static_range(4):
            if ZERO_IN_OPERAND:  # operand columns 16 q .. belong to piece q // (4 / PIECES)
                # (the [W, R] pairs moved to this half's row layout: the same registers)
                zero = gl.convert_layout(neg_zeros[q // (4 // PIECES)], gl.SliceLayout(2, words.type.layout))
                zero = gl.expand_dims(zero, 2) + gl.zeros_like(words)
                p = gl.inline_asm_elementwise(
                    f"{{ .reg .b32 t, one; mov.b32 one, {ONE}; shr.b32 t, $1, {4 * q}; "
                    f"lop3.b32 t, t, 0x000F000F, {MAGIC}, 0xEA; {FMA} $0, t, one, $2; }}", "=r,r,r", [words, zero],
                    dtype=gl.uint32, is_pure=True, pack=1)
            elif q == 0:
                p = gl.inline_asm_elementwise(f"lop3.b32 $0, $1, 0x000F000F, {MAGIC}, 0xEA;", "=r,r", [words],
                                              dtype=gl.uint32, is_pure=True, pack=1)
            else:
                p = gl.inline_asm_elementwise(
                    f"{{ .reg .b32 t; shr.b32 t, $1, {4 * q}; lop3.b32 $0, t, 0x000F000F, {MAGIC}, 0xEA; }}", "=r,r",
                    [words], dtype=gl.uint32, is_pure=True, pack=1)
            pairs = pairs + (gl.join(p.to(gl.uint16), (p >> 16).to(gl.uint16)),)  # [W, R, 8, 2 (b)]
        j = gl.join(gl.join(pairs[0], pairs[1]), gl.join(pairs[2], pairs[3]))  # [W, R, 8, b, q0, q1]
        W: gl.constexpr = words.shape[0]
        R: gl.constexpr = words.shape[1]
        j = gl.reshape(j, [W, R, 2, 2, 2, 2, 2, 2])  # (w, n, t1, t0, u, b, q0, q1)
        j = gl.permute(j, (0, 1, 7, 6, 4, 2, 3, 5))  # (w, n, q1, q0, u, t1, t0, b)
        pieces = _last_dim_pieces(gl.reshape(j, [W, R, 64]).to(dtype, bitcast=True), PIECES)
        operands = ()
        for i in gl.static_range(PIECES):
            operands = operands + (gl.convert_layout(pieces[i], a_layout),)
        return operands

    @gluon.jit
    def _operand_x(x_pairs, b_layout: gl.constexpr, dtype: gl.constexpr, PIECES: gl.constexpr):
        """x^T pairs of one half [W, 32, BLOCK_M] (uint32, pair j = 8 s + 2 t + u) -> B operands in dtype for PIECES
        consecutive row ranges of [W, 64, BLOCK_M], rows in `_unpack_half`'s column order."""
        W: gl.constexpr = x_pairs.shape[0]
        BM: gl.constexpr = x_pairs.shape[2]
        lo, hi = gl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [x_pairs], dtype=(gl.float16, gl.float16),
                                           is_pure=True, pack=1)
        j = gl.permute(gl.join(lo, hi), (0, 1, 3, 2))  # [W, 32 (j), 2 (b), BM]
        j = gl.reshape(j, [W, 4, 4, 2, 2, BM])  # (w, s, t, u, b, m)
        j = gl.permute(j, (0, 1, 3, 2, 4, 5))  # (w, s, u, t, b, m)
        # pieces along the rows: as [W, BM, 64] column pieces, moved back
        pieces = _last_dim_pieces(gl.permute(gl.reshape(j, [W, 64, BM]), (0, 2, 1)).to(dtype, bitcast=True), PIECES)
        operands = ()
        for i in gl.static_range(PIECES):
            operands = operands + (gl.convert_layout(gl.permute(pieces[i], (0, 2, 1)), b_layout),)
        return operands

    @gluon.jit
    def _neg_zero_pair(z, MAGIC: gl.constexpr):
        """Integer zeros z -> uint32 -(C + z) in both 16-bit halves (the fma addend of `_unpack_half`)."""
        z = z.to(gl.uint32)
        return (z | (z << 16)) + MAGIC | 0x80008000

    @gluon.jit
    def _load_words(qw_base, step, kb_w, num_kb, WARPS: gl.constexpr, EVICT_FIRST: gl.constexpr):
        """The words of block kb = step * WARPS + w of each warp w (a block past K reads the last block again); with
        EVICT_FIRST under evict-first policies (streamed once): Triton's evict_first is `ld.global.L1::evict_first` with
        an L2 evict-first cache hint, so the words leave L1 first too, where x's blocks are shared by the SM's programs."""
        POLICY: gl.constexpr = "evict_first" if EVICT_FIRST else ""
        return gl.load(qw_base + gl.minimum(step * WARPS + kb_w, num_kb - 1) * 1024, eviction_policy=POLICY)

    @gluon.jit
    def _load_x(x_base, step, kb_x, num_kb, WARPS: gl.constexpr):
        """x's block kb = step * WARPS + w as 32-bit row pairs (tokens past M clamped by x_base; num_kb from
        `_after_prior_grid` where x is written by the grid before)."""
        return gl.load(x_base + gl.minimum(step * WARPS + kb_x, num_kb - 1) * 64)

    @gluon.jit
    def _after_prior_grid(t):
        """t (int32), given back only once the grid this kernel is a programmatic dependent of has finished
        (griddepcontrol.wait): x's block indices are clamped by it (`_load_x`), so no x load can be placed before the
        wait (act-order's gather writes x); the weights' loads need not wait."""
        return gl.inline_asm_elementwise("griddepcontrol.wait; mov.b32 $0, $1;", "=r,r", [t], dtype=gl.int32,
                                         is_pure=False, pack=1)

    @gluon.jit
    def _release_dependents(t):
        """t (int32), given back after griddepcontrol.launch_dependents: the kernel launched after this one as a
        programmatic dependent (plan option PDL) may be placed now. It waits (griddepcontrol.wait) for this grid to finish
        before it reads anything this grid writes, so the release only lets its launch overlap this grid's work."""
        return gl.inline_asm_elementwise("griddepcontrol.launch_dependents; mov.b32 $0, $1;", "=r,r", [t], dtype=gl.int32,
                                         is_pure=False, pack=1)

    @gluon.jit
    def _load_params(s_base, z_base, step, kb_p, num_kb, N, p_layout: gl.constexpr, z_layout: gl.constexpr,
                     WARPS: gl.constexpr, SYMMETRIC: gl.constexpr, GROUPS: gl.constexpr, BLOCKS_PER_GROUP: gl.constexpr,
                     ZERO_IN_OPERAND: gl.constexpr):
        """Block kb = step * WARPS + w's GROUPS scale groups: the rows' scales (fp32, p_layout) and zeros: fp32 for the
        fold (p_layout), or with ZERO_IN_OPERAND the integer zeros in the words' row layout (z_layout; constant when
        SYMMETRIC, so not loaded); when SYMMETRIC without ZERO_IN_OPERAND the zero is the scale again, never used.
        Loaded as [W, 8, ROWS / 8] (`_params_layout`) and relabelled into program row order."""
        kb = gl.minimum(step * WARPS + kb_p, num_kb - 1)
        scales = ()
        zeros = ()
        for j in gl.static_range(GROUPS):
            g = scale_group(kb, j, GROUPS, BLOCKS_PER_GROUP)
            s = gl.load(s_base + g * N).to(gl.float32)  # (carried as fp32: 16-bit values cost permutes)
            scales = scales + (_program_order(s, p_layout),)
            if ZERO_IN_OPERAND:
                if SYMMETRIC:
                    zeros = zeros + (gl.full([WARPS, s.shape[1] * s.shape[2]], 8, gl.uint32, layout=z_layout),)
                else:
                    zeros = zeros + (_program_order(gl.load(z_base + g * N), z_layout),)
            elif SYMMETRIC:
                zeros = zeros + (scales[j],)
            else:
                zeros = zeros + (_program_order(gl.load(z_base + g * N).to(gl.float32), p_layout),)
        return scales, zeros

    @gluon.jit
    def _load_step(qw_base, x_base, s_base, z_base, step, kb_w, kb_x, num_kb_x, kb_p, num_kb, N, p_layout: gl.constexpr,
                   z_layout: gl.constexpr, WARPS: gl.constexpr, SYMMETRIC: gl.constexpr, GROUPS: gl.constexpr,
                   BLOCKS_PER_GROUP: gl.constexpr, ZERO_IN_OPERAND: gl.constexpr, WITH_X: gl.constexpr,
                   EVICT_FIRST: gl.constexpr):
        """Block kb = step * WARPS + w of each warp w: (words, scales, zeros), and with WITH_X x's block after them,
        as `_load_words`, `_load_params` and `_load_x` say. No masks (a masked load costs a zeroing move per
        register): a block past K reads the last block again and is dropped by its scale (the kernel zeroes it); rows
        past N and tokens past M are clamped (never stored)."""
        words = _load_words(qw_base, step, kb_w, num_kb, WARPS, EVICT_FIRST)
        loaded = ()
        if WITH_X:  # (issued between the words and the parameters, as before the option existed)
            loaded = (_load_x(x_base, step, kb_x, num_kb_x, WARPS),)
        scales, zeros = _load_params(s_base, z_base, step, kb_p, num_kb, N, p_layout, z_layout, WARPS, SYMMETRIC,
                                     GROUPS, BLOCKS_PER_GROUP, ZERO_IN_OPERAND)
        return (words, scales, zeros) + loaded

    @gluon.jit
    def _fold(acc, part, x_sum, s, z, valid, C: gl.constexpr, SYMMETRIC: gl.constexpr, ZERO_IN_OPERAND: gl.constexpr):
        """acc += s * part - s * (z + C) * x_sum for one scale group's rows of a block: part = sum_k (C + q) x and
        x_sum = sum_k x, both from MMAs (exact products, fp32 sums), so any zero (fractional too) enters exactly.
        With ZERO_IN_OPERAND part is sum_k (q - z) x already (x_sum None): acc += s * part. A block that is not `valid`
        (past K) adds nothing."""
        s = gl.where(valid, s, 0.0)
        acc += gl.expand_dims(s, 2) * part
        if not ZERO_IN_OPERAND:
            if SYMMETRIC:
                shifted = s * (C + 8.0)
            else:
                shifted = s * (z + C)
            acc -= gl.expand_dims(shifted, 2) * x_sum
        return acc

    @gluon.jit
    def _decode_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
                       WARPS: gl.constexpr, ROWS: gl.constexpr, BLOCK_M: gl.constexpr, AHEAD: gl.constexpr,
                       SYMMETRIC: gl.constexpr, GROUPS: gl.constexpr, BLOCKS_PER_GROUP: gl.constexpr,
                       ADJACENT_ROWS: gl.constexpr, PARAMS_VECTOR: gl.constexpr, ZEROS_BY_X_SUM: gl.constexpr,
                       X_AT_USE: gl.constexpr, WAIT_PRIOR: gl.constexpr, EVICT_FIRST: gl.constexpr,
                       TOKENS_FIRST: gl.constexpr, RELEASE_DEPENDENTS: gl.constexpr):
        """y[M, N] = x[M, K] @ W: see the module docstring. GROUPS: scale groups per 128-row block
        (`layout.groups_per_block`: 1 when a group spans the block); BLOCKS_PER_GROUP: blocks per group then (0:
        per-channel); TOKENS_FIRST: grid axis 0 runs over the token blocks (module docstring); ADJACENT_ROWS: the row
        order of the module docstring, PARAMS_VECTOR: with N a multiple of
        ROWS / 8, so that every thread's scales and zeros are one vector load. ZEROS_BY_X_SUM: integer and symmetric
        zeros folded through the x sums too (as fractional zeros are). X_AT_USE: x's block loaded in the step that
        uses it, not AHEAD steps before with the weights' (x comes from L1 / L2, a shorter wait than the words', and
        its registers, 16 a step at BLOCK_M 8, are not held across steps). WAIT_PRIOR: launched as a programmatic
        dependent of the kernel before it (act-order's gather of x: plan option GATHER_PDL; any kernel: the call's
        `pdl`, plan option PDL): x's loads wait for it (griddepcontrol.wait); the words, scales and zeros of the first
        blocks need not. RELEASE_DEPENDENTS (PDL): the next kernel may be launched once every program has started.
        EVICT_FIRST: the words loaded under L1 and L2
        evict-first policies (read once; it won on most large shapes and lost on some small ones, NOTES v35, v38)."""
        # integer zeros (uint8: 0..127, layout.py) and symmetric weights subtract the zero in the operand (one fma
        # per word, exact), which spares the x sums' MMAs (a third of them at BLOCK_M 8, for 13% more instructions);
        # fractional (float) zeros fold it through them
        ZERO_IN_OPERAND: gl.constexpr = (SYMMETRIC or z_ptr.dtype.element_ty == gl.uint8) and not ZEROS_BY_X_SUM
        dtype: gl.constexpr = x_ptr.dtype.element_ty
        MAGIC: gl.constexpr = MAGIC_PAIRS[0] if dtype == gl.float16 else MAGIC_PAIRS[1]
        C: gl.constexpr = MAGIC_VALUES[0] if dtype == gl.float16 else MAGIC_VALUES[1]
        PIECES: gl.constexpr = GROUPS // 2 if GROUPS > 1 else 1  # fold pieces per half block (GROUPS > 1: one per group)
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1, 1], instr_shape=[1, 16, 8])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        b_layout: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
        w_layout: gl.constexpr = _words_layout(WARPS, ROWS)
        x_layout: gl.constexpr = _x_layout(WARPS, BLOCK_M)
        p_layout: gl.constexpr = gl.SliceLayout(2, mma)  # [W, R]: a row's scale / zero, as the accumulator's rows

        if TOKENS_FIRST:
            n0 = gl.program_id(1) * ROWS
            m0 = gl.program_id(0) * BLOCK_M
        else:
            n0 = gl.program_id(0) * ROWS
            m0 = gl.program_id(1) * BLOCK_M
        num_kb = K // 128
        if RELEASE_DEPENDENTS:  # (first thing: the next kernel's launch then overlaps all of this one)
            num_kb = _release_dependents(num_kb)

        # words: qweight[n // 64, kb, n % 64, c] (rows past N exist: the layout pads N to 64)
        w_w = gl.arange(0, WARPS, layout=gl.SliceLayout(1, gl.SliceLayout(2, w_layout)))
        w_r = gl.arange(0, ROWS, layout=gl.SliceLayout(0, gl.SliceLayout(2, w_layout)))
        w_c = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, w_layout)))
        n_w = gl.expand_dims(gl.expand_dims(n0 + _weight_row(w_r % 8, w_r // 8, ROWS, ADJACENT_ROWS), 0), 2)
        qw_base = qw_ptr + (n_w // 64) * (num_kb * 1024) + (n_w % 64) * 16 + gl.expand_dims(gl.expand_dims(w_c, 0), 1)
        kb_w = gl.expand_dims(gl.expand_dims(w_w, 1), 2)
        # x^T blocks as 32-bit row pairs [W, 64, BLOCK_M] (x rows 4-byte aligned: the launcher checks)
        x_w = gl.arange(0, WARPS, layout=gl.SliceLayout(1, gl.SliceLayout(2, x_layout)))
        x_k = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(2, x_layout)))
        x_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, gl.SliceLayout(1, x_layout)))
        tok = gl.expand_dims(gl.expand_dims(gl.minimum(m0 + x_m, M - 1), 0), 1)
        x_base = (x_ptr.to(gl.pointer_type(gl.uint32), bitcast=True) + tok * (stride_xm // 2)
                  + gl.expand_dims(gl.expand_dims(x_k, 0), 2))
        kb_x = gl.expand_dims(gl.expand_dims(x_w, 1), 2)
        num_kb_x = num_kb  # (x's loads' block count: with WAIT_PRIOR, given back by the wait for the gather of x)
        # scales / zeros, loaded as [W, 8, ROWS / 8] (`_params_layout`), used as [W, R] in the accumulator's row layout
        # (p_layout) or, integer zeros in the operand, the words' (z_layout)
        z_layout: gl.constexpr = gl.SliceLayout(2, w_layout)
        pa_layout: gl.constexpr = _params_layout(WARPS, ROWS)
        pa_w = gl.arange(0, WARPS, layout=gl.SliceLayout(1, gl.SliceLayout(2, pa_layout)))
        pa_l = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, pa_layout)))
        pa_i = gl.arange(0, ROWS // 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, pa_layout)))
        lane_row = gl.expand_dims(gl.expand_dims(pa_l, 0), 2)
        reg_row = gl.expand_dims(gl.expand_dims(pa_i, 0), 1)
        if PARAMS_VECTOR:  # ADJACENT_ROWS, N a multiple of ROWS / 8: rows past N come in whole threads' groups, and such a
            # group reads the last one instead (a clamp per group keeps the loads vectors)
            n_pa = gl.minimum(n0 + _weight_row(lane_row, 0, ROWS, True), N - ROWS // 8) + reg_row
        else:  # a row past N reads row N - 1 (never stored)
            n_pa = gl.minimum(n0 + _weight_row(lane_row, reg_row, ROWS, ADJACENT_ROWS), N - 1)
        s_base = s_ptr + n_pa
        z_base = z_ptr + n_pa
        kb_p = gl.expand_dims(gl.expand_dims(pa_w, 1), 2)
        kb_v = gl.expand_dims(gl.arange(0, WARPS, layout=gl.SliceLayout(1, p_layout)), 1)  # [W, 1]: a block's validity

        steps = (num_kb + WARPS - 1) // WARPS
        # the register ring: each step's loads are issued AHEAD steps before their use; the loop is unrolled by
        # AHEAD + 1 so that every slot is refilled in place (a loop-carried tuple rotated by one costs a move per
        # register). A slot: (words, scales, zeros), and x's block unless X_AT_USE.
        X_AHEAD: gl.constexpr = not X_AT_USE
        ring = ()
        for j in gl.static_range(AHEAD):
            ring = ring + (_load_step(qw_base, x_base, s_base, z_base, j, kb_w, kb_x, num_kb_x, kb_p, num_kb, N,
                                      p_layout, z_layout, WARPS, SYMMETRIC, GROUPS, BLOCKS_PER_GROUP, ZERO_IN_OPERAND,
                                      X_AHEAD and not WAIT_PRIOR, EVICT_FIRST),)
        if WAIT_PRIOR:  # every weight load of the first AHEAD steps went out before the wait for the gather of x
            num_kb_x = _after_prior_grid(num_kb)
            if X_AHEAD:  # then those steps' x blocks
                weights = ring
                ring = ()
                for j in gl.static_range(AHEAD):
                    ring = ring + (weights[j] + (_load_x(x_base, j, kb_x, num_kb_x, WARPS),),)
        ones = gl.full([WARPS, ROWS, 64 // PIECES], 1.0, dtype, layout=a_layout)  # (x sums: unused with ZERO_IN_OPERAND)
        acc = gl.zeros([WARPS, ROWS, BLOCK_M], gl.float32, layout=mma)
        zero_acc = gl.zeros([WARPS, ROWS, BLOCK_M], gl.float32, layout=mma)
        for i0 in range(0, steps, AHEAD + 1):
            for j in gl.static_range(AHEAD + 1):
                fresh = _load_step(qw_base, x_base, s_base, z_base, i0 + j + AHEAD, kb_w, kb_x, num_kb_x, kb_p, num_kb,
                                   N, p_layout, z_layout, WARPS, SYMMETRIC, GROUPS, BLOCKS_PER_GROUP, ZERO_IN_OPERAND,
                                   X_AHEAD, EVICT_FIRST)
                if j == 0:
                    current = ring[0]
                    extra = fresh
                else:
                    if j == AHEAD:
                        current = extra
                    else:
                        current = ring[j]
                    refilled = ()
                    for t in gl.static_range(AHEAD):
                        if t == j - 1:
                            refilled = refilled + (fresh,)
                        else:
                            refilled = refilled + (ring[t],)
                    ring = refilled
                words, scales, zeros = current[0], current[1], current[2]
                if X_AHEAD:
                    x = current[3]
                else:
                    x = _load_x(x_base, i0 + j, kb_x, num_kb_x, WARPS)
                valid = (i0 + j) * WARPS + kb_v < num_kb
                # the block as two halves h (word columns of parity h: block rows 64 h ..), each half's operands
                # built right before its MMAs
                w_halves = gl.split(gl.reshape(words.to(gl.uint32, bitcast=True), [WARPS, ROWS, 8, 2]))
                x_halves = gl.split(gl.permute(gl.reshape(x, [WARPS, 2, 32, BLOCK_M]), (0, 2, 3, 1)))
                neg_zeros = ()  # -(C + z) pairs per group piece (ZERO_IN_OPERAND)
                if ZERO_IN_OPERAND:
                    for i in gl.static_range(GROUPS):
                        neg_zeros = neg_zeros + (_neg_zero_pair(zeros[i], MAGIC),)
                if GROUPS == 1:  # one group spans the block: both halves' sums first, one fold
                    a0 = _unpack_half(w_halves[0], a_layout, dtype, MAGIC, 1, neg_zeros, ZERO_IN_OPERAND)[0]
                    a1 = _unpack_half(w_halves[1], a_layout, dtype, MAGIC, 1, neg_zeros, ZERO_IN_OPERAND)[0]
                    xb0 = _operand_x(x_halves[0], b_layout, dtype, 1)[0]
                    xb1 = _operand_x(x_halves[1], b_layout, dtype, 1)[0]
                    part = mma_v2(a1, xb1, mma_v2(a0, xb0, zero_acc))
                    # sum_k x in every row (not needed when the zero is in the operand)
                    x_sum = None if ZERO_IN_OPERAND else mma_v2(ones, xb1, mma_v2(ones, xb0, zero_acc))
                    acc = _fold(acc, part, x_sum, scales[0], zeros[0], valid, C, SYMMETRIC, ZERO_IN_OPERAND)
                else:
                    for h in gl.static_range(2):
                        operands = _unpack_half(w_halves[h], a_layout, dtype, MAGIC, PIECES,
                                                neg_zeros[h * PIECES:(h + 1) * PIECES], ZERO_IN_OPERAND)
                        xbs = _operand_x(x_halves[h], b_layout, dtype, PIECES)
                        for i in gl.static_range(PIECES):  # piece i of half h: the block's scale group h * PIECES + i
                            part = mma_v2(operands[i], xbs[i], zero_acc)
                            x_sum = None if ZERO_IN_OPERAND else mma_v2(ones, xbs[i], zero_acc)
                            acc = _fold(acc, part, x_sum, scales[h * PIECES + i], zeros[h * PIECES + i], valid, C,
                                        SYMMETRIC, ZERO_IN_OPERAND)
        # the warps' K shares summed through shared memory (by hand: gl.sum's combine function is a Triton function,
        # which a Gluon kernel cannot call under the interpreter's patching, where CI compiles it), read back as the
        # [ROWS, BLOCK_M] tile spread over the program's threads (rows on lanes, tokens over the warps), so a thread
        # sums one or two outputs' WARPS shares (a read-back layout replicated over the warps had every thread sum all
        # BLOCK_M tokens' columns: 6x the epilogue's instructions at M = 2, NOTES v29)
        shares = gl.allocate_shared_memory(gl.float32, [WARPS * ROWS, BLOCK_M],
                                           gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))
        shares.store(gl.reshape(acc, [WARPS * ROWS, BLOCK_M]))
        cta_barrier()
        out: gl.constexpr = gl.BlockedLayout([1, 1], [ROWS, 32 // ROWS], [1, WARPS], [0, 1])
        total = shares.slice(0, ROWS).load(out)
        for w in gl.static_range(1, WARPS):
            total += shares.slice(w * ROWS, ROWS).load(out)
        o_r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, out))
        o_n = n0 + _weight_row(o_r % 8, o_r // 8, ROWS, ADJACENT_ROWS)
        o_m = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, out))
        ptrs = y_ptr + gl.expand_dims(o_m, 0) * stride_ym + gl.expand_dims(o_n, 1)
        gl.store(ptrs, total.to(dtype), mask=(gl.expand_dims(o_n, 1) < N) & (gl.expand_dims(o_m, 0) < M))


@dataclass(frozen=True)
class _DecodeLaunch:
    """A decode plan's launch for one weight format and shape, made once and kept in `plan.launches`: the weight
    tiles' grid dimension (cdiv(N, ROWS)) is fixed by the shape, a call adds its token blocks."""

    weight_tiles: int
    block_m: int
    tokens_first: bool
    prepared: PreparedLaunch

    def grid(self, m: int) -> tuple:
        token_blocks = -(-m // self.block_m)
        return (token_blocks, self.weight_tiles) if self.tokens_first else (self.weight_tiles, token_blocks)


_TENSOR_ARGS = ("x_ptr", "qw_ptr", "s_ptr", "z_ptr", "y_ptr")
_INT_ARGS = ("M", "N", "K", "stride_xm", "stride_ym")


def adjacent_rows_apply(group_size: int, in_features: int) -> bool:
    """Whether the plan option ADJACENT_ROWS changes the kernel for this weight format: only where the loop loads
    scales and zeros per block, not per-channel (its one group's loads leave the loop, and the row order would only
    cost its word loads, NOTES v30). The launcher ignores the option elsewhere and the dispatcher drops it."""
    return blocks_per_group(group_size, in_features) != 0


def _launch_config(cfg: dict, block_m: int, in_features: int, out_features: int, group_size: int,
                   symmetric: bool) -> tuple[dict, dict]:
    """(constexprs, options) of `_decode_kernel` for a decode plan's configuration `cfg` (num_warps, ROWS, AHEAD,
    maxnreg, ZEROS_BY_X_SUM, ADJACENT_ROWS, X_AT_USE, EVICT_FIRST, TOKENS_FIRST, GATHER_PDL: WAIT_PRIOR and a
    programmatic launch, kept by the dispatcher only for act-order weights on sm_90+; PDL, which the dispatcher adds
    for a call's `pdl` on sm_90+: WAIT_PRIOR, RELEASE_DEPENDENTS and a programmatic launch) and a call's BLOCK_M
    (`decode_block_m`), weight shape (N decides PARAMS_VECTOR) and format, or a ValueError naming the entry the kernel
    cannot take."""
    warps, rows, ahead = cfg.get("num_warps", 4), cfg.get("ROWS", 16), cfg.get("AHEAD", 1)
    if block_m not in DECODE_BLOCK_M:
        raise ValueError(f"config BLOCK_M must be one of {DECODE_BLOCK_M} for path 'decode', got {block_m!r}")
    if rows not in DECODE_ROWS:
        raise ValueError(f"config ROWS must be one of {DECODE_ROWS} for path 'decode', got {rows!r}")
    tokens_first = bool(cfg.get("TOKENS_FIRST", False))
    if tokens_first and _weight_tiles(out_features, rows) > _GRID_AXIS_LIMIT:  # the weight tiles on the second axis
        raise ValueError(f"w4a16: the decode plan option TOKENS_FIRST takes N <= {_GRID_AXIS_LIMIT * rows} at ROWS {rows}, "
                         f"got N={out_features}")
    if warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"config num_warps must be a power of two <= 16 for path 'decode', got {warps!r}")
    if ahead not in (1, 2, 3):
        raise ValueError(f"config AHEAD must be 1, 2 or 3 for path 'decode', got {ahead!r}")
    wait_prior, release_dependents = programmatic_dependence(cfg)
    groups = groups_per_block(group_size, in_features)
    group_blocks = blocks_per_group(group_size, in_features)
    adjacent = bool(cfg.get("ADJACENT_ROWS", False)) and adjacent_rows_apply(group_size, in_features)
    constexprs = dict(WARPS=warps, ROWS=rows, BLOCK_M=block_m, AHEAD=ahead, SYMMETRIC=symmetric, GROUPS=groups,
                      BLOCKS_PER_GROUP=group_blocks, ADJACENT_ROWS=adjacent,
                      PARAMS_VECTOR=adjacent and out_features % (rows // 8) == 0,
                      ZEROS_BY_X_SUM=bool(cfg.get("ZEROS_BY_X_SUM", False)), X_AT_USE=bool(cfg.get("X_AT_USE", False)),
                      WAIT_PRIOR=wait_prior, EVICT_FIRST=bool(cfg.get("EVICT_FIRST", False)),
                      TOKENS_FIRST=tokens_first, RELEASE_DEPENDENTS=release_dependents)
    maxnreg = cfg.get("maxnreg")
    options = {"num_warps": warps, **({"maxnreg": maxnreg} if maxnreg else {}), **({"launch_pdl": True} if wait_prior else {})}
    return constexprs, options


def decode_block_m(m: int, config: dict) -> int:
    """The kernel's BLOCK_M for a call of M <= 16 tokens with a decode plan's configuration: its BLOCK_M if it has
    one (8 or 16: `_launch_config` checks), else one n8 MMA tile up to M = 8 and two above."""
    return config.get("BLOCK_M") or (8 if m <= 8 else 16)


def grid_programs(config: dict, m: int, out_features: int) -> int:
    """Programs of a decode plan's grid for M tokens and N = out_features (`_DecodeLaunch.grid`: weight tiles x token
    blocks)."""
    return _weight_tiles(out_features, config.get("ROWS", 16)) * -(-m // decode_block_m(m, config))


def resident_programs(config: dict) -> int | None:
    """Programs of a decode plan resident on one SM at once: under maxnreg each holds num_warps * 32 threads of maxnreg
    registers of the SM's 64K; None without maxnreg (the compiler's register count decides)."""
    maxnreg = config.get("maxnreg")
    return max(1, 65536 // (config.get("num_warps", 4) * 32 * maxnreg)) if maxnreg else None


def _weight_tiles(out_features: int, rows: int) -> int:
    return -(-out_features // rows)


def takes_shape(config: dict, out_features: int, in_features: int) -> bool:
    """Whether a decode plan runs on an N x K weight (N = out_features, K = in_features): K a multiple of K_BLOCK and,
    with TOKENS_FIRST, at most 65535 weight tiles (then the grid's second axis); `_launch_config` refuses the rest."""
    if in_features % K_BLOCK:
        return False
    return not config.get("TOKENS_FIRST") or _weight_tiles(out_features, config.get("ROWS", 16)) <= _GRID_AXIS_LIMIT


def _decode_launch(plan, m: int, in_features: int, out_features: int, group_size: int, symmetric: bool) -> _DecodeLaunch:
    """The plan's launch for this token count's BLOCK_M (`decode_block_m`) and this format, made on first use (its
    configuration checked then: a ValueError naming the entry, on any device) and kept in `plan.launches`."""
    block_m = decode_block_m(m, plan.config)
    key = ("decode", block_m, in_features, out_features, group_size, symmetric)
    run = plan.launches.get(key)
    if run is None:
        constexprs, options = _launch_config(plan.config, block_m, in_features, out_features, group_size, symmetric)
        if not HAVE_GLUON:
            raise RuntimeError(_UNAVAILABLE)
        run = plan.launches[key] = _DecodeLaunch(_weight_tiles(out_features, constexprs["ROWS"]), block_m, constexprs["TOKENS_FIRST"],
                                                 PreparedLaunch(_decode_kernel, constexprs, options, _TENSOR_ARGS, _INT_ARGS))
    return run


_UNAVAILABLE = "w4a16: path 'decode' needs Gluon (Triton >= 3.5) and an NVIDIA GPU of compute capability >= 8.0"


def launch_decode(x2, qweight, scales, zeros, in_features: int, group_size: int, plan, out=None) -> torch.Tensor:
    """y = x2 @ W by `_decode_kernel` with the plan's (a dispatch.Plan) configuration (`_launch_config`)."""
    return _launch_decode(x2, qweight, scales, zeros, in_features, group_size, plan, out, keep=False)[0]


def launch_decode_kept(x2, qweight, scales, zeros, in_features: int, group_size: int, plan) -> tuple[torch.Tensor, RepeatLaunch | None]:
    """`launch_decode`, and the launch kept as a `launch.RepeatLaunch` (None where Triton's fast launch path does not
    apply: see `PreparedLaunch.bind`)."""
    return _launch_decode(x2, qweight, scales, zeros, in_features, group_size, plan, None, keep=True)


_REPEAT_SLOTS = tuple(range(len(_TENSOR_ARGS)))  # x, qweight, scales, zeros, y: every tensor per repeat


def _launch_decode(x2, qweight, scales, zeros, in_features: int, group_size: int, plan, out, keep: bool):
    m, k = x2.shape
    if m > 16:
        raise ValueError(f"w4a16: path 'decode' takes M <= 16 tokens, got M={m}")
    if k % K_BLOCK:
        raise ValueError(f"w4a16: path 'decode' needs in_features a multiple of {K_BLOCK}, got {k}")
    if qweight.numel() >= 2**31 or scales.numel() >= 2**31:  # the kernel's word and scale offsets are int32
        raise ValueError(f"w4a16: path 'decode' takes weights of < 2**31 words and scales, got N={scales.shape[1]}, K={k}")
    n = scales.shape[1]
    run = _decode_launch(plan, m, k, n, group_size, zeros is None)  # (TOKENS_FIRST's limit on N checked when it was made)
    grid = run.grid(m)
    if not available(x2.device):
        raise RuntimeError(f"{_UNAVAILABLE}; x is on {x2.device}")
    if x2.data_ptr() % 4 or x2.stride(0) % 2 or x2.stride(1) != 1:  # x is read as 32-bit row pairs
        x2 = x2.contiguous() if not x2.is_contiguous() else x2.clone()
    y = torch.empty((m, n), device=x2.device, dtype=x2.dtype) if out is None else out
    tensors = (x2, qweight, scales, scales if zeros is None else zeros, y)
    ints = (m, n, k, x2.stride(0), y.stride(0))
    stream = current_stream(x2.device)
    run.prepared(grid, tensors, ints, stream)
    bound = run.prepared.bind(grid, tensors, ints, stream, _REPEAT_SLOTS) if keep else None
    if bound is None:
        return y, None
    return y, RepeatLaunch(bound, (m, n), y.dtype, y.device, None, None)


def compile_for_sm90(config: dict, dtype: torch.dtype = torch.float16, block_m: int = 8, symmetric: bool = False,
                     zeros_dtype: torch.dtype = torch.uint8, scales_dtype: torch.dtype | None = None, group_size: int = 128,
                     in_features: int = 4096, out_features: int = 4096):
    """Compile `_decode_kernel` for sm_90 without a GPU, with the constexprs and options a launch of the decode plan
    configuration `config` (a tuned entry's keys: num_warps, ROWS, AHEAD, maxnreg and the options `_launch_config`
    reads, GATHER_PDL included) would take at this BLOCK_M (`decode_block_m`). Returns Triton's compiled kernel (asm:
    ttgir, ptx, cubin)."""
    constexprs, options = _launch_config(config, block_m, in_features, out_features, group_size, symmetric)
    s_type = TRITON_TYPE_NAMES[scales_dtype or dtype]
    signature = {"x_ptr": f"*{TRITON_TYPE_NAMES[dtype]}", "qw_ptr": "*i32", "s_ptr": f"*{s_type}",
                 "z_ptr": f"*{s_type if symmetric else TRITON_TYPE_NAMES[zeros_dtype]}", "y_ptr": f"*{TRITON_TYPE_NAMES[dtype]}",
                 **{name: "i32" for name in _INT_ARGS}}
    # (what a launch specialises on: 16-byte aligned tensors, ints divisible by 16)
    return compile_gluon_for_sm90(_decode_kernel, signature, constexprs, _TENSOR_ARGS + ("N", "K", "stride_xm", "stride_ym"),
                                  options)
