"""The GEMM's entry point: check the inputs, plan the call by shape, run the planned path.

    x [..., K] fp16/bf16 -> checks (here; a W4A16Weight's tensors were checked when it was made)
      -> dispatch.plan_gemm (path and launch configuration from the tuned table)
      -> gemm.launch_gemm (Triton kernels) | gemm_decode.launch_decode (Gluon, NVIDIA, M <= 16)
         | gemm_pingpong.launch_pingpong (Gluon, sm_90)
         | cuBLAS on gemm.dequantize_native's copy | plain torch (CPU)
      -> y [..., N] in x's dtype
"""

from __future__ import annotations

import os

import torch

from .dispatch import plan_gemm
from .gather import gather_columns
from .gemm import dequantize_native, launch_gemm, launch_gemm_kept
from .gemm_decode import launch_decode, launch_decode_kept
from .gemm_pingpong import launch_pingpong, launch_pingpong_kept
from .launch import current_stream
from .layout import W4A16Weight, unpack_int4_tiled_striped, validate_weight_tensors
from .quantize import apply_group_params

__all__ = ["w4a16_matmul", "matmul_weight", "validate_gemm_inputs", "validate_activation", "launcher_for"]


ACTIVATION_DTYPES = (torch.float16, torch.bfloat16)  # what x may be (y takes x's dtype)


