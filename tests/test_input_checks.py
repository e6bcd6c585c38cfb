"""Bad input to the public API: a clear TypeError / ValueError naming the argument, never a crash inside torch or
Triton and never a silently wrong result (tensors the kernels would misread, flags given as strings, a perm that is not
a permutation). Host code only: every check here runs before any kernel, on any device.
"""

import pytest
import torch

from test_gemm import TOL, random_layer


def _layer(w4a16, act_order=False, symmetric=False, k=256, n=32, group_size=64, seed=1):
    return random_layer(w4a16, k, n, group_size, symmetric, torch.float16, "cpu", act_order=act_order, seed=seed)


@pytest.mark.parametrize("name", ["qweight", "scales", "zeros", "perm"])
def test_non_contiguous_weight_tensors_are_refused(w4a16, name):
    """The kernels address qweight / scales / zeros / perm by shape: a transposed or sliced view of the right shape
    would be read as if contiguous (a silently wrong result on the GPU), so it is refused by name, both when a
    W4A16Weight is made and by the op on raw tensors."""
    weight, _ = _layer(w4a16, act_order=True)
    t = getattr(weight, name)
    strided = torch.stack([t, t], -1)[..., 0]  # the same values and shape, every other element of a wider buffer
    assert strided.shape == t.shape and not strided.is_contiguous() and torch.equal(strided, t)
    fields = dict(qweight=weight.qweight, scales=weight.scales, zeros=weight.zeros, perm=weight.perm)
    fields[name] = strided
    with pytest.raises(ValueError, match=rf"{name} must be contiguous"):
        w4a16.W4A16Weight(**fields, in_features=weight.in_features, out_features=weight.out_features,
                          group_size=weight.group_size)
    x = torch.randn(2, weight.in_features, dtype=torch.float16)
    with pytest.raises(ValueError, match=rf"{name} must be contiguous"):
        w4a16.ops.gemm(x, fields["qweight"], fields["scales"], fields["zeros"], fields["perm"], weight.in_features,
                       weight.group_size)


