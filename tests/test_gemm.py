"""The GEMM kernels against an independent float64 reference, round trips, dispatch and bad input.

On a CPU machine the Triton kernels run under TRITON_INTERPRET=1 (set by conftest) by forcing a
Triton path on CPU tensors; on a GPU the same tests run the compiled kernels. Weights are built from
random codes, scales and zeros, and the reference (q - z[g]) * s[g] is computed here in float64
without the package's dequantize.
"""

import dataclasses
import importlib
import os
import re

import pytest
import torch

# Each Triton path the dispatcher can choose; the tensor-core paths in both scale modes (fold:
# scale and zero applied to the fp32 accumulator per group; operand: dequantized in the operand).
TRITON_PATHS = ("gemv", "splitk:fold", "splitk:operand", "streamk:fold", "streamk:operand", "tiled:fold", "tiled:operand", "dense")
BATCH_SIZES = (1, 2, 3, 8, 16, 33, 64)
# Relative (Frobenius) error bounds against the float64 reference, >= 2.5x the largest error a correct kernel made over
# every accuracy test of this file (the Triton interpreter, Triton 3.9): fp16 5.2e-4 (act-order, fp32 scales, scale in
# operand, M = 1; every other case <= 3.9e-4), bf16 6.5e-3 (scale in operand; fold, GEMV and dense <= 4.0e-3). An fp16
# accumulator (rounded after each 16-row MMA step) makes 2.5e-3 at K = 4096 (test_triton_paths_long_k).
# The interpreter rounds fp32 -> bf16 toward zero (a 3.1e-3 relative error on gaussian values where round to nearest
# makes 1.7e-3): its bf16 errors are about twice a compiled kernel's.
TOL = {torch.float16: 1.4e-3, torch.bfloat16: 1.7e-2}
# run_and_check's elementwise bound: max |y - ref| <= ELEMENT_TOL * TOL * rms(ref) (measured: at most 1.9 TOL for fp16,
# 2.6e-3 rms; 2.2 TOL for bf16, 3.6e-2 rms), so one wrong element cannot hide in the norm
ELEMENT_TOL = 6

# (K, N, group_size, symmetric): N off the tile sizes, K not a multiple of 128, per-channel, g32..g128.
CASES = [
    (256, 48, 128, False),
    (256, 40, 64, True),
    (320, 24, 64, False),
    (256, 33, 32, False),
    (264, 20, -1, False),
    (384, 72, 128, True),
    (512, 40, 256, False),
    (256, 24, 16, True),
]