def validate_activation(x, in_features: int, device: torch.device) -> None:
    """Raise a clear TypeError / ValueError unless x is an fp16 / bf16 tensor [..., in_features] on `device`."""
    if not isinstance(x, torch.Tensor) or x.dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"x must be a float16 or bfloat16 tensor, got {getattr(x, 'dtype', type(x))}")
    if x.dim() < 1 or x.shape[-1] != in_features:
        raise ValueError(f"x must have in_features={in_features} as its last dim, got shape {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"x is on {x.device} but the weight is on {device}: all tensors must be on one device")


def validate_gemm_inputs(x, qweight, scales, zeros, perm, in_features: int, group_size: int) -> int:
    """Raise a clear TypeError / ValueError for anything the kernels cannot take; return the effective
    group size (K for -1). Cheap (no syncs)."""
    group_size = validate_weight_tensors(qweight, scales, zeros, perm, in_features, group_size)
    validate_activation(x, in_features, qweight.device)
    return group_size


def _reference_matmul(x2, qweight, scales, zeros, in_features, group_size) -> torch.Tensor:
    """Plain torch: dequantize (fp32) and matmul. The CPU path of the op."""
    w = apply_group_params(unpack_int4_tiled_striped(qweight, in_features, scales.shape[1]), scales, zeros, group_size, torch.float32)
    return (x2.to(torch.float32) @ w).to(x2.dtype)


def w4a16_matmul(
    x, qweight, scales, zeros, perm, in_features: int, group_size: int, path: str = "auto", strict: bool = False,
    out: torch.Tensor | None = None, config: dict | None = None, pdl: bool = False,
) -> torch.Tensor:
    """y[..., N] = x[..., K] @ W for a kernel-native weight: validate, plan by shape, launch.

    `path="auto"` takes the dispatcher's plan (plain torch on CPU tensors); a named path
    ("gemv", "splitk", "streamk", "tiled", "decode", "pingpong", "dense", "reference") forces that kernel, which is how tests run the
    Triton kernels on CPU tensors under TRITON_INTERPRET=1. `out` ([M, N] contiguous, x's dtype)
    receives the result when given (tests poison it to catch unwritten elements). `config`
    overrides a forced path's launch configuration (see dispatch.CONFIG_KEYS). `pdl`: launch the GEMM as a
    programmatic dependent of the kernel before it (dispatch.py's docstring: that kernel must not write the weight).
    """
    group_size = validate_gemm_inputs(x, qweight, scales, zeros, perm, in_features, group_size)
    return _matmul_checked(x, qweight, scales, zeros, perm, in_features, group_size, path, strict, out, config, pdl=pdl)


# the launcher of each kernel path (the Triton kernels' for the others), and its form that keeps the launch for repeating
_LAUNCHERS = {"decode": launch_decode, "pingpong": launch_pingpong}
_KEPT_LAUNCHERS = {"decode": launch_decode_kept, "pingpong": launch_pingpong_kept}


def launcher_for(path: str, keep: bool = False):
    """The function that launches a plan of kernel path `path` (not "dense" / "reference"): `launch_*(x2, qweight,
    scales, zeros, K, G, plan, out=None)`, or with `keep` its `launch_*_kept` form returning (y, RepeatLaunch or None)."""
    return (_KEPT_LAUNCHERS.get(path, launch_gemm_kept) if keep else _LAUNCHERS.get(path, launch_gemm))


_KEPT_LAUNCHES_PER_WEIGHT = 16  # (M, dtype, stream, strict, pdl) keys per weight: decode batch sizes, a few streams


def _recently_used(kept: dict, key):
    """The launch kept for `key`, moved to the end of `kept` (the most recently used), or None."""
    repeat = kept.pop(key, None)
    if repeat is not None:
        kept[key] = repeat
    return repeat


def _make_room(kept: dict) -> None:
    """Drop the least recently used keys of `kept` until one more fits: a weight called with more keys than the cap
    (many batch sizes, or each timing on a fresh stream) keeps launches for the recent ones, not only the first 16."""
    while len(kept) >= _KEPT_LAUNCHES_PER_WEIGHT:
        del kept[next(iter(kept))]


def matmul_weight(x: torch.Tensor, weight: W4A16Weight, path: str = "auto", strict: bool = False,
                  pdl: bool = False) -> torch.Tensor:
    """`w4a16_matmul` on a `W4A16Weight`: its tensors were checked when it was made, so a call checks x only.

    Eager repeat calls on CUDA (path "auto", no act-order, x contiguous) repeat the launch kept from
    the first call of the same (M, dtype, stream, strict, pdl) in `weight.repeat_launches` (launch.RepeatLaunch):
    the plan of a shape never changes, so planning and building the arguments again is host time only. At most
    _KEPT_LAUNCHES_PER_WEIGHT keys are kept, the least recently used dropped first.
    """
    validate_activation(x, weight.in_features, weight.qweight.device)
    if path != "auto" or weight.perm is not None or not x.is_cuda or not x.is_contiguous():
        return _matmul_checked(x, weight.qweight, weight.scales, weight.zeros, weight.perm, weight.in_features,
                               weight.group_size, path, strict, pdl=pdl)
    kept = weight.repeat_launches
    key = (x.numel() // weight.in_features, x.dtype, current_stream(x.device), strict, pdl)
    repeat = _recently_used(kept, key)
    if repeat is not None and repeat.stale():  # the stream's split-K workspace was replaced: keep anew
        del kept[key]
        repeat = None
    if repeat is not None:
        y = repeat(x, weight.qweight, weight.scales, weight.zeros)
        if y is not None:
            return y if x.dim() == 2 else y.view(*x.shape[:-1], weight.out_features)
    # First call of this key (or an unaligned x): the full path, keeping its launch where it can
    keep = repeat is None and not torch.cuda.is_current_stream_capturing()
    if keep:
        _make_room(kept)
    return _matmul_checked(x, weight.qweight, weight.scales, weight.zeros, None, weight.in_features, weight.group_size,
                           path, strict, keep_into=(kept, key) if keep else None, pdl=pdl)


def _matmul_checked(x, qweight, scales, zeros, perm, in_features: int, group_size: int, path: str = "auto", strict: bool = False,
                    out: torch.Tensor | None = None, config: dict | None = None, keep_into: tuple | None = None,
                    pdl: bool = False) -> torch.Tensor:
    """The body of `w4a16_matmul` on validated inputs (group_size the effective one): plan, launch.
    `keep_into=(dict, key)`: a Triton kernel's launch is also kept there for repeating (`matmul_weight`)."""
    lead = x.shape[:-1]
    x2 = x if x.dim() == 2 else x.reshape(-1, in_features)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    n = scales.shape[1]
    if m == 0:
        return x.new_empty((*lead, n))
    plan = plan_gemm(m, n, in_features, group_size, x2.dtype, x2.device, path=path, symmetric=zeros is None, strict=strict,
                     config=config, act_order=perm is not None, pdl=pdl)
    if x2.device.type == "cpu" and plan.path != "reference" and os.environ.get("TRITON_INTERPRET") != "1":
        # (a forced Triton path on CPU tensors would fail inside Triton's launcher; plan_gemm itself plans for any
        # device: the tuner plans for a CPU stand-in)
        raise ValueError(f"path={plan.path!r} runs Triton kernels, which need GPU tensors (CPU tensors only under "
                         "Triton's interpreter, TRITON_INTERPRET=1); tensors on cpu take path='auto' or 'reference'")
    if out is not None and (tuple(out.shape) != (m, n) or out.dtype != x2.dtype or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous {x2.dtype} tensor of shape [M, N] = {(m, n)}, got {out.dtype} {tuple(out.shape)}")
    # act-order: one gather of x per call, before the GEMM (in the kernels' x loads it was 2-7x slower,
    # NOTES v5; per program inside the tensor-core kernels it cost more than this launch, v9), by a
    # Triton kernel (torch's index_select took 3x as long in a CUDA graph, v9)
    # GATHER_PDL (a tuned option of act-order entries, kept by the dispatcher on sm_90+ tensor-core plans
    # only): the GEMM is launched as a programmatic dependent of the gather, so its programs are placed
    # while the gather runs and wait (griddepcontrol.wait) before reading x. Faster on some shapes,
    # slower on others (NOTES v16): data.
    if perm is not None:
        x2 = (x2.index_select(1, perm) if plan.path == "reference"
              else gather_columns(x2, perm, launch_dependents=plan.config.get("GATHER_PDL", False)))
    if plan.path == "reference":
        y = _reference_matmul(x2, qweight, scales, zeros, in_features, group_size)
    elif plan.path == "dense":
        w = dequantize_native(qweight, scales, zeros, in_features, group_size, x2.dtype)
        y = torch.nn.functional.linear(x2, w)
    elif keep_into is not None and out is None:
        y, repeat = launcher_for(plan.path, keep=True)(x2, qweight, scales, zeros, in_features, group_size, plan)
        if repeat is not None:
            keep_into[0][keep_into[1]] = repeat
    else:
        y = launcher_for(plan.path)(x2, qweight, scales, zeros, in_features, group_size, plan, out)
        if out is not None and y is not out:  # (every kernel launcher writes into a given out; no copy is hidden here)
            raise RuntimeError(f"w4a16: the {plan.path} launcher did not write into out (a bug in w4a16)")
    if out is not None and plan.path in ("reference", "dense"):  # (torch's matmul gives its own tensor)
        out.copy_(y)
        y = out
    return y if x.dim() == 2 else y.reshape(*lead, n)
