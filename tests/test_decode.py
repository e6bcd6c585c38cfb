"""The decode path (gemm_decode.py, Gluon, mma.sync; M <= 16).

Triton's CPU interpreter does not run Gluon, so on the CPU (CI) the kernel is compiled for sm_90 in its format
variants (the Gluon API moves between Triton releases: this is where that shows) and its refusals are checked. On an
NVIDIA GPU (sm_80+) it runs against the float64 reference of test_gemm.py.
"""

import json
import re
from pathlib import Path

import pytest
import torch

from test_gemm import TOL, assert_path_matches_reference, random_layer

TABLE = Path(__file__).resolve().parent.parent / "torch-ext" / "w4a16" / "tuned_nvidia_h200.json"


def _on_nvidia() -> bool:
    return torch.cuda.is_available() and torch.version.hip is None and torch.cuda.get_device_capability()[0] >= 8


@pytest.mark.parametrize("dtype,symmetric,zeros_dtype,group_size", [
    (torch.float16, False, torch.uint8, 128),      # one group per 128-row block (and any multiple, per-channel)
    (torch.bfloat16, True, torch.uint8, 64),       # two groups per block, symmetric
    (torch.float16, False, torch.float16, 32),     # four groups per block, float (fractional) zeros
    (torch.bfloat16, False, torch.bfloat16, 16),   # eight groups per block
    (torch.float16, False, torch.uint8, 4096),     # a group spanning blocks (per-channel)
])
@pytest.mark.parametrize("block_m,rows,ahead,warps,by_x_sum,wait_prior,adjacent,x_at_use,evict_first,tokens_first", [
    (8, 16, 1, 4, False, False, False, False, False, False),
    (16, 32, 2, 8, True, True, True, False, True, False),
    (8, 16, 3, 8, False, True, False, True, False, True),
])
def test_decode_compiles_for_sm90(w4a16, pristine_triton_language, dtype, symmetric, zeros_dtype, group_size, block_m, rows,
                                  ahead, warps, by_x_sum, wait_prior, adjacent, x_at_use, evict_first, tokens_first):
    decode = w4a16.gemm_decode
    if not decode.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    config = {"num_warps": warps, "ROWS": rows, "AHEAD": ahead, "maxnreg": 128, "ZEROS_BY_X_SUM": by_x_sum,
              "GATHER_PDL": wait_prior, "ADJACENT_ROWS": adjacent, "X_AT_USE": x_at_use, "EVICT_FIRST": evict_first,
              "TOKENS_FIRST": tokens_first}
    compiled = decode.compile_for_sm90(config, dtype, block_m, symmetric, zeros_dtype, group_size=group_size)
    ptx = compiled.asm["ptx"]
    # the program's first token, m0 = BLOCK_M * (its token block), from the grid's first dimension with TOKENS_FIRST,
    # from the second without
    block_ids = {reg: axis for reg, axis in re.findall(r"mov\.u32\s+(%r\d+), %ctaid\.([xy]);", ptx)}
    first_token = [block_ids[reg] for reg in re.findall(rf"shl\.b32\s+%r\d+, (%r\d+), {block_m.bit_length() - 1};", ptx)
                   if reg in block_ids]
    assert first_token == ["x" if tokens_first else "y"]
    # EVICT_FIRST: the words' 16-byte loads (and only they) under an L2 evict-first policy
    words = re.findall(r"ld\.global[^;\n]*\.v4\.b32", ptx)
    assert words and all(("evict_first" in load) == evict_first for load in words)
    assert ("evict_first" in ptx) == evict_first
    assert ("griddepcontrol.wait" in ptx) == wait_prior  # GATHER_PDL: x read only after act-order's gather
    if not adjacent:  # (with ADJACENT_ROWS a thread's 16-bit scales of a group are an 8-byte load too)
        # x's 8-byte loads (BLOCK_M a step): in the prologue's AHEAD steps and the loop's AHEAD + 1, or with X_AT_USE
        # in the loop's only
        assert ptx.count("ld.global.v2.b32") == (ahead + 1 if x_at_use else 2 * ahead + 1) * block_m
    if wait_prior:  # ... and the words of all AHEAD prologue steps (rows / 8 16-byte loads a thread each) before it
        before_wait = ptx[:ptx.index("griddepcontrol.wait")]
        assert len(re.findall(r"ld\.global[^;\n]*\.v4", before_wait)) == ahead * rows // 8
    # integer and symmetric zeros are subtracted in the operand (fma.rn.f16x2 / bf16x2) unless ZEROS_BY_X_SUM;
    # fractional zeros always go through the x sums
    kind = "f16" if dtype == torch.float16 else "bf16"
    assert (f"fma.rn.{kind}x2" in ptx) == ((symmetric or zeros_dtype == torch.uint8) and not by_x_sum)
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32" in ptx  # tensor cores, fp32 accumulation
    assert "atom." not in ptx  # no split-K counters: a program owns its output rows
    assert not re.search(r"\b(div|rem)\.", ptx)  # scale groups by constexpr divisors (BLOCKS_PER_GROUP), not a runtime one
    # ADJACENT_ROWS (not for per-channel weights): a thread's uint8 zeros (and scales) of a group in one load
    assert ("ld.global.b8" in ptx) == (zeros_dtype == torch.uint8 and not symmetric and not (adjacent and group_size != 4096))
    assert "ld.shared" in ptx and ptx.count("bar.sync") <= 4  # shared memory only for the warps' final sum
    assert compiled.metadata.enable_fp_fusion  # launch.COMPILE_OPTIONS reached the compiler


