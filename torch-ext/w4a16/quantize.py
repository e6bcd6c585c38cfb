"""Quantize, pack, unpack and dequantize 4-bit grouped weights in the seed (interchange) layout.

The seed layout is the package's documented interchange format (what importers produce and what
`w4a16_gemm` accepts):

    packed  int32 [K/8, N]   eight 4-bit codes per word, packed along K, low bits first:
                             nibble j of packed[i, n] is the code of weight row k = 8*i + j.
    scales  [K/G, N]         one scale per group of G consecutive rows of one output column.
    zeros   [K/G, N]         one zero point per group (codes, may be fractional); symmetric means 8.
    weight  w[k, n] = (q[k, n] - zeros[k // G, n]) * scales[k // G, n]

K = in_features, N = out_features, G = group size (G = K for per-channel; `group_size=-1` is accepted
as its spelling). Everything here is plain torch: this module is the ground truth the kernels are
checked against.
"""

from __future__ import annotations

import torch

__all__ = [
    "SYMMETRIC_ZERO",
    "resolve_group_size",
    "validate_group_size",
    "quantize_weight_int4_grouped",
    "pack_int4_k_major",
    "unpack_int4_k_major",
    "dequantize_int4_grouped",
    "apply_group_params",
]

SYMMETRIC_ZERO = 8
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def is_int(value) -> bool:
    """Whether `value` is an int and not a bool (True would pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_flag(name: str, value) -> bool:
    """`value` if it is a bool, else a TypeError naming the argument: a truthy "no" or 1 would silently pick a format,
    a bias or a launch form the caller did not ask for."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def resolve_group_size(group_size: int, in_features: int) -> int:
    """The effective group size: `-1` (or `in_features`) means one group spanning all of K."""
    if not is_int(group_size):
        raise TypeError(f"group_size must be an int, got {type(group_size).__name__}")
    return in_features if group_size == -1 else group_size


def validate_group_size(group_size: int, in_features: int) -> int:
    """Check K and G against the kernels' constraints and return the effective group size.

    K must be a positive multiple of 8 (eight codes per int32 word) and of G. G is either K itself
    (per-channel) or a multiple of 16 that divides 128 (16, 32, 64) or is a multiple of 128.
    """
    if in_features <= 0 or in_features % 8 != 0:
        raise ValueError(f"in_features (K) must be a positive multiple of 8, got K={in_features}")
    g = resolve_group_size(group_size, in_features)
    if g <= 0:
        raise ValueError(f"group_size must be positive or -1 (per-channel), got {group_size}")
    if in_features % g != 0:
        raise ValueError(f"in_features (K={in_features}) must be a multiple of group_size (G={g})")
    if g != in_features and not (g % 16 == 0 and (128 % g == 0 or g % 128 == 0)):
        raise ValueError(
            f"group_size must be 16, 32, 64, a multiple of 128, or -1 (per-channel); got {group_size}"
        )
    return g


def _check_codes(codes: torch.Tensor, name: str) -> None:
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"{name} must be an integer tensor [K, N] of 4-bit codes, got {type(codes).__name__}")
    if codes.dim() != 2:
        raise ValueError(f"{name} must be 2-D [K, N], got shape {tuple(codes.shape)}")
    if codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor of 4-bit codes, got {codes.dtype}")


