"""`layers`: W4A16Linear, convert_to_w4a16, and the Kernel Hub layer under kernels.kernelize.

The package is reached only through the `w4a16` fixture (kernels.get_kernel on a fresh local build).
On CPU the op runs its plain-torch path; on a CUDA machine the same tests run the Triton kernels.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from test_gemm import rtn_codes, rtn_scales
from torch import nn

K, N, G = 256, 96, 64
HUB_NAME = "W4A16LinearForward"
DTYPES = [torch.float16, torch.bfloat16]


def _linear(k=K, n=N, bias=True, dtype=torch.float16, device="cpu", seed=0):
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        if bias:
            lin.bias.normal_(0, 0.5)
    return lin.to(device=device, dtype=dtype)


def _rtn(lin, group_size, symmetric, dtype=None) -> dict:
    """The linear's weight quantized here, independently of the package (test_gemm's round-to-nearest min-max
    `rtn_scales` / `rtn_codes` in float64), in the dtype `from_linear` documents (its `dtype`, by default the
    linear's if fp16/bf16, else fp16; an fp32 weight is quantized as it is, its scales stored in fp16):
    codes [K, N], scales and zeros [K/G, N] and the float64 weight [K, N], all on the CPU."""
    w = lin.weight.detach().cpu().t()
    dtype = dtype or (w.dtype if w.dtype in DTYPES else torch.float16)
    if not (w.dtype == torch.float32 and dtype == torch.float16):
        w = w.to(dtype)
    scales, scale_tie = rtn_scales(w, group_size, symmetric)
    q = rtn_codes(w, group_size, symmetric, scales)
    rows = torch.arange(w.shape[0]) // (w.shape[0] // scales.shape[0])
    tie = q["code_tie"] | q["zero_tie"][rows] | scale_tie[rows]
    return {**q, "scales": scales, "scale_tie": scale_tie, "tie": tie, "step": scales[rows]}


def _assert_same_quantization(layer, weight, tie, step) -> torch.Tensor:
    """The layer's dequantized weight [K, N] (returned, float64, CPU) equals the test's `weight` [K, N] except, by at
    most about one step, where the independent quantizer is within 1e-6 of a rounding tie (`tie`): the package
    computes the step in float32, and on a GPU torch divides by a scalar through its reciprocal, so it may round
    those the other way. Elsewhere the codes, scales and zeros must be the same."""
    got = layer.dequantized_weight(torch.float64).cpu().t()
    diff = (got - weight).abs()
    ok = (diff == 0) | (tie & (diff <= 1.1 * step))
    assert bool(ok.all()), f"{int((~ok).sum())} weights differ from the independent quantization"
    assert int((diff != 0).sum()) <= weight.numel() // 100  # ties are rare: a few in a layer, not a pattern
    return got


def _reference(x, weight, bias=None):
    """float64 x @ W (+ b) for a float64 weight [K, N] (on the CPU) made by the test, not by the package."""
    y = x.to(torch.float64) @ weight.to(x.device)
    return y if bias is None else y + bias.to(device=x.device, dtype=torch.float64)


def _weight(q: dict, zeros=None, scales=None):
    """(codes - z) * s [K, N] in float64 from `_rtn`'s codes, with other zeros / scales [K/G, N] where given."""
    g = q["codes"].shape[0] // q["scales"].shape[0]
    z = (q["zeros"] if zeros is None else zeros.cpu().to(torch.float64)).repeat_interleave(g, dim=0)
    s = (q["scales"] if scales is None else scales.cpu().to(torch.float64)).repeat_interleave(g, dim=0)
    return (q["codes"].to(torch.float64) - z) * s


def _assert_close_to_reference(y, ref, dtype):
    # Output rounding (and the bias add) in fp16/bf16, plus the fp16/bf16 dequantized weight of the
    # GPU prefill path: a few units of roundoff of the output's scale.
    eps = torch.finfo(dtype).eps
    err = (y.to(torch.float64) - ref).abs().max().item()
    bound = 4 * eps * ref.abs().max().item()
    assert err <= bound, f"max error {err:.3g} > {bound:.3g}"


def _host_class(kernels):
    """A model's own quantized-linear class: declares the hub layer name and holds the documented
    attributes, with a forward that must not run once kernelized."""

    @kernels.use_kernel_forward_from_hub("W4A16Linear")
    class HostLinear(nn.Module):
        def __init__(self, src):
            super().__init__()
            for name in ("qweight", "scales", "zeros", "perm", "bias"):
                self.register_buffer(name, getattr(src, name))
            self.in_features = src.in_features
            self.out_features = src.out_features
            self.group_size = src.group_size

        def forward(self, x):
            raise RuntimeError("original HostLinear.forward ran")

    return HostLinear


# ---------------------------------------------------------------------------------------------
# W4A16Linear
# ---------------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_from_linear_matches_reference(w4a16, device, dtype, symmetric):
    lin = _linear(dtype=dtype, device=device)
    layer = w4a16.layers.W4A16Linear.from_linear(lin, group_size=G, symmetric=symmetric)
    assert (layer.in_features, layer.out_features, layer.group_size) == (K, N, G)
    assert layer.symmetric == symmetric and (layer.zeros is None) == symmetric
    assert layer.perm is None
    assert layer.qweight.dtype == torch.int32 and tuple(layer.qweight.shape) == (-(-N // 64), -(-K // 128), 64, 16)
    assert layer.scales.dtype == dtype and layer.bias.dtype == dtype
    torch.testing.assert_close(layer.bias, lin.bias.detach(), rtol=0, atol=0)

    # The layer holds the independent quantization of the linear's weight (the same codes, scales and zeros), which
    # is the weight within half of its step; the forward is checked against that weight, not the layer's own.
    q = _rtn(lin, G, symmetric)
    held = _assert_same_quantization(layer, q["weight"], q["tie"], q["step"])
    assert bool(((q["weight"] - lin.weight.detach().cpu().t().to(torch.float64)).abs() <= 0.5 * q["step"] * (1 + 1e-6)).all())

    gen = torch.Generator().manual_seed(1)
    for m in (1, 3, 16):
        x = torch.randn((m, K), generator=gen).to(device=device, dtype=dtype)
        y = layer(x)
        assert y.dtype == dtype and tuple(y.shape) == (m, N)
        _assert_close_to_reference(y, _reference(x, held, lin.bias.detach()), dtype)
    x3 = torch.randn((2, 3, K), generator=gen).to(device=device, dtype=dtype)
    _assert_close_to_reference(layer(x3), _reference(x3, held, lin.bias.detach()), dtype)


@pytest.mark.kernels_ci
def test_from_linear_fp32_linear_and_no_bias(w4a16, device):
    lin = _linear(bias=False, dtype=torch.float32, device=device)
    layer = w4a16.layers.W4A16Linear.from_linear(lin, group_size=-1)
    assert layer.bias is None and layer.group_size == K and layer.scales.dtype == torch.float16
    assert "bias" not in layer.state_dict()
    x = torch.randn((3, K), device=device, dtype=torch.float16)
    _assert_close_to_reference(layer(x), _reference(x, _rtn(lin, -1, False)["weight"]), torch.float16)

    bf = w4a16.layers.W4A16Linear.from_linear(lin, group_size=G, dtype=torch.bfloat16)
    assert bf.scales.dtype == torch.bfloat16 and bf.zeros.dtype == torch.uint8  # integer zeros: uint8
    xb = x.to(torch.bfloat16)  # quantized from the weight in bf16 (the dtype asked for)
    _assert_close_to_reference(bf(xb), _reference(xb, _rtn(lin, G, False, torch.bfloat16)["weight"]), torch.bfloat16)


@pytest.mark.kernels_ci
def test_extra_repr(w4a16):
    W4A16Linear = w4a16.layers.W4A16Linear
    r = repr(W4A16Linear.from_linear(_linear(), group_size=G))
    assert r.startswith("W4A16Linear(") and "in_features=256" in r and "out_features=96" in r
    assert "bias=True" in r and "int4 g64 asym" in r and "float16" in r
    r = repr(W4A16Linear(K, N, bias=False, group_size=-1, symmetric=True, act_order=True, dtype=torch.bfloat16))
    assert "bias=False" in r and "per-channel" in r and "sym" in r and "act-order" in r and "bfloat16" in r


@pytest.mark.kernels_ci
def test_constructor_flags_must_be_bools(w4a16):
    # "no" is truthy: taken as is, it would build the symmetric format (or a bias) the caller did not ask for
    W4A16Linear = w4a16.layers.W4A16Linear
    for name, bad in (("bias", "no"), ("symmetric", "no"), ("act_order", 1)):
        with pytest.raises(TypeError, match=f"{name} must be True or False, got {bad!r}"):
            W4A16Linear(K, N, group_size=G, **{name: bad})
    assert not W4A16Linear(K, N, bias=False, group_size=G, symmetric=False).symmetric


# ---------------------------------------------------------------------------------------------
# state_dict
# ---------------------------------------------------------------------------------------------


def _act_order_layer(w4a16, device, bias=True):
    """A W4A16Linear with act-order (g_idx) built through prepare_weight + from_weight, and its reference (`_make`'s):
    the test's own quantization of the same float weight, its codes read with the groups of the g_idx (row k takes
    group g_idx[k]'s scale and zero)."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn((K, N), generator=gen).to(torch.float16)
    packed, scales, zeros = w4a16.quantize_weight_int4_grouped(w, G)
    g_idx = (torch.arange(K) % (K // G))[torch.randperm(K, generator=gen)]
    weight = w4a16.prepare_weight(packed.to(device), scales.to(device), zeros.to(device), G, g_idx=g_idx.to(device))
    assert weight.act_order
    b = torch.randn(N, generator=gen) if bias else None
    my_scales, scale_tie = rtn_scales(w, G, False)
    q = rtn_codes(w, G, False, my_scales)
    tie = q["code_tie"] | q["zero_tie"][g_idx] | scale_tie[g_idx]
    ref_weight = (q["codes"].to(torch.float64) - q["zeros"][g_idx]) * my_scales[g_idx]
    ref = (ref_weight, None if b is None else b.to(torch.float16), tie, my_scales[g_idx])
    return w4a16.layers.W4A16Linear.from_weight(weight, b), ref


FORMATS = [
    # (symmetric, act_order, bias)
    (False, False, True),
    (True, False, False),
    (False, True, True),
]


def _make(w4a16, device, symmetric, act_order, bias):
    """(layer, reference): the reference is (float64 weight [K, N], bias or None, rounding ties [K, N], step [K, N]),
    the independent quantization of the layer's float weight that `_assert_same_quantization` compares with."""
    if act_order:
        return _act_order_layer(w4a16, device, bias=bias)
    lin = _linear(bias=bias, device=device)
    q = _rtn(lin, G, symmetric)
    layer = w4a16.layers.W4A16Linear.from_linear(lin, group_size=G, symmetric=symmetric)
    return layer, (q["weight"], lin.bias.detach() if bias else None, q["tie"], q["step"])


@pytest.mark.kernels_ci
def test_forward_follows_buffer_updates(w4a16, device):
    """The forward keeps its weight view between calls: updates in place (load_state_dict), buffers
    replaced by assignment and dtype moves must all reach the next call."""
    first, second = _linear(device=device), _linear(seed=7, device=device)
    layer = w4a16.layers.W4A16Linear.from_linear(first, group_size=G)
    other = w4a16.layers.W4A16Linear.from_linear(second, group_size=G)
    q_first, q_other = _rtn(first, G, False), _rtn(second, G, False)
    b_other = second.bias.detach()
    x = torch.randn((3, K), device=device, dtype=torch.float16)
    _assert_close_to_reference(layer(x), _reference(x, q_first["weight"], first.bias.detach()), torch.float16)  # view kept
    layer.load_state_dict(other.state_dict())  # in place: same tensor objects, new values
    _assert_close_to_reference(layer(x), _reference(x, q_other["weight"], b_other), torch.float16)
    layer.scales = layer.scales * 2  # a new buffer tensor
    _assert_close_to_reference(layer(x), _reference(x, 2 * q_other["weight"], b_other), torch.float16)
    layer.to(torch.bfloat16)  # scales, zeros and bias move to new bf16 tensors
    xb = x.to(torch.bfloat16)
    assert layer.weight_view().scales.dtype == torch.bfloat16
    moved = (2 * q_other["scales"]).to(torch.float16).to(torch.bfloat16)  # the doubled fp16 scales, cast to bf16
    _assert_close_to_reference(layer(xb), _reference(xb, _weight(q_other, scales=moved), b_other.to(torch.bfloat16)),
                               torch.bfloat16)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("symmetric,act_order,bias", FORMATS, ids=["asym", "sym-nobias", "act-order"])
def test_state_dict_round_trip(w4a16, device, tmp_path, symmetric, act_order, bias):
    from safetensors.torch import load_file, save_file

    W4A16Linear = w4a16.layers.W4A16Linear
    layer, (ref_weight, ref_bias, tie, step) = _make(w4a16, device, symmetric, act_order, bias)
    sd = layer.state_dict()
    expected = {"qweight", "scales"} | ({"zeros"} if not symmetric else set())
    expected |= ({"perm"} if act_order else set()) | ({"bias"} if bias else set())
    assert set(sd) == expected

    def fresh():
        return W4A16Linear(
            K, N, bias=bias, group_size=G, symmetric=symmetric, act_order=act_order, dtype=torch.float16, device=device
        )

    x = torch.randn((5, K), device=device, dtype=torch.float16)
    y = layer(x)
    held = _assert_same_quantization(layer, ref_weight, tie, step)  # the codes, scales, zeros
    _assert_close_to_reference(y, _reference(x, held, ref_bias), torch.float16)

    a = fresh()
    assert set(a.state_dict()) == expected
    a.load_state_dict(sd)
    assert torch.equal(a(x), y)

    path = tmp_path / "layer.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    b = fresh()
    b.load_state_dict(load_file(str(path), device=str(device)))
    assert torch.equal(b(x), y)
    assert repr(b) == repr(layer)


@pytest.mark.kernels_ci
def test_state_dict_zeros_load_in_their_dtype(w4a16, device):
    """A fresh layer's zeros are uint8; zeros saved as floats (fractional ones, or integer ones from an
    older version) load as floats instead of being truncated into that buffer."""
    W4A16Linear = w4a16.layers.W4A16Linear
    lin = _linear(device=device)
    layer = W4A16Linear.from_linear(lin, group_size=G)
    assert layer.zeros.dtype == torch.uint8
    q = _rtn(lin, G, False)
    held = _assert_same_quantization(layer, q["weight"], q["tie"], q["step"])
    assert bool(((layer.zeros.cpu().to(torch.float64) == q["zeros"]) | q["zero_tie"] | q["scale_tie"]).all())
    sd = layer.state_dict()
    sd["zeros"] = sd["zeros"].to(torch.float16) + 0.25  # fractional
    fresh = W4A16Linear(K, N, bias=True, group_size=G, dtype=torch.float16, device=device)
    assert fresh.zeros.dtype == torch.uint8
    fresh.load_state_dict(sd)
    assert fresh.zeros.dtype == torch.float16 and torch.equal(fresh.zeros, sd["zeros"])
    x = torch.randn((3, K), device=device, dtype=torch.float16)
    shifted = held - 0.25 * layer.scales.cpu().to(torch.float64).repeat_interleave(G, dim=0)  # z + 0.25: w - s / 4
    assert torch.allclose(fresh.dequantized_weight(torch.float64).cpu(), shifted.t(), rtol=1e-12, atol=1e-15)
    _assert_close_to_reference(fresh(x), _reference(x, shifted, lin.bias.detach()), torch.float16)


@pytest.mark.kernels_ci
def test_state_dict_int64_perm_loads_as_int32(w4a16, device):
    """An act-order perm saved as int64 (by an older version, or made by hand) loads into the layer's int32 buffer
    (the gather reads it every call) and gives the same output; a W4A16Weight may also hold the int64 one."""
    layer, _ = _make(w4a16, device, False, True, False)
    assert layer.perm.dtype == torch.int32
    sd = layer.state_dict()
    sd["perm"] = sd["perm"].to(torch.int64)
    fresh = w4a16.layers.W4A16Linear(K, N, bias=False, group_size=G, act_order=True, dtype=torch.float16, device=device)
    fresh.load_state_dict(sd)
    assert fresh.perm.dtype == torch.int32 and torch.equal(fresh.perm.long(), sd["perm"])
    x = torch.randn((3, K), device=device, dtype=torch.float16)
    y = layer(x)
    assert torch.equal(fresh(x), y)
    wide = dataclasses.replace(layer.weight_view(), perm=sd["perm"])
    assert torch.equal(w4a16.w4a16_linear(x, wide), y)


@pytest.mark.kernels_ci
def test_state_dict_format_mismatch_is_an_error(w4a16):
    W4A16Linear = w4a16.layers.W4A16Linear
    sd = W4A16Linear.from_linear(_linear(), group_size=G).state_dict()  # asymmetric: has zeros
    with pytest.raises(RuntimeError, match="zeros"):
        W4A16Linear(K, N, group_size=G, symmetric=True).load_state_dict(sd)
    with pytest.raises(RuntimeError, match="size mismatch"):
        W4A16Linear(K, N, group_size=128).load_state_dict(sd)


# ---------------------------------------------------------------------------------------------
# convert_to_w4a16
# ---------------------------------------------------------------------------------------------


class _Block(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class _TinyModel(nn.Module):
    def __init__(self, vocab=50, d=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleDict({"0": _Block(d, 256), "1": _Block(d, 96)})  # 96 % 64 != 0
        self.odd = nn.Linear(d, 100)  # K=128 fine, N=100 is allowed
        self.proj = nn.Linear(100, d)  # K=100: not a multiple of 8
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        for block in self.blocks.values():
            h = h + block(h)
        h = h + self.proj(self.odd(h))
        return self.lm_head(h)


@pytest.mark.kernels_ci
def test_convert_to_w4a16(w4a16, device):
    layers = w4a16.layers
    torch.manual_seed(0)
    model = _TinyModel().to(device=device, dtype=torch.float16)
    ids = torch.randint(0, 50, (2, 5), device=device)
    with torch.no_grad():
        before = model(ids).to(torch.float64)
    weights = {name: m.weight.numel() * 2 for name, m in model.named_modules() if isinstance(m, nn.Linear)}

    summary = layers.convert_to_w4a16(model, group_size=G)

    assert isinstance(summary, layers.ConversionSummary)
    assert summary.converted == ["blocks.0.up", "blocks.0.down", "blocks.1.up", "odd"]
    assert set(summary.skipped) == {"blocks.1.down", "proj", "lm_head"}
    assert "lm_head" in summary.skipped["lm_head"]
    assert "multiple of group_size" in summary.skipped["blocks.1.down"]
    assert "multiple of 8" in summary.skipped["proj"]
    for name in summary.converted:
        assert isinstance(model.get_submodule(name), layers.W4A16Linear)
    for name in summary.skipped:
        assert type(model.get_submodule(name)) is nn.Linear
    assert summary.bytes_before == sum(weights[n] for n in summary.converted)
    assert summary.bytes_after == sum(model.get_submodule(n).weight_nbytes() for n in summary.converted)
    assert summary.saved_bytes == summary.bytes_before - summary.bytes_after > 0
    assert summary.bytes_after < summary.bytes_before / 2.5
    text = str(summary)
    assert "\n" not in text and "converted 4" in text and "skipped 3" in text and "MiB" in text

    with torch.no_grad():
        after = model(ids).to(torch.float64)
    assert float((after - before).norm() / before.norm()) < 0.1

    # Skip by suffix and by component; a shared Linear is converted once and replaced everywhere.
    torch.manual_seed(0)
    model = _TinyModel().to(device=device, dtype=torch.float16)
    model.blocks["1"].up = model.blocks["0"].up = nn.Linear(128, 128).to(device=device, dtype=torch.float16)
    summary = layers.convert_to_w4a16(model, group_size=32, symmetric=True, skip=("0.down", "odd", "lm_head"))
    assert summary.converted == ["blocks.0.up", "blocks.1.down"]
    assert set(summary.skipped) == {"blocks.0.down", "odd", "proj", "lm_head"}
    assert model.blocks["0"].up is model.blocks["1"].up
    assert isinstance(model.blocks["1"].up, layers.W4A16Linear) and model.blocks["1"].up.symmetric

    with pytest.raises(ValueError, match="group_size"):
        layers.convert_to_w4a16(model, group_size=100)
    with pytest.raises(ValueError, match=r"linear.weight is on the meta device: .* load a quantized state_dict"):
        layers.W4A16Linear.from_linear(nn.Linear(128, 64, device="meta"))
    with pytest.raises(TypeError, match="symmetric must be True or False, got 1"):
        layers.convert_to_w4a16(model, symmetric=1)


# ---------------------------------------------------------------------------------------------
# Plan logging
# ---------------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
def test_plan_logged_once_at_debug(w4a16, device, caplog):
    layer = w4a16.layers.W4A16Linear.from_linear(_linear(device=device), group_size=G)
    x = torch.randn((3, K), device=device, dtype=torch.float16)
    with caplog.at_level(logging.DEBUG, logger=w4a16.layers.__name__):
        with pytest.raises(TypeError, match="x must be a float16 or bfloat16 tensor"):  # x's error, not the log's
            layer(x.float())
        layer(x)
        layer(x)
    records = [r for r in caplog.records if r.name == w4a16.layers.__name__]
    assert len(records) == 1
    assert "W4A16Linear" in records[0].getMessage() and "M=3 float16" in records[0].getMessage()


# ---------------------------------------------------------------------------------------------
# Kernel Hub layer and kernelize
# ---------------------------------------------------------------------------------------------


@pytest.mark.kernels_ci
def test_hub_layer_is_stateless(w4a16):
    Hub = getattr(w4a16.layers, HUB_NAME)
    assert issubclass(Hub, nn.Module) and Hub.__init__ is nn.Module.__init__
    extra = set(dir(Hub)) - set(dir(nn.Module))
    assert extra <= {"has_backward", "can_torch_compile"}
    assert Hub.has_backward is False and Hub.can_torch_compile is True


@pytest.mark.kernels_ci
def test_kernelize_replaces_forward(w4a16, build_dir, device):
    import kernels
    from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_mapping

    layer = w4a16.layers.W4A16Linear.from_linear(_linear(device=device), group_size=G)
    HostLinear = _host_class(kernels)
    model = nn.Sequential(HostLinear(layer), nn.ReLU())
    x = torch.randn((4, K), device=device, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="original"):
        model(x)

    repo = LocalLayerRepository(repo_path=build_dir, layer_name=HUB_NAME)
    mapping = {"W4A16Linear": {device: repo}}
    with use_kernel_mapping(mapping, inherit_mapping=False):
        # No backward: a training kernelize keeps the original forward.
        kernelize(model, mode=Mode.TRAINING, device=device)
        with pytest.raises(RuntimeError, match="original"):
            model(x)
        kernelize(model, mode=Mode.INFERENCE, device=device)

    host = model[0]
    assert host.forward.__func__ is getattr(w4a16.layers, HUB_NAME).forward
    assert torch.equal(model(x), torch.relu(layer(x)))


def test_torch_compile_fullgraph_matches_eager(w4a16, build_dir, device):
    """Both forwards (W4A16Linear and the kernelized hub layer) in one graph, no graph break.
    On CPU this compiles the plain-torch path (tens of seconds): not a kernels_ci test."""
    import kernels
    from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_mapping

    W4A16Linear = w4a16.layers.W4A16Linear
    first = W4A16Linear.from_linear(_linear(K, 128, device=device, seed=1), group_size=G)
    second = W4A16Linear.from_linear(_linear(128, 64, device=device, seed=2), group_size=-1, symmetric=True)
    host = _host_class(kernels)(second)
    model = nn.Sequential(first, nn.ReLU(), host)
    mapping = {"W4A16Linear": {device: LocalLayerRepository(repo_path=build_dir, layer_name=HUB_NAME)}}
    with use_kernel_mapping(mapping, inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, device=device)

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn((3, K), device=device, dtype=torch.float16)
    y = compiled(x)  # traced before any eager call: the plan-log flags are still unset
    assert torch.equal(y, model(x))  # eager: logs the plans and sets the flags
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert torch.equal(compiled(x), y)  # the flags are not guarded: no recompilation
    x = torch.randn((1, K), device=device, dtype=torch.float16)
    assert torch.equal(compiled(x), model(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_capture_replay(w4a16):
    layer = w4a16.layers.W4A16Linear.from_linear(_linear(device="cuda"), group_size=G)
    static_x = torch.randn((4, K), device="cuda", dtype=torch.float16)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up (Triton compilation, plan) outside capture
        for _ in range(2):
            layer(static_x)
    torch.cuda.current_stream().wait_stream(stream)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = layer(static_x)
    for seed in (5, 6):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn((4, K), device="cuda", dtype=torch.float16, generator=gen)
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, layer(x))
