"""w4a16: 4-bit-weight x fp16/bf16-activation GEMM in pure Triton (Kernel Hub package).

This module only registers the torch op and re-exports the public API; see README for the design.
"""

from typing import Optional

import torch

from ._ops import add_op_namespace_prefix, ops
from .dispatch import Plan, plan_gemm
from .formats import checkpoint_options, import_awq, import_compressed_tensors, import_gptq
from .functional import LayerCheck, check_layer, plan_for, w4a16_gemm, w4a16_linear
from .matmul import validate_gemm_inputs, w4a16_matmul
from .layout import W4A16Weight, prepare_weight
from .quantize import dequantize_int4_grouped, pack_int4_k_major, quantize_weight_int4_grouped, unpack_int4_k_major
from . import layers
from .layers import W4A16Linear, convert_checkpoint_to_w4a16, convert_to_w4a16


@torch.library.custom_op(add_op_namespace_prefix("gemm"), mutates_args=())
def _gemm_op(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: Optional[torch.Tensor],
    perm: Optional[torch.Tensor],
    in_features: int,
    group_size: int,
    path: str = "auto",
    strict: bool = False,
    pdl: bool = False,
) -> torch.Tensor:
    """y[..., N] = x[..., K] @ W for a weight in the kernel-native layout (see layout.py)."""
    return w4a16_matmul(x, qweight, scales, zeros, perm, in_features, group_size, path, strict, pdl=pdl)


@_gemm_op.register_fake
def _gemm_fake(x, qweight, scales, zeros, perm, in_features, group_size, path="auto", strict=False, pdl=False):
    validate_gemm_inputs(x, qweight, scales, zeros, perm, in_features, group_size)
    return x.new_empty((*x.shape[:-1], scales.shape[1]))


# The op itself is `ops.gemm` (torch.ops.<namespace>.gemm); the module `gemm` holds the kernels.
__all__ = [
    "ops",
    "quantize_weight_int4_grouped",
    "pack_int4_k_major",
    "unpack_int4_k_major",
    "dequantize_int4_grouped",
    "W4A16Weight",
    "prepare_weight",
    "w4a16_gemm",
    "w4a16_linear",
    "plan_for",
    "plan_gemm",
    "Plan",
    "check_layer",
    "LayerCheck",
    "import_gptq",
    "import_awq",
    "import_compressed_tensors",
    "checkpoint_options",
    "layers",
    "W4A16Linear",
    "convert_to_w4a16",
    "convert_checkpoint_to_w4a16",
]
