"""Triton W4A16 kernels and their launchers.

All kernels read the kernel-native weight layout of `layout.py`:

    qweight int32 [Np/64, Kp/128, 64, 16]  4 KB tiles: qweight[n // 64, b, n % 64, 2p + h] holds at
                             nibble r = q + 4t the code of row k = b*128 + 16*(4h + q) + 2p + t of
                             output row n (padding rows and columns hold code 0): see layout.py.
    scales  [K/G, N]         fp16 / bf16 / fp32, contiguous.
    zeros   [K/G, N]         same dtype rules, or uint8 (integer zero points), or absent (SYMMETRIC: zero 8).
    x       [M, K]           fp16 or bf16, unit stride along K; y [M, N] in x's dtype, unit stride along N.

Codes become floats in registers by the "magic number" unpack of dequant.py: the nibble OR-ed into the
mantissa of a float whose integer part is C (fp16 1024.0 = 0x6400 or bf16 128.0 = 0x4300 for the
tensor-core kernels, fp32 2**23 for the CUDA-core kernel) gives c = C + q with no integer-to-float
conversion. Scale and zero are then
applied in one of two ways (the tensor-core kernels' SCALE_IN_OPERAND, chosen per shape by the tuned
table):
- fold: within one group g of rows and one column n,
      y[m, n] += s[g, n] * (sum_k x[m, k] * c[k, n]  -  (z[g, n] + C) * sum_k x[m, k]),
  the dot on C + q being exact per product with fp32 accumulation (any zero exact); with one group
  spanning K (per-channel) the dots chain over the blocks and the fold runs once per tile;
- scale in operand: the MMA operand is (q - z) * s, computed on pairs with packed sub + fma and
  rounded once to x's dtype, so the accumulator needs no per-group work.

Kernels:
- `_w4a16_tc_kernel`: tensor cores, operands swapped (y^T = W x^T) so the weight tile [BLOCK_N, 128]
  is the wide MMA side and tokens the narrow side; optional split-K over the 128-row blocks.
  With SPLIT_K = 1 it is the tiled kernel for mid-size M.
- `_w4a16_streamk_kernel`: the same loop (`_tile_accumulate`) on a persistent grid that splits the
  (tile, K block) work list evenly over its programs (Stream-K), reducing shared tiles like split-K.
- `_w4a16_gemv_kernel`: CUDA cores (fp32 FMA) for tiny M, split-K (the H200 table does not pick it;
  `benchmarks/tune.py` considers it for M <= 2 on every GPU).
- `_dequantize_kernel`: writes the fp16/bf16 weight [N, K] for the dense (cuBLAS) prefill path.
Act-order weights take x already permuted (gather.py); on sm_90+ the GEMM may follow that gather as a programmatic
dependent (tuned option GATHER_PDL: it waits for the gather's writes before loading x). A call's `pdl` (plan option
PDL, sm_90+) makes the tensor-core kernels a programmatic dependent of whatever kernel ran before (they wait for it
before any load) that releases the kernel after it at once.

Scales and zeros of the scale-in-operand loop: plain loads one block ahead (their [BLOCK_N] vectors then cross
shared memory into the operand's register layout, block-wide barriers each block), or with the tuned option
STREAM_PARAMS loaded for each block as the 32-bit words holding them, which Triton's pipeliner streams with the
weights and reads back in that layout (`_load_elements`; needs N % 4 == 0 and 4-byte aligned scales / zeros,
else the plan runs without it).

Split-K reduction: each split writes its fp32 partial tile to a workspace; a per-tile arrival counter
(atomic) elects the last split, which sums the partials in split order (deterministic) and writes y,
then resets the counter to zero (so `launch.split_k_scratch` can hand the same counters to the next call).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .dequant import MAGIC_PAIR, MAGIC_VALUE, concat_slices, operand_part, pack_pair, row_of, uint_as_float, unpack_slices
from .dispatch import Plan
from .launch import (COMPILE_OPTIONS, PreparedLaunch, RepeatLaunch, current_stream, programmatic_dependence, split_k_scratch,
                     workspace_entry)
from .layout import K_BLOCK, N_TILE, groups_per_block

__all__ = ["launch_gemm", "launch_gemm_kept", "dequantize_native"]

_TL_DTYPE = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
_N_TILE = tl.constexpr(N_TILE)  # output rows per stored weight tile (layout.py)
_TILE_WORDS = tl.constexpr(N_TILE * K_BLOCK // 8)  # words per (tile, K block): 64 x 16


# --------------------------------------------------------------------------------------------------
# Device helpers: loads, the split-K reduction, the main loop (dequantization: dequant.py)
# --------------------------------------------------------------------------------------------------


@triton.jit
def _load_elements(ptr, index, mask, other, BY_WORDS: tl.constexpr):
    """ptr[index] (`other` where masked off; by words: 0). BY_WORDS: each element read as the aligned 32-bit word
    that holds it, its bits then shifted out (ptr 4-byte aligned; `index` >= 0). Why: Triton's software
    pipeliner streams a load of 32-bit elements with asynchronous copies and reads it back from shared memory
    straight in the register layout its user wants, but leaves a vector of 8- or 16-bit elements (a [BLOCK_N]
    of scales or zeros) a plain load whose layout conversion costs shared-memory round trips and block-wide
    barriers every block (NOTES v22)."""
    if BY_WORDS:
        T: tl.constexpr = ptr.dtype.element_ty
        BITS: tl.constexpr = T.primitive_bitwidth
        PER_WORD: tl.constexpr = 32 // BITS
        words = tl.load(ptr.to(tl.pointer_type(tl.uint32), bitcast=True) + index // PER_WORD, mask=mask, other=0)
        # (if / else, not an early return: Triton 3.6 compiles the statements after a constexpr branch's return)
        if PER_WORD == 1:
            value = words.to(T, bitcast=True)
        else:
            BITS_TYPE: tl.constexpr = tl.uint8 if BITS == 8 else tl.uint16
            value = (words >> ((index % PER_WORD) * BITS).to(tl.uint32)).to(BITS_TYPE).to(T, bitcast=True)
    else:
        value = tl.load(ptr + index, mask=mask, other=other)
    return value


@triton.jit
def _load_group_params(s_ptr, z_ptr, g, num_groups, offs_n, n_mask, N, MAGIC_VALUE: tl.constexpr, SYMMETRIC: tl.constexpr,
                       BY_WORDS: tl.constexpr = False):
    """Scale s and shifted zero (z + MAGIC_VALUE) of group(s) g for columns offs_n, as fp32 in the
    broadcast shape of g and offs_n ([BLOCK_N] for a scalar g; the GEMV passes [1, 16, 1] groups).
    BY_WORDS: loaded as 32-bit words (`_load_elements`; N a multiple of 4, s / z 4-byte aligned).

    Groups past the end (padding rows of the last 128-row block) get s = 0, so they add nothing.
    """
    valid = n_mask & ((offs_n * 0 + g) < num_groups)
    # (group g's row pointer first, then the columns: the address arithmetic the shipped plans were timed with)
    s = _load_elements(s_ptr + g * N, offs_n, valid, 0.0, BY_WORDS).to(tl.float32)
    if SYMMETRIC:
        zz = tl.zeros_like(s) + (8.0 + MAGIC_VALUE)
    elif z_ptr.dtype.element_ty == tl.uint8:  # integer zeros (layout.py)
        zz = uint_as_float(_load_elements(z_ptr + g * N, offs_n, valid, 0, BY_WORDS).to(tl.uint32), MAGIC_VALUE)
    else:
        zz = _load_elements(z_ptr + g * N, offs_n, valid, 0.0, BY_WORDS).to(tl.float32) + MAGIC_VALUE
    return s, zz


@triton.jit
def _param_words(s_ptr, z_ptr, offs_n):
    """The loop-invariant half of `_word_pairs_by_prmt`: pointers to the 32-bit words of group 0 that hold rows
    offs_n's scale (two per word) and zero (four per word), and the prmt selectors that pick each row's half /
    byte out of them."""
    s_words = s_ptr.to(tl.pointer_type(tl.uint32), bitcast=True) + (offs_n >> 1)
    z_words = z_ptr.to(tl.pointer_type(tl.uint32), bitcast=True) + (offs_n >> 2)
    s_select = ((offs_n & 1) * 0x2222 + 0x1010).to(tl.uint32)  # half h of the word in both halves
    byte = (offs_n & 3).to(tl.uint32)
    z_select = byte | (byte << 8) | 0x4040  # bytes (z, magic, z, magic); selector 4 = byte 0 of the second operand
    return s_words, z_words, s_select, z_select


@triton.jit
def _word_pairs_by_prmt(param_words, g, num_groups, n_mask, N, MAGIC_PAIR: tl.constexpr, SYMMETRIC: tl.constexpr):
    """(s, R), or (s,) when SYMMETRIC, of group g as the packed 16-bit pairs `dequantize_pairs` takes, each
    [BLOCK_N, 1], from the 32-bit words holding them (`_param_words`; N a multiple of 4; scales in x's dtype,
    zeros uint8 or none), one prmt per value: s = the scale's half of its word in both halves; R = C + z = the
    magic number's high byte over the zero's byte in both halves (exact: zero codes < 128). Inline asm (NVIDIA);
    elsewhere `_load_operand_params` computes the same through `_load_group_params(..., BY_WORDS=True)`."""
    s_words, z_words, s_select, z_select = param_words
    valid = n_mask & ((s_select * 0 + g) < num_groups)
    s_word = tl.load(s_words + g * (N >> 1), mask=valid, other=0)
    s2 = tl.inline_asm_elementwise("prmt.b32 $0, $1, $1, $2;", "=r,r,r", [s_word, s_select], dtype=tl.uint32,
                                   is_pure=True, pack=1)
    pairs = (s2[:, None],)
    if not SYMMETRIC:
        z_word = tl.load(z_words + g * (N >> 2), mask=valid, other=0)
        MAGIC_HIGH: tl.constexpr = (MAGIC_PAIR >> 8) & 0xFF
        r2 = tl.inline_asm_elementwise(f"{{ .reg .b32 m; mov.b32 m, {MAGIC_HIGH}; prmt.b32 $0, $1, m, $2; }}", "=r,r,r",
                                       [z_word, z_select], dtype=tl.uint32, is_pure=True, pack=1)
        pairs = pairs + (r2[:, None],)
    return pairs


@triton.jit
def _weight_words_ptrs(qw_ptr, offs_n, K):
    """Pointers [BLOCK_N, 16] to the words of K block 0 of output rows offs_n; block b is
    `+ b * _TILE_WORDS`. Tile t of block b starts at word (t * blocks + b) * 1024 (layout.py)."""
    blocks = tl.cdiv(K, 128)
    tile_rows = (offs_n // _N_TILE)[:, None].to(tl.int64) * (blocks * _TILE_WORDS)
    return qw_ptr + tile_rows + (offs_n % _N_TILE)[:, None] * 16 + tl.arange(0, 16)[None, :]


@triton.jit
def _store_output(acc, y_ptr, part_ptr, lock_ptr, offs_n, offs_m, n_mask, m_mask, M, N, stride_ym, SPLIT_K, IS_SPLIT: tl.constexpr):
    """Write acc [BLOCK_N, BLOCK_M] (fp32, y^T tile) to y, reducing over split-K programs if needed."""
    y_ptrs = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None]
    mask = n_mask[:, None] & m_mask[None, :]
    if not IS_SPLIT:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        pid_k = tl.program_id(2)
        tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
        part_ptrs = part_ptr + offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
        # part [SPLIT_K, M, N]; < 2**31 elements: checked by the launcher
        if _publish_partial(acc, part_ptrs + pid_k * M * N, mask, lock_ptr + tile) == SPLIT_K - 1:
            total = tl.zeros_like(acc)
            for split in range(SPLIT_K):
                total += tl.load(part_ptrs + split * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            _finish_tile(total, y_ptrs, mask, lock_ptr + tile)


@triton.jit
def _publish_partial(acc, part_ptrs, mask, counter_ptr):
    """Store this program's fp32 partial tile and count its arrival; returns the count before it
    (so the program that gets contributors - 1 is the last and does the reduction)."""
    tl.store(part_ptrs, acc, mask=mask)
    # Every thread's partial must be written before the counter says so (CTA barrier, then a
    # release at GPU scope); the last arrival then reads all partials from L2 (.cg loads).
    tl.debug_barrier()
    return tl.atomic_add(counter_ptr, 1, sem="acq_rel")


@triton.jit
def _finish_tile(total, y_ptrs, mask, counter_ptr):
    """The last arrival's part: write the reduced tile and reset the counter for the next launch."""
    tl.store(y_ptrs, total.to(y_ptrs.dtype.element_ty), mask=mask)
    # relaxed: the next launch is ordered by the kernel boundary, and no program of this one touches the counter
    # again (all have arrived); the default (acq_rel) would first wait for the y store to complete (MEMBAR)
    tl.atomic_xchg(counter_ptr, 0, sem="relaxed")


