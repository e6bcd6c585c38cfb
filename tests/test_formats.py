"""Checkpoint importers (GPTQ, AWQ, compressed-tensors) against independent reconstructions.

Every checkpoint here is written by a small encoder in this file, following the format descriptions
in FORMATS.md (not the package's pack functions), from known codes / zeros / scales. The imported
weight must dequantize exactly to the float64 reference (q - z) * s computed from those known values.
Wrong nibble orders and off-by-one zeros must be caught by `check_layer`.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

pytestmark = pytest.mark.kernels_ci

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble position p holds element order[p]
NATURAL = (0, 1, 2, 3, 4, 5, 6, 7)


# ---------------------------------------------------------------------------------------------
# Independent encoders
# ---------------------------------------------------------------------------------------------


def _as_int32(words: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit values held in int64 -> the int32 tensor with the same bit pattern."""
    assert bool(((words >= 0) & (words < 2**32)).all())
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _pack_rows(codes: torch.Tensor, order=NATURAL) -> torch.Tensor:
    """Pack 4-bit values along dim 0: word i, nibble position p <- codes[8*i + order[p]].

    Rows beyond codes.shape[0] (padding up to a multiple of 8) get random garbage nibbles, which
    an importer must ignore.
    """
    r, c = codes.shape
    garbage = torch.Generator().manual_seed(r * 131 + c)
    padded = torch.randint(0, 16, (-(-r // 8) * 8, c), generator=garbage, dtype=torch.int64)
    padded[:r] = codes.to(torch.int64)
    words = torch.zeros((padded.shape[0] // 8, c), dtype=torch.int64)
    for p in range(8):
        words |= padded[order[p] :: 8] << (4 * p)
    return _as_int32(words)


def _pack_cols(codes: torch.Tensor, order=NATURAL) -> torch.Tensor:
    """Pack 4-bit values along dim 1: word c, nibble position p <- codes[:, 8*c + order[p]]."""
    return _pack_rows(codes.t(), order).t().contiguous()


def _codes(gen, *shape):
    return torch.randint(0, 16, shape, generator=gen, dtype=torch.int64)


def _scales(gen, *shape):
    return (torch.rand(shape, generator=gen) * 0.02 + 0.001).to(torch.float16)


def _reference(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor, group_of_row: torch.Tensor) -> torch.Tensor:
    """float64 [K, N]: w[k, n] = (q[k, n] - z[g(k), n]) * s[g(k), n]."""
    zk = z.to(torch.float64)[group_of_row]
    sk = s.to(torch.float64)[group_of_row]
    return (q.to(torch.float64) - zk) * sk


def _groups(k: int, g: int) -> torch.Tensor:
    return torch.arange(k) // (k if g == -1 else g)


def _act_order_g_idx(gen, k: int, g: int) -> torch.Tensor:
    """A desc_act-style g_idx: a random permutation of rows, G rows per group."""
    return (torch.randperm(k, generator=gen) // g).to(torch.int32)


def _gptq_checkpoint(gen, k, n, g, convention, symmetric=False, act_order=False):
    """Known codes/zeros/scales and the GPTQ tensors that encode them."""
    ng = 1 if g == -1 else k // g
    q = _codes(gen, k, n)
    s = _scales(gen, ng, n)
    if symmetric:
        z = torch.full((ng, n), 8, dtype=torch.int64)
        qzeros = None
    else:
        if convention == "v1":
            # v1 stores z - 1; z spans 1..16 (stored 0..15). Make sure both ends occur.
            z = torch.randint(1, 17, (ng, n), generator=gen, dtype=torch.int64)
            z[0, 0], z[-1, -1] = 1, 16
            stored = z - 1
        else:
            z = _codes(gen, ng, n)
            z[0, 0], z[-1, -1] = 0, 15
            stored = z
        qzeros = _pack_cols(stored)
    g_idx = _act_order_g_idx(gen, k, g) if act_order else None
    groups = g_idx.to(torch.int64) if act_order else _groups(k, g)
    return dict(qweight=_pack_rows(q), qzeros=qzeros, scales=s, g_idx=g_idx), _reference(q, z, s, groups)


def _awq_checkpoint(gen, k, n, g, order=AWQ_ORDER):
    ng = 1 if g == -1 else k // g
    q, z, s = _codes(gen, k, n), _codes(gen, ng, n), _scales(gen, ng, n)
    ckpt = dict(qweight=_pack_cols(q, order), qzeros=_pack_cols(z, order), scales=s)
    return ckpt, _reference(q, z, s, _groups(k, g))


def _ct_checkpoint(gen, k, n, g, with_zero_point, act_order=False):
    ng = 1 if g == -1 else k // g
    q, s = _codes(gen, k, n), _scales(gen, ng, n)
    z = _codes(gen, ng, n) if with_zero_point else torch.full((ng, n), 8, dtype=torch.int64)
    ckpt = dict(
        weight_packed=_pack_cols(q.t()),  # [N, K/8], along K
        weight_scale=s.t().contiguous(),  # [N, K/G]
        weight_zero_point=_pack_rows(z.t()) if with_zero_point else None,  # [ceil(N/8), K/G], along N
    )
    groups = _groups(k, g)
    if act_order:  # `actorder: group`: columns stay in place, weight_g_idx maps each to its group
        ckpt["weight_g_idx"] = _act_order_g_idx(gen, k, g)
        groups = ckpt["weight_g_idx"].to(torch.int64)
    return ckpt, _reference(q, z, s, groups)


def _assert_exact(weight, ref, k, n):
    assert (weight.in_features, weight.out_features) == (k, n)
    deq = weight.dequantize()
    assert deq.dtype == torch.float64 and tuple(deq.shape) == (k, n)
    assert torch.equal(deq, ref), f"max abs diff {(deq - ref).abs().max().item()}"


# ---------------------------------------------------------------------------------------------
# Exact reconstruction
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "k,n,g,convention",
    [
        (256, 64, 128, "v1"),
        (256, 48, 32, "v2"),
        (320, 24, 64, "v1"),  # K not a multiple of 128 (tensor-parallel shard style)
        (320, 24, 64, "v2"),
        (256, 16, -1, "v1"),  # per-channel
        (128, 20, 64, "v1"),  # N not a multiple of 8: qzeros has ceil(N/8) columns
        (128, 20, 32, "v2"),
    ],
)
def test_gptq_exact(w4a16, k, n, g, convention):
    gen = torch.Generator().manual_seed(k * 1000 + n + g)
    ckpt, ref = _gptq_checkpoint(gen, k, n, g, convention)
    weight = w4a16.import_gptq(**ckpt, group_size=g, zero_convention=convention)
    _assert_exact(weight, ref, k, n)
    assert weight.group_size == (k if g == -1 else g)
    assert not weight.symmetric and not weight.act_order


@pytest.mark.parametrize("convention", ["v1", "v2"])
@pytest.mark.parametrize("g", [32, 64])
def test_gptq_act_order_exact(w4a16, convention, g):
    gen = torch.Generator().manual_seed(7 + g)
    ckpt, ref = _gptq_checkpoint(gen, 256, 40, g, convention, act_order=True)
    weight = w4a16.import_gptq(**ckpt, group_size=g, zero_convention=convention)
    assert weight.act_order
    _assert_exact(weight, ref, 256, 40)


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("pass_qzeros", [False, True])
def test_gptq_symmetric_uint4b8_exact(w4a16, act_order, pass_qzeros):
    gen = torch.Generator().manual_seed(11)
    ckpt, ref = _gptq_checkpoint(gen, 256, 32, 64, "v1", symmetric=True, act_order=act_order)
    if pass_qzeros:  # symmetric checkpoints may still carry qzeros (v1: 7 = 8 - 1); they are ignored
        ckpt["qzeros"] = _pack_cols(torch.full((4, 32), 7, dtype=torch.int64))
    weight = w4a16.import_gptq(**ckpt, group_size=64, zero_convention="v1", symmetric=True)
    assert weight.symmetric and weight.act_order == act_order
    _assert_exact(weight, ref, 256, 32)


@pytest.mark.parametrize("k,n,g", [(256, 64, 128), (128, 16, 32), (320, 32, 64), (256, 24, -1)])
def test_awq_exact(w4a16, k, n, g):
    gen = torch.Generator().manual_seed(k + n + g)
    ckpt, ref = _awq_checkpoint(gen, k, n, g)
    weight = w4a16.import_awq(**ckpt, group_size=g)
    _assert_exact(weight, ref, k, n)


@pytest.mark.parametrize(
    "k,n,g,with_zp,infer",
    [
        (256, 64, 128, True, True),
        (256, 64, 128, False, False),
        (128, 20, 32, True, True),  # N not a multiple of 8: zero points padded to ceil(N/8) rows
        (128, 20, 64, False, True),
        (320, 24, 64, True, False),
        (256, 16, -1, True, True),  # channel strategy: weight_scale [N, 1]
    ],
)
def test_compressed_tensors_exact(w4a16, k, n, g, with_zp, infer):
    gen = torch.Generator().manual_seed(k + n + g + with_zp)
    ckpt, ref = _ct_checkpoint(gen, k, n, g, with_zp)
    kwargs = {} if infer else {"group_size": g}
    weight = w4a16.import_compressed_tensors(**ckpt, weight_shape=torch.tensor([n, k]), **kwargs)
    _assert_exact(weight, ref, k, n)
    assert weight.group_size == (k if g == -1 else g)
    assert weight.symmetric == (not with_zp)


@pytest.mark.parametrize("with_zp", [False, True])
def test_compressed_tensors_act_order_exact(w4a16, with_zp):
    gen = torch.Generator().manual_seed(35 + with_zp)
    ckpt, ref = _ct_checkpoint(gen, 256, 40, 64, with_zp, act_order=True)
    weight = w4a16.import_compressed_tensors(**ckpt)
    assert weight.act_order and weight.symmetric == (not with_zp)
    _assert_exact(weight, ref, 256, 40)


# ---------------------------------------------------------------------------------------------
# Wrong layouts are caught by check_layer; right ones pass it
# ---------------------------------------------------------------------------------------------


# check_layer's error on a failed comparison (functional.py), not some other ValueError on the way
CHECK_LAYER_FAILED = r"w4a16 check_layer failed for .*: relative errors \{1: .*, 3: .*\} exceed 0\.01"


def test_check_layer_accepts_correct_imports(w4a16):
    gen = torch.Generator().manual_seed(21)
    ckpt, ref = _awq_checkpoint(gen, 256, 32, 64)
    w4a16.check_layer(w4a16.import_awq(**ckpt, group_size=64), reference_linear_weight=ref.t(), batch_sizes=(1, 3))
    ckpt, ref = _gptq_checkpoint(gen, 256, 32, 64, "v1", act_order=True)
    weight = w4a16.import_gptq(**ckpt, group_size=64, zero_convention="v1")
    w4a16.check_layer(weight, reference_linear_weight=ref.t(), batch_sizes=(1, 3))


def test_check_layer_catches_wrong_nibble_order(w4a16):
    # A checkpoint packed in natural nibble order, read by the AWQ importer (interleaved order).
    gen = torch.Generator().manual_seed(22)
    ckpt, ref = _awq_checkpoint(gen, 256, 32, 64, order=NATURAL)
    weight = w4a16.import_awq(**ckpt, group_size=64)
    with pytest.raises(ValueError, match=CHECK_LAYER_FAILED):
        w4a16.check_layer(weight, reference_linear_weight=ref.t(), batch_sizes=(1, 3))


def test_check_layer_catches_wrong_zero_convention(w4a16):
    # A v1 checkpoint read as v2: every zero off by one. Codes sit near their zero as in real
    # checkpoints (RTN/GPTQ codes of a bell-shaped weight), so the shift is ~50% of the weight's
    # norm. On zero-mean activations it only shows through the per-group sums of x, so use many
    # groups (16 per row) to keep the output error well above any fp16 tolerance (> 0.1 typically).
    gen = torch.Generator().manual_seed(23)
    k, n, g = 512, 32, 32
    z = torch.randint(4, 12, (k // g, n), generator=gen, dtype=torch.int64)
    q = (z.repeat_interleave(g, dim=0) + torch.randint(-3, 4, (k, n), generator=gen)).clamp(0, 15)
    s = _scales(gen, k // g, n)
    ref = _reference(q, z, s, _groups(k, g))
    ckpt = dict(qweight=_pack_rows(q), qzeros=_pack_cols(z - 1), scales=s)
    right = w4a16.import_gptq(**ckpt, group_size=g, zero_convention="v1")
    _assert_exact(right, ref, k, n)
    w4a16.check_layer(right, reference_linear_weight=ref.t(), batch_sizes=(1, 3))
    wrong = w4a16.import_gptq(**ckpt, group_size=g, zero_convention="v2")
    with pytest.raises(ValueError, match=CHECK_LAYER_FAILED):
        w4a16.check_layer(wrong, reference_linear_weight=ref.t(), batch_sizes=(1, 3))


# ---------------------------------------------------------------------------------------------
# Bad inputs give errors that name the argument
# ---------------------------------------------------------------------------------------------


def _good_gptq(n=44):
    gen = torch.Generator().manual_seed(31)
    ckpt, _ = _gptq_checkpoint(gen, 128, n, 32, "v2", act_order=True)
    return ckpt


def test_gptq_requires_zero_convention(w4a16):
    ckpt = _good_gptq()
    with pytest.raises(TypeError, match="zero_convention"):
        w4a16.import_gptq(**ckpt, group_size=32)
    with pytest.raises(ValueError, match="zero_convention"):
        w4a16.import_gptq(**ckpt, group_size=32, zero_convention="v3")


@pytest.mark.parametrize(
    "field,value,exc,match",
    [
        ("qweight", lambda c: c["qweight"].to(torch.int64), TypeError, "qweight"),
        ("qweight", lambda c: c["qweight"].reshape(-1), ValueError, "qweight"),
        ("qzeros", lambda c: c["qzeros"][:, :5], ValueError, r"qzeros must have shape \[K/G, ceil\(N/8\)\] = \(4, 6\)"),
        ("qzeros", lambda c: c["qzeros"].to(torch.int64), TypeError, "qzeros"),
        ("qzeros", lambda c: None, ValueError, "qzeros"),
        ("scales", lambda c: c["scales"][:, :40], ValueError, "scales"),
        ("scales", lambda c: c["scales"].to(torch.int32), TypeError, "scales"),
        ("g_idx", lambda c: c["g_idx"][:64], ValueError, "g_idx"),
        ("g_idx", lambda c: torch.zeros(128, dtype=torch.int32), ValueError, "g_idx"),
    ],
)
def test_gptq_bad_inputs(w4a16, field, value, exc, match):
    ckpt = _good_gptq()
    ckpt[field] = value(ckpt)
    with pytest.raises(exc, match=match):
        w4a16.import_gptq(**ckpt, group_size=32, zero_convention="v2")


def test_gptq_bad_group_size(w4a16):
    with pytest.raises(ValueError, match="group_size"):
        w4a16.import_gptq(**_good_gptq(), group_size=48, zero_convention="v2")


@pytest.mark.parametrize(
    "field,value,exc",
    [
        ("qweight", lambda c: c["qweight"].to(torch.float32), TypeError),
        ("qweight", lambda c: c["qweight"][None], ValueError),
        ("qzeros", lambda c: c["qzeros"][:, :3], ValueError),
        ("qzeros", lambda c: c["qzeros"].to(torch.uint8), TypeError),
        ("scales", lambda c: c["scales"].t(), ValueError),
    ],
)
def test_awq_bad_inputs(w4a16, field, value, exc):
    ckpt, _ = _awq_checkpoint(torch.Generator().manual_seed(32), 128, 32, 32)
    ckpt[field] = value(ckpt)
    with pytest.raises(exc, match=field):
        w4a16.import_awq(**ckpt, group_size=32)


@pytest.mark.parametrize(
    "field,value,exc",
    [
        ("weight_packed", lambda c: c["weight_packed"].to(torch.int16), TypeError),
        ("weight_packed", lambda c: c["weight_packed"].reshape(-1), ValueError),
        ("weight_scale", lambda c: c["weight_scale"][:10], ValueError),
        ("weight_scale", lambda c: c["weight_scale"].to(torch.int32), TypeError),
        ("weight_zero_point", lambda c: c["weight_zero_point"][:2], ValueError),
        ("weight_zero_point", lambda c: c["weight_zero_point"].to(torch.int64), TypeError),
        ("weight_shape", lambda c: [20, 64], ValueError),
    ],
)
def test_compressed_tensors_bad_inputs(w4a16, field, value, exc):
    ckpt, _ = _ct_checkpoint(torch.Generator().manual_seed(33), 128, 20, 32, True)
    ckpt[field] = value(ckpt)
    with pytest.raises(exc, match=field):
        w4a16.import_compressed_tensors(**ckpt, group_size=32)


def test_compressed_tensors_cannot_infer_group_size(w4a16):
    ckpt, _ = _ct_checkpoint(torch.Generator().manual_seed(34), 128, 20, 32, False)
    ckpt["weight_scale"] = torch.ones(20, 3, dtype=torch.float16)
    with pytest.raises(ValueError, match="group_size"):
        w4a16.import_compressed_tensors(**ckpt)


# ---------------------------------------------------------------------------------------------
# Whole checkpoints: convert_checkpoint_to_w4a16
# ---------------------------------------------------------------------------------------------


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(256, 64, bias=True)
        self.o_proj = torch.nn.Linear(64, 40, bias=False)


class _TinyCausalLM(torch.nn.Module):
    """Module names like a Hugging Face decoder's: model.layers.<i>.self_attn.<proj>, lm_head."""

    def __init__(self):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList([torch.nn.Module()])
        self.model.layers[0].self_attn = _Attention()
        self.lm_head = torch.nn.Linear(40, 24, bias=False)


# (module name, K, N): the quantized layers of _TinyCausalLM
_QUANTIZED = (("model.layers.0.self_attn.q_proj", 256, 64), ("model.layers.0.self_attn.o_proj", 64, 40))


def _checkpoint_of(gen, checkpoint_format, g, key_prefix="", dtype=torch.float16):
    """A whole checkpoint of _TinyCausalLM's quantized layers (the encoders above) with q_proj's bias and the float
    lm_head in `dtype` (the scales are fp16, as GPTQ and AWQ store them for bf16 models too), and each layer's float64
    reference weight [K, N]."""
    state_dict, refs = {}, {}
    for name, k, n in _QUANTIZED:
        if checkpoint_format in ("gptq-v1-act-order", "gptq-v2-symmetric"):
            convention, rest = checkpoint_format.split("-")[1], checkpoint_format.split("-")[2:]
            tensors, ref = _gptq_checkpoint(gen, k, n, g, convention, symmetric=rest == ["symmetric"],
                                            act_order=rest == ["act", "order"])
            if tensors["g_idx"] is None:  # GPTQ checkpoints carry g_idx also without act-order (the trivial one)
                tensors["g_idx"] = _groups(k, g).to(torch.int32)
        elif checkpoint_format == "awq":
            tensors, ref = _awq_checkpoint(gen, k, n, g)
        else:
            tensors, ref = _ct_checkpoint(gen, k, n, g, with_zero_point=checkpoint_format != "ct-symmetric",
                                          act_order=checkpoint_format == "ct-act-order")
            tensors["weight_shape"] = torch.tensor([n, k])
        state_dict.update({f"{key_prefix}{name}.{t}": v for t, v in tensors.items() if v is not None})
        refs[name] = ref
    state_dict[f"{key_prefix}model.layers.0.self_attn.q_proj.bias"] = (torch.randn(64, generator=gen) * 0.1).to(dtype)
    state_dict[f"{key_prefix}lm_head.weight"] = torch.randn(24, 40, generator=gen).to(dtype)
    return state_dict, refs


_CHECKPOINT_CASES = {  # test format -> (checkpoint_format, importer options)
    "gptq-v1-act-order": ("gptq", dict(group_size=32, zero_convention="v1")),
    "gptq-v2-symmetric": ("gptq", dict(group_size=32, zero_convention="v2", symmetric=True)),
    "awq": ("awq", dict(group_size=32)),
    "ct-zero-point": ("compressed-tensors", {}),
    "ct-symmetric": ("compressed-tensors", dict(group_size=32)),
    "ct-act-order": ("compressed-tensors", {}),
}


@pytest.mark.parametrize("case", sorted(_CHECKPOINT_CASES))
@pytest.mark.parametrize("on_meta", [False, True])
def test_convert_checkpoint_to_w4a16(w4a16, case, on_meta):
    """Every quantized Linear of a checkpoint is replaced by a layer that dequantizes exactly to the encoded weight and
    computes x W + b against a float64 reference; the float LM head is left alone and reported skipped."""
    checkpoint_format, options = _CHECKPOINT_CASES[case]
    gen = torch.Generator().manual_seed(41 + sorted(_CHECKPOINT_CASES).index(case))
    dtype = torch.bfloat16 if on_meta else torch.float16  # a bf16 model takes the checkpoint's fp16 scales as they are
    state_dict, refs = _checkpoint_of(gen, case, 32, key_prefix="base.", dtype=dtype)
    with torch.device("meta" if on_meta else "cpu"):
        model = _TinyCausalLM().to(dtype)
    summary = w4a16.convert_checkpoint_to_w4a16(model, state_dict, checkpoint_format, prefix="base.", **options)
    assert summary.converted == [name for name, _, _ in _QUANTIZED]
    assert list(summary.skipped) == ["lm_head"] and "not quantized" in summary.skipped["lm_head"]
    assert isinstance(model.lm_head, torch.nn.Linear)
    # the rest of the checkpoint is the float weights: it loads into the model as they are
    assert sorted(summary.checkpoint_keys) == sorted(k for k in state_dict if k != "base.lm_head.weight")
    rest = {k[len("base."):]: v for k, v in state_dict.items() if k not in summary.checkpoint_keys}
    model.load_state_dict(rest, strict=False, assign=True)
    assert torch.equal(model.lm_head.weight, state_dict["base.lm_head.weight"])
    assert summary.bytes_before == (256 * 64 + 64 * 40) * 2 and 0 < summary.bytes_after < summary.bytes_before
    for name, k, n in _QUANTIZED:
        layer = model.get_submodule(name)
        assert isinstance(layer, w4a16.W4A16Linear)
        _assert_exact(layer.weight_view(), refs[name], k, n)
        bias = state_dict.get(f"base.{name}.bias")
        assert (layer.bias is None) == (bias is None)
        assert layer.bias is None or layer.bias.dtype == dtype
        x = torch.randn(3, k, generator=gen).to(dtype)
        expected = x.double() @ refs[name] + (0 if bias is None else bias.double())
        y = layer(x)
        assert y.dtype == dtype
        torch.testing.assert_close(y.double(), expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())
    assert model.model.layers[0].self_attn.q_proj.weight_view().act_order == case.endswith("act-order")


def test_convert_checkpoint_to_w4a16_errors_name_the_layer_and_change_nothing(w4a16):
    gen = torch.Generator().manual_seed(51)
    good, _ = _checkpoint_of(gen, "awq", 32)
    q_key = "model.layers.0.self_attn.q_proj"

    def fails(state_dict, exc, match, **kwargs):
        model = _TinyCausalLM().half()
        options = {"group_size": 32, **kwargs}
        with pytest.raises(exc, match=match):
            w4a16.convert_checkpoint_to_w4a16(model, state_dict, options.pop("checkpoint_format", "awq"), **options)
        # every layer is imported before any is replaced: an error leaves the model as it was
        assert all(type(m) is torch.nn.Linear for m in (model.model.layers[0].self_attn.q_proj, model.lm_head,
                                                        model.model.layers[0].self_attn.o_proj))

    fails({k: v for k, v in good.items() if not k.endswith("o_proj.scales")}, ValueError,
          "o_proj.qweight but no model.layers.0.self_attn.o_proj.scales")
    fails({"x." + k: v for k, v in good.items()}, ValueError, "no nn.Linear .*x.model.layers.0.self_attn.o_proj")
    fails({**good, f"{q_key}.scales": good[f"{q_key}.scales"].int()}, TypeError, f"^{q_key}: scales")
    o_key = "model.layers.0.self_attn.o_proj"
    swapped = {**good, **{f"{q_key}.{t}": good[f"{o_key}.{t}"] for t in ("qweight", "qzeros", "scales")}}
    fails(swapped, ValueError, f"{q_key}: the checkpoint's layer has in_features=64, out_features=40; the model's")
    fails(good, ValueError, "checkpoint_format must be one of", checkpoint_format="gguf")
    fails(good, ValueError, "group_size is required", group_size=None)
    fails(good, ValueError, "zero_convention applies to GPTQ", zero_convention="v1")
    fails(good, ValueError, "symmetric=True applies to GPTQ", symmetric=True)
    fails(good, ValueError, "zero_convention must be 'v1'", checkpoint_format="gptq")
    fails(good, TypeError, "prefix must be a str", prefix=None)
    fails(list(good), TypeError, "state_dict must be a mapping")

    # a meta model's biased Linear needs its bias in the checkpoint
    with torch.device("meta"):
        model = _TinyCausalLM().half()
    with pytest.raises(ValueError, match=f"{q_key}.bias is not in state_dict and .* meta device"):
        w4a16.convert_checkpoint_to_w4a16(model, {k: v for k, v in good.items() if k != f"{q_key}.bias"}, "awq",
                                          group_size=32)
    # a second call with the same checkpoint finds the layers converted: nothing to do, no error
    model = _TinyCausalLM().half()
    assert len(w4a16.convert_checkpoint_to_w4a16(model, good, "awq", group_size=32).converted) == 2
    again = w4a16.convert_checkpoint_to_w4a16(model, good, "awq", group_size=32)
    assert again.converted == [] and list(again.skipped) == ["lm_head"]


class _LazyShards(Mapping):
    """A checkpoint's safetensors shards read one tensor at a time (`safe_open`), as a user converting a large model
    passes them instead of merging every shard into one dict; records which keys were read."""

    def __init__(self, files):
        self._file_of = {}
        for file in files:
            with safe_open(file, "pt") as shard:
                self._file_of.update(dict.fromkeys(shard.keys(), file))
        self.read = []

    def __getitem__(self, key):
        file = self._file_of[key]  # (KeyError for a key no shard holds: Mapping.get gives None)
        self.read.append(key)
        with safe_open(file, "pt") as shard:
            return shard.get_tensor(key)

    def __iter__(self):
        return iter(self._file_of)

    def __len__(self):
        return len(self._file_of)


def test_convert_checkpoint_to_w4a16_reads_lazy_shards(w4a16, tmp_path):
    """A lazy mapping over the shards works as the merged dict does, and only the converted layers' tensors are read
    (one layer's tensors split across two shards, as sharded checkpoints do)."""
    gen = torch.Generator().manual_seed(71)
    state_dict, refs = _checkpoint_of(gen, "gptq-v1-act-order", 32)
    keys = sorted(state_dict)
    shards = [tmp_path / "model-00001-of-00002.safetensors", tmp_path / "model-00002-of-00002.safetensors"]
    for file, part in zip(shards, (keys[: len(keys) // 2], keys[len(keys) // 2:])):
        save_file({k: state_dict[k].contiguous() for k in part}, str(file))
    lazy = _LazyShards(shards)
    model = _TinyCausalLM().half()
    summary = w4a16.convert_checkpoint_to_w4a16(model, lazy, "gptq", group_size=32, zero_convention="v1")
    assert summary.converted == [name for name, _, _ in _QUANTIZED]
    assert sorted(set(lazy.read)) == sorted(summary.checkpoint_keys) and "lm_head.weight" not in lazy.read
    for name, k, n in _QUANTIZED:
        _assert_exact(model.get_submodule(name).weight_view(), refs[name], k, n)
    bias = state_dict["model.layers.0.self_attn.q_proj.bias"]
    assert torch.equal(model.model.layers[0].self_attn.q_proj.bias, bias)


# quantization_config objects as config.json files carry them (keys as the tools write them)
_GPTQ_CONFIG = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": True,
                "checkpoint_format": "gptq"}
_AWQ_CONFIG = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}
_CT_CONFIG = {
    "quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                                  "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                              "group_size": 128, "actorder": "group", "dynamic": False}}},
}


def _with(config: dict, **changes) -> dict:
    return {**config, **changes}


def _ct_with(**weight_changes) -> dict:
    group = _CT_CONFIG["config_groups"]["group_0"]
    return _with(_CT_CONFIG, config_groups={"group_0": {**group, "weights": {**group["weights"], **weight_changes}}})


@pytest.mark.parametrize("config,expected", [
    (_GPTQ_CONFIG, dict(checkpoint_format="gptq", group_size=128, zero_convention="v1", symmetric=True)),
    (_with(_GPTQ_CONFIG, checkpoint_format="gptq_v2", sym=False, group_size=-1),
     dict(checkpoint_format="gptq", group_size=-1, zero_convention="v2", symmetric=False)),
    ({k: v for k, v in _GPTQ_CONFIG.items() if k not in ("sym", "checkpoint_format")},  # GPTQConfig's defaults
     dict(checkpoint_format="gptq", group_size=128, zero_convention="v1", symmetric=True)),
    (_AWQ_CONFIG, dict(checkpoint_format="awq", group_size=128)),
    ({"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "version": "GEMM", "zero_point": True},  # AutoAWQ's keys
     dict(checkpoint_format="awq", group_size=64)),
    (_CT_CONFIG, dict(checkpoint_format="compressed-tensors", group_size=128)),
    (_ct_with(strategy="channel", group_size=None), dict(checkpoint_format="compressed-tensors", group_size=-1)),
])
def test_checkpoint_options_read_the_quantization_config(w4a16, config, expected):
    assert w4a16.checkpoint_options(config) == expected


@pytest.mark.parametrize("config,match", [
    (_with(_GPTQ_CONFIG, bits=8), "bits'\\] is 8: w4a16 runs 4-bit weights only"),
    (_with(_GPTQ_CONFIG, checkpoint_format="marlin"), "checkpoint_format'\\] must be 'gptq' or 'gptq_v2'"),
    ({k: v for k, v in _GPTQ_CONFIG.items() if k != "group_size"}, "no group size"),
    (_with(_AWQ_CONFIG, version="gemv"), "version'\\] must be 'gemm'"),
    (_with(_AWQ_CONFIG, zero_point=False), "zero_point'\\] must be true"),
    (_with(_CT_CONFIG, format="marlin-24"), "format must be 'pack-quantized'"),
    (_ct_with(num_bits=8), "num_bits'\\] is 8"),
    (_ct_with(type="float"), "type'\\] must be 'int'"),
    (_ct_with(strategy="tensor"), "strategy'\\] must be 'group' or 'channel'"),
    (_ct_with(group_size=None), "\\['group_0'\\]\\['weights'\\]\\['group_size'\\] \\(group size\\) must be an int"),
    (_with(_CT_CONFIG, config_groups={"group_0": {**_CT_CONFIG["config_groups"]["group_0"],
                                                  "input_activations": {"num_bits": 8}}}), "input_activations"),
    (_with(_CT_CONFIG, config_groups={"a": _CT_CONFIG["config_groups"]["group_0"],
                                      "b": _ct_with(group_size=64)["config_groups"]["group_0"]}), "disagree"),
    (_with(_GPTQ_CONFIG, quant_method="bitsandbytes"), "quant_method'\\] must be one of"),
])
def test_checkpoint_options_refuse_what_cannot_run(w4a16, config, match):
    with pytest.raises(ValueError, match=match):
        w4a16.checkpoint_options(config)


def test_checkpoint_options_type_errors(w4a16):
    with pytest.raises(TypeError, match="quantization_config\\['sym'\\] must be True or False"):
        w4a16.checkpoint_options(_with(_GPTQ_CONFIG, sym="yes"))
    with pytest.raises(TypeError, match="quantization_config must be a dict"):
        w4a16.checkpoint_options(None)


def test_checkpoint_options_feed_convert_checkpoint_to_w4a16(w4a16):
    """The options read from a config convert that config's checkpoint (GPTQ v1, asymmetric, act-order, group 32)."""
    gen = torch.Generator().manual_seed(61)
    state_dict, refs = _checkpoint_of(gen, "gptq-v1-act-order", 32)
    model = _TinyCausalLM().half()
    options = w4a16.checkpoint_options(_with(_GPTQ_CONFIG, group_size=32, sym=False))
    assert len(w4a16.convert_checkpoint_to_w4a16(model, state_dict, **options).converted) == 2
    for name, k, n in _QUANTIZED:
        _assert_exact(model.get_submodule(name).weight_view(), refs[name], k, n)