def test_flags_must_be_bools(w4a16):
    """strict / pdl of w4a16_linear and plan_for, symmetric of import_gptq: a truthy "no" or 1 would silently pick a
    behaviour (import_gptq's would drop the zeros: the layer imported as symmetric)."""
    weight, _ = _layer(w4a16)
    x = torch.randn(1, 256, dtype=torch.float16)
    for flag in ("strict", "pdl"):
        with pytest.raises(TypeError, match=rf"{flag} must be True or False, got 'no'"):
            w4a16.w4a16_linear(x, weight, **{flag: "no"})
        with pytest.raises(TypeError, match=rf"{flag} must be True or False, got 1"):
            w4a16.plan_for(weight, 1, torch.float16, **{flag: 1})
    k, n, g = 256, 32, 64
    gptq = dict(qweight=torch.zeros(k // 8, n, dtype=torch.int32), qzeros=torch.zeros(k // g, n // 8, dtype=torch.int32),
                scales=torch.ones(k // g, n, dtype=torch.float16))
    with pytest.raises(TypeError, match="symmetric must be True or False, got 'no'"):
        w4a16.import_gptq(**gptq, group_size=g, zero_convention="v2", symmetric="no")


def test_bias_is_checked(w4a16):
    weight, _ = _layer(w4a16)
    x = torch.randn(1, 256, dtype=torch.float16)
    with pytest.raises(TypeError, match="bias must be None or a floating-point tensor"):
        w4a16.w4a16_linear(x, weight, [0.0] * 32)
    with pytest.raises(TypeError, match="bias must be None or a floating-point tensor"):
        w4a16.w4a16_linear(x, weight, torch.zeros(32, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"bias must have shape \(out_features,\) = \(32,\), got \(31,\)"):
        w4a16.w4a16_linear(x, weight, torch.zeros(31, dtype=torch.float16))
    with pytest.raises(TypeError, match="bias must be None or a floating-point tensor"):
        w4a16.W4A16Linear.from_weight(weight, [0.0] * 32)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="bias is on cuda"):
            w4a16.w4a16_linear(x, weight, torch.zeros(32, dtype=torch.float16, device="cuda"))


def test_check_layer_arguments(w4a16):
    weight, _ = _layer(w4a16)
    with pytest.raises(TypeError, match="weight must be a W4A16Weight"):
        w4a16.check_layer(weight.qweight)
    with pytest.raises(TypeError, match="weight must be a W4A16Weight"):
        w4a16.check_layer(None)
    with pytest.raises(ValueError, match="batch_sizes must be a non-empty tuple or list of ints >= 1, got 4"):
        w4a16.check_layer(weight, batch_sizes=4)
    with pytest.raises(TypeError, match=r"dtype \(the activations'\) must be torch.float16 or torch.bfloat16"):
        w4a16.check_layer(weight, dtype=torch.float32)
    with pytest.raises(ValueError, match="tolerance must be a number > 0"):
        w4a16.check_layer(weight, tolerance=None)
    with pytest.raises(ValueError, match="tolerance must be a number > 0"):
        w4a16.check_layer(weight, tolerance=0.0)
    with pytest.raises(TypeError, match="reference_linear_weight must be None or a float tensor"):
        w4a16.check_layer(weight, reference_linear_weight=[[0.0]])


def test_g_idx_is_checked(w4a16):
    """A negative group index (bincount's own error before) and a g_idx that is not a tensor (an AttributeError, or
    for a numpy array a misleading device message) are named."""
    k, n, g = 256, 32, 64
    packed = w4a16.pack_int4_k_major(torch.randint(0, 16, (k, n), dtype=torch.uint8))
    scales = torch.rand(k // g, n, dtype=torch.float16) + 0.01
    g_idx = (torch.arange(k) // g).to(torch.int32)
    bad = g_idx.clone()
    bad[0] = -1
    with pytest.raises(ValueError, match=r"g_idx must hold group indices in 0..K/G-1 = 0..3, got a minimum of -1"):
        w4a16.prepare_weight(packed, scales, None, g, bad)
    with pytest.raises(TypeError, match="g_idx must be None or an integer tensor"):
        w4a16.prepare_weight(packed, scales, None, g, g_idx.tolist())
    with pytest.raises(TypeError, match="g_idx must be None or an integer tensor"):
        w4a16.prepare_weight(packed, scales, None, g, g_idx.numpy())
    with pytest.raises(TypeError, match="g_idx must be an integer tensor"):
        w4a16.prepare_weight(packed, scales, None, g, g_idx.float())


def test_layer_sizes_must_be_positive_ints(w4a16):
    for bad in (256.0, True, None, 0, -8):
        with pytest.raises(ValueError, match=rf"in_features must be an int > 0, got {bad!r}"):
            w4a16.W4A16Linear(bad, 32)
        with pytest.raises(ValueError, match=rf"out_features must be an int > 0, got {bad!r}"):
            w4a16.W4A16Linear(256, bad)


def test_state_dict_perm_must_be_a_permutation(w4a16):
    """The kernels gather x through perm without bounds checks, so a loaded perm is checked once (values out of range
    would read past x's rows on the GPU; a repeated value is a silently wrong layer)."""
    weight, ref = _layer(w4a16, act_order=True)
    layer = w4a16.W4A16Linear.from_weight(weight)
    state = layer.state_dict()
    for bad in (torch.full((256,), 261, dtype=torch.int32), torch.zeros(256, dtype=torch.int32)):
        fresh = w4a16.W4A16Linear(256, 32, bias=False, group_size=64, act_order=True)
        with pytest.raises(ValueError, match=r"perm must be a permutation of 0..K-1 = 0..255"):
            fresh.load_state_dict({**state, "perm": bad})
    with pytest.raises(ValueError, match=r"perm must be an integer tensor \[in_features\] = \(256,\)"):
        fresh.load_state_dict({**state, "perm": state["perm"].float()})
    fresh.load_state_dict(state)  # the real one loads, and the layer computes the reference
    x = torch.randn(3, 256, dtype=torch.float16)
    expected = x.double() @ ref
    err = float((fresh(x).double() - expected).norm() / expected.norm())
    assert err < TOL[torch.float16]


def test_float64_zeros_are_taken(w4a16, device):
    """Fractional float64 zeros (e.g. from a float64 quantizer) are stored as float32, which the kernels read; the
    result matches the float64 reference. (Before, the weight was refused with a message that named float zeros.)"""
    k, n, g = 256, 16, 64
    gen = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(k // g, n, generator=gen) * 0.05 + 0.01).to(torch.float16)
    zeros = torch.rand(k // g, n, generator=gen, dtype=torch.float64) * 15
    weight = w4a16.prepare_weight(w4a16.pack_int4_k_major(codes).to(device), scales.to(device), zeros.to(device), g)
    assert weight.zeros.dtype == torch.float32
    ref = (codes.double() - zeros.float().double().repeat_interleave(g, 0)) * scales.double().repeat_interleave(g, 0)
    x = torch.randn(2, k, generator=gen).to(torch.float16)
    expected = x.double() @ ref
    for path in ("reference", "tiled"):  # the plain-torch path and a Triton kernel (compiled, or the interpreter's)
        y = w4a16.w4a16_linear(x.to(device), weight, path=path)
        err = float((y.double().cpu() - expected).norm() / expected.norm())
        assert err < TOL[torch.float16], path


def test_a_weight_needs_an_output_column(w4a16):
    """N = 0 is refused by name, as W4A16Linear refuses out_features=0 (before, prepare_weight made an empty weight)."""
    k, g = 256, 64
    with pytest.raises(ValueError, match=r"packed must have N >= 1 output columns \[K/8, N\], got shape \(32, 0\)"):
        w4a16.prepare_weight(torch.zeros(k // 8, 0, dtype=torch.int32), torch.ones(k // g, 0, dtype=torch.float16), None, g)
    weight, _ = _layer(w4a16, k=k, group_size=g)
    x = torch.randn(2, k, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"scales must have N >= 1 output columns \[K/G, N\], got shape \(4, 0\)"):
        w4a16.ops.gemm(x, weight.qweight[:0], weight.scales[:, :0].contiguous(), None, None, k, g)


def test_seed_layout_helpers_check_their_inputs(w4a16):
    k, n, g = 64, 8, 32
    packed = w4a16.pack_int4_k_major(torch.randint(0, 16, (k, n), dtype=torch.uint8))
    scales = torch.rand(k // g, n, dtype=torch.float16)
    with pytest.raises(TypeError, match="codes must be an integer tensor"):
        w4a16.pack_int4_k_major([[1, 2]])
    with pytest.raises(TypeError, match="packed must be an int32 tensor"):
        w4a16.unpack_int4_k_major([[1, 2]])
    with pytest.raises(TypeError, match="scales must be a floating-point tensor"):
        w4a16.dequantize_int4_grouped(packed, None, None, g)
    with pytest.raises(TypeError, match="scales must be a floating-point tensor"):
        w4a16.dequantize_int4_grouped(packed, scales.to(torch.int32), None, g)
    with pytest.raises(TypeError, match="zeros must be None or a floating-point or uint8 tensor"):
        w4a16.dequantize_int4_grouped(packed, scales, [[8.0] * n] * (k // g), g)
    with pytest.raises(TypeError, match="dtype must be None or a floating-point torch.dtype"):
        w4a16.dequantize_int4_grouped(packed, scales, None, g, dtype=torch.int32)


def test_conversion_and_import_arguments(w4a16):
    model = torch.nn.Sequential(torch.nn.Linear(128, 16))
    with pytest.raises(TypeError, match="skip must be None, a string or a sequence of strings"):
        w4a16.convert_to_w4a16(model, skip=5)
    n, k, g = 16, 128, 64
    ct = dict(weight_packed=torch.zeros(n, k // 8, dtype=torch.int32), weight_scale=torch.ones(n, k // g, dtype=torch.float16))
    with pytest.raises(ValueError, match="weight_shape must be None or \\[N, K\\] as two ints"):
        w4a16.import_compressed_tensors(**ct, weight_shape=5)
    with pytest.raises(ValueError, match="weight_shape must be None or \\[N, K\\] as two ints"):
        w4a16.import_compressed_tensors(**ct, weight_shape=[16.7, 128])
    assert w4a16.import_compressed_tensors(**ct, weight_shape=torch.tensor([n, k])).out_features == n


def test_plan_gemm_takes_a_device_string(w4a16):
    plan = w4a16.plan_gemm(4, 96, 512, 128, torch.float16, "cpu")
    assert plan == w4a16.plan_gemm(4, 96, 512, 128, torch.float16, torch.device("cpu"))
    assert plan.path == "reference"  # (CPU tensors: the plain torch path)
    with pytest.raises(TypeError, match="device must be a torch.device or a device string, got int"):
        w4a16.plan_gemm(4, 96, 512, 128, torch.float16, 0)


def test_forced_triton_path_on_cpu_needs_the_interpreter(w4a16, monkeypatch):
    """A Triton path forced on CPU tensors outside Triton's interpreter is refused by name at the call (it failed
    inside Triton's launcher on a machine with a GPU); planning itself takes any device (the tuner plans for a CPU
    stand-in), and the plain-torch path still runs on CPU tensors."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    weight, _ = _layer(w4a16)
    x = torch.randn(2, weight.in_features, dtype=torch.float16)
    for path in ("tiled", "splitk", "dense"):
        assert w4a16.plan_gemm(2, 32, 256, 64, torch.float16, "cpu", path=path).path == path
        with pytest.raises(ValueError, match=f"path='{path}' runs Triton kernels, which need GPU tensors"):
            w4a16.w4a16_linear(x, weight, path=path)
    reference = w4a16.w4a16_linear(x, weight, path="reference")
    torch.testing.assert_close(w4a16.w4a16_linear(x, weight), reference, rtol=0, atol=0)
    assert w4a16.plan_gemm(2, 64, 256, 128, torch.float16, "cpu").path == "reference"