def triton_available(device: str) -> bool:
    return device == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def random_layer(w4a16, k, n, group_size, symmetric, dtype, device, act_order=False, seed=0, fractional_zeros=False,
                 max_zero=15):
    """Random codes/scales/zeros -> (W4A16Weight, float64 reference weight [K, N]). Integer zeros are drawn from
    0..max_zero (16: a GPTQ v1 checkpoint's stored 15 + 1)."""
    gen = torch.Generator().manual_seed(seed)
    g = k if group_size == -1 else group_size
    codes = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(k // g, n, generator=gen) * 0.05 + 0.01).to(dtype)
    if fractional_zeros:  # HQQ-style zeros anywhere in [0, 15]
        zeros = (torch.rand(k // g, n, generator=gen) * 15).to(dtype)
    else:
        zeros = None if symmetric else (torch.randint(0, max_zero + 1, (k // g, n), generator=gen).to(dtype))
    if act_order:
        order = torch.randperm(k, generator=gen)  # quantization order: row order[i] is in group i // g
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[order] = (torch.arange(k) // g).to(torch.int32)
    else:
        g_idx = torch.arange(k, dtype=torch.int32) // g
    z = torch.full((k // g, n), 8.0, dtype=torch.float64) if symmetric else zeros.to(torch.float64)
    ref = (codes.to(torch.float64) - z[g_idx.long()]) * scales.to(torch.float64)[g_idx.long()]
    packed = w4a16.pack_int4_k_major(codes)
    weight = w4a16.prepare_weight(
        packed.to(device), scales.to(device), None if zeros is None else zeros.to(device), group_size,
        g_idx.to(device) if act_order else None,
    )
    return weight, ref.to(device)


def forced_path(name) -> tuple:
    """A test path name -> (kernel path, config) for `w4a16_matmul`: "splitk" (the plan's own config), or
    "splitk:<scale mode>[-parts<P>]" with scale mode "fold" (per group on the fp32 accumulator),
    "fold-one-token" (the fold taking x sums from x's only row, ONE_TOKEN) or "operand" (dequantized in the
    MMA operand, SCALE_IN_OPERAND), and P the dot parts (DOT_PARTS). A (kernel path, config) pair is
    taken as it is (a whole launch configuration, e.g. one of the tuned table's)."""
    if isinstance(name, tuple):
        return name
    kernel_path, _, mode = name.partition(":")
    if not mode:
        return kernel_path, None
    scale_mode, _, parts = mode.partition("-parts")
    config = {"SCALE_IN_OPERAND": scale_mode == "operand", "ONE_TOKEN": scale_mode == "fold-one-token"}
    return kernel_path, {**config, "DOT_PARTS": int(parts)} if parts else config


def path_errors(y: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """(||y - ref|| / ||ref||, max |y - ref| / rms(ref)) of a result against its float64 reference: the norm-wise
    relative error and the largest elementwise one in units of the reference's rms (one wrong element shows there)."""
    diff = y.to(torch.float64) - expected
    norm = expected.norm()
    return float(diff.norm() / norm), float(diff.abs().max() / (norm / expected.numel() ** 0.5))


def run_and_check(w4a16, weight, ref, x, path):
    """Run one forced path through the op into a NaN-poisoned output and return the relative error (all written),
    asserting the elementwise bound (ELEMENT_TOL x TOL in units of the reference's rms). The op returns `out` itself:
    a kernel launcher must write into it (only the dense and reference paths' torch results are copied)."""
    m = x.shape[0]
    out = torch.full((m, weight.out_features), float("nan"), dtype=x.dtype, device=x.device)
    kernel_path, config = forced_path(path)
    y = w4a16.matmul.w4a16_matmul(x, weight.qweight, weight.scales, weight.zeros, weight.perm, weight.in_features,
                                  weight.group_size, path=kernel_path, out=out, config=config)
    assert y is out, f"{path}: the op did not return out"
    assert not torch.isnan(y).any(), f"{path}: unwritten (NaN) output elements at M={m}"
    rel, elementwise = path_errors(y, x.to(torch.float64) @ ref)
    assert elementwise <= ELEMENT_TOL * TOL[x.dtype], f"{path} M={m}: an element off by {elementwise:.2e} x rms(ref)"
    return rel


def assert_path_matches_reference(w4a16, weight, ref, path, dtype, device, batch_sizes, seed):
    """For each M: fresh random x (a generator seeded with `seed`), the forced path against the float64
    reference within the dtype's tolerance (`run_and_check`)."""
    gen = torch.Generator().manual_seed(seed)
    for m in batch_sizes:
        x = torch.randn(m, weight.in_features, generator=gen).to(device=device, dtype=dtype)
        err = run_and_check(w4a16, weight, ref, x, path)
        assert err < TOL[dtype], f"{path} M={m}: relative error {err:.2e}"


def test_a_launcher_that_ignores_out_is_caught(w4a16, device, monkeypatch):
    """The op copies only torch's own results (dense, reference) into `out`: a kernel launcher that returned a tensor
    of its own would be a bug, and the op says so instead of hiding it behind a copy."""
    weight, _ = random_layer(w4a16, 256, 32, 64, False, torch.float16, device)
    x = torch.randn(2, 256, dtype=torch.float16, device=device)
    out = torch.empty(2, 32, dtype=torch.float16, device=device)
    monkeypatch.setitem(w4a16.matmul._LAUNCHERS, "tiled", lambda x2, *args: torch.zeros_like(out))
    with pytest.raises(RuntimeError, match="the tiled launcher did not write into out"):
        w4a16.matmul.w4a16_matmul(x, weight.qweight, weight.scales, weight.zeros, None, 256, 64, path="tiled", out=out)


@pytest.mark.parametrize("path", TRITON_PATHS)
@pytest.mark.parametrize("k,n,group_size,symmetric", CASES)
def test_triton_paths_fp16(w4a16, device, path, k, n, group_size, symmetric):
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    weight, ref = random_layer(w4a16, k, n, group_size, symmetric, torch.float16, device)
    assert_path_matches_reference(w4a16, weight, ref, path, torch.float16, device, BATCH_SIZES, seed=k + n)


@pytest.mark.parametrize("path", ["splitk:fold-one-token", "streamk:fold-one-token", "tiled:fold-one-token"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("k,n,group_size,symmetric", [CASES[0], CASES[2], CASES[4], CASES[6]])
def test_triton_paths_one_token(w4a16, device, path, dtype, k, n, group_size, symmetric):
    """The ONE_TOKEN fold at M = 1 (and ignored at M = 2: the plain fold)."""
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    weight, ref = random_layer(w4a16, k, n, group_size, symmetric, dtype, device, seed=4)
    assert_path_matches_reference(w4a16, weight, ref, path, dtype, device, (1, 2), seed=5)


@pytest.mark.parametrize("path", ["tiled:operand-parts2", "splitk:operand-parts4", "streamk:operand-parts8",
                                  "splitk:fold-parts2", "tiled:fold-parts4", "streamk:fold-parts8", "splitk:fold-one-token-parts2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("k,n,group_size,symmetric", [CASES[0], CASES[3], CASES[4], CASES[5]])
def test_triton_paths_dot_parts(w4a16, device, path, dtype, k, n, group_size, symmetric):
    """Every dot in 2, 4 or 8 chained parts (DOT_PARTS), scale in operand and fold: each part's slices,
    scale folds and x rows must line up (group 32 splits an operand part of 64 rows in two; the fold
    splits each group's dot, per-channel the block's)."""
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    weight, ref = random_layer(w4a16, k, n, group_size, symmetric, dtype, device, seed=11)
    assert_path_matches_reference(w4a16, weight, ref, path, dtype, device, (1, 17), seed=12)


@pytest.mark.parametrize("path", TRITON_PATHS)
def test_triton_paths_long_k(w4a16, device, path):
    """K = 4096 through every path: summed in fp16 (over K / 16 MMA steps, or per K block) the accumulator's rounding
    alone exceeds TOL here; an fp32 accumulator stays at the output's rounding. (N tiny: the interpreter's time.)"""
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    weight, ref = random_layer(w4a16, 4096, 24, 128, False, torch.float16, device, seed=31)
    assert_path_matches_reference(w4a16, weight, ref, path, torch.float16, device, (1, 16), seed=32)


# Tile configurations of the shipped H200 table (large tiles, 8 warps, split-K 3 / 4, Stream-K), forced on a small
# layer whose N is off every tile size and whose 4 K blocks leave a split empty (split 3: blocks 2 + 2 + 0).
SHIPPED_TILES = [
    ("tiled", {"BLOCK_N": 128, "BLOCK_M": 256, "num_warps": 8, "num_stages": 3, "SCALE_IN_OPERAND": True, "DOT_PARTS": 2}),
    ("tiled", {"BLOCK_N": 128, "BLOCK_M": 256, "num_warps": 8, "num_stages": 2, "SCALE_IN_OPERAND": True}),
    ("splitk", {"BLOCK_N": 256, "BLOCK_M": 128, "SPLIT_K": 3, "num_warps": 8, "num_stages": 3, "SCALE_IN_OPERAND": True}),
    ("splitk", {"BLOCK_N": 128, "BLOCK_M": 64, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4, "SCALE_IN_OPERAND": True}),
    ("splitk", {"BLOCK_N": 256, "BLOCK_M": 16, "SPLIT_K": 3, "num_warps": 8, "num_stages": 3, "maxnreg": 128, "DOT_PARTS": 4}),
    ("streamk", {"BLOCK_N": 128, "BLOCK_M": 32, "PROGRAMS": 5, "num_warps": 4, "num_stages": 4}),
]


@pytest.mark.parametrize("kernel_path,config", SHIPPED_TILES)
@pytest.mark.parametrize("group_size,dtype", [(128, torch.float16), (64, torch.bfloat16)])
def test_shipped_tile_configs(w4a16, device, kernel_path, config, group_size, dtype):
    """The tuned table's large tiles against the float64 reference at M within one tile and over two."""
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    weight, ref = random_layer(w4a16, 512, 200, group_size, False, dtype, device, seed=13)
    assert_path_matches_reference(w4a16, weight, ref, (kernel_path, config), dtype, device, (33, config["BLOCK_M"] + 4), seed=14)


@pytest.mark.parametrize("m,k", [(1, 8), (3, 1000), (2, 2056), (5, 2056), (63, 1500), (64, 4100), (260, 9000), (3, 20000),
                                 (2, 40000)])
def test_gather_columns_is_index_select(w4a16, device, m, k):
    """The act-order gather kernel with the chunk `gather_chunk` picks: x[:, perm] exactly, for a strided x and K
    off the power-of-two row blocks (the row's columns past K masked; at K = 8 a row block of 1024), up to the
    largest row block (K = 40000: 65536 columns, 32 warps on a GPU)."""
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    gen = torch.Generator().manual_seed(k)
    wide = torch.randn(m, k + 24, generator=gen).to(device=device, dtype=torch.float16)
    x = wide[:, 16:16 + k]  # row stride k + 24, unit column stride
    perm = torch.randperm(k, generator=gen).to(device)
    out = w4a16.gather.gather_columns(x, perm)
    assert out.is_contiguous() and torch.equal(out, x.index_select(1, perm))


@pytest.mark.parametrize("m,k,chunk", [(1, 1000, 128), (3, 2056, 256), (2, 4104, 1024), (5, 300, 2048)])
def test_gather_columns_forced_chunk(w4a16, device, m, k, chunk):
    """`chunk` overrides the output columns per program (benchmarks/probe_gather.py times them): x[:, perm] exactly
    with a row split over many programs (the last chunk partly past K) and with a chunk wider than the row, bf16."""
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    gen = torch.Generator().manual_seed(k + m)
    wide = torch.randn(m, k + 8, generator=gen).to(device=device, dtype=torch.bfloat16)
    x = wide[:, 8:]
    perm = torch.randperm(k, generator=gen).to(device)
    assert torch.equal(w4a16.gather.gather_columns(x, perm, chunk=chunk), x.index_select(1, perm))


def test_gather_columns_refuses_bad_chunk_and_takes_any_k(w4a16, device):
    """A chunk that is not a power of two from 128 to 65536 is refused by name; rows past 65536 columns (beyond the
    kernel's row block) still gather exactly, through torch's index_select."""
    x = torch.randn(2, 300, device=device, dtype=torch.float16)
    perm = torch.randperm(300).to(device)
    for bad in (100, 64, 1 << 17):
        with pytest.raises(ValueError, match="chunk must be None or a power of two"):
            w4a16.gather.gather_columns(x, perm, chunk=bad)
    wide = torch.randn(1, 65544, device=device, dtype=torch.float16)
    perm = torch.randperm(65544).to(device)
    assert torch.equal(w4a16.gather.gather_columns(wide, perm), wide.index_select(1, perm))


def test_gather_chunk_fills_one_wave(w4a16):
    """`gather_chunk`: the smallest power of two from 1024 whose programs (M x chunks per row) fit the SMs, the whole
    row block once M alone fills them (values from NOTES v36's probe on 132 SMs)."""
    gather = w4a16.gather
    assert gather.gather_chunk(1, 4096, 132) == 1024
    assert gather.gather_chunk(16, 14336, 132) == 2048
    assert gather.gather_chunk(32, 14336, 132) == 4096
    assert gather.gather_chunk(32, 28672, 132) == 8192
    assert gather.gather_chunk(256, 14336, 132) == 16384
    assert gather.gather_chunk(4096, 8, 132) == 1024


@pytest.mark.parametrize("path", ["splitk:fold", "splitk:operand", "streamk:fold", "tiled:operand"])
@pytest.mark.parametrize("k,n,group_size", [(256, 24, 64), (320, 40, 32), (384, 20, 128)])
def test_triton_paths_act_order(w4a16, device, path, k, n, group_size):
    """Act-order through each tensor-core path: x[:, perm] gathered first (K not a multiple of 128 included)."""
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    weight, ref = random_layer(w4a16, k, n, group_size, False, torch.float16, device, act_order=True, seed=8)
    assert weight.act_order
    assert_path_matches_reference(w4a16, weight, ref, path, torch.float16, device, (1, 5, 33), seed=9)


@pytest.mark.parametrize("path", ["splitk:operand", "tiled:fold", "dense", "reference"])
@pytest.mark.parametrize("dtype,symmetric", [(torch.float16, True), (torch.bfloat16, False), (torch.bfloat16, True)],
                         ids=["fp16-sym", "bf16-asym", "bf16-sym"])
def test_act_order_symmetric_and_bf16(w4a16, device, path, dtype, symmetric):
    """Act-order with symmetric weights (no zeros) and with bf16 activations and scales, through a tensor-core path
    in each scale mode, the dense path and the plain-torch reference path, against the float64 reference."""
    if path != "reference" and not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    weight, ref = random_layer(w4a16, 256, 24, 64, symmetric, dtype, device, act_order=True, seed=41)
    assert weight.act_order and (weight.zeros is None) == symmetric and weight.scales.dtype == dtype
    assert_path_matches_reference(w4a16, weight, ref, path, dtype, device, (1, 17), seed=42)


@pytest.mark.parametrize("path", ["gemv", "splitk:operand", "tiled:fold", "streamk:operand"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_paths_zero_point_16(w4a16, device, path, dtype):
    """Integer zero points up to 16 (GPTQ v1 checkpoints: the stored 15 + 1), kept as uint8, against the float64
    reference (scale in operand: 16 past the 4-bit range in the magic-number form; fold: in the x-sum term)."""
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    weight, ref = random_layer(w4a16, 256, 40, 64, False, dtype, device, seed=43, max_zero=16)
    assert weight.zeros.dtype == torch.uint8 and int(weight.zeros.max()) == 16
    assert int((weight.zeros == 16).sum()) >= 4
    assert_path_matches_reference(w4a16, weight, ref, path, dtype, device, (1, 16), seed=44)


@pytest.mark.parametrize("path", TRITON_PATHS)
@pytest.mark.parametrize("k,n,group_size,symmetric", [CASES[0], CASES[1], CASES[2], CASES[4]])
def test_triton_paths_bf16(w4a16, device, path, k, n, group_size, symmetric):
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    weight, ref = random_layer(w4a16, k, n, group_size, symmetric, torch.bfloat16, device, seed=1)
    assert_path_matches_reference(w4a16, weight, ref, path, torch.bfloat16, device, (1, 3, 16, 33), seed=7)


@pytest.mark.parametrize("path", TRITON_PATHS)
def test_triton_paths_act_order_fp32_scales(w4a16, device, path):
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    weight, ref = random_layer(w4a16, 256, 24, 64, False, torch.float32, device, act_order=True, seed=2)
    assert weight.act_order and weight.scales.dtype == torch.float32
    assert_path_matches_reference(w4a16, weight, ref, path, torch.float16, device, (1, 8, 17), seed=3)


@pytest.mark.parametrize("path", TRITON_PATHS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_paths_fractional_zeros(w4a16, device, path, dtype):
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    weight, ref = random_layer(w4a16, 256, 40, 64, False, dtype, device, seed=9, fractional_zeros=True)
    assert not bool((weight.zeros == weight.zeros.round()).all())
    assert_path_matches_reference(w4a16, weight, ref, path, dtype, device, (1, 16, 33), seed=10)


@pytest.mark.parametrize("path", ["splitk", "streamk", "tiled"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("zeros_kind", ["integer", "fractional", "symmetric", "fp32 scales"])
def test_stream_params(w4a16, device, path, dtype, zeros_kind):
    """STREAM_PARAMS (scale in operand, s / z read as the 32-bit words holding them; on NVIDIA GPUs by prmt for
    integer and symmetric zeros with scales in x's dtype): every zero form and scale dtype against the float64
    reference, and bit for bit the result without the option (the same values reach the same arithmetic).
    N = 44: a multiple of 4 that leaves the 64-row tile part-filled (masked rows)."""
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    weight, ref = random_layer(w4a16, 384, 44, 64, zeros_kind == "symmetric", dtype, device, seed=21,
                               fractional_zeros=zeros_kind == "fractional")
    if zeros_kind == "fp32 scales":
        weight = dataclasses.replace(weight, scales=weight.scales.float())
    assert (weight.zeros is None) == (zeros_kind == "symmetric")
    assert weight.zeros is None or (weight.zeros.dtype == torch.uint8) == (zeros_kind in ("integer", "fp32 scales"))
    config = {"SCALE_IN_OPERAND": True, "BLOCK_N": 64, "BLOCK_M": 16, "num_stages": 3}
    config = {**config, **({"SPLIT_K": 2} if path == "splitk" else {"PROGRAMS": 3} if path == "streamk" else {})}
    gen = torch.Generator().manual_seed(22)
    for m in (1, 3, 17):
        x = torch.randn(m, 384, generator=gen).to(device=device, dtype=dtype)
        streamed = run_and_check(w4a16, weight, ref, x, (path, {**config, "STREAM_PARAMS": True}))
        assert streamed < TOL[dtype], f"{path} {zeros_kind} M={m}: relative error {streamed:.2e}"
        args = (x, weight.qweight, weight.scales, weight.zeros, weight.perm, 384, weight.group_size)
        plain = w4a16.matmul.w4a16_matmul(*args, path=path, config=config)
        assert torch.equal(w4a16.matmul.w4a16_matmul(*args, path=path, config={**config, "STREAM_PARAMS": True}), plain)
        assert streamed_launch(w4a16, weight, x, path, {**config, "STREAM_PARAMS": True})  # the option reached the kernel


def streamed_launch(w4a16, weight, x, path, config) -> bool:
    """Whether the kernel a call of this forced plan launches was compiled with STREAM_PARAMS."""
    plan = w4a16.dispatch.plan_gemm(x.shape[0], weight.out_features, weight.in_features, weight.group_size, x.dtype, x.device,
                                    path=path, config=config)
    run = w4a16.gemm._launch_arguments(x, weight.qweight, weight.scales, weight.zeros, weight.in_features, weight.group_size,
                                       plan, None, 0, x.device.type)[0]
    return run.kernel.constexprs["STREAM_PARAMS"]


def test_stream_params_falls_back_where_words_do_not_line_up(w4a16, device):
    """STREAM_PARAMS needs N a multiple of 4 and 4-byte aligned scales / zeros: elsewhere the plan runs without
    it (still correct), and a value that is not a bool is refused by name."""
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    config = {"SCALE_IN_OPERAND": True, "BLOCK_N": 64, "BLOCK_M": 16, "SPLIT_K": 2, "STREAM_PARAMS": True}
    weight, ref = random_layer(w4a16, 256, 42, 128, False, torch.float16, device, seed=23)  # N = 42: 2 mod 4
    x = torch.randn(3, 256, device=device).to(torch.float16)
    assert not streamed_launch(w4a16, weight, x, "splitk", config)
    assert run_and_check(w4a16, weight, ref, x, ("splitk", config)) < TOL[torch.float16]
    weight, ref = random_layer(w4a16, 256, 40, 128, False, torch.float16, device, seed=24)
    assert streamed_launch(w4a16, weight, x, "splitk", config)
    shifted = torch.empty(weight.scales.numel() + 1, dtype=weight.scales.dtype, device=device)[1:].view(weight.scales.shape)
    shifted.copy_(weight.scales)  # contiguous, 2 bytes off a word boundary
    assert shifted.data_ptr() % 4 == 2
    weight = dataclasses.replace(weight, scales=shifted)
    assert not streamed_launch(w4a16, weight, x, "splitk", config)
    assert run_and_check(w4a16, weight, ref, x, ("splitk", config)) < TOL[torch.float16]
    with pytest.raises(ValueError, match="STREAM_PARAMS must be True or False"):
        w4a16.matmul.w4a16_matmul(x, weight.qweight, weight.scales, weight.zeros, weight.perm, 256, weight.group_size,
                                  path="splitk", config={**config, "STREAM_PARAMS": 1})


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_auto_path_and_leading_dims(w4a16, device, dtype):
    weight, ref = random_layer(w4a16, 256, 40, 128, False, dtype, device, seed=4)
    x = torch.randn(2, 3, 256, device=device).to(dtype)
    y = w4a16.w4a16_linear(x, weight)
    assert y.shape == (2, 3, 40) and y.dtype == dtype
    expected = x.to(torch.float64) @ ref
    assert float((y.double() - expected).norm() / expected.norm()) < TOL[dtype]
    bias = torch.randn(40, device=device).to(dtype)
    yb = w4a16.w4a16_linear(x, weight, bias)
    torch.testing.assert_close(yb, y + bias)
    assert w4a16.w4a16_linear(x, weight, bias.float()).dtype == dtype  # the bias follows x's dtype


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_seed_api_round_trip(w4a16, device, dtype):
    """The seed layout's API: w4a16_gemm (default path) and a prepared weight through forced Triton paths, on codes,
    scales and zeros drawn here, packed by pack_int4_k_major, against x @ ((q - z) * s) computed here in float64."""
    k, n, g = 256, 64, 128
    gen = torch.Generator().manual_seed(17)
    codes = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(k // g, n, generator=gen) * 0.05 + 0.01).to(dtype)
    zeros = torch.randint(0, 16, (k // g, n), generator=gen).to(dtype)
    packed = w4a16.pack_int4_k_major(codes)
    assert packed.shape == (k // 8, n) and packed.dtype == torch.int32
    assert torch.equal(unpack_k_major(packed), codes.long())  # the documented nibble order, read here
    rows = torch.arange(k) // g
    ref = (codes.to(torch.float64) - zeros.to(torch.float64)[rows]) * scales.to(torch.float64)[rows]
    x = torch.randn(5, k, generator=gen).to(dtype)
    expected = x.double() @ ref
    args = packed.to(device), scales.to(device), zeros.to(device)
    results = {"default": w4a16.w4a16_gemm(x.to(device), *args, g)}
    if triton_available(device):
        weight = w4a16.prepare_weight(*args, g)
        for path in ("tiled", "splitk"):
            results[path] = w4a16.w4a16_linear(x.to(device), weight, path=path)
    for path, y in results.items():
        assert y.dtype == dtype and y.shape == (5, n)
        err = float((y.double().cpu() - expected).norm() / expected.norm())
        assert err < TOL[dtype], f"{path}: relative error {err:.2e}"
    # the quantizer's output is in this layout too (its values: test_quantize_error_within_half_step)
    packed, scales, zeros = w4a16.quantize_weight_int4_grouped(torch.randn(k, n, generator=gen), g, False)
    assert packed.shape == (k // 8, n) and packed.dtype == torch.int32 and scales.shape == zeros.shape == (k // g, n)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("symmetric", [False, True])
def test_quantize_step_on_a_storage_value(w4a16, device, symmetric):
    """A group whose step (range / 15, or max|w| / 7) is exactly an fp16 value gets that value as its scale on the
    test device too: on CUDA, torch's division by a Python number multiplies by the rounded reciprocal, which put
    such steps one float32 ulp above and their scales one fp16 step up (the H200 run at 04ce517)."""
    gen = torch.Generator().manual_seed(23)
    levels = 7 if symmetric else 15
    v = (torch.rand(4096, generator=gen) * 0.05 + 0.002).half()
    v = v[(v.float() * levels).half().float() == v.float() * levels][:32]  # steps whose range is an fp16 value
    g, n = 64, v.numel()
    # asymmetric: values in [0, 15v] with both ends present; symmetric: |values| <= 7v with 7v present
    w = (torch.rand(g, n, generator=gen) * (levels / 2 if symmetric else levels)) * v.float()
    if symmetric:
        w[1::2] = -w[1::2]
    else:
        w[1] = 0
    w[0] = levels * v.float()
    w = w.half()
    _, scales, _ = w4a16.quantize_weight_int4_grouped(w.to(device), g, symmetric)
    assert n >= 16 and torch.equal(scales.cpu()[0], v), int((scales.cpu()[0] != v).sum())


@pytest.mark.kernels_ci
def test_quantize_rounds_in_column_chunks(w4a16, monkeypatch):
    """The quantizer rounds the codes in float64 column chunks (bounded temporaries for an LM head): chunks of
    7 columns, the last one ragged, give the same packed weight, scales and zeros as one chunk."""
    quantize = importlib.import_module(w4a16.__name__ + ".quantize")
    w = torch.randn(256, 24, generator=torch.Generator().manual_seed(5)) * 3
    whole = w4a16.quantize_weight_int4_grouped(w, 64, False)
    monkeypatch.setattr(quantize, "_CODES_CHUNK", 7)
    for a, b in zip(whole, w4a16.quantize_weight_int4_grouped(w, 64, False)):
        assert torch.equal(a, b)


def round_up_to_dtype(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 values -> the smallest `dtype` value >= each (as float64): a scale rounded up to its storage."""
    stored = values.to(dtype)
    low = stored.to(torch.float64) < values
    return torch.where(low, torch.nextafter(stored, torch.full_like(stored, float("inf"))), stored).to(torch.float64)


def rtn_scales(w: torch.Tensor, group_size: int, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest min-max 4-bit scales of w [K, N] per group of G rows, computed here in float64 (independent of
    the package): asymmetric (max - min) / 15 over the group's range widened to hold 0, symmetric max|w| / 7, each
    rounded up to the storage dtype (w's, fp16 for fp32 weights; quantize_weight_int4_grouped's docstring). Returns
    (scales float64 [K/G, N], near_tie): near_tie marks the steps within 1e-6 (relative) of a storage value but not on
    it, where a float32 computation of the step may round up to that value or the next one."""
    k, n = w.shape
    g = k if group_size == -1 else group_size
    store = torch.float16 if w.dtype == torch.float32 else w.dtype
    wg = w.to(torch.float64).reshape(k // g, g, n)
    if symmetric:
        step = wg.abs().amax(dim=1) / 7
    else:
        step = (wg.amax(dim=1).clamp(min=0) - wg.amin(dim=1).clamp(max=0)) / 15
    scales = round_up_to_dtype(step, store)
    below = torch.nextafter(scales.to(store), torch.full_like(scales, float("-inf"), dtype=store)).to(torch.float64)
    # (a step that is a storage value itself is exact in float32 too)
    near_tie = ((scales - step) <= 1e-6 * step) & (scales != step) | ((step - below) <= 1e-6 * step)
    return scales, near_tie


def rtn_codes(w: torch.Tensor, group_size: int, symmetric: bool, scales: torch.Tensor) -> dict:
    """Round-to-nearest codes of w [K, N] for given float64 scales [K/G, N], in float64: zero = 8 (symmetric) or
    clamp(round(-min / s), 0, 15), codes = clamp(round(w / s) + zero, 0, 15). Returns codes (int64 [K, N]), zeros
    (float64 [K/G, N]), the float64 weight (codes - zero) * s [K, N], and code_tie / zero_tie: where the rounded value
    is within 1e-6 of a .5 tie (another float order may round it the other way)."""
    k, n = w.shape
    g = k if group_size == -1 else group_size
    wg = w.to(torch.float64).reshape(k // g, g, n)
    if symmetric:
        zeros = torch.full_like(scales, 8.0)
        zero_tie = torch.zeros_like(scales, dtype=torch.bool)
    else:
        z_exact = -wg.amin(dim=1).clamp(max=0) / scales
        zeros = torch.round(z_exact).clamp(0, 15)
        zero_tie = ((z_exact - z_exact.floor()) - 0.5).abs() <= 1e-6
    q_exact = wg / scales[:, None] + zeros[:, None]
    codes = torch.round(q_exact).clamp(0, 15)
    code_tie = ((q_exact - q_exact.floor()) - 0.5).abs() <= 1e-6
    weight = (codes - zeros[:, None]) * scales[:, None]
    return dict(codes=codes.reshape(k, n).long(), zeros=zeros, weight=weight.reshape(k, n), code_tie=code_tie.reshape(k, n),
                zero_tie=zero_tie)


def equal_but_ties(got: torch.Tensor, mine: torch.Tensor, tie: torch.Tensor) -> torch.Tensor:
    """Where the package's codes or zeros `got` agree with the test's `mine`: equal, or one apart at a .5 tie."""
    return (got == mine) | (tie & ((got - mine).abs() == 1))


def unpack_k_major(packed: torch.Tensor) -> torch.Tensor:
    """The seed layout's int32 [K/8, N] -> codes int64 [K, N] (nibble j of word i is row 8i + j), written here."""
    shifts = (4 * torch.arange(8, dtype=torch.int64)).view(1, 8, 1)
    return ((packed.to(torch.int64).unsqueeze(1) >> shifts) & 0xF).reshape(-1, packed.shape[1])


@pytest.mark.kernels_ci
@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_quantize_error_within_half_step(w4a16, group_size, symmetric, dtype):
    """quantize_weight_int4_grouped against a round-to-nearest min-max quantization written here in float64
    (`rtn_scales`, `rtn_codes`): the same scales, zeros and codes (a code or zero may differ by one only at a .5 tie,
    a scale by its storage dtype's next value only where the step is within 1e-6 of a stored value), and every weight
    within half of the independent step of its reconstruction."""
    k, n = 256, 24
    gen = torch.Generator().manual_seed(group_size % 1000 + 7 * symmetric + 31 * len(str(dtype)))
    # columns of different magnitudes, all far above the step floor in the code (16 x the storage dtype's smallest
    # normal, 2^-10 for fp16; not in the docstring: a group with max|w| below ~7e-3 gets a coarser step than RTN's)
    w = (torch.randn(k, n, generator=gen) * (torch.rand(1, n, generator=gen) * 3 + 0.25)).to(dtype)
    packed, scales, zeros = w4a16.quantize_weight_int4_grouped(w, group_size, symmetric)
    g = k if group_size == -1 else group_size
    store = torch.float16 if dtype == torch.float32 else dtype
    assert packed.shape == (k // 8, n) and scales.shape == zeros.shape == (k // g, n)
    assert scales.dtype == zeros.dtype == store
    my_scales, scale_tie = rtn_scales(w, group_size, symmetric)
    got_scales = scales.to(torch.float64)
    next_up = round_up_to_dtype(torch.nextafter(my_scales, torch.full_like(my_scales, float("inf"))), store)
    next_down = torch.nextafter(my_scales.to(store), torch.full_like(scales, float("-inf"))).to(torch.float64)
    scales_ok = (got_scales == my_scales) | (scale_tie & ((got_scales == next_up) | (got_scales == next_down)))
    assert bool(scales_ok.all()), f"{int((~scales_ok).sum())} scales differ, e.g. {float(got_scales[~scales_ok][0])}"
    # codes and zeros for the scales the package chose where the step was at a tie (elsewhere they are ours)
    mine = rtn_codes(w, group_size, symmetric, torch.where(scale_tie, got_scales, my_scales))
    got_zeros = zeros.to(torch.float64)
    zeros_ok = equal_but_ties(got_zeros, mine["zeros"], mine["zero_tie"])
    assert bool(zeros_ok.all()), f"{int((~zeros_ok).sum())} zeros differ"
    if symmetric:
        assert bool((zeros == 8).all())
    codes = unpack_k_major(packed)
    codes_ok = equal_but_ties(codes, mine["codes"], mine["code_tie"])
    assert bool(codes_ok.all()), f"{int((~codes_ok).sum())} codes differ"
    # the package's own reconstruction, written here, within half of OUR step of the float weight
    rows = torch.arange(k) // g
    deq = (codes.to(torch.float64) - got_zeros[rows]) * got_scales[rows]
    step = my_scales[rows]
    err = (deq - w.to(torch.float64)).abs()
    assert bool((err <= 0.5 * step * (1 + 1e-6)).all()), float((err / step).max())
    # and the data is not degenerate: each column's codes span at least half of the 4-bit range
    assert bool((codes.amax(0) - codes.amin(0) >= 7).all())


@pytest.mark.kernels_ci
def test_pack_unpack_exact(w4a16):
    codes = torch.randint(0, 16, (264, 37), dtype=torch.uint8)
    packed = w4a16.pack_int4_k_major(codes)
    assert torch.equal(w4a16.unpack_int4_k_major(packed), codes)
    # nibble j of word i is row 8i + j, low bits first
    assert int(packed[0, 0]) & 0xF == int(codes[0, 0]) and (int(packed[0, 0]) >> 4) & 0xF == int(codes[1, 0])
    # kernel-native: [ceil(N/64), ceil(K/128), 64, 16]; 70 columns = one full and one partial 64-row tile
    codes = torch.randint(0, 16, (264, 70), dtype=torch.uint8)
    native = w4a16.layout.pack_int4_tiled_striped(codes)
    assert tuple(native.shape) == (2, 3, 64, 16) == w4a16.layout.native_qweight_shape(70, 264)
    assert torch.equal(w4a16.layout.unpack_int4_tiled_striped(native, 264, 70), codes)
    # nibble r = q + 4t of word [n // 64, b, n % 64, 2p + h] is row b*128 + 16*(4h + q) + 2p + t (layout.py)
    for n in (5, 66):
        for c, r in ((3, 2), (6, 5), (15, 7), (0, 0)):
            p, h = divmod(c, 2)
            q, t = r % 4, r // 4
            assert (int(native[n // 64, 1, n % 64, c]) >> (4 * r)) & 0xF == int(codes[128 + 16 * (4 * h + q) + 2 * p + t, n])
    # padding: rows k >= 264 and output rows n >= 70 hold code 0; each (tile, block) is 4 KB contiguous
    # (in block 2 only rows 256..263 are real: nibbles 0 and 4 of words 0, 2, 4, 6)
    last = native[:, 2]
    assert int(native[1, :, 6:].abs().sum()) == 0 and int(last[..., 8:].abs().sum()) == 0 and int(last[..., 1::2].abs().sum()) == 0
    assert int((last[..., 0:8:2] & ~0x000F000F).abs().sum()) == 0
    assert native.is_contiguous() and native[1, 2].data_ptr() - native[1, 1].data_ptr() == 4096


@pytest.mark.kernels_ci
def test_symmetric_high_nibble_constants(w4a16):
    """The shift-free read of nibble pairs 1 and 3 (symmetric fp16, NVIDIA asm: `dequant.magic_high_pairs`): for every
    code q at bits 4-7 of either half, (w & 0x00F000F0) | 0x6400 is the fp16 1024 + 16 q, and one fma with the asm's
    constants (1 / 16, -72) gives q - 8 exactly (the asm itself runs only on a GPU, in the Triton path tests)."""
    dq = w4a16.dequant

    def halves(pair):  # uint32 pair -> its two fp16 values
        return torch.tensor([pair & 0xFFFF, pair >> 16], dtype=torch.int32).to(torch.int16).view(torch.float16).double()

    scale, offset = halves(int(dq.HIGH_NIBBLE_SCALE_PAIR)), halves(int(dq.SYMMETRIC_HIGH_OFFSET_PAIR))
    magic = int(dq.MAGIC_PAIR[torch.float16])
    codes = torch.arange(16)
    for lo, hi in [(codes, codes.flip(0)), (codes.roll(5), codes)]:
        values = []
        for q_lo, q_hi in zip(lo.tolist(), hi.tolist()):
            word = ((q_lo << 4) | (q_hi << 20)) & 0x00F000F0 | magic  # nibbles 1 and 5 of a word, OR-ed with C
            pair = halves(word)
            assert pair.tolist() == [1024 + 16 * q_lo, 1024 + 16 * q_hi]
            exact = pair * scale + offset  # the fma's exact result, then its one fp16 rounding
            values.append(exact.to(torch.float16).double().tolist())
        assert values == [[q_lo - 8.0, q_hi - 8.0] for q_lo, q_hi in zip(lo.tolist(), hi.tolist())]


@pytest.mark.kernels_ci
def test_prepared_weight_dequantizes_like_seed(w4a16):
    weight, ref = random_layer(w4a16, 256, 24, 64, False, torch.float16, "cpu", act_order=True, seed=5)
    assert torch.equal(weight.dequantize(torch.float64), ref)
    identity, _ = random_layer(w4a16, 256, 24, 64, False, torch.float16, "cpu", act_order=False)
    assert identity.perm is None  # an identity g_idx costs nothing
    # integer zeros are stored as uint8 (the kernels' integer-zero form); fractional ones keep their dtype
    assert weight.zeros.dtype == torch.uint8
    fractional, _ = random_layer(w4a16, 256, 24, 64, False, torch.float16, "cpu", fractional_zeros=True)
    assert fractional.zeros.dtype == torch.float16


@pytest.mark.parametrize("path", ["splitk:operand", "tiled:operand", "splitk:fold", "gemv", "dense"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_integer_zeros_as_float_or_uint8(w4a16, device, path, dtype):
    """The same integer zeros as uint8 (what prepare_weight stores: the kernels' one-parameter-less
    form) and as floats (the general form with its residual): both match the float64 reference."""
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    weight, ref = random_layer(w4a16, 256, 40, 64, False, dtype, device, seed=11)
    assert weight.zeros.dtype == torch.uint8
    as_float = dataclasses.replace(weight, zeros=weight.zeros.to(dtype))
    for w in (weight, as_float):
        assert_path_matches_reference(w4a16, w, ref, path, dtype, device, (1, 16, 33), seed=12)


@pytest.mark.kernels_ci
def test_bad_inputs_raise_clear_errors(w4a16, device):
    w = torch.randn(256, 32)
    with pytest.raises(ValueError, match="multiple of group_size"):
        w4a16.quantize_weight_int4_grouped(torch.randn(192, 32), 128)
    with pytest.raises(ValueError, match="multiple of 8"):
        w4a16.quantize_weight_int4_grouped(torch.randn(100, 32), -1)
    with pytest.raises(ValueError, match="2-D"):
        w4a16.quantize_weight_int4_grouped(torch.randn(2, 256, 32), 128)
    with pytest.raises(TypeError, match="weight must be float"):
        w4a16.quantize_weight_int4_grouped(torch.randint(0, 3, (256, 32)), 128)
    packed, scales, zeros = w4a16.quantize_weight_int4_grouped(w, 128)
    with pytest.raises(ValueError, match="group_size"):
        w4a16.quantize_weight_int4_grouped(w, 48)
    with pytest.raises(TypeError, match="packed must be an int32"):
        w4a16.prepare_weight(packed.to(torch.int64), scales, zeros, 128)
    with pytest.raises(ValueError, match=r"scales must have shape \[K/G, N\]"):
        w4a16.prepare_weight(packed, scales[:, :16], zeros, 128)
    with pytest.raises(ValueError, match="zeros must have shape"):
        w4a16.prepare_weight(packed, scales, zeros[:1], 128)
    with pytest.raises(ValueError, match=r"uint8 zeros must be integer zero points in 0\.\.127, got a maximum of 200"):
        w4a16.prepare_weight(packed, scales, torch.full_like(zeros, 200, dtype=torch.uint8), 128)
    with pytest.raises(ValueError, match="one device"):
        w4a16.prepare_weight(packed, scales.to("meta"), zeros, 128)
    weight = w4a16.prepare_weight(packed, scales, zeros, 128)
    with pytest.raises(TypeError, match="x must be a float16 or bfloat16"):
        w4a16.w4a16_linear(torch.randn(2, 256), weight)
    with pytest.raises(ValueError, match="in_features=256"):
        w4a16.w4a16_linear(torch.randn(2, 128).half(), weight)
    with pytest.raises(ValueError, match="x is on"):
        w4a16.w4a16_linear(torch.randn(2, 256, device="meta").half(), weight)
    with pytest.raises(ValueError, match="path must be"):
        w4a16.w4a16_linear(torch.randn(2, 256).half(), weight, path="fast")
    with pytest.raises(TypeError, match="symmetric must be True or False, got 'yes'"):
        w4a16.quantize_weight_int4_grouped(w, 128, symmetric="yes")
    with pytest.raises(ValueError, match="weight is on the meta device: it has no values to quantize"):
        w4a16.quantize_weight_int4_grouped(w.to("meta"), 128)
    for bad_m in (-1, 1.5, True):
        with pytest.raises(ValueError, match=r"m \(the call's tokens.*\) must be an int >= 0"):
            w4a16.plan_for(weight, bad_m)
    assert w4a16.plan_for(weight, 0).path  # an empty batch has a plan (the layers log it)
    with pytest.raises(TypeError, match="dtype .* must be torch.float16 or torch.bfloat16, got torch.float32"):
        w4a16.plan_for(weight, 4, torch.float32)
    with pytest.raises(TypeError, match="weight must be a W4A16Weight .*got Tensor"):
        w4a16.plan_for(packed, 4)
    with pytest.raises(TypeError, match="weight must be a W4A16Weight .*got Tensor"):
        w4a16.w4a16_linear(torch.randn(2, 256).half(), packed)
    with pytest.raises(ValueError, match=r"bias must have shape \(out_features,\) = \(32,\), got \(33,\)"):
        w4a16.w4a16_linear(torch.randn(2, 256).half(), weight, torch.randn(33).half())
    with pytest.raises(ValueError, match="config DOT_PARTS must be 1, 2, 4 or 8"):
        # (on the test device: a Triton path on CPU tensors is refused outside the interpreter)
        w4a16.matmul.w4a16_matmul(torch.randn(2, 256).half().to(device), weight.qweight.to(device),
                                  weight.scales.to(device), weight.zeros.to(device), None, 256, 128,
                                  path="tiled", config={"SCALE_IN_OPERAND": True, "DOT_PARTS": 3})
    x = torch.randn(2, 256).half()
    row_major = weight.qweight.permute(0, 2, 1, 3).reshape(64, 32)  # the pre-tile [N, Kp/8] layout
    with pytest.raises(ValueError, match=r"qweight must have shape \[ceil\(N/64\), ceil\(K/128\), 64, 16\] = \[1, 2, 64, 16\]"):
        w4a16.matmul.w4a16_matmul(x, row_major, weight.scales, weight.zeros, None, 256, 128)
    with pytest.raises(TypeError, match="qweight must be an int32"):
        w4a16.matmul.w4a16_matmul(x, weight.qweight.to(torch.int64), weight.scales, weight.zeros, None, 256, 128)
    with pytest.raises(ValueError, match="scales must be a float16, bfloat16 or float32 tensor of shape"):
        w4a16.matmul.w4a16_matmul(x, weight.qweight, weight.scales[0], weight.zeros, None, 256, 128)
    with pytest.raises(ValueError, match="scales is on meta but qweight is on cpu"):
        w4a16.matmul.w4a16_matmul(x, weight.qweight, weight.scales.to("meta"), weight.zeros, None, 256, 128)
    # a W4A16Weight checks its tensors when it is made (calls on it then check x only)
    fields = dict(qweight=weight.qweight, scales=weight.scales, zeros=weight.zeros, perm=None, in_features=256,
                  out_features=32, group_size=128)
    with pytest.raises(ValueError, match=r"qweight must have shape .* = \[1, 2, 64, 16\]"):
        w4a16.W4A16Weight(**dict(fields, qweight=row_major))
    with pytest.raises(ValueError, match=r"zeros must be None or a float16, bfloat16, float32 or uint8 tensor of shape \[K/G, N\] = \(2, 32\)"):
        w4a16.W4A16Weight(**dict(fields, zeros=weight.zeros[:, :16]))
    with pytest.raises(ValueError, match=r"zeros must be None or a float16, bfloat16, float32 or uint8 tensor .* got torch.int32"):
        w4a16.W4A16Weight(**dict(fields, zeros=weight.zeros.to(torch.int32)))
    with pytest.raises(TypeError, match="zeros must be a floating-point or uint8 tensor or None, got torch.int32"):
        w4a16.prepare_weight(packed, scales, zeros.to(torch.int32), 128)
    with pytest.raises(ValueError, match="perm must be None or an int32 \\(or int64\\) tensor"):
        w4a16.W4A16Weight(**dict(fields, perm=torch.arange(256, dtype=torch.int16)))
    with pytest.raises(ValueError, match=r"perm must be None or an int32 \(or int64\) tensor of shape \[K\] = \(256,\)"):
        w4a16.W4A16Weight(**dict(fields, perm=torch.arange(128, dtype=torch.int32)))
    with pytest.raises(ValueError, match="out_features=31 must equal scales.shape"):
        w4a16.W4A16Weight(**dict(fields, out_features=31))
    with pytest.raises(ValueError, match="effective group size"):
        w4a16.W4A16Weight(**dict(fields, scales=weight.scales[:1], zeros=weight.zeros[:1], group_size=-1))


@pytest.mark.kernels_ci
def test_dispatch_plans(w4a16):
    dispatch = w4a16.dispatch
    cpu = torch.device("cpu")
    assert dispatch.plan_gemm(1, 4096, 4096, 128, torch.float16, cpu).path == "reference"
    with pytest.raises(RuntimeError, match="strict"):
        dispatch.plan_gemm(1, 4096, 4096, 128, torch.float16, cpu, strict=True)
    decode = dispatch._heuristic(1, 4096, 4096, 132)
    assert decode.path == "splitk" and decode.config["SPLIT_K"] > 1
    assert dispatch._heuristic(4096, 4096, 4096, 132).path == "dense"
    assert [dispatch.m_bucket(m) for m in (1, 3, 33, 5000)] == [1, 4, 64, 4096]
    file, table, by_format, table_sm_count = dispatch.load_tuned_table("NVIDIA H200")
    assert file == "tuned_nvidia_h200.json" and table_sm_count == 132
    # the H100 runs its own prefill entries over the H200's table (decode buckets come from the H200's)
    file, h100_table, h100_by_format, _ = dispatch.load_tuned_table("NVIDIA H100 80GB HBM3")
    assert file == "tuned_nvidia_h100.json"
    tables_by_m = {row["M"]: row["table"] for row in h100_table[(4096, 4096)]}
    assert tables_by_m[256] == "tuned_nvidia_h100.json" and tables_by_m[1] == "tuned_nvidia_h200.json"
    # and its own entries for the other formats there too (a format's entry outranks the base's at its bucket)
    symmetric_rows = h100_by_format[(4096, 4096, dispatch.format_key(torch.float16, 128, True))]
    assert symmetric_rows[256]["table"] == "tuned_nvidia_h100.json" and symmetric_rows[1]["table"] == "tuned_nvidia_h200.json"
    # format-specific entries win for their exact M bucket; other buckets and formats use the base rows
    base_rows = [{"M": 1, "path": "splitk"}, {"M": 16, "path": "tiled"}]
    bf16 = dispatch.format_key(torch.bfloat16, 128, False)
    assert bf16 == ("bfloat16", 128, False, False)
    assert dispatch.format_key(torch.float16, 128, False, act_order=True) == ("float16", 128, False, True)
    own = {(64, 256, bf16): {1: {"M": 1, "path": "streamk"}}}
    pick = lambda mb, fmt: dispatch.tuned_row({(64, 256): base_rows}, own, mb, 64, 256, fmt)["path"]  # noqa: E731
    assert pick(1, bf16) == "streamk" and pick(2, bf16) == "tiled"
    # past the shape's largest tuned bucket nothing: a decode-sized plan must not serve prefill
    assert dispatch.tuned_row({(64, 256): base_rows}, own, 64, 64, 256, bf16) is None
    assert pick(1, dispatch.format_key(torch.float16, 128, False)) == "splitk"
    assert dispatch.tuned_row({}, own, 1, 32, 256, bf16) is None
    assert pick(1, dispatch.format_key(torch.bfloat16, 128, False, act_order=True)) == "streamk"  # bf16's own entry
    assert all(len(key[2]) == 4 and set(rows) <= set(dispatch._M_BUCKETS) for key, rows in by_format.items())
    rows = table[(4096, 4096)]
    assert {r["M"] for r in rows} >= {1, 16} and all(r["path"] in dispatch.PATHS for r in rows)
    assert dispatch.load_tuned_table("Some Other GPU") is None
    # every tuned entry names only launch keys the launcher knows, and both scale modes are in use
    # note: free text on an entry; tuned_at: the commit the entry was measured on (newer entries)
    known = set(dispatch.CONFIG_KEYS) | {"N", "K", "M", "path", "us", "note", "tuned_at", "FALLBACK", "table"}
    assert all(set(r) <= known for rows in table.values() for r in rows)
    # ... and only keys its own path's launcher reads (as a forced config must), FALLBACK plans too
    every = [r for rows in table.values() for r in rows] + [r for rows in by_format.values() for r in rows.values()]
    every += [r["FALLBACK"] for r in every if "FALLBACK" in r]
    misplaced = [(r["path"], sorted(set(dispatch.row_config(r)) - set(dispatch.PATH_CONFIG_KEYS[r["path"]]))) for r in every]
    assert not [m for m in misplaced if m[1]], [m for m in misplaced if m[1]]
    stamps = [r["tuned_at"] for rows in table.values() for r in rows if "tuned_at" in r]
    stamps += [r["tuned_at"] for rows in by_format.values() for r in rows.values() if "tuned_at" in r]
    # a commit id, marked as tune.py's machine_info marks it (a table changed in-session, a dirty tree)
    assert stamps and all(re.fullmatch(r"[0-9a-f]{7,40}(\+tuned-in-session|-dirty)?", c) for c in stamps), sorted(set(stamps))
    assert all(set(r) <= known | {"dtype", "group_size", "symmetric", "act_order"} for rows in by_format.values() for r in rows.values())
    # the on / off options are bools in every entry and FALLBACK, as a forced config must give them
    entries = [r for rows in table.values() for r in rows] + [r for rows in by_format.values() for r in rows.values()]
    entries += [r["FALLBACK"] for r in entries if "FALLBACK" in r]
    assert all(type(r[key]) is bool for r in entries for key in dispatch.CONFIG_OPTIONS if key in r)
    with pytest.raises(ValueError, match="ONE_TOKEN must be True or False"):
        dispatch.plan_gemm(1, 64, 256, 128, torch.float16, cpu, path="splitk", config={"ONE_TOKEN": 1})
    modes = {r.get("SCALE_IN_OPERAND") for rows in table.values() for r in rows if r["path"] in ("splitk", "tiled")}
    assert modes == {True, False}
    # a forced path takes overrides of its launch configuration; anything else is a clear error
    forced = dispatch.plan_gemm(1, 64, 256, 128, torch.float16, cpu, path="splitk", config={"SCALE_IN_OPERAND": True, "maxnreg": 128})
    assert forced.config["SCALE_IN_OPERAND"] is True and forced.config["maxnreg"] == 128 and forced.config["SPLIT_K"] == 2
    with pytest.raises(ValueError, match="config keys"):
        dispatch.plan_gemm(1, 64, 256, 128, torch.float16, cpu, path="splitk", config={"BLOCK_K": 64})
    # a key another path reads is refused too (it would run as a silent no-op): decode's, pingpong's, split-K's
    for path, key, value in (("splitk", "X_AT_USE", True), ("pingpong", "GATHER_PDL", True), ("decode", "SPLIT_K", 2),
                             ("streamk", "SPLIT_K", 2), ("gemv", "SCALE_IN_OPERAND", True), ("dense", "BLOCK_M", 64)):
        with pytest.raises(ValueError, match=f"config keys for path '{path}' must be among .*'{key}'"):
            dispatch.plan_gemm(1, 64, 256, 128, torch.float16, cpu, path=path, config={key: value})
    with pytest.raises(ValueError, match="forced path"):
        dispatch.plan_gemm(1, 64, 256, 128, torch.float16, cpu, config={"SPLIT_K": 4})


@pytest.mark.kernels_ci
def test_tuned_table_overlays_another(w4a16, tmp_path):
    """A table with `overlays` (an H100's re-tuned entries over the H200's table) replaces the other table's entries
    of the same (N, K, M, format) on the GPUs it applies to, keeps the rest, and says which file each row comes from;
    the GPUs it does not apply to see only the other table."""
    import json

    dispatch = w4a16.dispatch
    # load_tuned_table is memoised per (device name, directory): each rewrite of the files below asks for another
    # device name that the tables still match, so it reads them anew
    base_rows = [{"N": 64, "K": 256, "M": m, "path": "splitk", "SPLIT_K": 2} for m in (1, 256, 512)]
    base_rows.append({"N": 64, "K": 256, "M": 256, "dtype": "bfloat16", "path": "tiled"})
    shared = {"group_size": 128, "sm_count": 132}
    (tmp_path / "tuned_b.json").write_text(json.dumps({"applies_to": ["H200", "H100"], **shared, "entries": base_rows}))
    h100_rows = [{"N": 64, "K": 256, "M": 256, "path": "dense"}, {"N": 128, "K": 256, "M": 512, "path": "tiled"}]
    (tmp_path / "tuned_a.json").write_text(json.dumps({"applies_to": ["H100"], "overlays": "tuned_b.json", **shared,
                                                       "entries": h100_rows}))
    file, table, by_format, sm = dispatch.load_tuned_table("NVIDIA H100 80GB HBM3", tmp_path)
    assert (file, sm) == ("tuned_a.json", 132)
    assert [(r["M"], r["path"], r["table"]) for r in table[(64, 256)]] == [
        (1, "splitk", "tuned_b.json"), (256, "dense", "tuned_a.json"), (512, "splitk", "tuned_b.json")]
    assert [(r["M"], r["table"]) for r in table[(128, 256)]] == [(512, "tuned_a.json")]
    # a format's own entry is not a base entry: the overlay's base entry leaves it in place
    assert by_format[(64, 256, ("bfloat16", 128, False, False))][256]["table"] == "tuned_b.json"
    file, table, _, _ = dispatch.load_tuned_table("NVIDIA H200", tmp_path)
    assert file == "tuned_b.json" and [r["path"] for r in table[(64, 256)]] == ["splitk"] * 3
    assert (128, 256) not in table
    # an overlay must name a table that is there, and agree with it on the base group size and the SM count
    (tmp_path / "tuned_a.json").write_text(json.dumps({"applies_to": ["H100"], "overlays": "tuned_c.json", **shared,
                                                       "entries": h100_rows}))
    with pytest.raises(ValueError, match="`overlays` must name another tuned table"):
        dispatch.load_tuned_table("NVIDIA H100 PCIe", tmp_path)
    (tmp_path / "tuned_a.json").write_text(json.dumps({"applies_to": ["H100"], "overlays": "tuned_b.json",
                                                       "group_size": 128, "sm_count": 114, "entries": h100_rows}))
    with pytest.raises(ValueError, match="their sm_count must agree, got 114 and 132"):
        dispatch.load_tuned_table("NVIDIA H100 NVL", tmp_path)
    # two tables for one GPU, neither overlaying the other, are refused rather than one picked by file name
    (tmp_path / "tuned_a.json").write_text(json.dumps({"applies_to": ["H100"], **shared, "entries": h100_rows}))
    with pytest.raises(ValueError, match=r"tuned tables \['tuned_a.json', 'tuned_b.json'\] all apply to 'NVIDIA H100 SXM'"):
        dispatch.load_tuned_table("NVIDIA H100 SXM", tmp_path)
    (tmp_path / "tuned_b.json").write_text(json.dumps({"applies_to": ["H100"], "overlays": "tuned_a.json", **shared,
                                                       "entries": base_rows}))
    (tmp_path / "tuned_a.json").write_text(json.dumps({"applies_to": ["H100"], "overlays": "tuned_b.json", **shared,
                                                       "entries": h100_rows}))
    with pytest.raises(ValueError, match="overlay one another in a cycle"):
        dispatch.load_tuned_table("NVIDIA H100 HBM3", tmp_path)
    # the shipped tables: each loads for the GPUs it names, and the overlaid one still serves the chips it names
    for path in sorted(dispatch._TUNED_DIR.glob("tuned_*.json")):
        for tag in json.loads(path.read_text())["applies_to"]:
            assert dispatch.load_tuned_table(f"NVIDIA {tag}") is not None


@pytest.mark.kernels_ci
def test_check_layer(w4a16):
    weight, ref = random_layer(w4a16, 256, 32, 128, False, torch.float16, "cpu", seed=6)
    report = w4a16.check_layer(weight, reference_linear_weight=ref.t(), batch_sizes=(1, 3))
    assert report.ok and set(report.errors) == {1, 3}
    wrong = ref.t().clone()
    wrong[:, :8] = wrong[:, :8].flip(1)  # a wrong nibble order within the first word
    with pytest.raises(ValueError, match="check_layer failed"):
        w4a16.check_layer(weight, reference_linear_weight=wrong, batch_sizes=(1, 3))
    for bad in ((), (0,), (1, -2), (1.5,)):  # an empty batch's error of 0 would pass the wrong weight too
        with pytest.raises(ValueError, match="batch_sizes must be a non-empty tuple or list of ints >= 1"):
            w4a16.check_layer(weight, reference_linear_weight=wrong, batch_sizes=bad)


def test_split_k_counters_are_reused_clean(w4a16, device):
    """The split-K arrival counters come from a per-stream slot that every launch leaves zeroed."""
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    weight, ref = random_layer(w4a16, 512, 40, 128, False, torch.float16, device, seed=11)
    launch = w4a16.launch
    dev = weight.qweight.device  # the launches' own key (on a GPU "cuda:0": a bare "cuda" would name another entry)
    for m in (1, 5):
        x = torch.randn(m, 512).to(device=device, dtype=torch.float16)
        err = run_and_check(w4a16, weight, ref, x, "splitk:operand")
        assert err < TOL[torch.float16]
        work, counters = launch.split_k_scratch(dev, launch.current_stream(dev), 64, 100)
        # the stream's cached slot, which the launch used (not a fresh, zeroed one)
        assert counters is launch.workspace_entry(dev, launch.current_stream(dev))[0]
        assert work.numel() >= 100 and counters.numel() >= 64 and int(counters.abs().sum()) == 0
    # a register cap (tuned entries carry `maxnreg`) is a launch option only: same result
    x = torch.randn(3, 512).to(device=device, dtype=torch.float16)
    capped = w4a16.matmul.w4a16_matmul(x, weight.qweight, weight.scales, weight.zeros, None, 512, 128, path="splitk",
                                     config={"SCALE_IN_OPERAND": False, "maxnreg": 128})
    expected = x.double() @ ref
    assert float((capped.double() - expected).norm() / expected.norm()) < TOL[torch.float16]
    # Stream-K with more programs than work units (they are clamped) and sharing patterns of 1-3
    # programs per tile; every launch must leave the counters zeroed for the next
    for programs in (2, 3, 5, 64):
        y = w4a16.matmul.w4a16_matmul(x, weight.qweight, weight.scales, weight.zeros, None, 512, 128, path="streamk",
                                    config={"PROGRAMS": programs})
        assert float((y.double() - expected).norm() / expected.norm()) < TOL[torch.float16], programs
        _, counters = launch.split_k_scratch(dev, launch.current_stream(dev), 64, 1)
        assert int(counters.abs().sum()) == 0, programs
    _, fresh = launch.split_k_scratch(dev, launch.current_stream(dev), launch.COUNTER_SLOT + 1, 1)
    assert fresh.numel() == launch.COUNTER_SLOT + 1 and int(fresh.abs().sum()) == 0


@pytest.mark.parametrize("path,config", [
    ("splitk", {"SPLIT_K": 7, "BLOCK_N": 64, "BLOCK_M": 16}),
    ("splitk", {"SPLIT_K": 3, "BLOCK_N": 64, "BLOCK_M": 64}),
    ("streamk", {"PROGRAMS": 7, "BLOCK_N": 64, "BLOCK_M": 16}),  # 2-3 programs per tile
])
def test_split_reduction_is_deterministic(w4a16, device, path, config):
    """Whichever contributor of a shared tile arrives last (on a GPU: any of them, from run to run), it sums the
    partials in split / program order: the same bits every run, and right."""
    if not triton_available(device):
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1")
    weight, ref = random_layer(w4a16, 1024, 128, 128, False, torch.float16, device, seed=5)
    for m in (1, 3, 33):
        x = torch.randn(m, 1024).to(device=device, dtype=torch.float16)
        runs = [w4a16.matmul.w4a16_matmul(x, weight.qweight, weight.scales, weight.zeros, None, 1024, 128, path=path,
                                          config={"SCALE_IN_OPERAND": True, **config}) for _ in range(40 if device == "cuda" else 2)]
        expected = x.double() @ ref
        assert float((runs[0].double() - expected).norm() / expected.norm()) < TOL[torch.float16], m
        assert all(torch.equal(run, runs[0]) for run in runs[1:]), f"{path} M={m}: results differ between runs"


@pytest.mark.kernels_ci
def test_untuned_shapes_take_the_nearest_tuned_plan(w4a16, monkeypatch):
    """Another model's layers (Qwen2.5-7B's 4608 x 3584 and 3584 x 18944, a tensor-parallel shard with K = 10944) take
    the plan of the nearest tuned shape within BORROW_RATIO in N and K, in their own format (per-channel keyed by the
    near shape's K), and say so in the plan's source, which `strict` refuses; the decode kernel's plan only where K is
    a multiple of 128 (else its FALLBACK); shapes farther off, and a tuned shape past its largest tuned bucket (the LM
    head, tuned at M <= 16, at prefill), get the heuristic. Planned for a CPU device named as an H200, with the Gluon
    kernels reported available so that their entries are taken as they are."""
    dispatch = w4a16.dispatch
    _, table, by_format, _ = dispatch.load_tuned_table("NVIDIA H200")
    assert dispatch.nearest_tuned_shape(table, 4608, 3584, 1) == (4096, 4096)
    assert dispatch.nearest_tuned_shape(table, 3584, 18944, 1) == (4096, 14336)
    assert dispatch.nearest_tuned_shape(table, 4096, 10944, 4096) == (4096, 14336)
    assert dispatch.nearest_tuned_shape(table, 6144, 4096, 64) == (6144, 4096)  # a tuned shape is its own nearest
    assert dispatch.nearest_tuned_shape(table, 896, 896, 1) is None  # 4.6x off in N and K
    assert dispatch.nearest_tuned_shape(table, 128256, 4096, 64) is None  # the LM head: 57344 is 2.2x off
    monkeypatch.setattr(dispatch, "_device_info", lambda device: ("NVIDIA H200", 132))
    monkeypatch.setattr(dispatch, "decode_available", lambda device: True)
    monkeypatch.setattr(dispatch, "pingpong_available", lambda device: True)
    cpu = torch.device("cpu")

    def plan(mb, n, k, g=128, symmetric=False):
        return dispatch._plan_cached.__wrapped__(mb, n, k, g, torch.float16, cpu, symmetric, False)

    def entry(mb, n, k, g=128, symmetric=False):
        return dispatch.tuned_row(table, by_format, mb, n, k, dispatch.format_key(torch.float16, g, symmetric))

    for mb, n, k, near in ((1, 4608, 3584, (4096, 4096)), (64, 3584, 18944, (4096, 14336)), (4096, 37888, 3584, (28672, 4096))):
        got, row = plan(mb, n, k), entry(mb, *near)
        assert (got.path, got.config) == (row["path"], dispatch.row_config(row)), (mb, n, k)
        assert got.source == f"nearest:tuned_nvidia_h200.json {near[0]}x{near[1]}" and not got.source.startswith("tuned")
    # formats: symmetric's own entry of the near shape; per-channel's (group size = K) that of the near shape's K
    for g, symmetric, g0 in ((128, True, 128), (3584, False, 4096)):
        got, row = plan(8, 4608, 3584, g, symmetric), entry(8, 4096, 4096, g0, symmetric)
        assert "dtype" in row and (got.path, got.config) == (row["path"], dispatch.row_config(row))
    # group 64 with K = 10944 (85.5 blocks of 128): the near shape's decode entry cannot run, its FALLBACK does
    row = entry(1, 4096, 14336, 64)
    assert row["path"] == "decode" and not dispatch.takes_shape(row, 4096, 10944) and dispatch.takes_shape(row, 4096, 14336)
    got = plan(1, 4096, 10944, 64)
    assert (got.path, got.config) == (row["FALLBACK"]["path"], dispatch.row_config(row["FALLBACK"]))
    assert got.source == "nearest:tuned_nvidia_h200.json 4096x14336 (FALLBACK of a decode entry)"
    assert not dispatch.takes_shape({"path": "decode", "ROWS": 16, "TOKENS_FIRST": True}, 65536 * 16, 4096)
    # too far from every tuned shape, or the LM head past its tuned buckets: the heuristic
    assert plan(1, 896, 896).source == "heuristic"
    assert plan(16, 128256, 4096).source == "tuned:tuned_nvidia_h200.json"
    lm_head = plan(4096, 128256, 4096)
    assert lm_head.source == "heuristic" and lm_head.path == "dense"


@pytest.mark.kernels_ci
def test_borrowed_plans_that_would_spill_a_wave(w4a16, monkeypatch):
    """A borrowed plan whose grid fit one wave on its tuned shape but spills into a second, mostly empty one on the
    wider untuned shape (`dispatch.keeps_wave_fill`; 4608 x 3584 taking 4096 x 4096's plans, 5120 x 13824 taking
    4096 x 14336's): from M bucket 16 a pingpong plan runs the same configuration on a persistent Stream-K grid of one
    wave's programs, a decode plan is refused for the heuristic; below bucket 16, narrower shapes, and shapes whose
    grid needs no extra wave keep the plan as tuned. Planned for a CPU device named as an H200, Gluon reported
    available."""
    dispatch = w4a16.dispatch
    _, table, by_format, _ = dispatch.load_tuned_table("NVIDIA H200")
    monkeypatch.setattr(dispatch, "_device_info", lambda device: ("NVIDIA H200", 132))
    monkeypatch.setattr(dispatch, "decode_available", lambda device: True)
    monkeypatch.setattr(dispatch, "pingpong_available", lambda device: True)
    cpu = torch.device("cpu")

    def plan(mb, n, k):
        return dispatch._plan_cached.__wrapped__(mb, n, k, 128, torch.float16, cpu, False, False)

    def entry(mb, n, k):
        return dispatch.tuned_row(table, by_format, mb, n, k, dispatch.format_key(torch.float16, 128, False))

    # the fill arithmetic: a one-consumer pingpong plan (two programs per SM) at SPLIT_K 4 and BLOCK_M 64
    pp = {"path": "pingpong", "BLOCK_M": 64, "CONSUMERS": 1, "maxnreg": 128, "SPLIT_K": 4}
    assert dispatch.wave_fill(pp, 64, 4096, 4096, 132) == (1, 256 / 264)  # 64 tiles x 4 splits on 264 slots
    assert dispatch.wave_fill(pp, 64, 4608, 3584, 132) == (2, 288 / 528)
    assert dispatch.wave_fill(pp, 64, 4096, 3 * 128, 132) == (1, 192 / 264)  # at most one split per 128-row K block
    assert not dispatch.keeps_wave_fill(pp, 64, (4608, 3584), (4096, 4096), 132)
    assert dispatch.keeps_wave_fill(pp, 64, (3584, 3584), (4096, 4096), 132)
    assert dispatch.keeps_wave_fill(pp, 8, (4608, 3584), (4096, 4096), 132)  # below WAVE_GUARD_FROM_M
    assert dispatch.wave_fill({**pp, "PROGRAMS": 264}, 64, 4608, 3584, 132) is None  # a persistent grid: no last wave
    assert dispatch.wave_fill({"path": "splitk", "BLOCK_N": 128, "SPLIT_K": 4}, 64, 4608, 3584, 132) is None  # unknown
    dec = {"path": "decode", "ROWS": 16, "num_warps": 4, "maxnreg": 256}  # 64K registers: 2 programs per SM
    assert dispatch.wave_fill(dec, 16, 4096, 4096, 132) == (1, 256 / 264)
    assert dispatch.wave_fill({**dec, "maxnreg": None}, 16, 4096, 4096, 132) is None
    assert dispatch.stream_k_form(pp, 132) == {"path": "pingpong", "BLOCK_M": 64, "CONSUMERS": 1, "maxnreg": 128,
                                               "PROGRAMS": 264}
    for mb, n, k, near in ((256, 4608, 3584, (4096, 4096)), (64, 5120, 13824, (4096, 14336))):
        row, got = entry(mb, *near), plan(mb, n, k)
        assert row["path"] == "pingpong" and row.get("SPLIT_K", 1) > 1 and not row.get("PROGRAMS")
        expected = {key: v for key, v in dispatch.row_config(row).items() if key != "SPLIT_K"}
        expected["PROGRAMS"] = (2 if row.get("CONSUMERS", 2) == 1 else 1) * 132
        assert got.path == "pingpong" and got.config == expected, (mb, n, k)
        assert got.source.endswith("Stream-K: its split-K grid would spill a wave")
    # the decode plan of 4096 x 4096 at M = 16 (256 programs on 264 slots) would run 288 on 4608: the heuristic
    row = entry(16, 4096, 4096)
    assert row["path"] == "decode"
    got = plan(16, 4608, 3584)
    assert got.source.startswith("heuristic (nearest:") and got.path != "decode"
    # kept as tuned: M = 1 (the decode kernel's lead is larger there), a narrower shape, the tuned shape itself
    for mb, n, k, near in ((1, 4608, 3584, (4096, 4096)), (256, 3584, 3584, (4096, 4096)), (256, 4096, 4096, (4096, 4096))):
        row, got = entry(mb, *near), plan(mb, n, k)
        assert (got.path, got.config) == (row["path"], dispatch.row_config(row)), (mb, n, k)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the pingpong kernel runs on an sm_90 GPU")
def test_stream_k_form_of_a_borrowed_pingpong_plan(w4a16):
    """The Stream-K form the dispatcher gives a borrowed pingpong plan that would spill a wave (see
    test_borrowed_plans_that_would_spill_a_wave), run through the op on 4608 x 3584 at the M it serves, against
    the float64 reference."""
    device = torch.device("cuda")
    if not w4a16.gemm_pingpong.available(device):
        pytest.skip("the pingpong kernel needs Gluon and an sm_90 GPU")
    weight, ref = random_layer(w4a16, 3584, 4608, 128, False, torch.float16, "cuda", seed=31)
    for m in (33, 64, 200, 256, 1000):
        plan = w4a16.dispatch.plan_gemm(m, 4608, 3584, 128, torch.float16, device)
        if w4a16.dispatch.load_tuned_table(torch.cuda.get_device_name()) is not None and m > 32:
            assert plan.path == "pingpong" and "Stream-K" in plan.source, (m, plan)
        x = torch.randn(m, 3584, device="cuda", dtype=torch.float16)
        expected = x.double() @ ref
        y = w4a16.w4a16_linear(x, weight).double()
        assert float((y - expected).norm() / expected.norm()) < TOL[torch.float16], (m, plan)


def test_stream_k_programs_follow_the_sm_count(w4a16, monkeypatch):
    """A tuned Stream-K entry keeps its programs per SM on a GPU of the same family with fewer SMs (the H100
    tables, measured on the 132-SM SXM, apply to the H100 PCIe, 114 SMs): 396 programs on 132 SMs become 342
    on 114, so the persistent grid stays resident; split-K and tiled entries are taken as they are. (Planned for
    a CPU device named as the GPU: where the Gluon decode kernel cannot run, the M = 1 entry's FALLBACK, a
    Stream-K plan.)"""
    dispatch = w4a16.dispatch
    assert dispatch.programs_for_device(396, 132, 132) == 396
    assert dispatch.programs_for_device(396, 132, 114) == 342 and dispatch.programs_for_device(264, 132, 114) == 228
    assert dispatch.programs_for_device(396, None, 114) == 396  # a table that does not say: as written
    plan_on = dispatch._plan_cached.__wrapped__  # the memoised function itself, for a device it cannot see
    cpu = torch.device("cpu")
    plans = {}
    for name, sms in (("NVIDIA H100 80GB HBM3", 132), ("NVIDIA H100 PCIe", 114)):
        monkeypatch.setattr(dispatch, "_device_info", lambda device, name=name, sms=sms: (name, sms))
        plans[sms] = [plan_on(m, 57344, 8192, 128, torch.float16, cpu, False, False) for m in (1, 128)]
    assert plans[132][0].path == "streamk" and plans[132][0].config["PROGRAMS"] % 132 == 0
    assert plans[114][0].config["PROGRAMS"] == plans[132][0].config["PROGRAMS"] // 132 * 114
    assert {k: v for k, v in plans[114][0].config.items() if k != "PROGRAMS"} == \
        {k: v for k, v in plans[132][0].config.items() if k != "PROGRAMS"}
    assert plans[132][1].path != "streamk" and plans[114][1].config == plans[132][1].config


@pytest.mark.parametrize("path,options", [("splitk", {}), ("streamk", {}), ("tiled", {}), ("decode", {}),
                                          ("decode", {"X_AT_USE": True, "AHEAD": 2})])
def test_act_order_gemm_launched_after_its_gather(w4a16, device, path, options):
    """GATHER_PDL (a tuned option of act-order entries): on sm_90+ the GEMM is a programmatic dependent
    of the gather (its programs wait for the gather's x before loading it); elsewhere (the interpreter,
    AMD, older GPUs) the option is ignored. Back-to-back calls and, on CUDA, replays of a CUDA graph
    (programmatic edges in the graph), against the float64 reference; at M = 300 a row per gather program.
    The decode kernel (Gluon, M <= 16) runs only on an NVIDIA GPU; with X_AT_USE its x loads are all in the loop."""
    cuda = device == "cuda"
    if path == "decode" and not (cuda and w4a16.gemm_decode.available(torch.device(device))):
        pytest.skip("the decode kernel needs Gluon and an NVIDIA GPU (sm_80+)")
    weight, ref = random_layer(w4a16, 512 if cuda else 256, 96 if cuda else 40, 64, False, torch.float16, device, act_order=True,
                               seed=21)
    assert weight.perm is not None
    capable = cuda and torch.cuda.get_device_capability()[0] >= 9
    assert w4a16.dispatch.programmatic_launch(torch.device(device)) == capable
    config = {"GATHER_PDL": True, **options}
    # the dispatcher keeps the option only where it applies: act-order weights, tensor-core path, sm_90+
    plan = w4a16.dispatch.plan_gemm(16, 96, 512, 64, torch.float16, torch.device(device), path=path, config=config, act_order=True)
    assert plan.config.get("GATHER_PDL", False) == capable
    plain = w4a16.dispatch.plan_gemm(16, 96, 512, 64, torch.float16, torch.device(device), path=path, config=config)
    assert "GATHER_PDL" not in plain.config

    def call(x):
        return w4a16.matmul.w4a16_matmul(x, weight.qweight, weight.scales, weight.zeros, weight.perm, weight.in_features,
                                         weight.group_size, path=path, config=config)

    def check(xs, ys, what):
        for x, y in zip(xs, ys):
            expected = x.double() @ ref
            assert float((y.double() - expected).norm() / expected.norm()) < TOL[torch.float16], (x.shape[0], path, what)

    for m in ((1, 3, 16) if path == "decode" else (1, 3, 16, 64, 300) if cuda else (1, 33)):
        xs = [torch.randn(m, ref.shape[0], device=device, dtype=torch.float16) for _ in range(4 if cuda else 2)]
        check(xs, [call(x) for x in xs], "back to back on one stream")
        if not cuda:
            continue
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = [call(x) for x in xs]
        for x in xs:
            x.copy_(torch.randn_like(x))
        graph.replay()
        graph.replay()
        check(xs, captured, "graph")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_capture_of_op(w4a16):
    weight, ref = random_layer(w4a16, 512, 96, 128, False, torch.float16, "cuda", seed=8)
    for m in (1, 16, 64):
        x = torch.randn(m, 512, device="cuda", dtype=torch.float16)
        w4a16.w4a16_linear(x, weight)  # compile outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = w4a16.w4a16_linear(x, weight)
        x.copy_(torch.randn_like(x))
        graph.replay()
        graph.replay()  # split-K counters must be clean for the next replay
        expected = x.double() @ ref
        assert float((y.double() - expected).norm() / expected.norm()) < TOL[torch.float16]
