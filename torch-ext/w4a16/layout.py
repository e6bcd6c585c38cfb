"""The kernel-native weight layout and the one-time repack into it from the seed layout.

Kernel-native layout ("N-major, K-striped"), made once at load by `prepare_weight`:

    qweight int32 [N, Kp/8], Kp = K rounded up to a multiple of 128 (padding rows hold code 0).
    K is cut into blocks of 128 rows; block b owns word columns b*16 .. b*16+15 of every output row n.
    Nibble j (bits 4j..4j+3) of word qweight[n, b*16 + i] holds the code of weight row
        k = b*128 + 16*j + i.
    So one [BLOCK_N, 16] tile of words holds a [BLOCK_N, 128] block of the weight, and taking
    nibble j of every word yields the contiguous 16-row slice k = b*128 + 16*j .. +15 directly as a
    [BLOCK_N, 16] matrix operand: no reshape, interleave or transpose of the unpacked tile.

    scales [K/G, N] and zeros [K/G, N] (or None: symmetric, zero 8) keep the seed layout.
    perm int64 [K] or None: act-order. Rows were sorted so that groups are contiguous; the GEMM
        computes x[:, perm] @ W_sorted, where W_sorted[i] = W[perm[i]].

Why N-major: each output row's words are contiguous along K, so a program streams BLOCK_N rows of 64
bytes per 128-row block with wide loads, and the tensor-core kernel computes y^T = W x^T with the
weight on the wide side of the MMA (tokens on the narrow side).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .quantize import SYMMETRIC_ZERO, unpack_int4_k_major, validate_group_size

__all__ = [
    "K_BLOCK",
    "W4A16Weight",
    "prepare_weight",
    "pack_int4_n_major_striped",
    "unpack_int4_n_major_striped",
    "act_order_permutation",
]

K_BLOCK = 128  # rows of K per stripe block: 8 nibbles x 16 words
_SUB = K_BLOCK // 8  # rows per nibble slice (the depth of one sub-dot)


def pack_int4_n_major_striped(codes: torch.Tensor) -> torch.Tensor:
    """Codes [K, N] (0..15) -> int32 [N, Kp/8] in the kernel-native layout (see module docstring)."""
    if codes.dim() != 2:
        raise ValueError(f"codes must be 2-D [K, N], got shape {tuple(codes.shape)}")
    k, n = codes.shape
    kp = -(-k // K_BLOCK) * K_BLOCK
    c = torch.zeros((kp, n), dtype=torch.int64, device=codes.device)
    c[:k] = codes.to(torch.int64)
    # [Kp, N] -> [N, blocks, nibble j, word i]
    c = c.t().reshape(n, kp // K_BLOCK, 8, _SUB)
    shifts = (torch.arange(8, device=codes.device, dtype=torch.int64) * 4).view(1, 1, 8, 1)
    words = (c << shifts).sum(dim=2)  # [N, blocks, 16]
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.reshape(n, kp // 8).to(torch.int32).contiguous()


def unpack_int4_n_major_striped(qweight: torch.Tensor, in_features: int) -> torch.Tensor:
    """Inverse of `pack_int4_n_major_striped`: int32 [N, Kp/8] -> uint8 codes [K, N]."""
    n, kp8 = qweight.shape
    shifts = (torch.arange(8, device=qweight.device, dtype=torch.int64) * 4).view(1, 1, 8, 1)
    w = qweight.to(torch.int64).reshape(n, kp8 // _SUB, 1, _SUB)
    codes = ((w >> shifts) & 0xF).reshape(n, kp8 * 8)
    return codes[:, :in_features].t().to(torch.uint8).contiguous()


def act_order_permutation(g_idx: torch.Tensor, group_size: int) -> torch.Tensor | None:
    """Turn a GPTQ `g_idx` [K] into the row permutation that makes groups contiguous.

    Returns None for the identity (no act-order), so a trivial g_idx costs nothing per call.
    """
    if g_idx.dim() != 1:
        raise ValueError(f"g_idx must be 1-D [K], got shape {tuple(g_idx.shape)}")
    if g_idx.dtype.is_floating_point:
        raise TypeError(f"g_idx must be an integer tensor, got {g_idx.dtype}")
    k = g_idx.numel()
    g = g_idx.to(torch.int64)
    counts = torch.bincount(g, minlength=k // group_size)
    if g.min() < 0 or counts.numel() != k // group_size or bool((counts != group_size).any()):
        raise ValueError(
            f"g_idx must assign exactly group_size={group_size} rows to each of the K/G={k // group_size} groups"
        )
    perm = torch.sort(g, stable=True).indices
    if bool((perm == torch.arange(k, device=perm.device)).all()):
        return None
    return perm


@dataclass(frozen=True)
class W4A16Weight:
    """A 4-bit weight in the kernel-native layout, with everything the GEMM needs.

    Build it with `prepare_weight` (from the seed layout) or the importers in `formats`.
    """

    qweight: torch.Tensor  # int32 [N, Kp/8], N-major K-striped
    scales: torch.Tensor  # [K/G, N]
    zeros: torch.Tensor | None  # [K/G, N] or None (symmetric: zero 8)
    perm: torch.Tensor | None  # int64 [K] act-order permutation or None
    in_features: int  # K
    out_features: int  # N
    group_size: int  # effective G (K for per-channel)

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
        codes_sorted = unpack_int4_n_major_striped(self.qweight, self.in_features)
        if self.perm is None:
            return codes_sorted
        codes = torch.empty_like(codes_sorted)
        codes[self.perm] = codes_sorted
        return codes

    def dequantize(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The weight [K, N] = (q - z) * s in the original row order, computed in float64."""
        codes_sorted = unpack_int4_n_major_striped(self.qweight, self.in_features).to(torch.float64)
        g = self.group_size
        s = self.scales.to(torch.float64).repeat_interleave(g, dim=0)
        z = SYMMETRIC_ZERO if self.zeros is None else self.zeros.to(torch.float64).repeat_interleave(g, dim=0)
        w_sorted = (codes_sorted - z) * s
        if self.perm is None:
            return w_sorted.to(dtype)
        w = torch.empty_like(w_sorted)
        w[self.perm] = w_sorted
        return w.to(dtype)


