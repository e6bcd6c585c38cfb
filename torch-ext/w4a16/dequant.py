"""Register-level dequantization for the Triton kernels of gemm.py: the words of one [BLOCK_N, 16] tile of
the kernel-native layout (layout.py) become MMA operands, in registers, with no memory traffic.

    word column c = 2p + h of a tile row holds, at nibble r = q + 4t, the code of row
    16 * (4h + q) + 2p + t of the 128-row block (`row_of`): one shift and one and-or per word and q
    (`magic_pairs`) put the row pair (2p, 2p + 1) of slice 4h + q into the two 16-bit halves of a
    register, which is where the MMA operand wants them (`pairs_to_slice` only names the halves).

The magic number: a nibble OR-ed into the mantissa of a float whose integer part is C (fp16 1024.0 =
0x6400, bf16 128.0 = 0x4300; fp32 2**23 for `uint_as_float`) gives the float C + q with no
integer-to-float conversion. `dequantize_pairs` then applies zero and scale on the packed pairs.

Every function with PTX inline assembly (USE_ASM, NVIDIA only) has a plain bit-op twin selected by the
same constexpr: Triton's CPU interpreter and AMD run the twin, and the asm must compute what it computes. The
symmetric fp16 read of nibble pairs 1 and 3 without a shift (`magic_high_pairs`, `dequantize_symmetric_high_pairs`) is
used only with USE_ASM: without it those pairs take the shifting path, whose twin computes the same values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["MAGIC_PAIR", "MAGIC_VALUE", "HIGH_NIBBLE_SCALE_PAIR", "SYMMETRIC_HIGH_OFFSET_PAIR", "uint_as_float",
           "magic_pairs", "dequantize_pairs", "magic_high_pairs", "dequantize_symmetric_high_pairs", "pack_pair",
           "pairs_to_slice", "concat_k", "concat_slices", "unpack_slices", "operand_part", "row_of"]

# fp16 1024.0 / bf16 128.0 in both 16-bit halves of a word: OR-ed with two nibbles at bits 0 and 16
# it gives the two 16-bit floats C + q (the magic-number conversion).
MAGIC_PAIR = {torch.float16: 0x64006400, torch.bfloat16: 0x43004300}
MAGIC_VALUE = {torch.float16: 1024.0, torch.bfloat16: 128.0}


@triton.jit
def uint_as_float(v, OFFSET: tl.constexpr):
    """uint32 v < 2**23 -> fp32 v + OFFSET, exact, without an int-to-float convert: v OR-ed into the
    mantissa of 2**23 is the float 2**23 + v (the magic number), then one subtract."""
    return (v | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 - OFFSET)


@triton.jit
def magic_pairs(words, q: tl.constexpr, MAGIC_PAIR: tl.constexpr, USE_ASM: tl.constexpr):
    """((words >> 4q) & 0x000F000F) | MAGIC_PAIR for a uint32 tile: nibbles q and q + 4 as two 16-bit floats.

    With USE_ASM (NVIDIA) it is one PTX `lop3` with both constants as operands (ptxas keeps one in a
    register: one LOP3 per word instead of two); the plain bit-op twin is what the Triton
    interpreter and AMD run, and what the asm must equal.
    """
    if USE_ASM:
        if q == 0:
            asm: tl.constexpr = f"lop3.b32 $0, $1, 0x000F000F, {MAGIC_PAIR}, 0xEA;"
        else:
            asm: tl.constexpr = f"{{ .reg .b32 t; shr.b32 t, $1, {4 * q}; lop3.b32 t, t, 0x000F000F, {MAGIC_PAIR}, 0xEA; mov.b32 $0, t; }}"
        return tl.inline_asm_elementwise(asm, "=r,r", [words], dtype=tl.uint32, is_pure=True, pack=1)
    else:
        return ((words >> (4 * q)) & 0x000F000F) | MAGIC_PAIR


@triton.jit
def dequantize_pairs(pairs, params, MAGIC_VALUE: tl.constexpr, XT_DTYPE: tl.constexpr, USE_ASM: tl.constexpr):
    """Pairs of C + q (uint32) -> pairs of (q - z) * s in XT_DTYPE, two packed instructions per pair.

    Float zeros: params = (s, R, -(C + z - R) * s), each [BLOCK_N, 1], with R = C + z rounded to XT_DTYPE
    (`gemm._load_operand_params`). The weight is fma(c - R, s, residual): c - R is exact and the residual
    carries a fractional zero's fraction, so the result is (q - z) * s rounded once, like a weight
    dequantized to fp16/bf16 for cuBLAS. Integer (uint8) zeros: params = (s, R), R exact, and the
    weight is (c - R) * s (sub + mul: one parameter less to bring into the operand's register layout,
    3-9% faster at M = 64, NOTES v12). Symmetric: params = (s,) and the weight is (c - (C + 8)) * s,
    the constant an immediate of the asm (as a tensor operand derived from s, the symmetric kernel
    ran 10-25% slower than the asymmetric one with the same plan at M = 64..128, NOTES v11).
    With USE_ASM the params are packed pairs (uint32) and sub + fma / mul run on f16x2 / bf16x2;
    the twin computes the same in fp32 on the two halves.
    """
    SYMMETRIC: tl.constexpr = len(params) == 1
    INTEGER_ZERO: tl.constexpr = len(params) == 2
    T: tl.constexpr = "f16x2" if XT_DTYPE == tl.float16 else "bf16x2"
    if USE_ASM and SYMMETRIC:
        ZERO_PAIR: tl.constexpr = "0x64086408" if XT_DTYPE == tl.float16 else "0x43084308"  # C + 8 in both halves
        asm: tl.constexpr = f"{{ .reg .b32 t, z; mov.b32 z, {ZERO_PAIR}; sub.{T} t, $1, z; mul.rn.{T} $0, t, $2; }}"
        return tl.inline_asm_elementwise(asm, "=r,r,r", [pairs, params[0]], dtype=tl.uint32, is_pure=True, pack=1)
    elif USE_ASM and INTEGER_ZERO:
        asm: tl.constexpr = f"{{ .reg .b32 t; sub.{T} t, $1, $3; mul.rn.{T} $0, t, $2; }}"
        return tl.inline_asm_elementwise(asm, "=r,r,r,r", [pairs, params[0], params[1]], dtype=tl.uint32, is_pure=True, pack=1)
    elif USE_ASM:
        asm: tl.constexpr = f"{{ .reg .b32 t; sub.{T} t, $1, $3; fma.rn.{T} $0, t, $2, $4; }}"
        return tl.inline_asm_elementwise(asm, "=r,r,r,r,r", [pairs, params[0], params[1], params[2]], dtype=tl.uint32,
                                         is_pure=True, pack=1)
    else:
        shifted_zero = MAGIC_VALUE + 8.0 if SYMMETRIC else params[1]
        residual = params[2] if len(params) == 3 else 0.0
        low = dequantize_half(pairs & 0xFFFF, params[0], shifted_zero, residual, XT_DTYPE)
        high = dequantize_half(pairs >> 16, params[0], shifted_zero, residual, XT_DTYPE)
        return low | (high << 16)


@triton.jit
def dequantize_half(bits, scale, shifted_zero, residual, XT_DTYPE: tl.constexpr):
    """Bit-op twin of one half of `dequantize_pairs`: 16-bit float bits (in uint32) -> result bits."""
    c = bits.to(tl.uint16).to(XT_DTYPE, bitcast=True).to(tl.float32)
    return ((c - shifted_zero) * scale + residual).to(XT_DTYPE).to(tl.uint16, bitcast=True).to(tl.uint32)


# Symmetric fp16 weights (USE_ASM) read nibble pairs 1 and 3 without a shift: (w & 0x00F000F0) | C is C + 16 q (fp16's
# unit at C = 1024 is 1, so bits 4-7 stay in the mantissa), and q - 8 = (C + 16 q) / 16 - 72 is one fma with constants,
# exact (small integers); pairs 2 and 3 share one shift (w >> 8): 13 instructions per word instead of 15, ~2%
# faster at M = 16..64 on the H200 (NOTES v34). With a zero per group the fma would need 960 - R as one more
# parameter tensor, whose layout conversion cost the asymmetric loop two barriers and the gain (NOTES v34); bf16's
# mantissa ends at bit 6, so bf16 keeps the shifts.
HIGH_NIBBLE_MAGIC = tl.constexpr(MAGIC_PAIR[torch.float16])
HIGH_NIBBLE_SCALE_PAIR = tl.constexpr(0x2C002C00)  # fp16 1 / 16 in both halves
SYMMETRIC_HIGH_OFFSET_PAIR = tl.constexpr(0xD480D480)  # fp16 -72 = -(1024 / 16 + 8) in both halves


@triton.jit
def magic_high_pairs(words):
    """(words & 0x00F000F0) | fp16 C in both halves (one lop3): nibbles 1 and 5 as the fp16 pair C + 16 q."""
    return tl.inline_asm_elementwise(f"lop3.b32 $0, $1, 0x00F000F0, {HIGH_NIBBLE_MAGIC}, 0xEA;", "=r,r", [words],
                                     dtype=tl.uint32, is_pure=True, pack=1)


@triton.jit
def dequantize_symmetric_high_pairs(pairs, params):
    """`dequantize_pairs` (USE_ASM, fp16, symmetric: params = (s,)) for pairs of C + 16 q (`magic_high_pairs`):
    q - 8 = pairs / 16 - 72 by one fma, then * s."""
    return tl.inline_asm_elementwise(f"{{ .reg .b32 t, m, k; mov.b32 m, {HIGH_NIBBLE_SCALE_PAIR}; "
                                     f"mov.b32 k, {SYMMETRIC_HIGH_OFFSET_PAIR}; fma.rn.f16x2 t, $1, m, k; "
                                     "mul.rn.f16x2 $0, t, $2; }", "=r,r,r", [pairs, params[0]], dtype=tl.uint32,
                                     is_pure=True, pack=1)


@triton.jit
def pack_pair(v, XT_DTYPE: tl.constexpr):
    """A 16-bit float tensor -> uint32 holding its bits in both halves (the operand of packed math)."""
    bits = v.to(XT_DTYPE).to(tl.uint16, bitcast=True).to(tl.uint32)
    return bits | (bits << 16)


@triton.jit
def pairs_to_slice(pairs, XT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr):
    """uint32 [BLOCK_N, 8] of 16-bit pairs (row 2p low, row 2p+1 high) -> [BLOCK_N, 16] values.

    The pair already sits in one register the way the MMA operand wants it; truncate / shift /
    join only name the halves (a PTX register split in inline asm compiles to the same SASS on
    sm_90 with Triton 3.6, so this needs no asm).
    """
    low = pairs.to(tl.uint16)
    high = (pairs >> 16).to(tl.uint16)
    return tl.reshape(tl.join(low, high), (BLOCK_N, 16)).to(XT_DTYPE, bitcast=True)


@triton.jit
def concat_k(a, b):
    """[R, C] and [R, C] -> [R, 2C] = [a | b] (register relabelling: join, permute, reshape)."""
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (a.shape[0], 2 * a.shape[1]))


@triton.jit
def concat_slices(slices, START: tl.constexpr, COUNT: tl.constexpr):
    """slices[START : START + COUNT] (each [R, 16]) concatenated along K, COUNT in {1, 2, 4, 8}."""
    if COUNT == 1:
        return slices[START]
    elif COUNT == 2:
        return concat_k(slices[START], slices[START + 1])
    elif COUNT == 4:
        return concat_k(concat_k(slices[START], slices[START + 1]), concat_k(slices[START + 2], slices[START + 3]))
    else:
        return concat_k(
            concat_k(concat_k(slices[START], slices[START + 1]), concat_k(slices[START + 2], slices[START + 3])),
            concat_k(concat_k(slices[START + 4], slices[START + 5]), concat_k(slices[START + 6], slices[START + 7])),
        )


@triton.jit
def _nibble_pairs(words, words_hi, q: tl.constexpr, HIGH: tl.constexpr, MAGIC_PAIR: tl.constexpr, USE_ASM: tl.constexpr):
    """Nibble pair q of each word as magic pairs: C + q (`magic_pairs`), or with HIGH (symmetric fp16, asm) the
    shift-free read: odd q as C + 16 q (`magic_high_pairs`), q = 2 and 3 from words_hi = words >> 8."""
    if HIGH and q % 2 == 1:
        pairs = magic_high_pairs(words if q == 1 else words_hi)
    elif HIGH and q == 2:
        pairs = magic_pairs(words_hi, 0, MAGIC_PAIR, USE_ASM)
    else:
        pairs = magic_pairs(words, q, MAGIC_PAIR, USE_ASM)
    return pairs


@triton.jit
def _dequantized(pairs, params, q: tl.constexpr, HIGH: tl.constexpr, MAGIC_VALUE: tl.constexpr, XT_DTYPE: tl.constexpr,
                 USE_ASM: tl.constexpr):
    """`_nibble_pairs`' pairs of nibble pair q -> (q - z) * s with one fold's params."""
    if HIGH and q % 2 == 1:
        pairs = dequantize_symmetric_high_pairs(pairs, params)
    else:
        pairs = dequantize_pairs(pairs, params, MAGIC_VALUE, XT_DTYPE, USE_ASM)
    return pairs


@triton.jit
def unpack_slices(words, operand_params, MAGIC_PAIR: tl.constexpr, MAGIC_VALUE: tl.constexpr, USE_ASM: tl.constexpr,
                   DEQUANTIZE: tl.constexpr, FOLD_SUBS: tl.constexpr, XT_DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """A [BLOCK_N, 16] word tile -> the 8 slices [BLOCK_N, 16] (slice j = rows 16j..16j+15), as a tuple.

    For q = 0..3 one shift and one and-or (`magic_pairs`) turn every word into two 16-bit magic
    values C + q, the row pair (2p, 2p+1) of slice 4h + q (see layout.py); even word columns (h = 0)
    hold slices 0..3, odd ones (h = 1) slices 4..7. With DEQUANTIZE the pairs become (q - z) * s
    (`dequantize_pairs`; operand_params holds one parameter triple per scale fold). Split, join and
    reshape only relabel registers. Symmetric fp16 (asm) reads pairs 1 and 3 without a shift (`_nibble_pairs`).
    """
    HIGH: tl.constexpr = DEQUANTIZE and USE_ASM and MAGIC_PAIR == HIGH_NIBBLE_MAGIC and len(operand_params[0]) == 1
    words_hi = words >> 8 if HIGH else words
    low_slices = ()
    high_slices = ()
    for q in tl.static_range(4):
        pairs = _nibble_pairs(words, words_hi, q, HIGH, MAGIC_PAIR, USE_ASM)  # [BLOCK_N, 16]: word c = 2p + h (uint32)
        even, odd = tl.split(tl.reshape(pairs, (BLOCK_N, 8, 2)))
        if DEQUANTIZE:  # slice j = 4h + q belongs to scale fold j // FOLD_SUBS
            even = _dequantized(even, operand_params[q // FOLD_SUBS], q, HIGH, MAGIC_VALUE, XT_DTYPE, USE_ASM)
            odd = _dequantized(odd, operand_params[(4 + q) // FOLD_SUBS], q, HIGH, MAGIC_VALUE, XT_DTYPE, USE_ASM)
        low_slices = low_slices + (pairs_to_slice(even, XT_DTYPE, BLOCK_N).to(DOT_DTYPE),)
        high_slices = high_slices + (pairs_to_slice(odd, XT_DTYPE, BLOCK_N).to(DOT_DTYPE),)
    return low_slices + high_slices


@triton.jit
def operand_part(words, params, FIRST: tl.constexpr, COUNT: tl.constexpr, DEQUANTIZE: tl.constexpr, MAGIC_PAIR: tl.constexpr,
                  MAGIC_VALUE: tl.constexpr, USE_ASM: tl.constexpr, FOLD_SUBS: tl.constexpr, XT_DTYPE: tl.constexpr,
                  DOT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Slices FIRST .. FIRST + COUNT - 1 of a [BLOCK_N, 16] word tile concatenated along K: one dot operand
    [BLOCK_N, 16 * COUNT] of C + q, or with DEQUANTIZE of (q - z) * s (`unpack_slices` makes all eight
    slices at once). Slice j = 4h + q is nibble pair q of the word columns 2p + h."""
    halves = tl.split(tl.reshape(words, (BLOCK_N, 8, 2)))  # (even word columns: slices 0..3, odd: 4..7)
    HIGH: tl.constexpr = DEQUANTIZE and USE_ASM and MAGIC_PAIR == HIGH_NIBBLE_MAGIC and len(params[0]) == 1
    halves_hi = (halves[0] >> 8, halves[1] >> 8) if HIGH else halves
    slices = ()
    for j in tl.static_range(FIRST, FIRST + COUNT):
        pairs = _nibble_pairs(halves[j // 4], halves_hi[j // 4], j % 4, HIGH, MAGIC_PAIR, USE_ASM)
        if DEQUANTIZE:
            pairs = _dequantized(pairs, params[j // FOLD_SUBS], j % 4, HIGH, MAGIC_VALUE, XT_DTYPE, USE_ASM)
        slices = slices + (pairs_to_slice(pairs, XT_DTYPE, BLOCK_N).to(DOT_DTYPE),)
    return concat_slices(slices, 0, COUNT)


@triton.jit
def row_of(c, r: tl.constexpr):
    """Row within a 128-row block of word column c (tensor), nibble r (see layout.py)."""
    return 16 * (4 * (c % 2) + (r % 4)) + 2 * (c // 2) + r // 4