def test_decode_refuses_what_it_cannot_run(w4a16, device):
    """Forced where it cannot run, or with a configuration or a call it does not take: a clear error naming the
    argument, not a crash inside Triton."""
    weight, _ = random_layer(w4a16, 256, 40, 64, False, torch.float16, device, seed=3)

    def call(m=4, config=None, k=256, w=weight):
        x = torch.randn(m, k, dtype=torch.float16, device=device)
        return w4a16.matmul.w4a16_matmul(x, w.qweight, w.scales, w.zeros, None, k, w.group_size, path="decode", config=config)

    with pytest.raises(ValueError, match="ROWS must be one of"):
        call(config={"ROWS": 24})
    with pytest.raises(ValueError, match="AHEAD must be 1, 2 or 3"):
        call(config={"AHEAD": 0})
    with pytest.raises(ValueError, match="num_warps must be a power of two"):
        call(config={"num_warps": 3})
    with pytest.raises(ValueError, match="BLOCK_M must be one of"):
        call(config={"BLOCK_M": 32})
    with pytest.raises(ValueError, match="M <= 16"):
        call(m=17)
    odd, _ = random_layer(w4a16, 320, 40, 64, False, torch.float16, device, seed=4)
    with pytest.raises(ValueError, match="multiple of 128"):
        call(k=320, w=odd)
    if not _on_nvidia():
        with pytest.raises(RuntimeError, match="compute capability"):
            call()
    # TOKENS_FIRST puts the weight tiles on the grid's second dimension (at most 65535 programs)
    n = 65535 * 16 + 1
    tall = dict(qweight=torch.empty(-(-n // 64), 1, 64, 16, dtype=torch.int32, device=device),
                scales=torch.empty(1, n, dtype=torch.float16, device=device), zeros=torch.empty(1, n, dtype=torch.uint8, device=device))
    plan = w4a16.dispatch.Plan("decode", {"ROWS": 16, "BLOCK_M": 8, "TOKENS_FIRST": True}, "test")
    with pytest.raises(ValueError, match=r"TOKENS_FIRST takes N <= 1048560 at ROWS 16, got N=1048561"):
        w4a16.gemm_decode.launch_decode(torch.randn(9, 128, dtype=torch.float16, device=device), **tall, in_features=128,
                                        group_size=128, plan=plan)


@pytest.mark.parametrize("path,row", [
    ("decode", {"N": 4096, "K": 4096, "M": 1, "num_warps": 4, "ROWS": 16}),
    ("pingpong", {"N": 4096, "K": 4096, "M": 256, "BLOCK_M": 128}),
])
def test_runnable_row_falls_back_where_a_gluon_kernel_cannot_run(w4a16, path, row):
    """A Gluon path's entry runs where its kernel can (whatever the other Gluon kernel's availability), else the plan it
    carries as FALLBACK (None without one); entries of the Triton paths run as they are."""
    fallback = {"path": "tiled", "BLOCK_N": 128, "BLOCK_M": 64, "num_warps": 4}
    row = {**row, "path": path, "FALLBACK": fallback}
    other = "pingpong" if path == "decode" else "decode"
    runnable_row = w4a16.dispatch.runnable_row
    assert runnable_row(row, {path: True, other: False}) is row
    assert runnable_row(row, {path: False, other: True}) == fallback
    assert runnable_row({**row, "FALLBACK": None}, {path: False, other: False}) is None
    tiled = {"N": 4096, "K": 4096, "M": 64, "path": "tiled", "BLOCK_N": 128}
    assert runnable_row(tiled, {path: False, other: False}) is tiled


def test_shipped_gluon_entries_carry_a_runnable_fallback(w4a16):
    """Every decode / pingpong entry of the shipped table names a plan of another kernel for where Gluon cannot run,
    and only keys the launchers know."""
    dispatch = w4a16.dispatch
    entries = [e for e in json.loads(TABLE.read_text())["entries"] if e["path"] in dispatch.GLUON_PATHS]
    assert any(e["path"] == "decode" for e in entries) and any(e["path"] == "pingpong" for e in entries)
    for e in entries:
        fallback = e.get("FALLBACK")
        assert fallback and fallback["path"] in dispatch.PATHS and fallback["path"] not in dispatch.GLUON_PATHS, e
        assert set(fallback) - {"path", "us"} <= set(dispatch.CONFIG_KEYS), e
        assert set(e) - {"N", "K", "M", "path", "us", "tuned_at", "dtype", "group_size", "symmetric", "act_order", "FALLBACK"} <= set(
            dispatch.CONFIG_KEYS), e
        if e["path"] == "decode":
            assert e["M"] <= 16 and e["K"] % 128 == 0, e


@pytest.mark.skipif(not _on_nvidia(), reason="the Gluon kernel needs an NVIDIA GPU (sm_80+)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("k,n,group_size,symmetric,fractional", [
    (512, 200, 128, False, False),   # N off the 16 / 32-row program
    (512, 75, 128, False, False),    # N odd: the last rows' scale / zero loads clamped row by row (not PARAMS_VECTOR)
    (1024, 136, 256, True, False),   # group 256 (one group over two blocks), symmetric
    (1152, 48, 384, False, False),   # group 384: three blocks per group (a divisor that is no power of two)
    (384, 72, -1, False, False),     # per-channel
    (384, 64, 128, False, True),     # fractional zeros
    (256, 40, 64, True, False),      # group 64: two groups per 128-row block
    (640, 24, 32, False, True),      # group 32, 5 blocks: the warps' shares differ (and some steps run past K)
    (256, 24, 16, False, False),     # group 16
])
@pytest.mark.parametrize("config", [
    {"num_warps": 4, "ROWS": 16, "AHEAD": 1, "maxnreg": 96},
    {"num_warps": 8, "ROWS": 32, "AHEAD": 2, "ADJACENT_ROWS": True},
    {"num_warps": 2, "ROWS": 32, "AHEAD": 3, "maxnreg": 128},
    {"num_warps": 4, "ROWS": 32, "AHEAD": 1, "ZEROS_BY_X_SUM": True},
    {"num_warps": 4, "ROWS": 16, "AHEAD": 1, "ZEROS_BY_X_SUM": True, "ADJACENT_ROWS": True},
    {"num_warps": 8, "ROWS": 16, "AHEAD": 3, "X_AT_USE": True, "maxnreg": 128},
    {"num_warps": 4, "ROWS": 32, "AHEAD": 1, "ADJACENT_ROWS": True, "EVICT_FIRST": True, "maxnreg": 128},
    # two programs of 8 tokens per weight tile from M = 9, launched together or a grid row apart
    {"num_warps": 4, "ROWS": 32, "AHEAD": 1, "maxnreg": 128, "BLOCK_M": 8, "TOKENS_FIRST": True},
    {"num_warps": 8, "ROWS": 16, "AHEAD": 2, "BLOCK_M": 8, "ZEROS_BY_X_SUM": True, "X_AT_USE": True},
    {"num_warps": 4, "ROWS": 16, "AHEAD": 1, "BLOCK_M": 16, "TOKENS_FIRST": True},  # 16 tokens from M = 1
])
def test_decode_matches_reference(w4a16, dtype, k, n, group_size, symmetric, fractional, config):
    weight, ref = random_layer(w4a16, k, n, group_size, symmetric, dtype, "cuda", seed=21, fractional_zeros=fractional)
    assert_path_matches_reference(w4a16, weight, ref, ("decode", config), dtype, "cuda", (1, 2, 3, 8, 9, 16), seed=22)


def test_decode_keeps_gather_pdl_only_for_act_order(w4a16, device):
    """GATHER_PDL on a decode plan (the kernel a programmatic dependent of act-order's gather): kept for act-order weights
    where programmatic launches exist (sm_90+), dropped elsewhere, as for the tensor-core paths."""
    dispatch = w4a16.dispatch
    dev = torch.device(device)
    plan = dispatch.plan_gemm(4, 96, 512, 128, torch.float16, dev, path="decode", config={"GATHER_PDL": True}, act_order=True)
    assert plan.config.get("GATHER_PDL", False) == dispatch.programmatic_launch(dev)
    plain = dispatch.plan_gemm(4, 96, 512, 128, torch.float16, dev, path="decode", config={"GATHER_PDL": True})
    assert "GATHER_PDL" not in plain.config


def test_decode_drops_adjacent_rows_for_per_channel(w4a16, device):
    """ADJACENT_ROWS (the row order of the per-block scale and zero loads) is dropped from a per-channel plan, whose one
    group's loads leave the loop, so the plan shows what runs; kept for every group size that loads per block."""
    dispatch = w4a16.dispatch
    dev = torch.device(device)
    for group_size, kept in ((512, False), (128, True), (256, True), (64, True), (32, True)):
        plan = dispatch.plan_gemm(4, 96, 512, group_size, torch.float16, dev, path="decode", config={"ADJACENT_ROWS": True})
        assert plan.config.get("ADJACENT_ROWS", False) == kept, group_size


@pytest.mark.skipif(not _on_nvidia(), reason="the Gluon kernel needs an NVIDIA GPU (sm_80+)")
def test_decode_act_order_and_unaligned_x(w4a16):
    """Act-order weights (x gathered first, as for every path) and an x whose rows are not 4-byte aligned (the
    launcher copies it: the kernel reads x as 32-bit row pairs)."""
    weight, ref = random_layer(w4a16, 512, 96, 128, False, torch.float16, "cuda", act_order=True, seed=71)
    assert_path_matches_reference(w4a16, weight, ref, ("decode", {"ROWS": 32}), torch.float16, "cuda", (1, 5, 16), seed=72)
    # launched as a programmatic dependent of the gather (sm_90+; elsewhere the dispatcher drops the option)
    assert_path_matches_reference(w4a16, weight, ref, ("decode", {"ROWS": 32, "GATHER_PDL": True}), torch.float16, "cuda",
                                  (1, 5, 16), seed=73)
    # ... with three steps' weights loaded before the wait (AHEAD 3)
    assert_path_matches_reference(w4a16, weight, ref, ("decode", {"ROWS": 16, "AHEAD": 3, "GATHER_PDL": True}),
                                  torch.float16, "cuda", (1, 5, 16), seed=74)
    plain, ref = random_layer(w4a16, 256, 64, 128, False, torch.float16, "cuda", seed=73)
    wide = torch.randn(3, 257, dtype=torch.float16, device="cuda")
    x = wide[:, 1:]  # rows start 2 bytes past an aligned address, stride 257 elements
    y = w4a16.gemm_decode.launch_decode(x, plain.qweight, plain.scales, plain.zeros, 256, 128,
                                        w4a16.dispatch.Plan("decode", {}, "test"))
    expected = x.double() @ ref.to(torch.float64)
    assert float((y.double() - expected).norm() / expected.norm()) < TOL[torch.float16]


@pytest.mark.skipif(not _on_nvidia(), reason="the Gluon kernel needs an NVIDIA GPU (sm_80+)")
def test_decode_repeat_launch(w4a16):
    """The kept launch (eager repeat calls of `matmul_weight`): new x, new output, same shapes, against the reference."""
    weight, ref = random_layer(w4a16, 1024, 192, 128, False, torch.float16, "cuda", seed=81)
    plan = w4a16.dispatch.Plan("decode", {"num_warps": 4, "ROWS": 16}, "test")
    gen = torch.Generator().manual_seed(82)
    x = torch.randn(4, 1024, generator=gen).to(device="cuda", dtype=torch.float16)
    w4a16.gemm_decode.launch_decode(x, weight.qweight, weight.scales, weight.zeros, 1024, 128, plan)  # compiles
    y, repeat = w4a16.gemm_decode.launch_decode_kept(x, weight.qweight, weight.scales, weight.zeros, 1024, 128, plan)
    assert repeat is not None
    for _ in range(3):
        x = torch.randn(4, 1024, generator=gen).to(device="cuda", dtype=torch.float16)
        y = repeat(x, weight.qweight, weight.scales, weight.zeros)
        expected = x.double() @ ref.to(torch.float64)
        assert float((y.double() - expected).norm() / expected.norm()) < TOL[torch.float16]