def prepare_weight(
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    group_size: int = 128,
    g_idx: torch.Tensor | None = None,
) -> W4A16Weight:
    """Validate a seed-layout weight and repack it, once, into the kernel-native layout.

    packed int32 [K/8, N]; scales [K/G, N] (fp16, bf16 or fp32); zeros [K/G, N] or None (symmetric).
    Zeros that are all 8 are dropped (the symmetric kernel reads no zeros). `g_idx` [K] (GPTQ
    act-order) is turned into a row permutation; an identity `g_idx` is dropped.
    """
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.int32:
        raise TypeError(f"packed must be an int32 tensor [K/8, N], got {getattr(packed, 'dtype', type(packed))}")
    if packed.dim() != 2:
        raise ValueError(f"packed must be 2-D [K/8, N], got shape {tuple(packed.shape)}")
    k, n = packed.shape[0] * 8, packed.shape[1]
    g = validate_group_size(group_size, k)
    if not isinstance(scales, torch.Tensor) or scales.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"scales must be float16, bfloat16 or float32, got {getattr(scales, 'dtype', type(scales))}")
    if tuple(scales.shape) != (k // g, n):
        raise ValueError(f"scales must have shape [K/G, N] = {(k // g, n)}, got {tuple(scales.shape)}")
    devices = {packed.device, scales.device}
    if zeros is not None:
        if not isinstance(zeros, torch.Tensor) or not zeros.dtype.is_floating_point:
            raise TypeError(f"zeros must be a floating-point tensor or None, got {getattr(zeros, 'dtype', type(zeros))}")
        if tuple(zeros.shape) != (k // g, n):
            raise ValueError(f"zeros must have shape [K/G, N] = {(k // g, n)}, got {tuple(zeros.shape)}")
        devices.add(zeros.device)
        if bool((zeros == SYMMETRIC_ZERO).all()):
            zeros = None
    if g_idx is not None:
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
        qweight=pack_int4_n_major_striped(codes),
        scales=scales.contiguous(),
        zeros=None if zeros is None else zeros.contiguous(),
        perm=perm,
        in_features=k,
        out_features=n,
        group_size=g,
    )
