"""Modules: `W4A16Linear`, whole-model conversion, and the Kernel Hub layer `W4A16LinearForward`.

`W4A16Linear` is an inference-only drop-in for `nn.Linear` holding a 4-bit weight in the
kernel-native layout (see layout.py) as buffers:

    qweight  int32 [ceil(N/64), ceil(K/128), 64, 16]   kernel-native (64-row tiles, K-striped)
    scales   [K/G, N]                    the layer's dtype (fp16 / bf16)
    zeros    [K/G, N] or None            uint8 (integer zero points; float if fractional, loaded in the
                                         checkpoint's dtype); None: symmetric (zero 8), key absent
    perm     int32 [K] or None           act-order row permutation (an int64 one loads, cast); key absent without
                                         act-order
    bias     [N] or None
    in_features, out_features, group_size (ints; group_size is the effective G, K for per-channel)
    pdl      bool, not in the state_dict (default False): the GEMM launched as a programmatic dependent of the
             kernel before it (`functional.w4a16_linear`'s `pdl`; a host module without it runs with False)

So the state_dict keys depend only on the format (bias, symmetric, act_order), and a checkpoint
saved from one layer loads into a fresh `W4A16Linear(K, N, bias, group_size, symmetric, act_order)`.

Kernel Hub layer (for `kernels.kernelize`): any module class declared with
`@use_kernel_forward_from_hub("W4A16Linear")` that holds the attributes above (`W4A16Linear` itself
with `kernels.replace_kernel_forward_from_hub(W4A16Linear, "W4A16Linear")`, or a model's own
quantized-linear class) can have its forward replaced by `W4A16LinearForward.forward`:

    from kernels import LayerRepository, Mode, kernelize, register_kernel_mapping
    register_kernel_mapping({"W4A16Linear": {"cuda": LayerRepository(
        "w4a16-kernels/w4a16", layer_name="W4A16LinearForward", version=1)}})
    model = kernelize(model, mode=Mode.INFERENCE)          # | Mode.TORCH_COMPILE also works

`W4A16LinearForward` has no state and no backward (`has_backward = False`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from dataclasses import replace as _dc_replace

import torch
from torch import nn

from .formats import CHECKPOINT_MARKERS, check_checkpoint_arguments, import_checkpoint_layer
from .functional import linear_unchecked, plan_for
from .layout import K_BLOCK, W4A16Weight, native_qweight_shape, prepare_weight, validate_permutation
from .quantize import SYMMETRIC_ZERO, check_flag, is_int, quantize_weight_int4_grouped, validate_group_size

__all__ = ["W4A16Linear", "W4A16LinearForward", "ConversionSummary", "convert_to_w4a16", "convert_checkpoint_to_w4a16"]

logger = logging.getLogger(__name__)

_HALF_DTYPES = (torch.float16, torch.bfloat16)


def _weight_of(module: nn.Module) -> W4A16Weight:
    """The `W4A16Weight` view of a module's documented attributes (no copies)."""
    return W4A16Weight(
        qweight=module.qweight,
        scales=module.scales,
        zeros=module.zeros,
        perm=module.perm,
        in_features=module.in_features,
        out_features=module.out_features,
        group_size=module.group_size,
    )


def _log_plan_once(module: nn.Module, weight: W4A16Weight, x: torch.Tensor, pdl: bool) -> None:
    """Log the GEMM plan of a module's first (eager, non-captured) forward at debug level.

    The forwards call this only while `module._w4a16_plan_logged` is false and never while
    torch.compile traces: `torch.compiler.is_compiling()` is tested first, so dynamo folds the test
    to a constant and never reads (hence never guards on) the flag, and an eager call that flips
    the flag does not make compiled code recompile. Per eager call that costs ~30 ns; a forward
    during CUDA-graph capture is skipped here (the next one logs).
    """
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    module._w4a16_plan_logged = True
    if logger.isEnabledFor(logging.DEBUG):
        m = x.numel() // max(x.shape[-1], 1)
        logger.debug(
            "w4a16 %s [N=%d, K=%d] %s, M=%d %s on %s: %s",
            type(module).__name__, weight.out_features, weight.in_features, weight.describe(),
            m, str(x.dtype).replace("torch.", ""), x.device, plan_for(weight, m, x.dtype, pdl=pdl),
        )