@triton.jit
def _load_x_rows(x_rows, offs_k, K, m_mask, EVEN_K: tl.constexpr, CACHE: tl.constexpr, valid):
    """x^T rows offs_k as a [rows, BLOCK_M] tile (zeros where not `valid`); x_rows = the [1, BLOCK_M]
    row pointers of x. Without a K mask (EVEN_K) the load is vectorised along K, so the software
    pipeliner can stream it with asynchronous copies. (A gather here, x[:, perm[k]] for act-order,
    made these loads synchronous and the kernel 2-7x slower on the H200: act-order permutes x first.)"""
    mask = m_mask[None, :] & ((offs_k[:, None] * 0 + valid) != 0)
    if not EVEN_K:
        mask = mask & (offs_k[:, None] < K)
    return tl.load(x_rows + offs_k[:, None], mask=mask, other=0.0, cache_modifier=CACHE)


@triton.jit
def _chained_part_dots(acc, words, params, x_rows, k_first, K, m_mask, FIRST: tl.constexpr, SLICES: tl.constexpr,
                       PARTS: tl.constexpr, DEQUANTIZE: tl.constexpr, MAGIC_PAIR: tl.constexpr, MAGIC_VALUE: tl.constexpr,
                       USE_ASM: tl.constexpr, FOLD_SUBS: tl.constexpr, XT_DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr,
                       BLOCK_N: tl.constexpr, EVEN_K: tl.constexpr):
    """acc + (slices FIRST .. FIRST + SLICES - 1 of the word tile) . x^T[k_first : k_first + 16 * SLICES] as PARTS
    chained dots (DOT_PARTS), each part's operand built right before its dot: ptxas can then unpack part p + 1
    while part p's MMAs run, and fewer operand registers are live at once."""
    PART_SLICES: tl.constexpr = SLICES // PARTS
    offs_k = tl.arange(0, 16 * PART_SLICES)
    for p in tl.static_range(PARTS):
        a = operand_part(words, params, FIRST + p * PART_SLICES, PART_SLICES, DEQUANTIZE, MAGIC_PAIR, MAGIC_VALUE, USE_ASM,
                          FOLD_SUBS, XT_DTYPE, DOT_DTYPE, BLOCK_N)
        xt = _load_x_rows(x_rows, k_first + p * 16 * PART_SLICES + offs_k, K, m_mask, EVEN_K, "", True)
        acc = tl.dot(a, xt.to(DOT_DTYPE), acc, out_dtype=tl.float32)
    return acc


