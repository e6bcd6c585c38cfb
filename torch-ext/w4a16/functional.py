"""The functional API: run the registered GEMM op on a prepared weight, explain its plan, check a layer.

Under `torch.compile` these call the torch op `gemm` registered in `__init__.py` (through `ops`), so
the graph has no break; eagerly (and inside CUDA-graph capture) they call the function the op wraps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._ops import ops
from .dispatch import Plan, plan_gemm
from .matmul import ACTIVATION_DTYPES, matmul_weight
from .layout import W4A16Weight, prepare_weight
from .quantize import check_flag, is_int

__all__ = ["w4a16_linear", "w4a16_gemm", "plan_for", "check_layer", "LayerCheck"]


def w4a16_linear(
    x: torch.Tensor,
    weight: W4A16Weight,
    bias: torch.Tensor | None = None,
    *,
    path: str = "auto",
    strict: bool = False,
    pdl: bool = False,
) -> torch.Tensor:
    """y[..., N] = x[..., K] @ W (+ bias) for a prepared weight. x fp16 or bf16; y in x's dtype.

    `path` forces a kernel ("gemv", "splitk", "streamk", "tiled", "decode", "pingpong", "dense", "reference");
    `strict=True` raises instead of falling back to an untuned configuration (see dispatch.py).
    `pdl=True` (NVIDIA sm_90+, decode and tensor-core paths; ignored elsewhere): the GEMM is launched as a
    programmatic dependent of the kernel before it on the stream, so its first weight loads overlap that kernel's
    end (x is read only once that kernel has finished), and the kernel after it may launch early. Only where the
    kernel before does not write this weight's tensors (in a model's forward it writes activations). Pays in a CUDA
    graph whose other kernels take part too (torch.compile with `torch._inductor.config.triton.enable_pdl`).
    """
    _check_weight(weight)
    check_bias(bias, weight.out_features, weight.qweight.device)
    return linear_unchecked(x, weight, bias, path, check_flag("strict", strict), check_flag("pdl", pdl))


def linear_unchecked(x: torch.Tensor, weight: W4A16Weight, bias: torch.Tensor | None, path: str, strict: bool,
                     pdl: bool) -> torch.Tensor:
    """`w4a16_linear` without its checks of `weight` and `bias` (x is still checked): for the layers' forward, so it
    does not pay them per call. Their weight view is a W4A16Weight by construction; a W4A16Linear's bias has its
    shape (constructor, load_state_dict), a hub layer's host module's bias is its own (the add checks its length)."""
    # Eagerly, skip the op: the dispatcher round trip of a custom op costs tens of microseconds per
    # call, as much as the whole GEMM of a small layer, and the weight's tensors were checked when it
    # was made (`matmul_weight` checks x only). torch.compile sees the op.
    if torch.compiler.is_compiling():
        y = ops.gemm(x, weight.qweight, weight.scales, weight.zeros, weight.perm, weight.in_features, weight.group_size, path, strict,
                     pdl)
    else:
        y = matmul_weight(x, weight, path, strict, pdl)
    return y if bias is None else y + bias.to(y.dtype)


def check_bias(bias, out_features: int, device: torch.device) -> None:
    """Raise a clear TypeError / ValueError unless `bias` is None or a float tensor (out_features,) on `device`."""
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor) or not bias.dtype.is_floating_point:
        raise TypeError(f"bias must be None or a floating-point tensor, got {getattr(bias, 'dtype', type(bias).__name__)}")
    if tuple(bias.shape) != (out_features,):
        raise ValueError(f"bias must have shape (out_features,) = ({out_features},), got {tuple(bias.shape)}")
    if bias.device != device:
        raise ValueError(f"bias is on {bias.device} but the weight is on {device}: all tensors must be on one device")


def _check_weight(weight) -> None:
    if not isinstance(weight, W4A16Weight):  # (a raw packed tensor would fail deep inside with an AttributeError)
        raise TypeError(f"weight must be a W4A16Weight (from prepare_weight or import_gptq / import_awq / "
                        f"import_compressed_tensors), got {type(weight).__name__}")


def w4a16_gemm(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    group_size: int = 128,
) -> torch.Tensor:
    """Seed-compatible API: x [..., K] @ W with W in the seed layout (packed int32 [K/8, N]).

    Convenient but it repacks the weight on every call: for speed, `prepare_weight` once and call
    `w4a16_linear` (or use `W4A16Linear`).
    """
    return w4a16_linear(x, prepare_weight(packed, scales, zeros, group_size))


def plan_for(weight: W4A16Weight, m: int, dtype: torch.dtype = torch.float16, strict: bool = False,
             pdl: bool = False) -> Plan:
    """The path and launch configuration a call with M = m tokens (and this `pdl`) will take on the weight's device."""
    _check_weight(weight)
    check_flag("strict", strict)
    check_flag("pdl", pdl)
    if not is_int(m) or m < 0:
        raise ValueError(f"m (the call's tokens, x.numel() // in_features) must be an int >= 0, got {m!r}")
    if dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"dtype (the activations') must be torch.float16 or torch.bfloat16, got {dtype}")
    return plan_gemm(
        m, weight.out_features, weight.in_features, weight.group_size, dtype, weight.qweight.device,
        symmetric=weight.symmetric, strict=strict, act_order=weight.act_order, pdl=pdl,
    )