def _kept_weight_of(module: nn.Module) -> W4A16Weight:
    """`_weight_of`, kept in the module's `__dict__` between eager calls for as long as its buffers
    are the same tensor objects and its sizes unchanged (building the view reads seven attributes
    through `nn.Module.__getattr__`: ~3 us per call). In-place updates (`load_state_dict`) keep
    the tensors; `.to()`, `.half()` or assigning a buffer replace them, and the view is rebuilt.
    A module whose tensors are not registered buffers gets a fresh view every call."""
    view = module.__dict__.get("_w4a16_view")
    buffers = module._buffers
    if (view is None or view.qweight is not buffers.get("qweight") or view.scales is not buffers.get("scales")
            or view.zeros is not buffers.get("zeros") or view.perm is not buffers.get("perm")
            or view.in_features != module.in_features or view.out_features != module.out_features
            or view.group_size != module.group_size):
        view = module.__dict__["_w4a16_view"] = _weight_of(module)
    return view


def _forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The forward of `W4A16Linear` and of the hub layer: the GEMM on the module's buffers (+ bias)."""
    # `pdl` read from __dict__, where a plain attribute lives: a hub layer's host module without it would cost an
    # AttributeError raised by nn.Module.__getattr__ on every call
    pdl = module.__dict__.get("pdl", False)
    # (`linear_unchecked`: w4a16_linear without the per-call checks of the view and the bias, see its docstring)
    if torch.compiler.is_compiling():  # the view is built in the traced code (no module state written there)
        return linear_unchecked(x, _weight_of(module), module.bias, "auto", False, pdl)
    weight = _kept_weight_of(module)
    y = linear_unchecked(x, weight, module.bias, "auto", False, pdl)
    if not getattr(module, "_w4a16_plan_logged", False):  # after the GEMM: a bad x raises its own error first
        _log_plan_once(module, weight, x, pdl)
    return y


