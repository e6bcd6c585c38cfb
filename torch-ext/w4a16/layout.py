"""The kernel-native weight layout and the one-time repack into it from the seed layout.

Kernel-native layout ("64-row tiles, K-striped, pair-interleaved"), made once at load by `prepare_weight`:

    qweight int32 [Np/64, Kp/128, 64, 16]: Np = N rounded up to a multiple of 64 (N_TILE) and
    Kp = K rounded up to a multiple of 128 (K_BLOCK); padding rows and columns hold code 0.
    qweight[t, b] is the [64, 16]-word tile of output rows n = 64t .. 64t+63 and K block b (rows
    b*128 .. b*128+127): 4 KB, contiguous. Within it, word [n % 64, c] with c = 2p + h (p = 0..7,
    h = 0..1) holds, at nibble r = q + 4t' (q = 0..3, t' = 0..1, bits 4r..4r+3), the code of
        k = b*128 + 16*(4h + q) + 2p + t',
    i.e. the pair of rows (2p, 2p+1) of the four 16-row slices 4h .. 4h+3: nibbles q and q+4 are the
    two rows of one pair. So `(word >> 4q) & 0x000F000F | 0x64006400` turns a word into the two fp16
    values (1024 + code) of one row pair of slice 4h+q with one shift and one LOP3, already packed
    the way a tensor-core operand register holds two neighbouring k (magic-number dequant, two
    weights per instruction). Splitting the even and odd word columns of that result gives the
    [BLOCK_N, 16] slices 4h+q without moving data between threads.

    scales [K/G, N] and zeros [K/G, N] (or None: symmetric, zero 8) keep the seed layout. zeros are
        uint8 when every zero point is an integer in 0..127 (what `prepare_weight` makes of
        integer-valued zeros, and what checkpoints hold): the tensor-core kernel then applies them with one packed
        subtract (no correction term), which measured 3-9% faster at M = 64 on the H200 (NOTES v12).
        Float zeros (fp16 / bf16 / fp32) may be fractional and take the general form. uint8 zeros
        must be at most 127 (`prepare_weight` checks it; the per-call checks do not read values).
    perm int32 [K] or None: act-order. Rows were sorted so that groups are contiguous; the GEMM
        computes x[:, perm] @ W_sorted, where W_sorted[i] = W[perm[i]]. int64 is accepted too (the
        gather then reads twice the index bytes per call; `prepare_weight` makes int32).

Why tiles: a program reads, per 128-row block, BLOCK_N rows of 64 bytes (one word row of the tile
per output row) and the tensor-core kernel computes y^T = W x^T with the weight on the wide side of
the MMA (tokens on the narrow side). Stored row by row (an earlier N-major [N, Kp/8] layout) those
64-byte pieces lie K/2 bytes apart and each opens a DRAM page of its own; stored as 4 KB tiles the
same program reads whole tiles. Measured on the H200 (benchmarks/NOTES.md, v7): a plain streaming
kernel went from 81% to 95% of 4.2 TB/s and the GEMM from 109 to 95 us on 57344 x 8192 at M = 1.
Any BLOCK_N that is a multiple of 64 reads whole tiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from .quantize import SYMMETRIC_ZERO, apply_group_params, unpack_int4_k_major, validate_group_size

__all__ = [
    "K_BLOCK",
    "W4A16Weight",
    "prepare_weight",
    "validate_permutation",
    "N_TILE",
    "groups_per_block",
    "blocks_per_group",
    "native_qweight_shape",
    "pack_int4_tiled_striped",
    "unpack_int4_tiled_striped",
    "act_order_permutation",
    "integer_zeros_as_uint8",
]

K_BLOCK = 128  # rows of K per block: 16 words x 8 nibbles
N_TILE = 64  # output rows per stored tile (4 KB per tile and K block)
_NIBBLE_SHIFTS = torch.arange(8, dtype=torch.int64) * 4


def groups_per_block(group_size: int, in_features: int) -> int:
    """Scale groups within one K_BLOCK-row block: K_BLOCK / G for G = 16, 32, 64; 1 for G a multiple of K_BLOCK and
    for per-channel (one group spanning K, whatever K is). The kernels' per-block parameter count."""
    return K_BLOCK // group_size if (group_size < K_BLOCK and group_size != in_features) else 1


