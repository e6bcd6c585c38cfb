"""Checkpoint importers: GPTQ, AWQ (GEMM format) and compressed-tensors pack-quantized -> `W4A16Weight`; one layer of a
whole checkpoint by its keys (`import_checkpoint_layer`), and the import's arguments read from a quantization config
(`checkpoint_options`).

Each importer reads a checkpoint's tensors, converts them into the seed layout (see `quantize`):

    packed int32 [K/8, N] (codes along K, low bits first), scales [K/G, N],
    zeros [K/G, N] as uint8 codes (or None: symmetric, zero 8), optional g_idx [K],

and returns `prepare_weight(...)`. K = in_features, N = out_features, G = group size along K
(`group_size=-1`: one group spanning all of K). The weight is always w = (q - z) * s per group, q and
z being unsigned 4-bit codes as stored in the checkpoint (after each format's zero correction).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .layout import W4A16Weight, prepare_weight
from .quantize import check_flag, is_int, pack_int4_k_major, validate_group_size

__all__ = ["import_gptq", "import_awq", "import_compressed_tensors", "checkpoint_options"]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_NATURAL_ORDER = (0, 1, 2, 3, 4, 5, 6, 7)
# AWQ GEMM packing: nibble position p of word c holds column 8*c + _AWQ_ORDER[p].
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _check(t, name: str, shape: tuple[int, ...], what: str, dtypes: tuple[torch.dtype, ...]) -> None:
    """Raise TypeError / ValueError naming `name` unless `t` is a tensor of one of `dtypes` and `shape`."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {what}, got {type(t).__name__}")
    if t.dtype not in dtypes:
        names = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype {names}, got {str(t.dtype).replace('torch.', '')}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {what} = {shape}, got {tuple(t.shape)}")