def _weight_bytes(weight: W4A16Weight) -> int:
    tensors = (weight.qweight, weight.scales, weight.zeros, weight.perm)
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class W4A16Linear(nn.Module):
    """y = x @ W^T + b with a 4-bit grouped weight; x [..., in_features] fp16/bf16, y in x's dtype.

    Inference only. Build it with `from_linear` (quantize an `nn.Linear`), `from_weight` (a
    `W4A16Weight` from `prepare_weight` or an importer in `formats`), or the constructor followed by
    `load_state_dict` (the constructor allocates empty buffers of the format's shapes). `pdl` (an attribute, also
    settable later): launch the GEMM as a programmatic dependent of the kernel before it (`w4a16_linear`'s `pdl`).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        group_size: int = 128,
        symmetric: bool = False,
        act_order: bool = False,
        dtype: torch.dtype = torch.float16,
        device: torch.device | str | None = None,
        *,
        pdl: bool = False,
    ) -> None:
        super().__init__()
        for name, flag in (("bias", bias), ("symmetric", symmetric), ("act_order", act_order), ("pdl", pdl)):
            check_flag(name, flag)
        for name, size in (("in_features", in_features), ("out_features", out_features)):
            if not is_int(size) or size <= 0:
                raise ValueError(f"{name} must be an int > 0, got {size!r}")
        g = validate_group_size(group_size, in_features)
        if dtype not in _HALF_DTYPES:
            raise TypeError(f"dtype (of scales, zeros and bias) must be float16 or bfloat16, got {dtype}")
        k, n = in_features, out_features
        self.in_features = k
        self.out_features = n
        self.group_size = g
        self.register_buffer("qweight", torch.zeros(native_qweight_shape(n, k), dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.zeros((k // g, n), dtype=dtype, device=device))
        self.register_buffer(
            "zeros", None if symmetric else torch.full((k // g, n), SYMMETRIC_ZERO, dtype=torch.uint8, device=device)
        )
        self.register_buffer("perm", torch.arange(k, dtype=torch.int32, device=device) if act_order else None)
        self.register_buffer("bias", torch.zeros(n, dtype=dtype, device=device) if bias else None)
        self.pdl = pdl
        self._w4a16_plan_logged = False

    # ------------------------------------------------------------------------------------------
    # Constructors
    # ------------------------------------------------------------------------------------------

    @classmethod
    def from_weight(
        cls, weight: W4A16Weight, bias: torch.Tensor | None = None, *, dtype: torch.dtype | None = None,
        pdl: bool = False,
    ) -> "W4A16Linear":
        """Wrap a prepared weight (from `prepare_weight` or an importer); the tensors are not copied.

        `dtype` is the activations' dtype: `bias` [N] is cast to it so that the output keeps it
        (default: the scales' dtype if fp16/bf16, else fp16). Scales and zeros keep their dtype.
        """
        if not isinstance(weight, W4A16Weight):
            raise TypeError(f"weight must be a W4A16Weight (see prepare_weight), got {type(weight).__name__}")
        k, n = weight.in_features, weight.out_features
        if dtype is None:
            dtype = weight.scales.dtype if weight.scales.dtype in _HALF_DTYPES else torch.float16
        layer = cls(
            k, n, bias=bias is not None, group_size=weight.group_size, symmetric=weight.symmetric,
            act_order=weight.act_order, dtype=dtype, device="meta", pdl=pdl,
        )
        expected = {"qweight": layer.qweight, "scales": layer.scales, "zeros": layer.zeros, "perm": layer.perm}
        for name, like in expected.items():
            t = getattr(weight, name)
            if t is not None and tuple(t.shape) != tuple(like.shape):
                raise ValueError(
                    f"weight.{name} must have shape {tuple(like.shape)} for K={k}, N={n}, got {tuple(t.shape)}"
                )
        if weight.qweight.dtype != torch.int32:
            raise TypeError(f"weight.qweight must be int32, got {weight.qweight.dtype}")
        layer.qweight = weight.qweight
        layer.scales = weight.scales
        layer.zeros = weight.zeros
        layer.perm = weight.perm
        if bias is not None:
            if not isinstance(bias, torch.Tensor) or not bias.dtype.is_floating_point:
                raise TypeError(f"bias must be None or a floating-point tensor [N], got {getattr(bias, 'dtype', type(bias).__name__)}")
            if tuple(bias.shape) != (n,):
                raise ValueError(f"bias must have shape [N] = ({n},), got {tuple(bias.shape)}")
            layer.bias = bias.detach().to(device=weight.qweight.device, dtype=dtype).contiguous()
        return layer

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        group_size: int = 128,
        symmetric: bool = False,
        *,
        dtype: torch.dtype | None = None,
        pdl: bool = False,
    ) -> "W4A16Linear":
        """Quantize an `nn.Linear` (round to nearest, grouped along in_features) and keep its bias.

        Scales, zeros and bias take `dtype`; by default the linear's dtype if fp16/bf16, else fp16.
        An asymmetric layer keeps its zeros even when they all happen to be 8, so its state_dict
        keys are those of `W4A16Linear(..., symmetric=False)`.
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        if w.device.type == "meta":
            raise ValueError("linear.weight is on the meta device: from_linear quantizes the weight's values; build "
                             "W4A16Linear(in_features, out_features, ...) and load a quantized state_dict instead")
        if dtype is None:
            dtype = w.dtype if w.dtype in _HALF_DTYPES else torch.float16
        elif dtype not in _HALF_DTYPES:
            raise TypeError(f"dtype must be float16 or bfloat16, got {dtype}")
        if w.dtype != dtype and not (w.dtype == torch.float32 and dtype == torch.float16):
            # quantize_weight_int4_grouped stores scales in the weight's dtype (fp16 for fp32)
            w = w.to(dtype)
        with torch.no_grad():
            packed, scales, zeros = quantize_weight_int4_grouped(w.t(), group_size, symmetric)
            weight = prepare_weight(packed, scales.to(dtype), None if symmetric else zeros, group_size)  # integer zeros: uint8
        if not symmetric and weight.zeros is None:
            weight = _dc_replace(weight, zeros=torch.full_like(weight.scales, SYMMETRIC_ZERO, dtype=torch.uint8))
        return cls.from_weight(weight, linear.bias, dtype=dtype, pdl=pdl)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Zeros load in the checkpoint's dtype: copied into the uint8 buffer, fractional (float) zeros
        # would be truncated; integer zeros saved as floats by an older version stay correct as floats.
        # (The buffer is converted, not emptied, so a load that fails on a shape keeps the old values.)
        zeros = state_dict.get(prefix + "zeros")
        if isinstance(zeros, torch.Tensor) and self.zeros is not None and zeros.dtype != self.zeros.dtype:
            self.zeros = self.zeros.to(zeros.dtype)
        # A perm is checked once here (one sync): the kernels gather x through it without bounds checks.
        perm = state_dict.get(prefix + "perm")
        if isinstance(perm, torch.Tensor) and perm.device.type != "meta" and self.perm is not None:
            if perm.dtype.is_floating_point or tuple(perm.shape) != (self.in_features,):
                raise ValueError(f"{prefix}perm must be an integer tensor [in_features] = ({self.in_features},), "
                                 f"got {perm.dtype} {tuple(perm.shape)}")
            validate_permutation(perm, self.in_features)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ------------------------------------------------------------------------------------------
    # Forward and views
    # ------------------------------------------------------------------------------------------

    def weight_view(self) -> W4A16Weight:
        """The layer's buffers as a `W4A16Weight` (a view: no copies)."""
        return _weight_of(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _forward(self, x)

    @property
    def symmetric(self) -> bool:
        return self.zeros is None

    @property
    def act_order(self) -> bool:
        return self.perm is not None

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight in `nn.Linear` orientation [N, K] (for checks; computed in float64)."""
        return _weight_of(self).dequantize(torch.float64).t().to(dtype)

    def weight_nbytes(self) -> int:
        """Bytes held by the quantized weight (qweight, scales, zeros, perm; not the bias)."""
        return _weight_bytes(_weight_of(self))

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, format={_weight_of(self).describe()}" + (", pdl=True" if self.pdl else "")
        )


class W4A16LinearForward(nn.Module):
    """Kernel Hub layer: the `W4A16Linear` forward for any module holding its attributes.

    Stateless (no `__init__`, no other members): `kernels.kernelize` binds `forward` to the host
    module, which must hold `qweight`, `scales`, `zeros`, `perm`, `bias`, `in_features`,
    `out_features` and `group_size` as documented in this module. Inference only.
    """

    has_backward = False
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _forward(self, x)


# ----------------------------------------------------------------------------------------------
# Whole-model conversion
# ----------------------------------------------------------------------------------------------


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


@dataclass
class ConversionSummary:
    """What `convert_to_w4a16` / `convert_checkpoint_to_w4a16` did: converted names, skipped names with the reason,
    weight bytes (before: the converted Linears' float weights, counted from their shapes and dtypes)."""

    converted: list[str] = field(default_factory=list)  # qualified names of the replaced nn.Linear modules
    skipped: dict[str, str] = field(default_factory=dict)  # qualified name -> reason
    bytes_before: int = 0  # the converted layers' original weights
    bytes_after: int = 0  # their quantized weights (qweight + scales + zeros + perm)
    # convert_checkpoint_to_w4a16: the state_dict keys of the converted layers (every `<layer key>.<tensor>`, read or
    # not, e.g. g_idx), so the rest of the checkpoint can be loaded as the model's float weights
    checkpoint_keys: list[str] = field(default_factory=list)

    @property
    def saved_bytes(self) -> int:
        return self.bytes_before - self.bytes_after

    def __str__(self) -> str:
        ratio = f", {self.bytes_before / self.bytes_after:.1f}x smaller" if self.bytes_after else ""
        return (
            f"w4a16: converted {len(self.converted)} Linear layer(s), skipped {len(self.skipped)}; "
            f"weights {_mib(self.bytes_before)} -> {_mib(self.bytes_after)} "
            f"(saved {_mib(self.saved_bytes)}{ratio})"
        )


def _matching_pattern(name: str, patterns) -> str | None:
    """The first pattern equal to the qualified name, to one of its components, or to a dotted suffix."""
    parts = name.split(".")
    return next((p for p in patterns if name == p or p in parts or name.endswith("." + p)), None)


def _linear_references(model: nn.Module) -> list[tuple[nn.Linear, list[str], list[tuple[nn.Module, str]]]]:
    """Each `nn.Linear` below `model` once, in model order, with every qualified name it has and every reference
    (parent module, attribute) to it: a shared Linear is replaced everywhere it is reachable."""
    found: dict[int, tuple[nn.Linear, list, list]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if name and isinstance(module, nn.Linear):
            parent_name, _, attr = name.rpartition(".")
            _, names, refs = found.setdefault(id(module), (module, [], []))
            names.append(name)
            refs.append((model.get_submodule(parent_name), attr))
    return list(found.values())


def _replace_linear(summary: "ConversionSummary", name: str, linear: nn.Linear, refs, layer: "W4A16Linear") -> None:
    layer.train(linear.training)
    for parent, attr in refs:
        setattr(parent, attr, layer)
    summary.converted.append(name)
    summary.bytes_before += linear.weight.numel() * linear.weight.element_size()
    summary.bytes_after += layer.weight_nbytes()


def _check_model_dtype(dtype) -> None:
    """A whole-model conversion's `dtype`: None (each Linear's own) or the activations' float16 / bfloat16."""
    if dtype is not None and dtype not in _HALF_DTYPES:
        raise TypeError(f"dtype must be None, float16 or bfloat16, got {dtype}")


def _check_group_size(group_size: int) -> None:
    """Reject a group size no layer could take (a per-layer misfit is a skip, not an error)."""
    if group_size == -1:
        return
    if not is_int(group_size) or group_size <= 0:
        raise ValueError(f"group_size must be a positive int or -1 (per-channel), got {group_size!r}")
    validate_group_size(group_size, math.lcm(group_size, K_BLOCK))


def _skip_reason(linear: nn.Linear, group_size: int) -> str | None:
    w = linear.weight
    if type(linear).__name__ == "NonDynamicallyQuantizableLinear":
        return "out_proj of nn.MultiheadAttention (its weight is read directly, forward is never called)"
    if w.dtype not in _HALF_DTYPES + (torch.float32,):
        return f"weight dtype {w.dtype} (needs float16, bfloat16 or float32)"
    if w.device.type == "meta":
        return "weight on the meta device (no values to quantize)"
    try:
        validate_group_size(group_size, linear.in_features)
    except (ValueError, TypeError) as e:
        return str(e)
    return None


def convert_to_w4a16(
    model: nn.Module,
    group_size: int = 128,
    symmetric: bool = False,
    skip=("lm_head",),
    dtype: torch.dtype | None = None,
    *,
    pdl: bool = False,
) -> ConversionSummary:
    """Replace, in place, every `nn.Linear` of `model` by a `W4A16Linear` quantized from it.

    `skip`: names to leave alone; a layer is skipped when a pattern equals its qualified name, one
    of its components (`"lm_head"`) or a dotted suffix (`"mlp.down_proj"`). A single string is
    taken as one pattern. Layers the kernels cannot take (in_features not a multiple of 8 and of
    the group size, unsupported dtype, ...) are skipped too, with the reason in `summary.skipped`.
    `dtype`: dtype of scales, zeros and bias (default: each layer's dtype if fp16/bf16, else fp16).
    A Linear reachable under several names (shared) is converted once and replaced everywhere
    (skipped if any of its names matches `skip`); it is reported under its first name.
    `pdl`: every converted layer's `pdl` (`W4A16Linear`): for a model whose forward runs in a CUDA graph, where the
    kernel before each GEMM writes activations, never weights.
    """
    _check_group_size(group_size)
    check_flag("pdl", pdl)
    check_flag("symmetric", symmetric)  # (here too: a model whose layers are all skipped never reaches from_linear)
    _check_model_dtype(dtype)
    if isinstance(skip, str):
        skip = (skip,)
    if skip is not None and not (isinstance(skip, (tuple, list, set, frozenset)) and all(isinstance(p, str) for p in skip)):
        raise TypeError(f"skip must be None, a string or a sequence of strings (module name patterns), got {skip!r}")
    skip = tuple(skip or ())
    summary = ConversionSummary()
    if isinstance(model, nn.Linear):
        summary.skipped[""] = "the root module cannot be replaced in place"
        return summary

    for linear, names, refs in _linear_references(model):
        name = names[0]  # a shared Linear is reported under its first name
        pattern = next(filter(None, (_matching_pattern(n, skip) for n in names)), None)
        if pattern is not None:
            summary.skipped[name] = f"matches skip pattern {pattern!r}"
            continue
        reason = _skip_reason(linear, group_size)
        if reason is not None:
            summary.skipped[name] = reason
            continue
        layer = W4A16Linear.from_linear(linear, group_size=group_size, symmetric=symmetric, dtype=dtype, pdl=pdl)
        _replace_linear(summary, name, linear, refs, layer)
    return summary


def convert_checkpoint_to_w4a16(
    model: nn.Module,
    state_dict,
    checkpoint_format: str,
    *,
    group_size: int | None = None,
    zero_convention: str | None = None,
    symmetric: bool = False,
    prefix: str = "",
    dtype: torch.dtype | None = None,
    pdl: bool = False,
) -> ConversionSummary:
    """Replace, in place, every `nn.Linear` of `model` that a GPTQ, AWQ or compressed-tensors checkpoint holds
    quantized by a `W4A16Linear` imported from the checkpoint's tensors (the importers of `formats`).

    `state_dict`: the checkpoint's tensors by key, every shard merged (one layer's tensors may sit in different shards),
    e.g. `safetensors.torch.load_file(path)`; or any mapping (keys(), get()) that loads a tensor when asked, such as a
    view over the shards' `safe_open` handles: only the converted layers' tensors are read. The Linear `name` is
    quantized when `state_dict` holds `prefix + name + ".qweight"` (gptq, awq) or `".weight_packed"`
    (compressed-tensors); its bias comes from `<key>.bias` when present, else from the Linear. `checkpoint_format`'s
    options come from the checkpoint's quantization config: `group_size` (gptq, awq; -1 per-channel; compressed-tensors
    infers it per layer), `zero_convention` (gptq: "v1" for checkpoint_format "gptq", "v2" for "gptq_v2") and
    `symmetric` (gptq's `sym`); `formats.checkpoint_options(config["quantization_config"])` reads all of them from a
    model's config.json.
    `dtype`: the activations' dtype, which the bias takes (default: each Linear's dtype if fp16/bf16, else the
    scales'). `pdl`: every converted layer's `pdl`, as in `convert_to_w4a16`.

    The model may be built on the meta device: a quantized Linear's values are never read (a meta Linear's bias must
    then be in the checkpoint). Linears the checkpoint does not hold quantized (typically the LM head) are left
    as they are and listed in `summary.skipped`; the float weights are the rest of the checkpoint, every key but
    `summary.checkpoint_keys` (`model.load_state_dict(rest, strict=False, assign=True)` for a meta model). Every
    layer is imported before any is replaced, so an error leaves the model as it was; it names the layer's key.
    Quantized tensors that belong to no Linear of the model (a wrong `prefix`) are an error too.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not hasattr(state_dict, "keys") or not hasattr(state_dict, "get"):
        raise TypeError(f"state_dict must be a mapping of tensor names to tensors, got {type(state_dict).__name__}")
    check_checkpoint_arguments(checkpoint_format, group_size, zero_convention, symmetric)
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str (prepended to module names to form the checkpoint's keys), "
                        f"got {prefix!r}")
    _check_model_dtype(dtype)
    check_flag("pdl", pdl)
    suffix = "." + CHECKPOINT_MARKERS[checkpoint_format]
    keys_of: dict[str, list[str]] = {}  # checkpoint module key -> its tensors' keys
    for key in state_dict.keys():
        if isinstance(key, str):
            keys_of.setdefault(key.rpartition(".")[0], []).append(key)
    # the model's names of the modules the checkpoint holds quantized
    quantized = {module[len(prefix):] for module, keys in keys_of.items()
                 if module.startswith(prefix) and module + suffix in keys}
    linears = _linear_references(model)
    known = {n for _, names, _ in linears for n in names}
    known |= {n for n, m in model.named_modules() if isinstance(m, W4A16Linear)}  # converted by an earlier call
    unmatched = sorted(quantized - known)
    if unmatched:
        raise ValueError(f"state_dict holds quantized layers for which the model has no nn.Linear (with prefix "
                         f"{prefix!r}): {', '.join(prefix + n for n in unmatched[:5])}"
                         f"{f' and {len(unmatched) - 5} more' if len(unmatched) > 5 else ''}; check `prefix`")

    summary, imported = ConversionSummary(), []
    for linear, names, refs in linears:
        name = next((n for n in names if n in quantized), None)
        if name is None:
            summary.skipped[names[0]] = f"not quantized in the checkpoint (no {prefix}{names[0]}{suffix})"
            continue
        key = prefix + name
        try:  # every error below names its argument or tensor; this says which layer it was
            weight = import_checkpoint_layer(state_dict, key, checkpoint_format, group_size=group_size,
                                             zero_convention=zero_convention, symmetric=symmetric)
            if (weight.in_features, weight.out_features) != (linear.in_features, linear.out_features):
                raise ValueError(f"the checkpoint's layer has in_features={weight.in_features}, out_features="
                                 f"{weight.out_features}; the model's {name} has {linear.in_features}, "
                                 f"{linear.out_features}")
            bias = state_dict.get(f"{key}.bias")
            if bias is None and linear.bias is not None:
                if linear.bias.device.type == "meta":
                    raise ValueError(f"{key}.bias is not in state_dict and {name}.bias is on the meta device")
                bias = linear.bias
            layer_dtype = dtype or (linear.weight.dtype if linear.weight.dtype in _HALF_DTYPES else None)
            layer = W4A16Linear.from_weight(weight, bias, dtype=layer_dtype, pdl=pdl)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{key}: {e}") from e
        imported.append((name, linear, refs, layer))
    for name, linear, refs, layer in imported:
        _replace_linear(summary, name, linear, refs, layer)
        summary.checkpoint_keys += keys_of[prefix + name]
    return summary