@dataclass(frozen=True)
class LayerCheck:
    """Result of `check_layer`: the relative error (Frobenius norm) per batch size and the bound."""

    errors: dict
    tolerance: float
    plans: dict

    @property
    def ok(self) -> bool:
        return all(e <= self.tolerance for e in self.errors.values())


def check_layer(
    weight: W4A16Weight,
    reference_linear_weight: torch.Tensor | None = None,
    batch_sizes: tuple[int, ...] = (1, 16, 64),
    dtype: torch.dtype = torch.float16,
    tolerance: float = 1e-2,
    path: str = "auto",
    seed: int = 0,
) -> LayerCheck:
    """Validate a packed layer at load time: run the GEMM on random activations at each batch size and
    compare with a float64 reference.

    The reference is `x @ reference_linear_weight.T` when given (the original or independently
    dequantized weight [N, K], nn.Linear orientation: catches a wrong nibble order or zero convention
    in an import) and otherwise the float64 dequantization of the weight's own codes (catches a wrong
    repack or a kernel fault). Raises ValueError when any relative error exceeds `tolerance`.
    The default tolerance suits an exact reference; against the original float weight the 4-bit
    quantization error itself (~5-10%) needs a looser one, and an off-by-one zero can hide in it.
    """
    _check_weight(weight)
    n, k = weight.out_features, weight.in_features
    device = weight.qweight.device
    if (not isinstance(batch_sizes, (tuple, list)) or not batch_sizes
            or not all(is_int(m) and m >= 1 for m in batch_sizes)):
        # (an empty batch has nothing to compare: its "error" of 0 would pass any layer)
        raise ValueError(f"batch_sizes must be a non-empty tuple or list of ints >= 1, got {batch_sizes!r}")
    if dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"dtype (the activations') must be torch.float16 or torch.bfloat16, got {dtype}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance > 0:
        raise ValueError(f"tolerance must be a number > 0 (a relative error bound), got {tolerance!r}")
    if reference_linear_weight is None:
        ref_w = weight.dequantize(torch.float64)  # [K, N]
    else:
        if not isinstance(reference_linear_weight, torch.Tensor) or not reference_linear_weight.dtype.is_floating_point:
            raise TypeError(f"reference_linear_weight must be None or a float tensor [N, K], "
                            f"got {getattr(reference_linear_weight, 'dtype', type(reference_linear_weight).__name__)}")
        if tuple(reference_linear_weight.shape) != (n, k):
            raise ValueError(
                f"reference_linear_weight must have shape [N, K] = {(n, k)}, got {tuple(reference_linear_weight.shape)}"
            )
        ref_w = reference_linear_weight.to(device=device, dtype=torch.float64).t()
    gen = torch.Generator(device="cpu").manual_seed(seed)
    errors, plans = {}, {}
    for m in batch_sizes:
        x = torch.randn((m, k), generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
        y = w4a16_linear(x, weight, path=path).to(torch.float64)
        ref = x.to(torch.float64) @ ref_w
        errors[m] = float((y - ref).norm() / ref.norm().clamp_min(1e-30))
        plans[m] = str(plan_for(weight, m, dtype)) if path == "auto" else path
    result = LayerCheck(errors=errors, tolerance=tolerance, plans=plans)
    if not result.ok:
        raise ValueError(
            f"w4a16 check_layer failed for {weight.describe()} [N={n}, K={k}]: relative errors {errors} exceed "
            f"{tolerance} (a wrong nibble order, zero convention or group size in the import?)"
        )
    return result