def _check_2d_int32(t, name: str, what: str) -> tuple[int, int]:
    """Check that `t` is a 2-D int32 tensor (shape still unknown) and return its shape."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {what}, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype int32 {what}, got {str(t.dtype).replace('torch.', '')}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D {what}, got shape {tuple(t.shape)}")
    return t.shape[0], t.shape[1]


def _unpack_along_last(words: torch.Tensor, n: int, order: Sequence[int] = _NATURAL_ORDER) -> torch.Tensor:
    """int32 [R, C] with 8 nibbles per word along the last dim -> int64 codes [R, n] (n <= 8*C).

    Nibble position p (bits 4p..4p+3) of word c holds element 8*c + order[p]; trailing padding
    elements beyond n are dropped. Shared by every format that packs along a dimension.
    """
    r, c = words.shape
    shifts = torch.arange(8, device=words.device, dtype=torch.int64) * 4
    nibbles = (words.to(torch.int64).unsqueeze(-1) >> shifts) & 0xF  # [R, C, p]
    inverse = [0] * 8  # element e of a word sits at nibble position inverse[e]
    for p, e in enumerate(order):
        inverse[e] = p
    codes = nibbles[..., inverse]  # [R, C, e]
    return codes.reshape(r, 8 * c)[:, :n]


def import_gptq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor | None,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None = None,
    *,
    group_size: int,
    zero_convention: str,
    symmetric: bool = False,
) -> W4A16Weight:
    """Import a GPTQ (AutoGPTQ / GPTQModel) 4-bit linear layer.

    Layout contract:
        qweight int32 [K/8, N]        codes packed along K, low bits first (nibble j of row i is k = 8i + j)
        qzeros  int32 [K/G, ceil(N/8)] zero codes packed along N, low bits first (padding columns ignored)
        scales  fp16/bf16/fp32 [K/G, N]
        g_idx   integer [K] or None   group of each input row (act-order / desc_act); each group must hold G rows
    `zero_convention` (required): "v1" = classic format storing z - 1 (1 is added on load),
    "v2" = GPTQModel's corrected format storing z. `symmetric=True` (uint4b8): every zero is 8 and
    `qzeros` is ignored (may be None). `group_size=-1` means per-channel (G = K).
    """
    if zero_convention not in ("v1", "v2"):
        raise ValueError(
            "zero_convention must be 'v1' (classic GPTQ: stored zero = z - 1) or 'v2' (GPTQModel: stored "
            f"zero = z); read it from the checkpoint's quantization config. Got {zero_convention!r}"
        )
    check_flag("symmetric", symmetric)  # ("no" is truthy: it would drop qzeros silently)
    k8, n = _check_2d_int32(qweight, "qweight", "[K/8, N]")
    k = k8 * 8
    g = validate_group_size(group_size, k)
    _check(scales, "scales", (k // g, n), "[K/G, N]", _FLOAT_DTYPES)
    if symmetric:
        zeros = None
    else:
        if qzeros is None:
            raise ValueError("qzeros is required for an asymmetric GPTQ checkpoint (pass symmetric=True for uint4b8)")
        _check(qzeros, "qzeros", (k // g, -(-n // 8)), "[K/G, ceil(N/8)]", (torch.int32,))
        z = _unpack_along_last(qzeros, n)
        if zero_convention == "v1":
            # Classic GPTQ packs z - 1 and its kernels add 1 to the unpacked nibble with no wrap, so
            # the effective zero lies in 1..16 and a stored 15 means z = 16 (not z = 0). We do the same
            # (our uint8 zeros hold 16), reproducing the outputs such checkpoints
            # were evaluated with. A z = 0 cannot be expressed in v1; that is what v2 fixed.
            z = z + 1
        zeros = z.to(torch.uint8)
    return prepare_weight(qweight, scales, zeros, group_size=g, g_idx=g_idx)


def import_awq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    *,
    group_size: int,
) -> W4A16Weight:
    """Import an AutoAWQ "GEMM"-format 4-bit linear layer (always asymmetric, no zero correction).

    Layout contract:
        qweight int32 [K, N/8]    codes packed along N, interleaved: nibble position p of word c
                                  holds column 8c + [0, 2, 4, 6, 1, 3, 5, 7][p]
        qzeros  int32 [K/G, N/8]  zero codes, same packing and order; stored zero = z
        scales  fp16/bf16/fp32 [K/G, N]
    (The "GEMV" format, [N, K/8] in natural order, is a different layout and is not accepted here.)
    """
    k, n8 = _check_2d_int32(qweight, "qweight", "[K, N/8]")
    n = n8 * 8
    g = validate_group_size(group_size, k)
    _check(scales, "scales", (k // g, n), "[K/G, N]", _FLOAT_DTYPES)
    _check(qzeros, "qzeros", (k // g, n8), "[K/G, N/8]", (torch.int32,))
    codes = _unpack_along_last(qweight, n, _AWQ_ORDER)  # [K, N]
    zeros = _unpack_along_last(qzeros, n, _AWQ_ORDER).to(torch.uint8)
    return prepare_weight(pack_int4_k_major(codes), scales, zeros, group_size=g)


def import_compressed_tensors(
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_zero_point: torch.Tensor | None = None,
    *,
    group_size: int | None = None,
    weight_shape: torch.Tensor | Sequence[int] | None = None,
    weight_g_idx: torch.Tensor | None = None,
) -> W4A16Weight:
    """Import a compressed-tensors "pack-quantized" 4-bit linear layer (llm-compressor).

    Layout contract (4-bit, group or channel strategy):
        weight_packed     int32 [N, K/8]         codes packed along K, low bits first (GPTQ's layout transposed)
        weight_scale      fp16/bf16/fp32 [N, K/G]
        weight_zero_point int32 [ceil(N/8), K/G] zero codes packed along N (rows), low bits first;
                                                 None for symmetric (zero 8)
        weight_shape      [N, K] (optional)      checked against the other tensors when given
        weight_g_idx      integer [K] (optional) group of each input column (`actorder: group`), as GPTQ's g_idx
    Nibbles are the stored unsigned values (the signed value + 8), so w = (q - z) * s on them directly.
    `group_size=None` infers G = K / weight_scale.shape[1] (a single column means per-channel).
    """
    n, k8 = _check_2d_int32(weight_packed, "weight_packed", "[N, K/8]")
    k = k8 * 8
    if not isinstance(weight_scale, torch.Tensor):
        raise TypeError(f"weight_scale must be a torch.Tensor [N, K/G], got {type(weight_scale).__name__}")
    if weight_scale.dim() != 2:
        raise ValueError(f"weight_scale must be 2-D [N, K/G], got shape {tuple(weight_scale.shape)}")
    if group_size is None:
        groups = weight_scale.shape[1]
        if groups <= 0 or k % groups != 0:
            raise ValueError(
                f"cannot infer group_size: weight_scale has {groups} columns, which does not divide K={k}"
            )
        group_size = k // groups
    g = validate_group_size(group_size, k)
    _check(weight_scale, "weight_scale", (n, k // g), "[N, K/G]", _FLOAT_DTYPES)
    if weight_shape is not None:
        if isinstance(weight_shape, torch.Tensor):
            weight_shape = weight_shape.tolist()
        if not isinstance(weight_shape, Sequence) or not all(is_int(v) for v in weight_shape):
            raise ValueError(f"weight_shape must be None or [N, K] as two ints (or an integer tensor), got {weight_shape!r}")
        shape = tuple(weight_shape)
        if shape != (n, k):
            raise ValueError(f"weight_shape must be [N, K] = {(n, k)} (from weight_packed), got {shape}")
    zeros = None
    if weight_zero_point is not None:
        _check(weight_zero_point, "weight_zero_point", (-(-n // 8), k // g), "[ceil(N/8), K/G]", (torch.int32,))
        zeros = _unpack_along_last(weight_zero_point.t(), n).to(torch.uint8)  # [K/G, N]
    codes = _unpack_along_last(weight_packed, k).t()  # [K, N]
    scales = weight_scale.t().contiguous()
    return prepare_weight(pack_int4_k_major(codes), scales, zeros, group_size=g, g_idx=weight_g_idx)


# Whole checkpoints. Per format: the tensor whose key `<module>.<name>` marks a module as quantized in a checkpoint.
CHECKPOINT_MARKERS = {"gptq": "qweight", "awq": "qweight", "compressed-tensors": "weight_packed"}


def import_checkpoint_layer(state_dict, key: str, checkpoint_format: str, *, group_size, zero_convention,
                            symmetric: bool) -> W4A16Weight:
    """One quantized layer of a whole checkpoint: its tensors `<key>.<tensor>` in `state_dict` through its format's
    importer (arguments as `check_checkpoint_arguments` accepts them)."""
    marker = CHECKPOINT_MARKERS[checkpoint_format]

    def tensor(name: str, required: bool = True):
        t = state_dict.get(f"{key}.{name}")
        if t is None and required:
            raise ValueError(f"state_dict has {key}.{marker} but no {key}.{name} (a sharded checkpoint: pass the "
                             f"tensors of all its shards in one mapping)")
        return t

    if checkpoint_format == "gptq":
        return import_gptq(tensor("qweight"), tensor("qzeros", required=not symmetric), tensor("scales"),
                           tensor("g_idx", required=False), group_size=group_size, zero_convention=zero_convention,
                           symmetric=symmetric)
    if checkpoint_format == "awq":
        return import_awq(tensor("qweight"), tensor("qzeros"), tensor("scales"), group_size=group_size)
    return import_compressed_tensors(tensor("weight_packed"), tensor("weight_scale"),
                                     tensor("weight_zero_point", required=False), group_size=group_size,
                                     weight_shape=tensor("weight_shape", required=False),
                                     weight_g_idx=tensor("weight_g_idx", required=False))


def check_checkpoint_arguments(checkpoint_format, group_size, zero_convention, symmetric) -> None:
    """The arguments a whole checkpoint's import takes (`layers.convert_checkpoint_to_w4a16`), checked once."""
    if checkpoint_format not in CHECKPOINT_MARKERS:
        raise ValueError(f"checkpoint_format must be one of {sorted(CHECKPOINT_MARKERS)}, got {checkpoint_format!r}")
    check_flag("symmetric", symmetric)
    if checkpoint_format in ("gptq", "awq") and group_size is None:
        raise ValueError(f"group_size is required for a {checkpoint_format} checkpoint (its quantization config's "
                         "group_size; -1 for per-channel)")
    if checkpoint_format != "gptq":
        if zero_convention is not None:
            raise ValueError(f"zero_convention applies to GPTQ checkpoints only, got {zero_convention!r} for "
                             f"{checkpoint_format}")
        if symmetric:
            raise ValueError(f"symmetric=True applies to GPTQ checkpoints only: {checkpoint_format}'s symmetry "
                             "follows its tensors (AWQ is always asymmetric; compressed-tensors is symmetric where "
                             "weight_zero_point is absent)")


def _config_int(config: dict, names: tuple[str, ...], what: str, where: str = "quantization_config") -> int:
    """The first of `names` present in `config` (`where`; the names are its spellings across tools), as an int."""
    for name in names:
        if name in config:
            value = config[name]
            if not is_int(value):
                raise ValueError(f"{where}[{name!r}] ({what}) must be an int, got {value!r}")
            return value
    raise ValueError(f"{where} has no {what} ({' or '.join(repr(n) for n in names)})")


def _require_4_bits(bits: int, where: str) -> None:
    if bits != 4:
        raise ValueError(f"{where} is {bits}: w4a16 runs 4-bit weights only")


def _gptq_options(config: dict) -> dict:
    _require_4_bits(_config_int(config, ("bits",), "bit width"), "quantization_config['bits']")
    packing = config.get("checkpoint_format", "gptq")
    conventions = {"gptq": "v1", "gptq_v2": "v2"}
    if packing not in conventions:
        raise ValueError(f"quantization_config['checkpoint_format'] must be 'gptq' or 'gptq_v2' (GPTQ's own packing), "
                         f"got {packing!r}")
    symmetric = config.get("sym", True)
    check_flag("quantization_config['sym']", symmetric)
    return {"checkpoint_format": "gptq", "group_size": _config_int(config, ("group_size",), "group size"),
            "zero_convention": conventions[packing], "symmetric": symmetric}


def _awq_options(config: dict) -> dict:
    _require_4_bits(_config_int(config, ("bits", "w_bit"), "bit width"), "the AWQ bit width")
    version = config.get("version", "gemm")
    if not isinstance(version, str) or version.lower() != "gemm":
        raise ValueError(f"quantization_config['version'] must be 'gemm' (AWQ's GEMM packing), got {version!r}")
    if config.get("zero_point", True) is not True:
        raise ValueError(f"quantization_config['zero_point'] must be true (AWQ GEMM checkpoints are asymmetric), got "
                         f"{config.get('zero_point')!r}")
    return {"checkpoint_format": "awq", "group_size": _config_int(config, ("group_size", "q_group_size"), "group size")}


def _compressed_tensors_options(config: dict) -> dict:
    groups = config.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ValueError("quantization_config['config_groups'] must be a non-empty dict of quantization groups")
    sizes = set()
    for name, group in groups.items():
        where = f"quantization_config['config_groups'][{name!r}]"
        if not isinstance(group, dict):
            raise ValueError(f"{where} must be a dict, got {group!r}")
        packing = group.get("format") or config.get("format")
        if packing != "pack-quantized":
            raise ValueError(f"{where}: format must be 'pack-quantized', got {packing!r}")
        if group.get("input_activations") is not None:
            raise ValueError(f"{where}['input_activations'] must be null: quantized activations are not W4A16")
        weights = group.get("weights")
        if not isinstance(weights, dict):
            raise ValueError(f"{where}['weights'] must be a dict of the weights' quantization arguments")
        _require_4_bits(_config_int(weights, ("num_bits",), "bit width", f"{where}['weights']"),
                        f"{where}['weights']['num_bits']")
        if weights.get("type", "int") != "int":
            raise ValueError(f"{where}['weights']['type'] must be 'int', got {weights.get('type')!r}")
        strategy = weights.get("strategy")
        if strategy == "group":
            sizes.add(_config_int(weights, ("group_size",), "group size", f"{where}['weights']"))
        elif strategy == "channel":
            sizes.add(-1)
        else:
            raise ValueError(f"{where}['weights']['strategy'] must be 'group' or 'channel', got {strategy!r}")
    if len(sizes) != 1:
        raise ValueError(f"quantization_config's config groups disagree on the group size ({sorted(sizes)}): convert "
                         "each group's layers with its own group_size")
    return {"checkpoint_format": "compressed-tensors", "group_size": sizes.pop()}


# quant_method -> its reader; each quant_method is the CHECKPOINT_MARKERS format of the same name
_OPTIONS_BY_METHOD = {"gptq": _gptq_options, "awq": _awq_options, "compressed-tensors": _compressed_tensors_options}


def checkpoint_options(quantization_config: dict) -> dict:
    """The `convert_checkpoint_to_w4a16` arguments that a checkpoint's quantization config states.

    `quantization_config`: the `quantization_config` object of a Hugging Face model's config.json (or a GPTQ
    quantize_config.json with its `quant_method`). Read, by `quant_method`:
        "gptq"                `bits` 4, `group_size`, `sym` (default True, as GPTQConfig's), `checkpoint_format`
                              "gptq" (zero convention v1, the default) or "gptq_v2" (v2); `desc_act` needs nothing
                              (the checkpoint's g_idx says it)
        "awq"                 `bits` / `w_bit` 4, `group_size` / `q_group_size`, `version` "gemm", `zero_point` true
        "compressed-tensors"  `format` "pack-quantized" (top level or per group); every config group's `weights`:
                              `num_bits` 4, `type` "int", `strategy` "group" (its `group_size`) or "channel", one
                              group size for all groups; no `input_activations` (quantized activations are not
                              W4A16). `actorder` needs nothing (the checkpoint's weight_g_idx says it), nor symmetry
                              (each layer's weight_zero_point says it)
    Anything else is a ValueError (a TypeError for a flag that is not a bool) naming the field: a checkpoint this
    package cannot run must not load.
    """
    if not isinstance(quantization_config, dict):
        raise TypeError(f"quantization_config must be a dict (config.json's quantization_config), got "
                        f"{type(quantization_config).__name__}")
    method = quantization_config.get("quant_method")
    if method not in _OPTIONS_BY_METHOD:
        raise ValueError(f"quantization_config['quant_method'] must be one of {sorted(_OPTIONS_BY_METHOD)}, got "
                         f"{method!r}")
    return _OPTIONS_BY_METHOD[method](quantization_config)