def pack_int4_k_major(codes: torch.Tensor) -> torch.Tensor:
    """Pack codes [K, N] (values 0..15) into int32 [K/8, N], nibble j of word i = row 8*i + j."""
    _check_codes(codes, "codes")
    k, n = codes.shape
    if k % 8 != 0:
        raise ValueError(f"codes must have a multiple of 8 rows (K), got K={k}")
    c = codes.to(torch.int64).reshape(k // 8, 8, n)
    if bool(((c < 0) | (c > 15)).any()):
        raise ValueError("codes must lie in [0, 15]")
    shifts = (torch.arange(8, device=codes.device, dtype=torch.int64) * 4).view(1, 8, 1)
    words = (c << shifts).sum(dim=1)  # < 2**32, exact in int64
    return _uint32_to_int32(words)


def unpack_int4_k_major(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_int4_k_major`: int32 [K/8, N] -> uint8 codes [K, N]."""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.int32:
        raise TypeError(f"packed must be an int32 tensor [K/8, N], got {getattr(packed, 'dtype', type(packed).__name__)}")
    if packed.dim() != 2:
        raise ValueError(f"packed must be 2-D [K/8, N], got shape {tuple(packed.shape)}")
    k8, n = packed.shape
    shifts = (torch.arange(8, device=packed.device, dtype=torch.int64) * 4).view(1, 8, 1)
    codes = (packed.to(torch.int64).unsqueeze(1) >> shifts) & 0xF
    return codes.reshape(k8 * 8, n).to(torch.uint8)


def _uint32_to_int32(words: torch.Tensor) -> torch.Tensor:
    """Reinterpret values in [0, 2**32) held in int64 as int32 bit patterns."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


_CODES_CHUNK = 8192  # output columns per step of the code rounding (a 4096-row chunk in float64: 256 MiB)


def quantize_weight_int4_grouped(
    weight: torch.Tensor, group_size: int = 128, symmetric: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest 4-bit quantization of a weight [K, N] (K = in_features) per group along K.

    Returns `(packed int32 [K/8, N], scales [K/G, N], zeros [K/G, N])` in the seed layout. Scales and
    zeros take the weight's dtype (fp16 for fp32 weights). Asymmetric: the group's [min, max] maps onto
    codes 0..15 with an integer zero; symmetric: zero is fixed at 8 and scale = max|w| / 7. Each scale
    is rounded up to its storage dtype so every weight lies within half a step of its code.
    """
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [K, N] (in_features, out_features), got shape {tuple(weight.shape)}")
    if weight.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"weight must be float16, bfloat16 or float32, got {weight.dtype}")
    if weight.device.type == "meta":
        raise ValueError("weight is on the meta device: it has no values to quantize")
    check_flag("symmetric", symmetric)
    k, n = weight.shape
    g = validate_group_size(group_size, k)
    store_dtype = torch.float16 if weight.dtype == torch.float32 else weight.dtype

    w = weight.detach().to(torch.float32).reshape(k // g, g, n)
    # the step divides by a tensor, not a Python number: on CUDA torch divides by a scalar through its rounded
    # reciprocal, which puts a step that is a storage value (a range of 15 x an fp16 value) one float32 ulp above
    # it, and the scale is then rounded up one fp16 step more than on the CPU
    if symmetric:
        span, levels = w.abs().amax(dim=1), 7.0
    else:
        w_min = w.amin(dim=1).clamp(max=0.0)
        span, levels = w.amax(dim=1).clamp(min=0.0) - w_min, 15.0
    step = span / torch.full_like(span, levels)
    step = step.clamp(min=torch.finfo(store_dtype).tiny * 16)
    scales = _round_up_to(step, store_dtype)
    # The rounding decisions in float64 (exact for these operands; MPS has no float64): in float32, w / s + z
    # can land on the wrong side of a half step for fp32 weights (by ~1e-6 of a step, NOTES v17)
    exact = torch.float32 if w.device.type == "mps" else torch.float64
    s = scales.to(exact)
    if symmetric:
        zeros_f = torch.full_like(s, float(SYMMETRIC_ZERO))
    else:
        zeros_f = torch.round(-w_min.to(exact) / s).clamp(0, 15)
    codes = torch.empty(w.shape, dtype=torch.uint8, device=w.device)
    for j in range(0, n, _CODES_CHUNK):  # in column chunks: the float64 temporaries stay small for an LM head
        cols = slice(j, j + _CODES_CHUNK)
        exact_codes = torch.round(w[..., cols].to(exact) / s[:, None, cols] + zeros_f[:, None, cols])
        codes[..., cols] = exact_codes.clamp(0, 15).to(torch.uint8)
    packed = pack_int4_k_major(codes.reshape(k, n))
    return packed, scales, zeros_f.to(store_dtype)


def _round_up_to(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast fp32 values to `dtype`, rounding up so the stored value is never smaller."""
    rounded = values.to(dtype)
    too_small = rounded.to(torch.float32) < values
    return torch.where(too_small, torch.nextafter(rounded, torch.full_like(rounded, float("inf"))), rounded)


def dequantize_int4_grouped(
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    group_size: int = 128,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Reconstruct the weight [K, N] = (q - z) * s from the seed layout, computed in float64.

    `zeros=None` means symmetric (z = 8). The result is returned in `dtype` (default: the scales' dtype;
    pass torch.float64 for the exact reconstruction, e.g. as a test's ground truth).
    """
    codes = unpack_int4_k_major(packed)
    k, n = codes.shape
    g = validate_group_size(group_size, k)
    if not isinstance(scales, torch.Tensor) or not scales.dtype.is_floating_point:
        raise TypeError(f"scales must be a floating-point tensor [K/G, N], got {getattr(scales, 'dtype', type(scales).__name__)}")
    if scales.dim() != 2 or tuple(scales.shape) != (k // g, n):
        raise ValueError(f"scales must have shape [K/G, N] = {(k // g, n)}, got {tuple(scales.shape)}")
    if zeros is not None and (not isinstance(zeros, torch.Tensor) or not (zeros.dtype.is_floating_point or zeros.dtype == torch.uint8)):
        raise TypeError(f"zeros must be None or a floating-point or uint8 tensor [K/G, N], "
                        f"got {getattr(zeros, 'dtype', type(zeros).__name__)}")
    if zeros is not None and tuple(zeros.shape) != (k // g, n):
        raise ValueError(f"zeros must have shape [K/G, N] = {(k // g, n)}, got {tuple(zeros.shape)}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be None or a floating-point torch.dtype, got {dtype!r}")
    return apply_group_params(codes, scales, zeros, g, torch.float64).to(dtype or scales.dtype)


def apply_group_params(
    codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, group_size: int, dtype: torch.dtype
) -> torch.Tensor:
    """(q - z[k // G]) * s[k // G] for codes [K, N] (rows in group order), computed in `dtype`.

    The one place the grouped reconstruction is written; `zeros=None` means symmetric (z = 8).
    """
    s = scales.to(dtype).repeat_interleave(group_size, dim=0)
    z = SYMMETRIC_ZERO if zeros is None else zeros.to(dtype).repeat_interleave(group_size, dim=0)
    return (codes.to(dtype) - z) * s