@triton.jit
def _load_fold_inputs(x_rows, x_first, s_ptr, z_ptr, block, block_end, K, N, num_groups, GROUP_SIZE: tl.constexpr, offs_n,
                      n_mask, m_mask, offs_fold, FOLD_SUBS: tl.constexpr, MAGIC_VALUE: tl.constexpr, SYMMETRIC: tl.constexpr,
                      EVEN_K: tl.constexpr, ONE_TOKEN: tl.constexpr):
    """For each scale fold of `block`: the x^T tile (for its column sums), s and z + MAGIC_VALUE.

    Tuples of 8 / FOLD_SUBS entries. Past the split's last block everything is masked off. The x^T
    load carries a distinct cache modifier so it is never merged with the dot operand's load of the
    same tile (that one must stay a pure dot operand to be streamed asynchronously). With ONE_TOKEN
    (M = 1) only the fold's rows of x's first row are loaded (x_first: its pointer), a vector whose sum
    is a scalar that needs no layout conversion.
    """
    FOLD_ROWS: tl.constexpr = 16 * FOLD_SUBS
    in_range = (offs_n * 0 + block) < block_end
    x_tiles = ()
    scales = ()
    zeros = ()
    for f in tl.static_range(8 // FOLD_SUBS):
        k0 = block * 128 + f * FOLD_ROWS
        if ONE_TOKEN:
            rows = k0 + offs_fold
            mask = (rows * 0 + block) < block_end
            if not EVEN_K:
                mask = mask & (rows < K)
            x_tiles = x_tiles + (tl.load(x_first + rows, mask=mask, other=0.0, cache_modifier=".ca"),)
        else:
            x_tiles = x_tiles + (_load_x_rows(x_rows, k0 + offs_fold, K, m_mask, EVEN_K, ".ca", block < block_end),)
        s, zz = _load_group_params(s_ptr, z_ptr, k0 // GROUP_SIZE, num_groups, offs_n, n_mask & in_range, N, MAGIC_VALUE, SYMMETRIC)
        scales = scales + (s,)
        zeros = zeros + (zz,)
    return x_tiles, scales, zeros


@triton.jit
def _gather_x_block(x_ptrs, block, block_end, K, offs_w, x_mask, EVEN_K: tl.constexpr):
    """x values [1, 16, BLOCK_M] (fp32) for the 8 nibbles of each word column of `block`, as a tuple."""
    xs = ()
    for r in tl.static_range(8):
        rows = block * 128 + row_of(offs_w, r)  # [16]
        mask = x_mask & ((rows[None, :, None] * 0 + block) < block_end)
        if not EVEN_K:
            mask = mask & (rows[None, :, None] < K)
        xs = xs + (tl.load(x_ptrs + rows[None, :, None], mask=mask, other=0.0).to(tl.float32),)
    return xs


@triton.jit
def _split_range(num_blocks, SPLIT_K):
    """The 128-row blocks [start, end) of K handled by this split-K program."""
    per_split = tl.cdiv(num_blocks, SPLIT_K)
    start = tl.program_id(2) * per_split
    end = tl.minimum(start + per_split, num_blocks)
    return start, end


# --------------------------------------------------------------------------------------------------
# Tensor-core kernel (split-K decode and tiled mid-size M)
# --------------------------------------------------------------------------------------------------


@triton.jit
def _load_operand_params(s_ptr, z_ptr, block, block_end, num_groups, offs_n, n_mask, N, GROUP_SIZE: tl.constexpr,
                         FOLD_SUBS: tl.constexpr, SYMMETRIC: tl.constexpr, MAGIC_VALUE: tl.constexpr, XT_DTYPE: tl.constexpr,
                         USE_ASM: tl.constexpr, STREAMED: tl.constexpr = False, MAGIC_PAIR: tl.constexpr = 0,
                         param_words=None):
    """For each scale fold of `block`, the parameters `dequantize_pairs` takes: (s, R, residual) for float
    zeros, (s, R) for integer (uint8) zeros, (s,) for symmetric weights (their zero is a constant of
    the dequantization).

    s is the scale rounded to XT_DTYPE, R = C + z rounded to XT_DTYPE (exact for integer zeros),
    residual = -(C + z - R) * s (a fractional zero's fraction; 0 for integer-valued float zeros).
    Each is [BLOCK_N, 1]: packed pairs (uint32) with USE_ASM, fp32 values otherwise. STREAMED: loaded as 32-bit
    words (`_load_elements`), by prmt from `param_words` (`_param_words`) where `_word_pairs_by_prmt` applies.
    """
    FOLD_ROWS: tl.constexpr = 16 * FOLD_SUBS
    INTEGER_ZEROS: tl.constexpr = z_ptr.dtype.element_ty == tl.uint8  # uint8 zeros are integers (layout.py)
    in_range = (offs_n * 0 + block) < block_end
    params = ()
    PRMT: tl.constexpr = STREAMED and USE_ASM and s_ptr.dtype.element_ty == XT_DTYPE and (SYMMETRIC or INTEGER_ZEROS)
    for f in tl.static_range(8 // FOLD_SUBS):
        g = (block * 128 + f * FOLD_ROWS) // GROUP_SIZE
        if PRMT:
            params = params + (_word_pairs_by_prmt(param_words, g, num_groups, n_mask, N, MAGIC_PAIR, SYMMETRIC),)
        else:
            s, zz = _load_group_params(s_ptr, z_ptr, g, num_groups, offs_n, n_mask & in_range, N, MAGIC_VALUE, SYMMETRIC,
                                       STREAMED)
            s = s.to(XT_DTYPE)
            values = (s,)
            if not SYMMETRIC:
                shifted_zero = zz.to(XT_DTYPE)
                values = values + (shifted_zero,)
                if not INTEGER_ZEROS:
                    values = values + ((-(zz - shifted_zero.to(tl.float32)) * s.to(tl.float32)).to(XT_DTYPE),)  # residual
            fold_params = ()
            for i in tl.static_range(len(values)):  # packed pairs for the asm, fp32 for the twin; [BLOCK_N, 1]
                fold_params = fold_params + ((pack_pair(values[i], XT_DTYPE) if USE_ASM else values[i].to(tl.float32))[:, None],)
            params = params + (fold_params,)
    return params


@triton.jit
def _tile_accumulate(
    x_ptr, qw_ptr, s_ptr, z_ptr, tile_n, tile_m, block_start, block_end, M, N, K, num_groups, stride_xm,
    GROUP_SIZE: tl.constexpr, FOLD_SUBS: tl.constexpr, SYMMETRIC: tl.constexpr, SCALE_IN_OPERAND: tl.constexpr,
    MAGIC_PAIR: tl.constexpr, MAGIC_VALUE: tl.constexpr, USE_ASM: tl.constexpr, DOT_DTYPE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, EVEN_K: tl.constexpr, ONE_TOKEN: tl.constexpr,
    PER_CHANNEL: tl.constexpr, DOT_PARTS: tl.constexpr, STREAM_PARAMS: tl.constexpr,
):
    """The fp32 y^T tile (tile_n, tile_m) [BLOCK_N, BLOCK_M] summed over the 128-row blocks
    [block_start, block_end) of K, with its offsets and masks: the loop both tensor-core kernels run.
    ONE_TOKEN (M = 1, fold only): the fold's x sums come from x's first row alone (columns >= M of
    the tile then hold values that are never stored). DOT_PARTS > 1: each dot (the block's, or a scale
    fold's) as chained dots over at most 128 / DOT_PARTS rows, operands built part by part. PER_CHANNEL
    (one group spanning K, fold only): the fold runs once after the loop instead of once per block."""
    offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_mask = offs_n < N
    m_mask = offs_m < M
    FOLD_ROWS: tl.constexpr = 16 * FOLD_SUBS
    X_ROWS: tl.constexpr = 128 if SCALE_IN_OPERAND else FOLD_ROWS  # x^T rows per dot (with DOT_PARTS = 1)
    # DOT_PARTS > 1: chained dots per scale fold (the whole block for scale in operand / per-channel)
    FOLD_PARTS: tl.constexpr = DOT_PARTS * FOLD_SUBS // 8 if DOT_PARTS * FOLD_SUBS >= 8 else 1
    offs_xk = tl.arange(0, X_ROWS)

    w_ptrs = _weight_words_ptrs(qw_ptr, offs_n, K)
    x_rows = x_ptr + offs_m[None, :].to(tl.int64) * stride_xm  # x^T tiles are x_rows + k[:, None]
    x_first = x_ptr + (tile_m * BLOCK_M).to(tl.int64) * stride_xm  # the tile's first row of x
    xt_dtype = x_ptr.dtype.element_ty

    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    # Side inputs (scales, zeros and, for the fold, x^T again for its column sums) are plain loads,
    # which the pipeliner does not stream: fetch them one block ahead so their latency hides behind
    # a block of unpacking and MMA instead of stalling every iteration. STREAM_PARAMS (scale in operand):
    # s and z are loaded for the block itself, as 32-bit words, which the pipeliner does stream.
    if SCALE_IN_OPERAND and STREAM_PARAMS:
        param_words = _param_words(s_ptr, z_ptr, offs_n)  # loop-invariant: s / z word pointers, prmt selectors
    elif SCALE_IN_OPERAND:
        side = _load_operand_params(s_ptr, z_ptr, block_start, block_end, num_groups, offs_n, n_mask, N,
                                    GROUP_SIZE, FOLD_SUBS, SYMMETRIC, MAGIC_VALUE, xt_dtype, USE_ASM)
    else:
        side = _load_fold_inputs(x_rows, x_first, s_ptr, z_ptr, block_start, block_end, K, N, num_groups, GROUP_SIZE, offs_n,
                                 n_mask, m_mask, offs_xk, FOLD_SUBS, MAGIC_VALUE, SYMMETRIC, EVEN_K, ONE_TOKEN)
    if PER_CHANNEL and not SCALE_IN_OPERAND:
        raw = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # sum over blocks of x . (C + q)
        if ONE_TOKEN:
            xsum_total = tl.full((), 0.0, dtype=tl.float32)
        else:
            xsum_total = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for block in range(block_start, block_end):
        # uint32 so that shifts are logical (no sign extension to mask away)
        words = tl.load(w_ptrs + block * _TILE_WORDS, mask=n_mask[:, None], other=0, eviction_policy="evict_first").to(tl.uint32, bitcast=True)
        if SCALE_IN_OPERAND:
            if STREAM_PARAMS:
                params = _load_operand_params(s_ptr, z_ptr, block, block_end, num_groups, offs_n, n_mask, N, GROUP_SIZE,
                                              FOLD_SUBS, SYMMETRIC, MAGIC_VALUE, xt_dtype, USE_ASM, True, MAGIC_PAIR, param_words)
            else:
                params = side
                side = _load_operand_params(s_ptr, z_ptr, block + 1, block_end, num_groups, offs_n, n_mask, N,
                                            GROUP_SIZE, FOLD_SUBS, SYMMETRIC, MAGIC_VALUE, xt_dtype, USE_ASM)
            # DOT_PARTS = 1 keeps the all-slices-first form here and below: the shipped entries were timed
            # with its sm_90 schedule (through _chained_part_dots five of them schedule differently, NOTES v10)
            if DOT_PARTS == 1:
                weights = unpack_slices(words, params, MAGIC_PAIR, MAGIC_VALUE, USE_ASM, True, FOLD_SUBS, xt_dtype, DOT_DTYPE, BLOCK_N)
                xt = _load_x_rows(x_rows, block * 128 + offs_xk, K, m_mask, EVEN_K, "", True)
                acc = tl.dot(concat_slices(weights, 0, 8), xt.to(DOT_DTYPE), acc, out_dtype=tl.float32)
            else:
                acc = _chained_part_dots(acc, words, params, x_rows, block * 128, K, m_mask, 0, 8, DOT_PARTS, True, MAGIC_PAIR,
                                         MAGIC_VALUE, USE_ASM, FOLD_SUBS, xt_dtype, DOT_DTYPE, BLOCK_N, EVEN_K)
        elif PER_CHANNEL:
            # One group spans K: chain the raw dots (nothing between the MMAs, as with SCALE_IN_OPERAND)
            # and the x sums over the blocks; the fold runs once, after the loop.
            x_again = side[0][0]
            side = _load_fold_inputs(x_rows, x_first, s_ptr, z_ptr, block + 1, block_end, K, N, num_groups, GROUP_SIZE, offs_n,
                                     n_mask, m_mask, offs_xk, FOLD_SUBS, MAGIC_VALUE, SYMMETRIC, EVEN_K, ONE_TOKEN)
            if DOT_PARTS == 1:
                slices = unpack_slices(words, (), MAGIC_PAIR, MAGIC_VALUE, USE_ASM, False, FOLD_SUBS, xt_dtype, DOT_DTYPE, BLOCK_N)
                xt = _load_x_rows(x_rows, block * 128 + offs_xk, K, m_mask, EVEN_K, "", True)
                raw = tl.dot(concat_slices(slices, 0, 8), xt.to(DOT_DTYPE), raw, out_dtype=tl.float32)
            else:
                raw = _chained_part_dots(raw, words, (), x_rows, block * 128, K, m_mask, 0, 8, DOT_PARTS, False, MAGIC_PAIR,
                                         MAGIC_VALUE, USE_ASM, FOLD_SUBS, xt_dtype, DOT_DTYPE, BLOCK_N, EVEN_K)
            xsum_total += tl.sum(x_again.to(tl.float32), axis=0)
        else:
            x_again, scales, shifted_zeros = side
            side = _load_fold_inputs(x_rows, x_first, s_ptr, z_ptr, block + 1, block_end, K, N, num_groups, GROUP_SIZE, offs_n,
                                     n_mask, m_mask, offs_xk, FOLD_SUBS, MAGIC_VALUE, SYMMETRIC, EVEN_K, ONE_TOKEN)
            if DOT_PARTS == 1:
                slices = unpack_slices(words, (), MAGIC_PAIR, MAGIC_VALUE, USE_ASM, False, FOLD_SUBS, xt_dtype, DOT_DTYPE, BLOCK_N)
            for f in tl.static_range(8 // FOLD_SUBS):
                k0 = block * 128 + f * FOLD_ROWS
                if DOT_PARTS == 1:
                    a = concat_slices(slices, f * FOLD_SUBS, FOLD_SUBS)  # [BLOCK_N, FOLD_ROWS]
                    xt = _load_x_rows(x_rows, k0 + offs_xk, K, m_mask, EVEN_K, "", True)
                    part = tl.dot(a, xt.to(DOT_DTYPE), out_dtype=tl.float32)
                else:
                    part = _chained_part_dots(tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32), words, (), x_rows, k0, K, m_mask,
                                              f * FOLD_SUBS, FOLD_SUBS, FOLD_PARTS, False, MAGIC_PAIR, MAGIC_VALUE, USE_ASM,
                                              FOLD_SUBS, xt_dtype, DOT_DTYPE, BLOCK_N, EVEN_K)
                xsum = tl.sum(x_again[f].to(tl.float32), axis=0)  # [BLOCK_M], or a scalar with ONE_TOKEN
                if not ONE_TOKEN:
                    xsum = xsum[None, :]
                s = scales[f]
                # two statements so that each becomes one FMA per element (one expression compiled to
                # FMUL + FFMA + FADD)
                acc += s[:, None] * part
                acc -= (s * shifted_zeros[f])[:, None] * xsum
    if PER_CHANNEL and not SCALE_IN_OPERAND:
        s, zz = _load_group_params(s_ptr, z_ptr, 0, num_groups, offs_n, n_mask, N, MAGIC_VALUE, SYMMETRIC)
        if not ONE_TOKEN:
            xsum_total = xsum_total[None, :]
        acc = s[:, None] * raw - (s * zz)[:, None] * xsum_total

    return acc, offs_n, offs_m, n_mask, m_mask


@triton.jit
def _w4a16_tc_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr,
    M, N, K, num_groups, stride_xm, stride_ym,
    GROUP_SIZE: tl.constexpr,
    FOLD_SUBS: tl.constexpr,  # 16-row slices per scale fold: min(G, 128) / 16 (8 for per-channel)
    SYMMETRIC: tl.constexpr, SCALE_IN_OPERAND: tl.constexpr,
    MAGIC_PAIR: tl.constexpr, MAGIC_VALUE: tl.constexpr, USE_ASM: tl.constexpr, DOT_DTYPE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT_K, IS_SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
    ONE_TOKEN: tl.constexpr,  # M == 1: the fold's x sums from one row (see _tile_accumulate)
    PER_CHANNEL: tl.constexpr,  # G == K: fold once after the loop (see _tile_accumulate)
    DOT_PARTS: tl.constexpr,  # 1, 2, 4 or 8: each dot as chained parts of <= 128 / DOT_PARTS rows
    WAIT_PRIOR: tl.constexpr,  # a programmatic dependent of the kernel before (GATHER_PDL, PDL): wait before any load
    STREAM_PARAMS: tl.constexpr,  # scale in operand: s / z loaded for each block as 32-bit words (_load_elements)
    RELEASE_DEPENDENTS: tl.constexpr,  # PDL: the next kernel may launch once every program has started
):
    """y[M, N] = x[M, K] @ W[K, N] with W in the kernel-native layout, on tensor cores.

    Grid (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M), SPLIT_K). Each program owns the y^T tile
    [BLOCK_N, BLOCK_M] (weights on the wide side of the MMA, tokens on the narrow side) and the
    128-row blocks of its split. Per block it loads the [BLOCK_N, 16] words of its rows (whole 4 KB tiles of
    qweight [ceil(N/64), ceil(K/128), 64, 16] when BLOCK_N is a multiple of 64) and unpacks them
    (`unpack_slices`: two weights per shift + and-or) into the eight 16-row slices as [BLOCK_N, 16]
    matrices of C + q, exact in DOT_DTYPE. Slices are concatenated along K (join / permute / reshape:
    register relabelling, no data movement) into one dot operand. Two ways to apply scale and zero:

    - SCALE_IN_OPERAND: each slice becomes (q - z) * s in x's dtype (two packed instructions per
      pair of weights, `dequantize_pairs`), the whole 128-row block is one dot (or DOT_PARTS chained
      dots, each part's operand unpacked right before it), and the accumulator chains from block
      to block with nothing between the MMAs (so they can run asynchronously). Integer (uint8)
      zeros take one parameter less than float zeros (see `dequantize_pairs`).
    - otherwise: one dot per scale group on the raw C + q, then the fold
      acc += s * dot - s * (z + C) * sum_k x (exact in fp32 for any zero) after every group.

    Options: PER_CHANNEL (G == K) folds once per tile after the loop; ONE_TOKEN (M == 1, fold) takes
    the x sums from x's single row; STREAM_PARAMS (scale in operand) loads s / z for each block as 32-bit
    words (N % 4 == 0, s / z 4-byte aligned: `_params_line_up`); DOT_PARTS splits every dot (the block's,
    or each scale fold's) into chained dots over at most 128 / DOT_PARTS rows, each part's operand unpacked
    right before it.
    Act-order weights take x already permuted (`gather_columns`). WAIT_PRIOR: launched as a programmatic dependent of
    the kernel before (act-order's gather, GATHER_PDL; any kernel, the call's `pdl`, PDL), nothing is loaded or stored
    before griddepcontrol.wait; RELEASE_DEPENDENTS (PDL) lets the kernel after this one launch early (it waits for
    this one in turn).

    Assumes BLOCK_M >= 16, x and y unit-stride along their last dim, qweight / scales / zeros
    contiguous (scales / zeros [K/G, N]; G divides K; num_groups = K / G is passed, not derived: derived,
    ptxas stopped interleaving the dequantization with the MMAs of the scale-in-operand loop, NOTES v9),
    MAGIC_PAIR = the magic bits of x's dtype in both 16-bit halves. The weight and x^T tiles are only
    used by the dot, which lets Triton's software pipeliner stream both with asynchronous copies.
    """
    if RELEASE_DEPENDENTS:
        gdc_launch_dependents()
    if WAIT_PRIOR:
        gdc_wait()
    block_start, block_end = _split_range(tl.cdiv(K, 128), SPLIT_K)
    acc, offs_n, offs_m, n_mask, m_mask = _tile_accumulate(
        x_ptr, qw_ptr, s_ptr, z_ptr, tl.program_id(0), tl.program_id(1), block_start, block_end, M, N, K,
        num_groups, stride_xm, GROUP_SIZE, FOLD_SUBS, SYMMETRIC, SCALE_IN_OPERAND, MAGIC_PAIR, MAGIC_VALUE, USE_ASM, DOT_DTYPE, BLOCK_N,
        BLOCK_M, EVEN_K, ONE_TOKEN, PER_CHANNEL, DOT_PARTS, STREAM_PARAMS,
    )
    _store_output(acc, y_ptr, part_ptr, lock_ptr, offs_n, offs_m, n_mask, m_mask, M, N, stride_ym, SPLIT_K, IS_SPLIT)


@triton.jit
def _w4a16_streamk_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr,
    M, N, K, num_groups, stride_xm, stride_ym,
    GROUP_SIZE: tl.constexpr, FOLD_SUBS: tl.constexpr, SYMMETRIC: tl.constexpr, SCALE_IN_OPERAND: tl.constexpr,
    MAGIC_PAIR: tl.constexpr, MAGIC_VALUE: tl.constexpr, USE_ASM: tl.constexpr, DOT_DTYPE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, EVEN_K: tl.constexpr, ONE_TOKEN: tl.constexpr,
    PER_CHANNEL: tl.constexpr, DOT_PARTS: tl.constexpr, WAIT_PRIOR: tl.constexpr, STREAM_PARAMS: tl.constexpr,
    RELEASE_DEPENDENTS: tl.constexpr,
):
    """Stream-K form of `_w4a16_tc_kernel`: a persistent grid (P,) shares the work evenly.

    The work is the list of (tile, 128-row block) units, tiles in order (n fastest) and blocks in K
    order within a tile: T = tiles * ceil(K / 128) units. Program p takes units
    [p*T // P, (p+1)*T // P), so every program streams the same number of weight blocks whatever the
    tile count (no half-empty last wave of CTAs). A tile a program covers whole is stored directly;
    a tile shared by programs first..last is reduced like split-K: each writes its fp32 partial to its
    own workspace slot (part [P, 2, BLOCK_N, BLOCK_M]: slot 0 for the segment a program starts with,
    1 for the one it ends with), bumps the tile's counter, and the last to arrive sums the partials in
    program order (deterministic), writes y and resets the counter. Assumes P <= T (no program
    without work: a tile's contributors are then the consecutive programs first..last) and T * P < 2**31.
    WAIT_PRIOR and RELEASE_DEPENDENTS as in `_w4a16_tc_kernel`.
    """
    if RELEASE_DEPENDENTS:
        gdc_launch_dependents()
    if WAIT_PRIOR:
        gdc_wait()
    kb = tl.cdiv(K, 128)
    tiles_n = tl.cdiv(N, BLOCK_N)
    total = tiles_n * tl.cdiv(M, BLOCK_M) * kb
    programs = tl.num_programs(0)
    pid = tl.program_id(0)
    start = (pid * total) // programs
    end = ((pid + 1) * total) // programs
    TILE: tl.constexpr = BLOCK_N * BLOCK_M
    unit = start
    while unit < end:
        tile = unit // kb
        block_start = unit - tile * kb
        block_end = tl.minimum(kb, block_start + (end - unit))
        acc, offs_n, offs_m, n_mask, m_mask = _tile_accumulate(
            x_ptr, qw_ptr, s_ptr, z_ptr, tile % tiles_n, tile // tiles_n, block_start, block_end, M, N, K,
            num_groups, stride_xm, GROUP_SIZE, FOLD_SUBS, SYMMETRIC, SCALE_IN_OPERAND, MAGIC_PAIR, MAGIC_VALUE, USE_ASM, DOT_DTYPE, BLOCK_N,
            BLOCK_M, EVEN_K, ONE_TOKEN, PER_CHANNEL, DOT_PARTS, STREAM_PARAMS,
        )
        y_ptrs = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None]
        mask = n_mask[:, None] & m_mask[None, :]
        if (block_start == 0) & (block_end == kb):
            tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
        else:
            local = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
            slot = (unit != start).to(tl.int32)
            first = ((tile * kb + 1) * programs - 1) // total  # the program that owns the tile's first unit
            last = ((tile + 1) * kb * programs - 1) // total  # ... and its last unit
            if _publish_partial(acc, part_ptr + (pid * 2 + slot) * TILE + local, None, lock_ptr + tile) == last - first:
                reduced = tl.zeros_like(acc)
                for q in range(first, last + 1):
                    q_slot = (((q * total) // programs) < tile * kb).to(tl.int32)  # q began before this tile
                    reduced += tl.load(part_ptr + (q * 2 + q_slot) * TILE + local, cache_modifier=".cg")
                _finish_tile(reduced, y_ptrs, mask, lock_ptr + tile)
        unit += block_end - block_start


# --------------------------------------------------------------------------------------------------
# CUDA-core kernel (M <= 4)
# --------------------------------------------------------------------------------------------------


@triton.jit
def _w4a16_gemv_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr,
    M, N, K, group_size, stride_xm, stride_ym,
    FOLD_SUBS: tl.constexpr, SYMMETRIC: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT_K, IS_SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
):
    """y[M, N] = x[M, K] @ W[K, N] on CUDA cores (fp32 FMA), for tiny M (BLOCK_M = next pow2 of M).

    Same layout, grid and split-K contract as `_w4a16_tc_kernel`. Codes are made fp32 by the magic
    number 2**23 (OR into the mantissa, subtract 2**23), so each weight costs shift, and-or, two
    subtracts (magic, zero) and one FMA per token. Everything lives in one 3-D layout
    [BLOCK_N, 16 words, BLOCK_M] (words as [BLOCK_N, 16, 1], x gathered as [1, 16, BLOCK_M]) so no
    register shuffles are needed; the word lanes are reduced once at the end. With one group per
    128-row block (G >= 128) the scale multiplies the accumulator once per block; smaller groups
    scale each weight (the two halves of a word column pair can lie in different groups).
    """
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_mask = offs_n < N
    m_mask = offs_m < M
    offs_w = tl.arange(0, 16)

    w_ptrs = _weight_words_ptrs(qw_ptr, offs_n, K)[:, :, None]
    x_ptrs = x_ptr + offs_m[None, None, :].to(tl.int64) * stride_xm
    w_mask = n_mask[:, None, None]
    x_mask = m_mask[None, None, :]
    num_groups = K // group_size

    acc3 = tl.zeros((BLOCK_N, 16, BLOCK_M), dtype=tl.float32)
    block_start, block_end = _split_range(tl.cdiv(K, 128), SPLIT_K)
    # x gathers are plain loads: fetch the next block's while this block computes.
    xs = _gather_x_block(x_ptrs, block_start, block_end, K, offs_w, x_mask, EVEN_K)
    for block in range(block_start, block_end):
        words = tl.load(w_ptrs + block * _TILE_WORDS, mask=w_mask, other=0, eviction_policy="evict_first").to(tl.uint32, bitcast=True)
        x_cur = xs
        xs = _gather_x_block(x_ptrs, block + 1, block_end, K, offs_w, x_mask, EVEN_K)
        if FOLD_SUBS == 8:
            s, zz = _load_group_params(s_ptr, z_ptr, (block * 128) // group_size, num_groups, offs_n, n_mask, N, 0.0, SYMMETRIC)
            zz3 = zz[:, None, None]
        for r in tl.static_range(8):
            # q as fp32 by the magic number. (The zero is subtracted separately: 2**23 + z would drop
            # a fractional zero's fraction.)
            codes = uint_as_float((words >> (4 * r)) & 0xF, 0.0)
            if FOLD_SUBS == 8:
                if r == 0:
                    part3 = (codes - zz3) * x_cur[r]
                else:
                    part3 += (codes - zz3) * x_cur[r]
            else:
                rows = block * 128 + row_of(offs_w, r)  # [16]
                s3, zz3 = _load_group_params(s_ptr, z_ptr, (rows // group_size)[None, :, None], num_groups, offs_n[:, None, None],
                                             n_mask[:, None, None], N, 0.0, SYMMETRIC)
                acc3 += ((codes - zz3) * s3) * x_cur[r]
        if FOLD_SUBS == 8:
            acc3 += s[:, None, None] * part3

    acc = tl.sum(acc3, axis=1)
    _store_output(acc, y_ptr, part_ptr, lock_ptr, offs_n, offs_m, n_mask, m_mask, M, N, stride_ym, SPLIT_K, IS_SPLIT)


# --------------------------------------------------------------------------------------------------
# Dequantize kernel (dense prefill path)
# --------------------------------------------------------------------------------------------------


@triton.jit
def _dequantize_kernel(
    qw_ptr, s_ptr, z_ptr, w_ptr, N, K, group_size,
    FOLD_SUBS: tl.constexpr, SYMMETRIC: tl.constexpr, MAGIC_PAIR: tl.constexpr, MAGIC_VALUE: tl.constexpr, USE_ASM: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """w[N, K] (row-major, w's dtype: fp16 or bf16) = (q - z) * s, one [BLOCK_N, 128] block per program.

    Grid (cdiv(N, BLOCK_N), cdiv(K, 128)). Same qweight / scales / zeros contract as the GEMM
    kernels; the block is unpacked like the tensor-core kernel's operand (rows in order), so each
    group's [BLOCK_N, rows] tile is stored contiguously along K.
    """
    pid_n = tl.program_id(0)
    block = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    num_groups = K // group_size
    w_dtype = w_ptr.dtype.element_ty
    words = tl.load(_weight_words_ptrs(qw_ptr, offs_n, K) + block * _TILE_WORDS, mask=n_mask[:, None], other=0).to(tl.uint32, bitcast=True)
    slices = unpack_slices(words, (), MAGIC_PAIR, MAGIC_VALUE, USE_ASM, False, FOLD_SUBS, w_dtype, w_dtype, BLOCK_N)
    FOLD_ROWS: tl.constexpr = 16 * FOLD_SUBS
    for f in tl.static_range(8 // FOLD_SUBS):
        k0 = block * 128 + f * FOLD_ROWS
        s, zz = _load_group_params(s_ptr, z_ptr, k0 // group_size, num_groups, offs_n, n_mask, N, MAGIC_VALUE, SYMMETRIC)
        w = (concat_slices(slices, f * FOLD_SUBS, FOLD_SUBS).to(tl.float32) - zz[:, None]) * s[:, None]
        offs_k = k0 + tl.arange(0, FOLD_ROWS)
        tl.store(w_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :], w.to(w_dtype), mask=n_mask[:, None] & (offs_k[None, :] < K))


# --------------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------------

def _use_asm(device_type: str) -> bool:
    """PTX inline assembly only on NVIDIA GPUs (not on AMD, not in Triton's CPU interpreter)."""
    return device_type == "cuda" and torch.version.hip is None


def _fold_subs(group_size: int, in_features: int) -> int:
    """16-row slices per scale fold: one fold per group, at most one per 128-row block."""
    return K_BLOCK // 16 // groups_per_block(group_size, in_features)


@dataclass(frozen=True)
class _MatmulLaunch:
    """What one plan needs at launch time, made once per (plan, format): the kernel prepared with
    its constexprs and options, the tiling that sets the grid and the split-K scratch, and the values
    of the kernel's int arguments that do not depend on the call (after M, N, K, stride_xm, stride_ym)."""

    path: str
    block_n: int
    block_m: int
    split_k: int
    programs: int  # Stream-K programs (0 for the other paths)
    kernel: PreparedLaunch
    fixed_ints: tuple


_TENSOR_ARGS = ("x_ptr", "qw_ptr", "s_ptr", "z_ptr", "y_ptr", "part_ptr", "lock_ptr")
_CALL_INTS = ("M", "N", "K", "stride_xm", "stride_ym")  # the int arguments every matmul kernel takes per call


def _matmul_launch(plan: Plan, dtype: torch.dtype, device_type: str, symmetric: bool, in_features: int, group_size: int,
                   one_token: bool, stream_params: bool) -> _MatmulLaunch:
    """The prepared launch of `plan` for this format (and ONE_TOKEN / STREAM_PARAMS used or not), kept in
    `plan.launches` (a forced plan, made afresh per call by tests and benchmarks, is prepared afresh too)."""
    fmt = (dtype, device_type, symmetric, in_features, group_size, one_token, stream_params)
    prepared = plan.launches.get(fmt)
    if prepared is None:
        prepared = plan.launches[fmt] = _prepare_matmul_launch(plan, *fmt)
    return prepared


def _prepare_matmul_launch(plan: Plan, dtype, device_type, symmetric, in_features, group_size, one_token,
                           stream_params) -> _MatmulLaunch:
    cfg = plan.config
    # a programmatic dependent of act-order's gather (GATHER_PDL), or with the call's `pdl` (PDL) of any kernel
    wait_prior, release_dependents = programmatic_dependence(cfg)
    block_n, block_m, split_k = cfg["BLOCK_N"], cfg["BLOCK_M"], cfg.get("SPLIT_K", 1)
    dot_parts = cfg.get("DOT_PARTS", 1)
    if dot_parts not in (1, 2, 4, 8):  # any other count would leave slices of a block out of the dot
        raise ValueError(f"config DOT_PARTS must be 1, 2, 4 or 8 (each dot in that many chained parts), got {dot_parts!r}")
    constexprs = dict(FOLD_SUBS=_fold_subs(group_size, in_features), SYMMETRIC=symmetric, BLOCK_N=block_n, BLOCK_M=block_m,
                      EVEN_K=in_features % K_BLOCK == 0)
    options = dict(num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3))
    if cfg.get("maxnreg"):  # a register cap buys occupancy (more CTAs per SM) where it does not spill
        options["maxnreg"] = cfg["maxnreg"]
    if wait_prior:
        options["launch_pdl"] = True

    def prepared(kernel, kernel_constexprs: dict, fixed: dict, programs: int = 0) -> _MatmulLaunch:
        # the int arguments fixed for this plan and format, named and valued in one place
        launch = PreparedLaunch(kernel, kernel_constexprs, options, _TENSOR_ARGS, _CALL_INTS + tuple(fixed))
        return _MatmulLaunch(plan.path, block_n, block_m, split_k if plan.path != "streamk" else 1, programs, launch,
                             tuple(fixed.values()))

    if plan.path == "gemv":
        return prepared(_w4a16_gemv_kernel, dict(constexprs, IS_SPLIT=split_k > 1), dict(group_size=group_size, SPLIT_K=split_k))
    tensor_core = dict(
        constexprs, GROUP_SIZE=group_size, SCALE_IN_OPERAND=cfg.get("SCALE_IN_OPERAND", False),
        MAGIC_PAIR=MAGIC_PAIR[dtype], MAGIC_VALUE=MAGIC_VALUE[dtype], USE_ASM=_use_asm(device_type),
        # Triton's CPU interpreter multiplies bf16 dot operands as raw bits: give it fp32 (exact
        # for C + q and for bf16 activations); the GPU always runs the bf16 MMA.
        DOT_DTYPE=tl.float32 if (device_type == "cpu" and dtype == torch.bfloat16) else _TL_DTYPE[dtype],
        ONE_TOKEN=one_token and not cfg.get("SCALE_IN_OPERAND", False),  # only the fold sums x
        PER_CHANNEL=group_size == in_features,  # one group: the fold runs once per tile, after the loop
        DOT_PARTS=dot_parts,
        WAIT_PRIOR=wait_prior,
        STREAM_PARAMS=stream_params and cfg.get("SCALE_IN_OPERAND", False),  # (the fold loads no operand params)
        RELEASE_DEPENDENTS=release_dependents,
    )
    num_groups = in_features // group_size
    if plan.path == "streamk":
        return prepared(_w4a16_streamk_kernel, tensor_core, dict(num_groups=num_groups), programs=cfg["PROGRAMS"])
    return prepared(_w4a16_tc_kernel, dict(tensor_core, IS_SPLIT=split_k > 1), dict(num_groups=num_groups, SPLIT_K=split_k))


def launch_gemm(x2, qweight, scales, zeros, in_features, group_size, plan: Plan, out=None) -> torch.Tensor:
    """Launch the GEMV, tensor-core or Stream-K kernel of `plan` on x2 [M, K] (for act-order weights:
    x already permuted, `gather_columns`; with the plan's GATHER_PDL the GEMM is launched as a
    programmatic dependent of that gather)."""
    return _launch_gemm(x2, qweight, scales, zeros, in_features, group_size, plan, out, keep=False)[0]


def launch_gemm_kept(x2, qweight, scales, zeros, in_features, group_size, plan: Plan) -> tuple[torch.Tensor, RepeatLaunch | None]:
    """`launch_gemm`, and the launch kept as a `launch.RepeatLaunch` (None where Triton's fast launch path does
    not apply: see `PreparedLaunch.bind`)."""
    return _launch_gemm(x2, qweight, scales, zeros, in_features, group_size, plan, None, keep=True)


# The tensors each repeat of a kept launch passes anew (the rest, the split-K scratch, stays bound)
_REPEAT_SLOTS = tuple(_TENSOR_ARGS.index(name) for name in ("x_ptr", "qw_ptr", "s_ptr", "z_ptr", "y_ptr"))
_PART_SLOT = _TENSOR_ARGS.index("part_ptr")


def _launch_gemm(x2, qweight, scales, zeros, in_features, group_size, plan: Plan, out, keep: bool):
    stream = current_stream(x2.device)
    run, grid, tensors, ints, y = _launch_arguments(x2, qweight, scales, zeros, in_features, group_size, plan, out, stream,
                                                    x2.device.type)
    run.kernel(grid, tensors, ints, stream)
    bound = run.kernel.bind(grid, tensors, ints, stream, _REPEAT_SLOTS) if keep else None
    if bound is None:
        return y, None
    part = tensors[_PART_SLOT]  # y itself when the plan uses no split-K scratch (`_launch_arguments`)
    scratch = None if part is y else workspace_entry(x2.device, stream)
    return y, RepeatLaunch(bound, tuple(y.shape), y.dtype, y.device, scratch, part)


def _params_line_up(n: int, scales: torch.Tensor, zeros: torch.Tensor | None) -> bool:
    """Whether scales / zeros can be read as the 32-bit words holding them (the tuned option STREAM_PARAMS): N a
    multiple of 4 and both tensors 4-byte aligned. Else a plan with the option runs without it."""
    return n % 4 == 0 and scales.data_ptr() % 4 == 0 and (zeros is None or zeros.data_ptr() % 4 == 0)


def _launch_arguments(x2, qweight, scales, zeros, in_features, group_size, plan: Plan, out, stream: int, device_type: str):
    """Everything `launch_gemm` hands the prepared kernel: (prepared launch, grid, tensors, ints, y).
    `device_type` picks the constexprs (benchmarks/sass_report.py asks for "cuda" on CPU tensors)."""
    m, k = x2.shape
    n = scales.shape[1]
    device = x2.device
    # ONE_TOKEN: x sums from one row at M = 1, a tuned option (off unless the plan's entry sets it)
    one_token = m == 1 and plan.config.get("ONE_TOKEN", False)
    stream_params = plan.config.get("STREAM_PARAMS", False) and _params_line_up(n, scales, zeros)
    run = _matmul_launch(plan, x2.dtype, device_type, zeros is None, in_features, group_size, one_token, stream_params)
    y = torch.empty((m, n), device=device, dtype=x2.dtype) if out is None else out
    tiles = -(-n // run.block_n) * -(-m // run.block_m)  # ceil-divs (triton.cdiv costs ~3 us from the host)
    if run.path == "streamk":
        units = tiles * -(-k // K_BLOCK)
        programs = min(run.programs, units)  # every program gets >= 1 unit (the reduction counts on it)
        if units * programs >= 2**31:
            raise ValueError(f"Stream-K work list too long for int32 arithmetic: PROGRAMS={programs}, M={m}, N={n}, K={k}")
        grid = (programs,)
        part, lock = split_k_scratch(device, stream, tiles, programs * 2 * run.block_n * run.block_m)
    else:
        grid = (-(-n // run.block_n), -(-m // run.block_m), run.split_k)
        if run.split_k > 1:
            if run.split_k * m * n >= 2**31:
                raise ValueError(f"split-K workspace too large for int32 offsets: SPLIT_K={run.split_k}, M={m}, N={n}")
            part, lock = split_k_scratch(device, stream, tiles, run.split_k * m * n)
        else:
            part = lock = y  # unused
    tensors = (x2, qweight, scales, scales if zeros is None else zeros, y, part, lock)
    return run, grid, tensors, (m, n, k, x2.stride(0), y.stride(0)) + run.fixed_ints, y


def dequantize_native(qweight, scales, zeros, in_features: int, group_size: int, dtype: torch.dtype, block_n: int = 64) -> torch.Tensor:
    """The weight [N, K] (nn.Linear orientation, rows in kernel order) in `dtype` (fp16 / bf16), by a Triton kernel."""
    n = scales.shape[1]
    w = torch.empty((n, in_features), device=qweight.device, dtype=dtype)
    grid = (-(-n // block_n), -(-in_features // K_BLOCK))
    _dequantize_kernel[grid](
        qweight, scales, scales if zeros is None else zeros, w, n, in_features, group_size,
        FOLD_SUBS=_fold_subs(group_size, in_features), SYMMETRIC=zeros is None,
        MAGIC_PAIR=MAGIC_PAIR[dtype], MAGIC_VALUE=MAGIC_VALUE[dtype], USE_ASM=_use_asm(qweight.device.type), BLOCK_N=block_n,
        **COMPILE_OPTIONS,
    )
    return w
