"""Hopper (sm_90) warp-specialised W4A16 GEMM for mid and large M, written in Gluon (Triton's explicit-layout
language): the "pingpong" path of the dispatcher.

Why a second kernel language: the Triton kernels of gemm.py unpack a block's weights and then multiply, in the
same warps, so the tensor cores wait for the unpack (NOTES v8-v17: ~480-540 TFLOP/s against cuBLAS's 600-670, and
Triton's automatic warp specialisation does not apply to that loop). Here one program is three partitions:

    consumer 0 (the default partition, 4 warps)  rows  0..63 of the program's 128 weight rows
    consumer 1 (4 warps)                          rows 64..127 (CONSUMERS = 2; with 1, 64 rows per program and
                                                  two programs per SM under maxnreg 128 take turns instead)
    x loader  (1 warp)                            x's [BLOCK_M, 128] tile of each K block into a shared-memory ring
                                                  (STAGES deep) by TMA, once both consumers have released the stage

Each consumer unpacks its rows' words straight into wgmma A-operand registers as (q - z) * s in x's dtype (the
layout makes that register relabelling, `_OPERAND_WORDS`), multiplies them with x's tile from shared memory (B),
waits, releases the stage. The two consumers drift apart, so one unpacks while the other's MMA runs (ping-pong
without explicit ordering), and nothing but the x ring is shared. With UNPACK_AHEAD a consumer also unpacks block
b + 1 into a second operand set while block b's MMAs run (32 more registers: BLOCK_M <= 128; on the H200 it paid on
one tuned entry and tied or lost on the rest, NOTES v24).

Contract (`launch_pingpong`): x [M, K] fp16 / bf16 (unit stride along K, 16-byte aligned rows: TMA); qweight int32
[ceil(N/64), ceil(K/128), 64, 16] (layout.py: word 2p + h of row n in K block b holds at nibble q + 4t the code of
row k = 128 b + 64 h + 16 q + 2 p + t); scales [K/G, N] (x's dtype, fp16 or fp32: rounded to x's dtype, as in the
Triton kernels); zeros [K/G, N] uint8 or float (fractional zeros exact up to one rounding, `_dequant_pairs`), or
None (symmetric: zero 8); G any group size `quantize.validate_group_size` accepts (16, 32, 64, a multiple of 128,
or K: per-channel). y [M, N] in x's dtype.

Work list and grid (as gemm.py's Stream-K kernel): the units are (tile, K block) pairs, tiles of BLOCK_M tokens x
64 * CONSUMERS weight rows in order (M tiles fastest: the M tiles of one weight tile are neighbours, so they share
it through L2), blocks in K order within a tile: T = tiles * ceil(K / 128) units. Program p of the 1-D grid (P,)
takes units [p*T // P, (p+1)*T // P): P = tiles gives each program one whole tile, P = tiles * SPLIT_K splits each
tile's K range SPLIT_K ways, and P = PROGRAMS (a persistent grid, about the SM count) shares the work evenly
whatever the tile count (Stream-K: no half-empty last wave). A tile a program covers whole is stored directly; a
shared one is reduced deterministically: each contributor writes its fp32 partial to its own workspace slot, bumps
the (tile, consumer) counter, and the last to arrive sums the partials in program order, writes y and resets the
counter. With SPREAD = S (an aligned split-K: each program exactly 1 / S of one tile's K blocks, and all P programs
resident at once, P <= the SM count: the launcher checks) the S contributors instead wait for one another on the
counter and each sums a share of the tile's 32-token chunks, still in program order. Assumes P <= T (every program has
work) and T < 2**31 (checked by the launcher; P * T may pass it).

Needs Gluon (Triton >= 3.5) and an sm_90 GPU (`available`); the dispatcher falls back to the entry's `FALLBACK`
plan elsewhere. Triton's CPU interpreter does not run
Gluon: CI compiles the kernel for sm_90 on the CPU (tests/test_pingpong.py); the GPU suite checks its results.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

from .launch import (COMPILE_OPTIONS, TRITON_TYPE_NAMES, PreparedLaunch, RepeatLaunch, compile_gluon_for_sm90, current_stream,
                     split_k_scratch, workspace_entry)
from .layout import K_BLOCK, blocks_per_group, groups_per_block

try:  # Gluon is experimental: absent before Triton 3.5, and its names move between releases
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .gluon_common import HAVE_GLUON, MAGIC_PAIRS, MAGIC_VALUES, cta_barrier, scale_group

    # renamed after Triton 3.6 (the old names remain there as stubs that raise)
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
except ImportError:  # pragma: no cover - exercised only with an old Triton
    HAVE_GLUON = False

__all__ = ["HAVE_GLUON", "available", "launch_pingpong", "launch_pingpong_kept", "spread_split", "grid_programs",
           "resident_programs", "compile_for_sm90"]

_CONSUMER_REGS = triton.language.constexpr(232)  # registers per consumer thread (setmaxnreg); the loader warp keeps 24


@functools.lru_cache(maxsize=None)
@functools.lru_cache(maxsize=None)
def available(device: torch.device) -> bool:
    """Gluon importable and an NVIDIA sm_90 GPU (wgmma, TMA and setmaxnreg as this kernel uses them); asked on every
    launch, so answered once per device."""
    return (HAVE_GLUON and device.type == "cuda" and torch.version.hip is None
            and torch.cuda.get_device_capability(device)[0] == 9)


if HAVE_GLUON:

    @gluon.constexpr_function
    def _operand_words_layout():
        # [64 rows, 16 words] whose unpacking lands in one warpgroup's m64 wgmma A-operand layout with no data
        # movement: word column c = 2p + h with c bits 0 (h) and 3 in registers, bits 1, 2 on lanes; row bits 0-2
        # on lanes, bit 3 in registers, bits 4-5 on warps (the m64 operand's rows 16w .. 16w + 15 per warp)
        return gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 8], [8, 0]],
                                          lane_bases=[[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]],
                                          warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 16])

    @gluon.constexpr_function
    def _y_layout():
        # y [M, N] is contiguous along n, the accumulator's rows: 8 n in a row per thread for the stores
        return gl.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1])

    @gluon.jit
    def _partial_offset(program, slot, CONSUMER: gl.constexpr, CONSUMERS: gl.constexpr, BLOCK_M: gl.constexpr):
        """Where a partial starts in the workspace part [P, 2, CONSUMERS, 64, BLOCK_M] fp32 (tokens fastest): slot 0
        holds the segment a program starts with, slot 1 the one it ends with."""
        return ((program * 2 + slot) * CONSUMERS + CONSUMER) * (64 * BLOCK_M)

    @gluon.jit
    def _dequant_pairs(words, s2, r2, e2, q: gl.constexpr, MAGIC: gl.constexpr, PAIR: gl.constexpr):
        # nibbles q and q + 4 of each word -> C + q as a 16-bit float pair (shr + lop3), then (c - R) * s + e on the
        # pair (sub + fma): R = C + z rounded to x's dtype, e = the rounding's residual times s (0 for integer zeros)
        pairs = gl.inline_asm_elementwise(
            f"{{ .reg .b32 t; shr.b32 t, $1, {4 * q}; lop3.b32 t, t, 0x000F000F, {MAGIC}, 0xEA; sub.{PAIR} t, t, $3; "
            f"fma.rn.{PAIR} $0, t, $2, $4; }}",
            "=r,r,r,r,r", [words, s2, r2, e2], dtype=gl.uint32, is_pure=True, pack=1)
        return gl.join(pairs.to(gl.uint16), (pairs >> 16).to(gl.uint16))  # (t = 0, t = 1) as raw 16-bit halves

    @gluon.jit
    def _pair_bits(v):
        bits = v.to(gl.uint16, bitcast=True).to(gl.uint32)
        return bits | (bits << 16)

    @gluon.constexpr_function
    def _group_of(h, q, groups):
        # the group (of the block's `groups`) of nibble q in word columns of parity h: block row 64 h + 16 q + ...
        return ((64 * h + 16 * q) * groups) // 128

    @gluon.jit
    def _pair_params(s, z, dtype: gl.constexpr, SYMMETRIC: gl.constexpr, MAGIC_VALUE: gl.constexpr):
        """One group's scale / zero for the rows -> [rows, 1] packed pairs (s, R, e): s and R = C + z rounded to x's
        dtype, e = -(C + z - R) * s, the residual a fractional zero leaves (0 for integer and symmetric zeros)."""
        s = s.to(dtype)
        if SYMMETRIC:
            shifted = gl.full(s.shape, MAGIC_VALUE + 8.0, gl.float32, s.type.layout)
        else:
            shifted = z.to(gl.float32) + MAGIC_VALUE
        r = shifted.to(dtype)
        e = (-(shifted - r.to(gl.float32)) * s.to(gl.float32)).to(dtype)
        return gl.expand_dims(_pair_bits(s), 1), gl.expand_dims(_pair_bits(r), 1), gl.expand_dims(_pair_bits(e), 1)

    @gluon.jit
    def _operands(words, scales, zeros, a_layout: gl.constexpr, dtype: gl.constexpr, SYMMETRIC: gl.constexpr, GROUPS: gl.constexpr,
                  MAGIC: gl.constexpr, MAGIC_VALUE: gl.constexpr, PAIR: gl.constexpr):
        """words [64, 16] uint32 and the rows' scales / zeros of the block's GROUPS groups (tuples) -> the two A
        operands [64, 64] (h = 0, 1) of (q - z) * s, operand column k = 32 q1 + 16 q0 + 8 p2 + 4 p1 + 2 p0 + t of word
        p = 4 p2 + 2 p1 + p0, nibble q = 2 q1 + q0. Nibble q of word column c = 2p + h is block row 64 h + 16 q + ...,
        so its group is (64 h + 16 q) * GROUPS // 128: static in q, and h is the column's parity."""
        params = ()
        for j in gl.static_range(GROUPS):
            params = params + (_pair_params(scales[j], zeros[j], dtype, SYMMETRIC, MAGIC_VALUE),)
        h_odd = gl.expand_dims(gl.arange(0, 16, layout=gl.SliceLayout(0, words.type.layout)) % 2 == 1, 0)
        pairs = ()
        for q in gl.static_range(4):
            if _group_of(0, q, GROUPS) == _group_of(1, q, GROUPS):
                s2, r2, e2 = params[_group_of(0, q, GROUPS)]
            else:
                even = params[_group_of(0, q, GROUPS)]
                odd = params[_group_of(1, q, GROUPS)]
                s2 = gl.where(h_odd, odd[0], even[0])
                r2 = gl.where(h_odd, odd[1], even[1])
                e2 = gl.where(h_odd, odd[2], even[2])
            pairs = pairs + (_dequant_pairs(words, s2, r2, e2, q, MAGIC, PAIR),)
        j = gl.join(gl.join(pairs[0], pairs[1]), gl.join(pairs[2], pairs[3]))  # (n, c, t, q0, q1)
        j = gl.reshape(j, [64, 2, 2, 2, 2, 2, 2, 2])  # (n, p2, p1, p0, h, t, q0, q1)
        j = gl.permute(j, (0, 7, 6, 1, 2, 3, 5, 4))  # (n, q1, q0, p2, p1, p0, t, h)
        lo, hi = gl.split(gl.reshape(j, [64, 64, 2]))
        return (gl.convert_layout(lo.to(dtype, bitcast=True), a_layout, assert_trivial=True),
                gl.convert_layout(hi.to(dtype, bitcast=True), a_layout, assert_trivial=True))

    @gluon.jit
    def _load_block(fetch, kb, SYMMETRIC: gl.constexpr, GROUPS: gl.constexpr, BLOCKS_PER_GROUP: gl.constexpr,
                    WORDS_TMA: gl.constexpr):
        """K block kb's words [64, 16] and the scales and zeros (tuples of GROUPS) of its groups for rows n (the scale
        again as the zero when SYMMETRIC: never used, no zeros tensor exists). Groups past K (a last block that
        K ends inside) read as 0. fetch: (word_ptrs, s_ptr, z_ptr, n, n_ok, N, num_groups). WORDS_TMA: the words
        come from the loader's shared-memory stage instead (`_stage_words`), and kb stands in for them (never read)."""
        word_ptrs, s_ptr, z_ptr, n, n_ok, N, num_groups = fetch
        if WORDS_TMA:
            words = kb
        else:
            words = gl.load(word_ptrs + kb * 1024, mask=n_ok[:, None], other=0)
        scales = ()
        zeros = ()
        for j in gl.static_range(GROUPS):
            g = scale_group(kb, j, GROUPS, BLOCKS_PER_GROUP)
            ok = n_ok & (g < num_groups)
            s = gl.load(s_ptr + g * N + n, mask=ok, other=0.0)
            scales = scales + (s,)
            if SYMMETRIC:
                zeros = zeros + (s,)
            else:
                zeros = zeros + (gl.load(z_ptr + g * N + n, mask=ok, other=0),)
        return words, scales, zeros

    @gluon.jit
    def _advance(ring, fetch, kb_fetch, SYMMETRIC: gl.constexpr, GROUPS: gl.constexpr, BLOCKS_PER_GROUP: gl.constexpr,
                 WORDS_TMA: gl.constexpr):
        """The register ring's first block (words as uint32, scales, zeros), and the ring moved on by one with block
        kb_fetch loaded at its end."""
        words, s, z = ring[0]
        return (words.to(gl.uint32, bitcast=True), s, z), (ring[1], _load_block(fetch, kb_fetch, SYMMETRIC, GROUPS, BLOCKS_PER_GROUP,
                                                                                    WORDS_TMA))

    @gluon.jit
    def _stage_words(block, w_smem, x_ready, i, STAGES: gl.constexpr, CONSUMER: gl.constexpr, CONSUMERS: gl.constexpr,
                     WORDS_TMA: gl.constexpr):
        """`block` (words, scales, zeros) of x's ring position i; with WORDS_TMA its words read from the stage's
        shared-memory tile [64, 16] of this consumer, which the loader fills with x's tile (one barrier for both)."""
        if WORDS_TMA:
            words, s, z = block
            stage = i % STAGES
            mbarrier.wait(x_ready.index(stage), (i // STAGES) & 1)
            words = w_smem.index(stage * CONSUMERS + CONSUMER).load(_operand_words_layout()).to(gl.uint32, bitcast=True)
            block = (words, s, z)
        return block

    @gluon.jit
    def _work_range(M, N, num_kb, BLOCK_M: gl.constexpr, CONSUMERS: gl.constexpr):
        """This program's units [start, end) of the work list (see the module docstring), the list's length and
        the M tiles per weight tile."""
        tiles_m = (M + BLOCK_M - 1) // BLOCK_M
        total = tiles_m * ((N + 64 * CONSUMERS - 1) // (64 * CONSUMERS)) * num_kb
        pid = gl.program_id(0)
        programs = gl.num_programs(0)
        # (unit bounds in int64: P * T passes 2**31 on the largest layers; the units themselves fit int32)
        start = (pid.to(gl.int64) * total) // programs
        end = ((pid + 1).to(gl.int64) * total) // programs
        return start.to(gl.int32), end.to(gl.int32), total, tiles_m

    @gluon.jit
    def _accumulate(word_ptrs, s_ptr, z_ptr, x_smem, x_ready, empty, n, n_ok, N, block_start, block_end, ring_start,
                    num_groups, a_layout: gl.constexpr, mma_layout: gl.constexpr, BLOCK_M: gl.constexpr,
                    STAGES: gl.constexpr, SYMMETRIC: gl.constexpr, GROUPS: gl.constexpr, BLOCKS_PER_GROUP: gl.constexpr,
                    UNPACK_AHEAD: gl.constexpr, w_smem, CONSUMER: gl.constexpr, CONSUMERS: gl.constexpr,
                    WORDS_TMA: gl.constexpr):
        """acc [64, BLOCK_M] fp32 over K blocks [block_start, block_end) of one weight tile's 64 rows: words (and
        scale / zero) loaded two blocks ahead into registers, unpacked into the A operands, two wgmma (K = 64
        each) against x's stage, wait, release the stage (UNPACK_AHEAD: the next block unpacked before that wait).
        ring_start: the x ring position of block_start. WORDS_TMA: the words from x's stage instead, STAGES blocks
        ahead (`_stage_words`); scales and zeros still from the register ring."""
        dtype: gl.constexpr = x_smem.dtype
        MAGIC: gl.constexpr = MAGIC_PAIRS[0] if dtype == gl.float16 else MAGIC_PAIRS[1]
        MAGIC_VALUE: gl.constexpr = MAGIC_VALUES[0] if dtype == gl.float16 else MAGIC_VALUES[1]
        PAIR: gl.constexpr = "f16x2" if dtype == gl.float16 else "bf16x2"
        # blocks block_start and block_start + 1 in flight before the loop; each step fetches the one two ahead
        # (clamped to the segment's last block: the tail re-reads it instead of reading past the range)
        fetch = (word_ptrs, s_ptr, z_ptr, n, n_ok, N, num_groups)
        ring = (_load_block(fetch, block_start, SYMMETRIC, GROUPS, BLOCKS_PER_GROUP, WORDS_TMA),
                _load_block(fetch, gl.minimum(block_start + 1, block_end - 1), SYMMETRIC, GROUPS, BLOCKS_PER_GROUP, WORDS_TMA))
        acc = gl.zeros([64, BLOCK_M], gl.float32, layout=mma_layout)
        if UNPACK_AHEAD:
            # block b + 1 unpacked while block b's MMAs run, into the other of two operand sets (unrolled by two:
            # a loop-carried operand would be rewritten under its own in-flight wgmma, which ptxas then serializes)
            block, ring = _advance(ring, fetch, gl.minimum(block_start + 2, block_end - 1), SYMMETRIC, GROUPS, BLOCKS_PER_GROUP, WORDS_TMA)
            i = ring_start
            words, s, z = _stage_words(block, w_smem, x_ready, i, STAGES, CONSUMER, CONSUMERS, WORDS_TMA)
            a_lo, a_hi = _operands(words, s, z, a_layout, dtype, SYMMETRIC, GROUPS, MAGIC, MAGIC_VALUE, PAIR)
            for kb in range(block_start, block_end - 1, 2):  # blocks kb (operands a) and kb + 1 (operands b)
                acc = _issue_block_mmas(a_lo, a_hi, acc, x_smem, x_ready, i, STAGES)
                block, ring = _advance(ring, fetch, gl.minimum(kb + 3, block_end - 1), SYMMETRIC, GROUPS, BLOCKS_PER_GROUP, WORDS_TMA)
                words, s, z = _stage_words(block, w_smem, x_ready, i + 1, STAGES, CONSUMER, CONSUMERS, WORDS_TMA)
                b_lo, b_hi = _operands(words, s, z, a_layout, dtype, SYMMETRIC, GROUPS, MAGIC, MAGIC_VALUE, PAIR)
                acc, a_lo, a_hi = warpgroup_mma_wait(num_outstanding=0, deps=[acc, a_lo, a_hi])
                mbarrier.arrive(empty.index(i % STAGES), count=1)
                acc = _issue_block_mmas(b_lo, b_hi, acc, x_smem, x_ready, i + 1, STAGES)
                block, ring = _advance(ring, fetch, gl.minimum(kb + 4, block_end - 1), SYMMETRIC, GROUPS, BLOCKS_PER_GROUP, WORDS_TMA)
                if kb + 2 < block_end:  # (with WORDS_TMA the loader fills position i + 2 only then)
                    words, s, z = _stage_words(block, w_smem, x_ready, i + 2, STAGES, CONSUMER, CONSUMERS, WORDS_TMA)
                    a_lo, a_hi = _operands(words, s, z, a_layout, dtype, SYMMETRIC, GROUPS, MAGIC, MAGIC_VALUE, PAIR)
                acc, b_lo, b_hi = warpgroup_mma_wait(num_outstanding=0, deps=[acc, b_lo, b_hi])
                mbarrier.arrive(empty.index((i + 1) % STAGES), count=1)
                i += 2
            if (block_end - block_start) % 2 == 1:  # an odd segment's last block
                acc = _issue_block_mmas(a_lo, a_hi, acc, x_smem, x_ready, i, STAGES)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
                mbarrier.arrive(empty.index(i % STAGES), count=1)
        else:
            for kb in range(block_start, block_end):
                i = ring_start + kb - block_start
                block, ring = _advance(ring, fetch, gl.minimum(kb + 2, block_end - 1), SYMMETRIC, GROUPS, BLOCKS_PER_GROUP, WORDS_TMA)
                words, s, z = _stage_words(block, w_smem, x_ready, i, STAGES, CONSUMER, CONSUMERS, WORDS_TMA)
                a_lo, a_hi = _operands(words, s, z, a_layout, dtype, SYMMETRIC, GROUPS, MAGIC, MAGIC_VALUE, PAIR)
                acc = _issue_block_mmas(a_lo, a_hi, acc, x_smem, x_ready, i, STAGES)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
                mbarrier.arrive(empty.index(i % STAGES), count=1)
        return acc

    @gluon.jit
    def _issue_block_mmas(a_lo, a_hi, acc, x_smem, x_ready, i, STAGES: gl.constexpr):
        """Once x's ring position i has landed: the block's two wgmma (K = 64 each), issued, not waited for."""
        stage = i % STAGES
        mbarrier.wait(x_ready.index(stage), (i // STAGES) & 1)
        acc = warpgroup_mma(a_lo, x_smem.index(2 * stage).permute((1, 0)), acc, is_async=True)
        return warpgroup_mma(a_hi, x_smem.index(2 * stage + 1).permute((1, 0)), acc, is_async=True)

    @gluon.jit
    def _store_y_chunk(y_ptr, values, offs_n, m_first, M, N, stride_ym, TOKENS: gl.constexpr):
        """y[m_first .. m_first + TOKENS - 1, offs_n] = values [64 weight rows, TOKENS tokens] (fp32, rounded to y's dtype);
        offs_n: the 64 rows in the row slice of `_y_layout`. The shared-tile reductions' store of one chunk."""
        out_layout: gl.constexpr = _y_layout()
        offs_m = m_first + gl.arange(0, TOKENS, layout=gl.SliceLayout(0, out_layout))
        gl.store(y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None], gl.convert_layout(values.to(y_ptr.dtype.element_ty), out_layout),
                 mask=(offs_m[None, :] < M) & (offs_n[:, None] < N))

    @gluon.jit
    def _reduce_tile(part_ptr, y_ptr, first, last, programs, total, tile_unit, m0, n0, M, N, stride_ym, CONSUMER: gl.constexpr,
                     CONSUMERS: gl.constexpr, BLOCK_M: gl.constexpr):
        """y[m0.., n0..] (BLOCK_M tokens x 64 weight rows) = the sum of the partials of programs first..last in program
        order (deterministic), 64 tokens at a time (few registers), two partials in flight per step. tile_unit: the
        tile's first unit (a program that began before it wrote its partial to slot 1)."""
        sum_layout: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])  # a row's 64 tokens per 16 lanes
        out_layout: gl.constexpr = _y_layout()
        rows = gl.arange(0, 64, layout=gl.SliceLayout(1, sum_layout))
        cols = gl.arange(0, 64, layout=gl.SliceLayout(0, sum_layout))
        offs_n = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, out_layout))
        for c in gl.static_range(BLOCK_M // 64):
            local = rows[:, None] * BLOCK_M + (c * 64 + cols)[None, :]
            reduced = gl.zeros([64, 64], gl.float32, layout=sum_layout)
            for q in range(first, last + 1, 2):  # (the second partial of a step may be past `last`: masked)
                q_slot = (((q.to(gl.int64) * total) // programs) < tile_unit).to(gl.int32)
                q1_slot = ((((q + 1).to(gl.int64) * total) // programs) < tile_unit).to(gl.int32)
                first_part = gl.load(part_ptr + _partial_offset(q, q_slot, CONSUMER, CONSUMERS, BLOCK_M) + local, cache_modifier=".cg")
                second_part = gl.load(part_ptr + _partial_offset(q + 1, q1_slot, CONSUMER, CONSUMERS, BLOCK_M) + local,
                                      mask=gl.full(local.shape, q + 1, gl.int32, sum_layout) <= last, other=0.0,
                                      cache_modifier=".cg")
                reduced += first_part + second_part
            _store_y_chunk(y_ptr, reduced, offs_n, m0 + c * 64, M, N, stride_ym, 64)

    @gluon.jit
    def _reduce_share(part_ptr, y_ptr, first, share, m0, n0, M, N, stride_ym, CONSUMER: gl.constexpr, CONSUMERS: gl.constexpr,
                      BLOCK_M: gl.constexpr, SPREAD: gl.constexpr):
        """SPREAD's reduction: contributor `share` (0 .. SPREAD - 1) of the tile, once all have arrived, writes y for the
        32-token chunks c of the tile with c % SPREAD == share, each the sum of the SPREAD partials of programs first ..
        first + SPREAD - 1 (slot 0) in program order (deterministic), all of a chunk's partials in flight at once."""
        share_layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])  # a row's 32 tokens per 8 lanes
        out_layout: gl.constexpr = _y_layout()
        rows = gl.arange(0, 64, layout=gl.SliceLayout(1, share_layout))
        cols = gl.arange(0, 32, layout=gl.SliceLayout(0, share_layout))
        offs_n = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, out_layout))
        for c in gl.static_range(BLOCK_M // 32):
            if c % SPREAD == share:
                local = rows[:, None] * BLOCK_M + (c * 32 + cols)[None, :]
                partials = ()
                for j in gl.static_range(SPREAD):
                    partials = partials + (gl.load(part_ptr + _partial_offset(first + j, 0, CONSUMER, CONSUMERS, BLOCK_M) + local,
                                                   cache_modifier=".cg"),)
                reduced = partials[0]
                for j in gl.static_range(1, SPREAD):
                    reduced = reduced + partials[j]
                _store_y_chunk(y_ptr, reduced, offs_n, m0 + c * 32, M, N, stride_ym, 32)

    @gluon.jit
    def _segment(qw_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr, x_smem, x_ready, empty, M, N, num_kb, num_groups,
                 stride_ym, unit, start, end, total, tiles_m, CONSUMER: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                 SYMMETRIC: gl.constexpr, GROUPS: gl.constexpr, BLOCKS_PER_GROUP: gl.constexpr, CONSUMERS: gl.constexpr,
                 SHARED_TILES: gl.constexpr, UNPACK_AHEAD: gl.constexpr, SPREAD: gl.constexpr, w_smem, WORDS_TMA: gl.constexpr):
        """The program's segment that begins at `unit` (a tile's run of K blocks, up to the tile's or the program's
        end), for rows CONSUMER * 64 .. + 63 of the tile: the accumulator, then y when the segment is the whole tile,
        else its fp32 partial and, for the tile's last arrival, the sum of the tile's partials in program order.
        Returns the unit after the segment."""
        dtype: gl.constexpr = x_smem.dtype
        mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
        w_layout: gl.constexpr = _operand_words_layout()
        out_layout: gl.constexpr = _y_layout()
        tile = unit // num_kb
        block_start = unit - tile * num_kb
        block_end = gl.minimum(num_kb, block_start + (end - unit))
        row_tile = (tile // tiles_m) * CONSUMERS + CONSUMER  # this consumer's 64-row tile of the weight
        rows = gl.arange(0, 64, layout=gl.SliceLayout(1, w_layout))
        cols = gl.arange(0, 16, layout=gl.SliceLayout(0, w_layout))
        n = row_tile * 64 + rows
        # tile (n // 64, b) of 64 x 16 words is contiguous (1024 words); int64: the largest weights pass 2**31 bytes
        word_ptrs = qw_ptr + row_tile.to(gl.int64) * num_kb * 1024 + (rows * 16)[:, None] + cols[None, :]
        acc = _accumulate(word_ptrs, s_ptr, z_ptr, x_smem, x_ready, empty, n, n < N, N, block_start, block_end, unit - start,
                          num_groups, a_layout, mma_layout, BLOCK_M, STAGES, SYMMETRIC, GROUPS, BLOCKS_PER_GROUP,
                          UNPACK_AHEAD, w_smem, CONSUMER, CONSUMERS, WORDS_TMA)

        offs_n = row_tile * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, out_layout))
        offs_m = (tile % tiles_m) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, out_layout))
        mask = (offs_m[None, :] < M) & (offs_n[:, None] < N)
        y_ptrs = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None]
        if not SHARED_TILES:  # every program has one whole tile (the reduction is not compiled in: registers)
            gl.store(y_ptrs, gl.convert_layout(acc.to(dtype), out_layout), mask=mask)
        elif (block_start == 0) & (block_end == num_kb):
            gl.store(y_ptrs, gl.convert_layout(acc.to(dtype), out_layout), mask=mask)
        else:
            # the partial, written from the accumulator's own layout (a re-layout would hold a second copy: 128 more
            # registers at BLOCK_M = 256); a counter per (tile, consumer)
            acc_rows = gl.arange(0, 64, layout=gl.SliceLayout(1, mma_layout))
            acc_cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma_layout))
            programs = gl.num_programs(0)
            slot = (unit != start).to(gl.int32)
            gl.store(part_ptr + _partial_offset(gl.program_id(0), slot, CONSUMER, CONSUMERS, BLOCK_M) + acc_rows[:, None] * BLOCK_M
                     + acc_cols[None, :], acc)
            cta_barrier()  # every thread's partial is written before the counter says so
            counter = lock_ptr + tile * CONSUMERS + CONSUMER
            first = (((tile * num_kb + 1).to(gl.int64) * programs - 1) // total).to(gl.int32)  # owns the tile's first unit
            last = ((((tile + 1) * num_kb).to(gl.int64) * programs - 1) // total).to(gl.int32)  # ... and its last unit
            if SPREAD:
                # all SPREAD contributors are resident (the launcher checks), so each waits for the others and sums its
                # share of the tile: the last arrival would read every partial alone (64-256 KB per SM at M = 128..512)
                arrived = gl.atomic_add(counter, 1, sem="acq_rel") + 1
                while arrived < SPREAD:
                    arrived = gl.atomic_add(counter, 0, sem="acquire")
                _reduce_share(part_ptr, y_ptr, first, gl.program_id(0) - first, (tile % tiles_m) * BLOCK_M, row_tile * 64, M, N,
                              stride_ym, CONSUMER, CONSUMERS, BLOCK_M, SPREAD)
                # a second count, after every contributor has seen the first complete; its last resets the counter
                if gl.atomic_add(counter, 1, sem="relaxed") == 2 * SPREAD - 1:
                    gl.atomic_xchg(counter, 0, sem="relaxed")
            elif gl.atomic_add(counter, 1, sem="acq_rel") == last - first:
                _reduce_tile(part_ptr, y_ptr, first, last, programs, total, tile * num_kb, (tile % tiles_m) * BLOCK_M,
                             row_tile * 64, M, N, stride_ym, CONSUMER, CONSUMERS, BLOCK_M)
                gl.atomic_xchg(counter, 0, sem="relaxed")  # relaxed: as gemm._finish_tile
        return unit + block_end - block_start

    @gluon.jit
    def _consumer(qw_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr, x_smem, x_ready, empty, M, N, num_kb, num_groups,
                  stride_ym, CONSUMER: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, SYMMETRIC: gl.constexpr,
                  GROUPS: gl.constexpr, BLOCKS_PER_GROUP: gl.constexpr, CONSUMERS: gl.constexpr, SHARED_TILES: gl.constexpr,
                  UNPACK_AHEAD: gl.constexpr, SPREAD: gl.constexpr, w_smem, WORDS_TMA: gl.constexpr):
        """Rows CONSUMER * 64 .. + 63 of each weight tile in the program's units, one segment at a time."""
        start, end, total, tiles_m = _work_range(M, N, num_kb, BLOCK_M, CONSUMERS)
        if SHARED_TILES:
            unit = start
            while unit < end:
                unit = _segment(qw_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr, x_smem, x_ready, empty, M, N, num_kb, num_groups,
                                stride_ym, unit, start, end, total, tiles_m, CONSUMER, BLOCK_M, STAGES, SYMMETRIC, GROUPS,
                                BLOCKS_PER_GROUP, CONSUMERS, SHARED_TILES, UNPACK_AHEAD, SPREAD, w_smem, WORDS_TMA)
        else:  # one whole tile
            _segment(qw_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr, x_smem, x_ready, empty, M, N, num_kb, num_groups,
                     stride_ym, start, start, end, total, tiles_m, CONSUMER, BLOCK_M, STAGES, SYMMETRIC, GROUPS, BLOCKS_PER_GROUP,
                     CONSUMERS, SHARED_TILES, UNPACK_AHEAD, SPREAD, w_smem, WORDS_TMA)

    @gluon.jit
    def _x_loader(x_desc, x_smem, x_ready, empty, M, N, num_kb, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                  CONSUMERS: gl.constexpr, w_desc, w_smem, WORDS_TMA: gl.constexpr):
        """One warp: x's tile of each unit of the program into the ring (two 64-column TMA boxes: one 128-byte
        swizzle row each), once every consumer has released the stage; TMA fills columns past K with zeros. WORDS_TMA:
        each consumer's [64, 16] word tile of the unit too, on the same barrier (w_desc: qweight as [rows, 16] words,
        a weight tile's 64 rows of K block b at row (row_tile * num_kb + b) * 64; a row tile past N reads zeros)."""
        start, end, total, tiles_m = _work_range(M, N, num_kb, BLOCK_M, CONSUMERS)
        for unit in range(start, end):
            tile = unit // num_kb
            kb = unit - tile * num_kb
            i = unit - start
            stage = i % STAGES
            phase = (i // STAGES) & 1
            mbarrier.wait(empty.index(stage), phase ^ 1)
            row = (tile % tiles_m) * BLOCK_M
            if WORDS_TMA:
                mbarrier.expect(x_ready.index(stage), 2 * x_desc.block_type.nbytes + CONSUMERS * w_desc.block_type.nbytes)
                for c in gl.static_range(CONSUMERS):
                    row_tile = (tile // tiles_m) * CONSUMERS + c
                    _tma_load(w_desc, [(row_tile * num_kb + kb) * 64, 0], x_ready.index(stage), w_smem.index(stage * CONSUMERS + c))
            else:
                mbarrier.expect(x_ready.index(stage), 2 * x_desc.block_type.nbytes)
            _tma_load(x_desc, [row, kb * 128], x_ready.index(stage), x_smem.index(2 * stage))
            _tma_load(x_desc, [row, kb * 128 + 64], x_ready.index(stage), x_smem.index(2 * stage + 1))

    @gluon.jit
    def _pingpong_kernel(x_desc, w_desc, qw_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr, M, N, K, group_size, stride_ym,
                         BLOCK_M: gl.constexpr, STAGES: gl.constexpr, SYMMETRIC: gl.constexpr, GROUPS: gl.constexpr,
                         BLOCKS_PER_GROUP: gl.constexpr, CONSUMERS: gl.constexpr, SHARED_TILES: gl.constexpr,
                         UNPACK_AHEAD: gl.constexpr, SPREAD: gl.constexpr, WORDS_TMA: gl.constexpr):
        """y[M, N] = x[M, K] @ W[K, N]: see the module docstring for the contract, the work list and the partitions.
        w_desc: with WORDS_TMA, qweight's TMA descriptor (`_w_descriptor`), else None."""
        x_smem = gl.allocate_shared_memory(x_desc.dtype, [2 * STAGES, BLOCK_M, 64], x_desc.layout)
        if WORDS_TMA:  # each stage's word tiles, one [64, 16] per consumer (8 KB a stage with two)
            w_smem = gl.allocate_shared_memory(gl.int32, [STAGES * CONSUMERS, 64, 16], w_desc.layout)
        else:
            w_smem = x_smem  # (never read: stands in for the argument)
        x_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(x_ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=CONSUMERS)  # every consumer releases a stage
        num_kb = (K + 127) // 128
        num_groups = K // group_size
        # (argument tuples written inline: a tuple assigned to a variable first turns its constexprs into values)
        if CONSUMERS == 2:
            gl.warp_specialize([
                (_consumer, (qw_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr, x_smem, x_ready, empty, M, N, num_kb, num_groups,
                             stride_ym, 0, BLOCK_M, STAGES, SYMMETRIC, GROUPS, BLOCKS_PER_GROUP, CONSUMERS, SHARED_TILES,
                             UNPACK_AHEAD, SPREAD, w_smem, WORDS_TMA)),
                (_consumer, (qw_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr, x_smem, x_ready, empty, M, N, num_kb, num_groups,
                             stride_ym, 1, BLOCK_M, STAGES, SYMMETRIC, GROUPS, BLOCKS_PER_GROUP, CONSUMERS, SHARED_TILES,
                             UNPACK_AHEAD, SPREAD, w_smem, WORDS_TMA)),
                (_x_loader, (x_desc, x_smem, x_ready, empty, M, N, num_kb, BLOCK_M, STAGES, CONSUMERS, w_desc, w_smem,
                             WORDS_TMA)),
            ], [4, 1], [_CONSUMER_REGS, 24])
        else:  # one consumer per program: two programs per SM (with maxnreg 128) ping-pong instead
            gl.warp_specialize([
                (_consumer, (qw_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr, x_smem, x_ready, empty, M, N, num_kb, num_groups,
                             stride_ym, 0, BLOCK_M, STAGES, SYMMETRIC, GROUPS, BLOCKS_PER_GROUP, CONSUMERS, SHARED_TILES,
                             UNPACK_AHEAD, SPREAD, w_smem, WORDS_TMA)),
                (_x_loader, (x_desc, x_smem, x_ready, empty, M, N, num_kb, BLOCK_M, STAGES, CONSUMERS, w_desc, w_smem,
                             WORDS_TMA)),
            ], [1], [24])

    # x's ring stage as TMA writes it: [BLOCK_M, 64] 16-bit boxes, 128-byte swizzle (one per call would be built anew)
    _X_SMEM_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    # a consumer's word tile as WORDS_TMA stages it: [64 rows, 16 words] (64 bytes a row), 64-byte swizzle
    _W_SMEM_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32, rank=2)


def _x_descriptor(x2: torch.Tensor, block_m: int):
    """x's TMA descriptor (per call: it holds x's address)."""
    return TensorDescriptor.from_tensor(x2, [block_m, 64], _X_SMEM_LAYOUT)


def _w_descriptor(qweight: torch.Tensor):
    """WORDS_TMA's descriptor of qweight [ceil(N/64), ceil(K/128), 64, 16] int32 seen as [rows, 16] words, box [64, 16]
    (one weight tile's K block; per call: it holds the weight's address)."""
    return TensorDescriptor.from_tensor(qweight.view(-1, 16), [64, 16], _W_SMEM_LAYOUT)


@dataclass(frozen=True)
class _PingpongLaunch:
    """What a pingpong plan needs per call, made once per (plan, format) and kept in `plan.launches` (as gemm.py's
    prepared launches are): the tiling that sets the grid and the scratch, and the kernel prepared with its
    constexprs for each (SHARED_TILES, SPREAD) a call needs (a repeat call skips Triton's per-call dispatch:
    launch.PreparedLaunch)."""

    block_m: int
    split_k: int  # grid = tiles * SPLIT_K programs (a call with fewer K blocks uses that many) ...
    programs: int  # ... or, when > 0, this many (Stream-K: a persistent grid)
    consumers: int
    constexprs: dict
    options: dict
    kernels: dict  # (SHARED_TILES, SPREAD) -> PreparedLaunch, made on first use

    def kernel(self, shared: bool, spread: int) -> PreparedLaunch:
        prepared = self.kernels.get((shared, spread))
        if prepared is None:
            words_tma = self.constexprs["WORDS_TMA"]
            constexprs = {**self.constexprs, "SHARED_TILES": shared, "SPREAD": spread, **({} if words_tma else {"w_desc": None})}
            prepared = self.kernels[shared, spread] = PreparedLaunch(
                _pingpong_kernel, constexprs, self.options, _TENSOR_ARGS, _INT_ARGS, ("x_desc", "w_desc") if words_tma else ("x_desc",))
        return prepared

    def descriptors(self, x2: torch.Tensor, qweight: torch.Tensor) -> tuple:
        """The call's TMA descriptors: x's, and with WORDS_TMA the weight's."""
        x_desc = _x_descriptor(x2, self.block_m)
        return (x_desc, _w_descriptor(qweight)) if self.constexprs["WORDS_TMA"] else (x_desc,)


_TENSOR_ARGS = ("qw_ptr", "s_ptr", "z_ptr", "y_ptr", "part_ptr", "lock_ptr")
_INT_ARGS = ("M", "N", "K", "group_size", "stride_ym")
_MOST_SPREAD = 4  # SPREAD's partials in flight per chunk (16 registers each)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _work_tiles(m: int, n: int, block_m: int, consumers: int) -> int:
    """Output tiles of the work list: BLOCK_M tokens x 64 * CONSUMERS weight rows each."""
    return -(-m // block_m) * -(-n // (64 * consumers))


def _grid_size(tiles: int, k_blocks: int, split_k: int, programs: int) -> int:
    """The 1-D grid of a launch: PROGRAMS (persistent), at most one per unit, else tiles x SPLIT_K, at most one split
    per K block (every program gets >= 1 unit: a tile's contributors are then consecutive programs, which the
    reduction counts on)."""
    return min(programs, tiles * k_blocks) if programs else tiles * max(1, min(split_k, k_blocks))


def grid_programs(config: dict, m: int, n: int, k: int) -> int | None:
    """Programs of a pingpong plan's grid for an M x N x K GEMM; None for a persistent grid (PROGRAMS: that many
    whatever the shape)."""
    if config.get("PROGRAMS"):
        return None
    tiles = _work_tiles(m, n, config.get("BLOCK_M", 128), config.get("CONSUMERS", 2))
    return _grid_size(tiles, -(-k // K_BLOCK), config.get("SPLIT_K", 1), 0)


def resident_programs(config: dict) -> int:
    """Programs of a pingpong plan resident on one SM at once: a two-consumer program holds the SM, one-consumer
    programs under maxnreg take turns two per SM (the kernel's docstring)."""
    return 2 if config.get("CONSUMERS", 2) == 1 and config.get("maxnreg") else 1


def spread_split(programs: int, tiles: int, k_blocks: int, persistent: bool, sm_count: int) -> int:
    """SPREAD for a launch of `programs` programs on `tiles` shared tiles of `k_blocks` K blocks: the split count S
    where each tile's reduction can be spread over its S contributors, else 0 (the last arrival's reduction). It needs
    an aligned split (not a persistent Stream-K grid; S divides the K blocks, so each program holds exactly one tile's
    K blocks / S), S <= _MOST_SPREAD (a chunk's S partials in flight at once) and every program resident at once while
    the others wait (P <= the SM count: one program per SM, which every plan fits)."""
    split = programs // tiles
    aligned = not persistent and programs == tiles * split and k_blocks % split == 0
    return split if aligned and 2 <= split <= _MOST_SPREAD and programs <= sm_count else 0


def _pingpong_launch(plan, in_features: int, group_size: int, symmetric: bool) -> _PingpongLaunch:
    key = ("pingpong", in_features, group_size, symmetric)
    prepared = plan.launches.get(key)
    if prepared is None:
        cfg = plan.config
        consumers = cfg.get("CONSUMERS", 2)
        if consumers not in (1, 2):
            raise ValueError(f"config CONSUMERS must be 1 or 2 (64 weight rows each per program), got {consumers!r}")
        programs = cfg.get("PROGRAMS", 0)
        if not isinstance(programs, int) or programs < 0 or (programs and cfg.get("SPLIT_K", 1) != 1):
            raise ValueError(f"config PROGRAMS must be a positive int (a persistent grid) and then SPLIT_K 1, got {cfg!r}")
        block_m = cfg.get("BLOCK_M", 128)
        if block_m not in (64, 128, 256):  # the shared-tile reductions sum 64 / 32 tokens at a time
            raise ValueError(f"config BLOCK_M must be 64, 128 or 256 for path 'pingpong', got {block_m!r}")
        constexprs = dict(BLOCK_M=block_m, STAGES=cfg.get("num_stages", 4), CONSUMERS=consumers,
                          UNPACK_AHEAD=cfg.get("UNPACK_AHEAD", False), WORDS_TMA=cfg.get("WORDS_TMA", False),
                          **_format_constexprs(group_size, in_features, symmetric))
        prepared = plan.launches[key] = _PingpongLaunch(block_m, cfg.get("SPLIT_K", 1), programs, consumers, constexprs,
                                                        _compile_options(cfg.get("maxnreg")), {})
    return prepared


def _format_constexprs(group_size: int, in_features: int, symmetric: bool) -> dict:
    """The kernel's constexprs of a weight format: SYMMETRIC, and a K block's scale groups (GROUPS groups in a block,
    or BLOCKS_PER_GROUP blocks per group, 0 for per-channel: `layout.groups_per_block`, `layout.blocks_per_group`)."""
    return dict(SYMMETRIC=symmetric, GROUPS=groups_per_block(group_size, in_features),
                BLOCKS_PER_GROUP=blocks_per_group(group_size, in_features))


def _compile_options(maxnreg: int | None) -> dict:
    """The kernel's compile options: the package's, one warpgroup per partition's default, the plan's register cap."""
    return {**COMPILE_OPTIONS, "num_warps": 4, **({"maxnreg": maxnreg} if maxnreg else {})}


def launch_pingpong(x2, qweight, scales, zeros, in_features: int, group_size: int, plan, out=None) -> torch.Tensor:
    """y = x2 @ W by `_pingpong_kernel` with the plan's (a dispatch.Plan) BLOCK_M (64, 128 or 256), num_stages (ring
    depth), SPLIT_K or PROGRAMS, CONSUMERS, UNPACK_AHEAD and maxnreg. x2 [M, K] is copied first when TMA cannot read it
    in place."""
    return _launch_pingpong(x2, qweight, scales, zeros, in_features, group_size, plan, out, keep=False)[0]


def launch_pingpong_kept(x2, qweight, scales, zeros, in_features: int, group_size: int, plan) -> tuple[torch.Tensor, RepeatLaunch | None]:
    """`launch_pingpong`, and the launch kept as a `launch.RepeatLaunch` that makes the descriptors per call (None where
    Triton's fast launch path does not apply: see `PreparedLaunch.bind`)."""
    return _launch_pingpong(x2, qweight, scales, zeros, in_features, group_size, plan, None, keep=True)


_REPEAT_SLOTS = tuple(_TENSOR_ARGS.index(name) for name in ("qw_ptr", "s_ptr", "z_ptr", "y_ptr"))  # (x: its descriptor)


def _launch_pingpong(x2, qweight, scales, zeros, in_features: int, group_size: int, plan, out, keep: bool):
    if not available(x2.device):
        raise RuntimeError(f"w4a16: path 'pingpong' needs Gluon (Triton >= 3.5) and an NVIDIA sm_90 GPU; x is on {x2.device}")
    run = _pingpong_launch(plan, in_features, group_size, zeros is None)
    m, k = x2.shape
    n = scales.shape[1]
    if x2.data_ptr() % 16 or x2.stride(0) % 8 or x2.stride(1) != 1:
        x2 = x2.contiguous() if not x2.is_contiguous() else x2.clone()
    y = torch.empty((m, n), device=x2.device, dtype=x2.dtype) if out is None else out
    k_blocks = -(-k // K_BLOCK)
    tiles = _work_tiles(m, n, run.block_m, run.consumers)
    programs = _grid_size(tiles, k_blocks, run.split_k, run.programs)
    if tiles * k_blocks >= 2**31:
        raise ValueError(f"pingpong work list too long for int32 unit indices: M={m}, N={n}, K={k}")
    # (with programs == tiles every program stores its own whole tile: no partials, no counters, but the kernel still
    # takes an fp32 and an int32 pointer)
    shared = programs != tiles
    spread = spread_split(programs, tiles, k_blocks, bool(run.programs), _sm_count(x2.device)) if shared else 0
    partials = programs * 2 * 64 * run.consumers * run.block_m if shared else 0  # part [P, 2, CONSUMERS, 64, BLOCK_M]
    if partials >= 2**31:
        raise ValueError(f"pingpong partial workspace too large for int32 offsets: {programs} programs of BLOCK_M={run.block_m}")
    stream = current_stream(x2.device)
    part, lock = split_k_scratch(x2.device, stream, tiles * run.consumers if shared else 0, partials)
    tensors = (qweight, scales, scales if zeros is None else zeros, y, part, lock)
    ints, descriptors, kernel = (m, n, k, group_size, y.stride(0)), run.descriptors(x2, qweight), run.kernel(shared, spread)
    kernel((programs,), tensors, ints, stream, descriptors)
    bound = kernel.bind((programs,), tensors, ints, stream, _REPEAT_SLOTS, descriptors) if keep else None
    if bound is None:
        return y, None
    # (the workspace stays bound even with whole tiles, where the kernel does not read it: the launch then goes stale
    # with it rather than keep a replaced one alive)
    return y, RepeatLaunch(bound, (m, n), y.dtype, y.device, workspace_entry(x2.device, stream), part, run.descriptors)


def compile_for_sm90(dtype: torch.dtype = torch.float16, block_m: int = 128, stages: int = 4, symmetric: bool = False,
                     zeros_dtype: torch.dtype = torch.uint8, scales_dtype: torch.dtype | None = None, group_size: int = 128,
                     in_features: int = 4096, consumers: int = 2, maxnreg: int | None = None, shared_tiles: bool = True,
                     unpack_ahead: bool = False, spread: int = 0, words_tma: bool = False):
    """Compile `_pingpong_kernel` for sm_90 without a GPU (CI runs this: Gluon API changes between Triton releases
    surface here), with the format's constexprs a launch would take (`_format_constexprs`). Returns Triton's compiled
    kernel (asm: ttgir, ptx, cubin)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    types = TRITON_TYPE_NAMES
    desc_kind, _ = native_specialize_impl(CUDABackend, _x_descriptor(torch.empty(block_m, 256, dtype=dtype), block_m), False, True, True)
    signature = {"x_desc": desc_kind, "qw_ptr": "*i32", "s_ptr": f"*{types[scales_dtype or dtype]}",
                 "z_ptr": f"*{types[(scales_dtype or dtype) if symmetric else zeros_dtype]}",
                 "y_ptr": f"*{types[dtype]}", "part_ptr": "*fp32", "lock_ptr": "*i32",
                 "M": "i32", "N": "i32", "K": "i32", "group_size": "i32", "stride_ym": "i32"}
    constexprs = {"BLOCK_M": block_m, "STAGES": stages, "CONSUMERS": consumers, "SHARED_TILES": shared_tiles,
                  "UNPACK_AHEAD": unpack_ahead, "SPREAD": spread, "WORDS_TMA": words_tma,
                  **_format_constexprs(group_size, in_features, symmetric)}
    if words_tma:
        signature["w_desc"], _ = native_specialize_impl(CUDABackend, _w_descriptor(torch.empty(2, 2, 64, 16, dtype=torch.int32)), False,
                                                        True, True)
    else:
        constexprs["w_desc"] = None
    return compile_gluon_for_sm90(_pingpong_kernel, signature, constexprs,
                                  ("qw_ptr", "s_ptr", "z_ptr", "y_ptr", "part_ptr", "lock_ptr", "N", "K"), _compile_options(maxnreg))