def blocks_per_group(group_size: int, in_features: int) -> int:
    """K_BLOCK-row blocks per scale group where a group spans blocks: G / K_BLOCK; 0 for per-channel (one group
    spanning K, whatever K is: the kernels need not specialise on K); 1 (unused) where a block holds several groups.
    With `groups_per_block`, what a kernel needs to find a block's groups without dividing by G at run time."""
    if groups_per_block(group_size, in_features) > 1:
        return 1
    return 0 if group_size == in_features else group_size // K_BLOCK


def native_qweight_shape(out_features: int, in_features: int) -> tuple[int, int, int, int]:
    """Shape of the kernel-native qweight of an N x K weight: [ceil(N/64), ceil(K/128), 64, 16]."""
    return -(-out_features // N_TILE), -(-in_features // K_BLOCK), N_TILE, K_BLOCK // 8


def pack_int4_tiled_striped(codes: torch.Tensor) -> torch.Tensor:
    """Codes [K, N] (0..15) -> int32 [Np/64, Kp/128, 64, 16] in the kernel-native layout (module docstring)."""
    if codes.dim() != 2:
        raise ValueError(f"codes must be 2-D [K, N], got shape {tuple(codes.shape)}")
    k, n = codes.shape
    tiles, blocks, _, _ = native_qweight_shape(n, k)
    c = torch.zeros((blocks * K_BLOCK, tiles * N_TILE), dtype=torch.int64, device=codes.device)
    c[:k, :n] = codes.to(torch.int64)
    # k = b*128 + 16*(4h + q) + 2p + t  ->  [Np, b, h, q, p, t]  ->  [Np, b, p, h, t, q] = [Np, b, word c, nibble r]
    c = c.t().reshape(tiles * N_TILE, blocks, 2, 4, 8, 2).permute(0, 1, 4, 2, 5, 3).reshape(tiles * N_TILE, blocks, 16, 8)
    words = (c << _NIBBLE_SHIFTS.to(codes.device)).sum(dim=3)  # [Np, blocks, 16], < 2**32
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    # [t, n % 64, b, c] -> [t, b, n % 64, c]: each (tile, block) 4 KB contiguous
    return words.reshape(tiles, N_TILE, blocks, 16).permute(0, 2, 1, 3).contiguous()


def unpack_int4_tiled_striped(qweight: torch.Tensor, in_features: int, out_features: int) -> torch.Tensor:
    """Inverse of `pack_int4_tiled_striped`: int32 [Np/64, Kp/128, 64, 16] -> uint8 codes [K, N]."""
    tiles, blocks = qweight.shape[:2]
    rows = qweight.permute(0, 2, 1, 3).reshape(tiles * N_TILE, blocks, 16, 1).to(torch.int64)
    nibbles = (rows >> _NIBBLE_SHIFTS.to(qweight.device)) & 0xF
    # [Np, b, p, h, t, q] -> [Np, b, h, q, p, t] = rows in order
    codes = nibbles.reshape(tiles * N_TILE, blocks, 8, 2, 2, 4).permute(0, 1, 3, 5, 2, 4).reshape(tiles * N_TILE, blocks * K_BLOCK)
    return codes[:out_features, :in_features].t().to(torch.uint8).contiguous()


def act_order_permutation(g_idx: torch.Tensor, group_size: int) -> torch.Tensor | None:
    """Turn a GPTQ `g_idx` [K] into the row permutation that makes groups contiguous.

    Returns None for the identity (no act-order), so a trivial g_idx costs nothing per call.
    """
    if not isinstance(g_idx, torch.Tensor) or g_idx.dtype.is_floating_point or g_idx.dtype.is_complex or g_idx.dtype == torch.bool:
        raise TypeError(f"g_idx must be an integer tensor [K], got {getattr(g_idx, 'dtype', type(g_idx).__name__)}")
    if g_idx.dim() != 1:
        raise ValueError(f"g_idx must be 1-D [K], got shape {tuple(g_idx.shape)}")
    k = g_idx.numel()
    g = g_idx.to(torch.int64)
    # (bincount refuses negative values with its own message: the range is checked first)
    if k and bool((g < 0).any()):
        raise ValueError(f"g_idx must hold group indices in 0..K/G-1 = 0..{k // group_size - 1}, got a minimum of {int(g.min())}")
    counts = torch.bincount(g, minlength=k // group_size)
    if counts.numel() != k // group_size or bool((counts != group_size).any()):
        raise ValueError(
            f"g_idx must assign exactly group_size={group_size} rows to each of the K/G={k // group_size} groups"
        )
    perm = torch.sort(g, stable=True).indices
    if bool((perm == torch.arange(k, device=perm.device)).all()):
        return None
    return perm.to(torch.int32)  # the gather reads perm every call: half int64's bytes (NOTES v36)


_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_ZERO_DTYPES = _FLOAT_DTYPES + (torch.uint8,)  # uint8: integer zero points (the kernels' fast form)


def validate_permutation(perm: torch.Tensor, in_features: int) -> None:
    """Raise a ValueError unless `perm` [K] holds each of 0..K-1 once (one host sync: for load time, e.g. a state_dict;
    the kernels gather x through it without bounds checks, so a value out of range would read past x's rows)."""
    k = in_features
    if perm.numel() != k or not bool((torch.sort(perm.reshape(-1).to(torch.int64)).values == torch.arange(k, device=perm.device)).all()):
        raise ValueError(f"perm must be a permutation of 0..K-1 = 0..{k - 1} (act-order's row order), and it is not")


def validate_weight_tensors(qweight, scales, zeros, perm, in_features: int, group_size: int) -> int:
    """Raise a clear TypeError / ValueError unless the tensors form a kernel-native weight with
    K = in_features (shapes and dtypes of the module docstring, all on one device); N is taken from
    scales. Returns the effective group size. Cheap (no syncs)."""
    k = in_features
    group_size = validate_group_size(group_size, k)  # also checks K
    if not isinstance(scales, torch.Tensor) or scales.dtype not in _FLOAT_DTYPES or scales.dim() != 2 or scales.shape[0] != k // group_size:
        raise ValueError(f"scales must be a float16, bfloat16 or float32 tensor of shape [K/G, N] with K/G = {k // group_size}, "
                         f"got {getattr(scales, 'dtype', type(scales))} {tuple(getattr(scales, 'shape', ()))}")
    n = scales.shape[1]  # N (qweight's rows are padded to whole 64-row tiles)
    if n < 1:
        raise ValueError(f"scales must have N >= 1 output columns [K/G, N], got shape {tuple(scales.shape)}")
    expected = native_qweight_shape(n, k)
    if not isinstance(qweight, torch.Tensor) or qweight.dtype != torch.int32:
        raise TypeError(f"qweight must be an int32 tensor (layout.py), got {getattr(qweight, 'dtype', type(qweight))}")
    if tuple(qweight.shape) != expected:
        raise ValueError(f"qweight must have shape [ceil(N/64), ceil(K/128), 64, 16] = {list(expected)} "
                         f"for N={n}, K={k} (layout.py), got {tuple(qweight.shape)}")
    if zeros is not None and (not isinstance(zeros, torch.Tensor) or zeros.dtype not in _ZERO_DTYPES
                              or tuple(zeros.shape) != (k // group_size, n)):
        raise ValueError(f"zeros must be None or a float16, bfloat16, float32 or uint8 tensor of shape [K/G, N] = "
                         f"{(k // group_size, n)}, got {getattr(zeros, 'dtype', type(zeros))} {tuple(getattr(zeros, 'shape', ()))}")
    if perm is not None and (not isinstance(perm, torch.Tensor) or perm.dtype not in (torch.int32, torch.int64)
                             or tuple(perm.shape) != (k,)):
        raise ValueError(f"perm must be None or an int32 (or int64) tensor of shape [K] = ({k},), "
                         f"got {getattr(perm, 'dtype', type(perm))} {tuple(getattr(perm, 'shape', ()))}")
    for name, t in (("qweight", qweight), ("scales", scales), ("zeros", zeros), ("perm", perm)):
        # the kernels compute addresses from the shapes alone: a transposed or sliced view would be read as if it were
        # contiguous, a silently wrong result
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (the kernels read it by shape, not strides), got strides "
                             f"{t.stride()} for shape {tuple(t.shape)}: pass {name}.contiguous()")
    for name, t in (("scales", scales), ("zeros", zeros), ("perm", perm)):
        if t is not None and t.device != qweight.device:
            raise ValueError(f"{name} is on {t.device} but qweight is on {qweight.device}: all tensors must be on one device")
    return group_size


@dataclass(frozen=True)
class W4A16Weight:
    """A 4-bit weight in the kernel-native layout, with everything the GEMM needs.

    Build it with `prepare_weight` (from the seed layout) or the importers in `formats`.
    """

    qweight: torch.Tensor  # int32 [Np/64, Kp/128, 64, 16]: 64-row tiles, K-striped
    scales: torch.Tensor  # [K/G, N]
    zeros: torch.Tensor | None  # [K/G, N] float or uint8 (integer zero points), or None (symmetric: zero 8)
    perm: torch.Tensor | None  # int32 [K] act-order permutation (int64 accepted) or None
    in_features: int  # K
    out_features: int  # N
    group_size: int  # effective G (K for per-channel)
    # Eager calls' kept launches per (M, dtype, stream, strict, pdl) (matmul.matmul_weight): a cache, not state,
    # never passed in; every new weight (a copy, `dataclasses.replace`) starts with an empty one. A plain dict, kept
    # least recently used first by matmul: torch.compile(fullgraph=True) cannot build an OrderedDict, and the hub
    # layer makes its weight inside the traced forward.
    repeat_launches: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Checked once here, so that calls on the weight check only the activations (the dataclass is
        # frozen and a tensor's shape, dtype and device do not change in place).
        if validate_weight_tensors(self.qweight, self.scales, self.zeros, self.perm, self.in_features, self.group_size) != self.group_size:
            raise ValueError(f"group_size must be the effective group size (K={self.in_features} for per-channel), got {self.group_size}")
        if self.out_features != self.scales.shape[1]:
            raise ValueError(f"out_features={self.out_features} must equal scales.shape[1]={self.scales.shape[1]}")

    def __reduce__(self):
        # Copies and pickles are made from the constructor's fields: the kept launches are bound to this
        # weight's own tensors and scratch (and hold compiled kernels), so a copy starts with none.
        return type(self), tuple(getattr(self, f.name) for f in fields(self) if f.init)

    @property
    def symmetric(self) -> bool:
        return self.zeros is None

    @property
    def act_order(self) -> bool:
        return self.perm is not None

    def describe(self) -> str:
        g = "per-channel" if self.group_size == self.in_features else f"g{self.group_size}"
        kind = "sym" if self.symmetric else "asym"
        act = ", act-order" if self.act_order else ""
        return f"int4 {g} {kind}{act}, scales {str(self.scales.dtype).replace('torch.', '')}"

    def codes(self) -> torch.Tensor:
        """Codes [K, N] in the original (checkpoint) row order."""
        codes_sorted = unpack_int4_tiled_striped(self.qweight, self.in_features, self.out_features)
        if self.perm is None:
            return codes_sorted
        codes = torch.empty_like(codes_sorted)
        codes[self.perm] = codes_sorted
        return codes

    def dequantize(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The weight [K, N] = (q - z) * s in the original row order, computed in float64."""
        codes_sorted = unpack_int4_tiled_striped(self.qweight, self.in_features, self.out_features)
        w_sorted = apply_group_params(codes_sorted, self.scales, self.zeros, self.group_size, torch.float64)
        if self.perm is None:
            return w_sorted.to(dtype)
        w = torch.empty_like(w_sorted)
        w[self.perm] = w_sorted
        return w.to(dtype)


def integer_zeros_as_uint8(zeros: torch.Tensor) -> torch.Tensor:
    """Zeros in the form the kernels read (one host sync): float zeros that are all integers in 0..127 as
    uint8, other float zeros unchanged; uint8 zeros must lie in 0..127 (a 4-bit zero point is 0..16),
    else ValueError. (Below 128, C + z is exact in bf16 too: the scale-in-operand kernel rounds it to
    the activations' dtype, which would silently shift a larger odd zero by one.)"""
    if zeros.dtype == torch.uint8:
        if not bool((zeros <= 127).all()):
            raise ValueError(f"uint8 zeros must be integer zero points in 0..127, got a maximum of {int(zeros.max())}")
        return zeros
    if bool(((zeros == zeros.round()) & (zeros >= 0) & (zeros <= 127)).all()):
        return zeros.to(torch.uint8)
    return zeros


def prepare_weight(
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    group_size: int = 128,
    g_idx: torch.Tensor | None = None,
) -> W4A16Weight:
    """Validate a seed-layout weight and repack it, once, into the kernel-native layout.

    packed int32 [K/8, N]; scales [K/G, N] (fp16, bf16 or fp32); zeros [K/G, N] (float or uint8) or
    None (symmetric). Zeros that are all 8 are dropped (the symmetric kernel reads no zeros); float
    zeros that are all integers in 0..127 are stored as uint8 (the kernels' faster integer-zero form,
    and half the bytes of fp16); fractional zeros stay as given. `g_idx` [K] (GPTQ act-order) is
    turned into a row permutation; an identity `g_idx` is dropped.
    """
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.int32:
        raise TypeError(f"packed must be an int32 tensor [K/8, N], got {getattr(packed, 'dtype', type(packed))}")
    if packed.dim() != 2:
        raise ValueError(f"packed must be 2-D [K/8, N], got shape {tuple(packed.shape)}")
    k, n = packed.shape[0] * 8, packed.shape[1]
    if n < 1:
        raise ValueError(f"packed must have N >= 1 output columns [K/8, N], got shape {tuple(packed.shape)}")
    g = validate_group_size(group_size, k)
    if not isinstance(scales, torch.Tensor) or scales.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"scales must be float16, bfloat16 or float32, got {getattr(scales, 'dtype', type(scales))}")
    if tuple(scales.shape) != (k // g, n):
        raise ValueError(f"scales must have shape [K/G, N] = {(k // g, n)}, got {tuple(scales.shape)}")
    devices = {packed.device, scales.device}
    if zeros is not None:
        if not isinstance(zeros, torch.Tensor) or not (zeros.dtype.is_floating_point or zeros.dtype == torch.uint8):
            raise TypeError(f"zeros must be a floating-point or uint8 tensor or None, got {getattr(zeros, 'dtype', type(zeros))}")
        if tuple(zeros.shape) != (k // g, n):
            raise ValueError(f"zeros must have shape [K/G, N] = {(k // g, n)}, got {tuple(zeros.shape)}")
        devices.add(zeros.device)
        if zeros.dtype == torch.float64:  # (the kernels read fp16 / bf16 / fp32 zeros; integer ones become uint8 below)
            zeros = zeros.to(torch.float32)
        zeros = integer_zeros_as_uint8(zeros)
        if bool((zeros == SYMMETRIC_ZERO).all()):
            zeros = None
    if g_idx is not None:
        if not isinstance(g_idx, torch.Tensor):
            raise TypeError(f"g_idx must be None or an integer tensor [K], got {type(g_idx).__name__}")
        if tuple(g_idx.shape) != (k,):
            raise ValueError(f"g_idx must have shape [K] = ({k},), got {tuple(g_idx.shape)}")
        devices.add(g_idx.device)
    if len(devices) > 1:
        raise ValueError(f"packed, scales, zeros and g_idx must be on one device, got {sorted(map(str, devices))}")

    codes = unpack_int4_k_major(packed)
    perm = act_order_permutation(g_idx, g) if g_idx is not None else None
    if perm is not None:
        codes = codes[perm]
    return W4A16Weight(
        qweight=pack_int4_tiled_striped(codes),
        scales=scales.contiguous(),
        zeros=None if zeros is None else zeros.contiguous(),
        perm=perm,
        in_features=k,
        out_features=n,
        group_size=g,
    )
