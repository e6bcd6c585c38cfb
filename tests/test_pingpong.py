"""The Hopper warp-specialised "pingpong" path (gemm_pingpong.py, Gluon).

Triton's CPU interpreter does not run Gluon, so on the CPU (CI) the kernel is compiled for sm_90 in its format
variants (the Gluon API moves between Triton releases: this is where that shows), and the dispatcher's fallback
rule is checked on data. On an sm_90 GPU the kernel runs against the float64 reference of test_gemm.py.
"""

import pytest
import torch

from test_gemm import TOL, assert_path_matches_reference, random_layer


def _on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.parametrize("dtype,symmetric,zeros_dtype,block_m,group_size,consumers,reduction", [
    (torch.float16, False, torch.uint8, 128, 128, 2, "whole"),    # group 128; whole tiles
    (torch.bfloat16, True, torch.uint8, 64, 64, 2, "counted"),    # group 64, symmetric; shared tiles (Stream-K, split-K)
    (torch.float16, False, torch.float16, 256, 32, 2, "spread"),  # group 32, float (fractional) zeros; aligned split-K
    (torch.float16, False, torch.uint8, 128, 256, 1, "counted"),  # group 256; one consumer per program, maxnreg 128
    (torch.bfloat16, False, torch.uint8, 128, 4096, 2, "whole"),  # per-channel (one group spanning K = 4096)
])
@pytest.mark.parametrize("unpack_ahead,words_tma", [(False, False), (True, False), (False, True), (True, True)])
def test_pingpong_compiles_for_sm90(w4a16, pristine_triton_language, dtype, symmetric, zeros_dtype, block_m, group_size,
                                    consumers, reduction, unpack_ahead, words_tma):
    pingpong = w4a16.gemm_pingpong
    if not pingpong.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    compiled = pingpong.compile_for_sm90(dtype, block_m, 3 if block_m < 256 else 2, symmetric, zeros_dtype,
                                         group_size=group_size, in_features=4096, consumers=consumers,
                                         maxnreg=128 if consumers == 1 else None, shared_tiles=reduction != "whole",
                                         unpack_ahead=unpack_ahead, spread=4 if reduction == "spread" else 0,
                                         words_tma=words_tma)
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx  # tensor cores fed by TMA
    # x's two boxes per stage, and with WORDS_TMA each consumer's word tile; the consumers then load no words
    assert ptx.count("cp.async.bulk.tensor") == 2 + (consumers if words_tma else 0)
    assert ("ld.global.v4.b32" in ptx or "ld.global.v2.b32" in ptx) != words_tma, "words loaded from global memory"
    assert "setmaxnreg" in ptx  # the partitions got their register budgets
    assert ("atom." in ptx) == (reduction != "whole")  # arrival counters only where tiles are shared
    # the spread reduction waits for the tile's other contributors (acquire loads of the counter in a loop)
    assert ("ld.global.gpu.acquire" in ptx) == (reduction == "spread")
    assert compiled.metadata.enable_fp_fusion  # launch.COMPILE_OPTIONS reached the compiler (not Triton's default)


@pytest.mark.parametrize("group_size,k", [(16, 256), (32, 320), (64, 384), (128, 1024), (256, 1024), (384, 1152), (512, 2048),
                                          (1024, 1024), (320, 320), (4096, 4096)])
def test_scale_group_of_each_block(w4a16, group_size, k):
    """The kernels find a K block's scale groups from two constants (no division by G at run time): `groups_per_block`
    groups in a block (piece j at kb * groups + j), else `blocks_per_group` blocks per group (kb // it; 0: one group
    spanning K). The group of each piece's first row, row // G, is what they must give."""
    layout = w4a16.layout
    groups, blocks = layout.groups_per_block(group_size, k), layout.blocks_per_group(group_size, k)
    for kb in range(-(-k // 128)):
        for j in range(groups):
            row = kb * 128 + j * (128 // groups)
            if row >= k:
                continue
            found = kb * groups + j if groups > 1 else (0 if blocks == 0 else kb // blocks)
            assert found == row // group_size, f"G={group_size} K={k}: block {kb} piece {j} -> {found}, row {row}"


def test_spread_reduction_only_where_its_contributors_can_wait(w4a16):
    """The spread reduction makes a tile's contributors wait for one another: only for an aligned split (each program
    one tile's K blocks / S), S <= 4, and programs that are all resident at once (one per SM)."""
    spread_split = w4a16.gemm_pingpong.spread_split
    assert spread_split(128, 32, 32, False, 132) == 4  # 8B.o M = 128: 32 tiles x split 4 on 132 SMs
    assert spread_split(128, 64, 64, False, 132) == 2
    assert spread_split(128, 32, 32, False, 114) == 0  # 128 programs on 114 SMs (H100 PCIe): not all resident
    assert spread_split(192, 64, 32, False, 132) == 0  # split 3 of 32 K blocks: programs straddle tiles
    assert spread_split(96, 32, 24, False, 132) == 3
    assert spread_split(256, 32, 64, False, 264) == 0  # split 8: more partials in flight than it holds
    assert spread_split(132, 32, 32, True, 132) == 0  # a persistent Stream-K grid: segments end at different times


def test_dispatcher_plans_the_fallback_of_a_pingpong_entry(w4a16, monkeypatch):
    """The H200 table's pingpong entry for 6144 x 4096 at M = 256, planned for a device where the Gluon kernel cannot
    run (here a CPU device named as an H200): the plan is the entry's FALLBACK, and its source says so."""
    dispatch = w4a16.dispatch
    _, table, by_format, _ = dispatch.load_tuned_table("NVIDIA H200")
    row = dispatch.tuned_row(table, by_format, 256, 6144, 4096, dispatch.format_key(torch.float16, 128, False, False))
    assert row["path"] == "pingpong" and "FALLBACK" in row
    monkeypatch.setattr(dispatch, "_device_info", lambda device: ("NVIDIA H200", 132))
    plan = dispatch._plan_cached.__wrapped__(256, 6144, 4096, 128, torch.float16, torch.device("cpu"), False, False)
    fallback = row["FALLBACK"]
    assert plan.path == fallback["path"] and plan.source.endswith("(FALLBACK of a pingpong entry)")
    assert plan.config == {key: fallback[key] for key in dispatch.CONFIG_KEYS if key in fallback}


def test_pingpong_refuses_what_it_cannot_run(w4a16, device):
    """Forced where it cannot run, or with a configuration it does not have: a clear error, not a crash inside Triton.
    (Every group size the package accepts, `validate_group_size`, is one the kernel reads.)"""
    weight, _ = random_layer(w4a16, 256, 40, 64, False, torch.float16, device, seed=3)
    x = torch.randn(64, 256, dtype=torch.float16, device=device)

    def call(config=None):
        return w4a16.matmul.w4a16_matmul(x, weight.qweight, weight.scales, weight.zeros, None, 256, 64, path="pingpong",
                                         config=config)

    with pytest.raises(ValueError, match="UNPACK_AHEAD must be True or False"):  # the dispatcher's check: any device
        call({"UNPACK_AHEAD": 1})
    if not _on_hopper():
        with pytest.raises(RuntimeError, match="sm_90"):
            call()
    else:
        with pytest.raises(ValueError, match="CONSUMERS must be 1 or 2"):
            call({"CONSUMERS": 3})
        with pytest.raises(ValueError, match="PROGRAMS must be a positive int"):
            call({"PROGRAMS": 4, "SPLIT_K": 2})
        with pytest.raises(ValueError, match="BLOCK_M must be 64, 128 or 256"):  # (32: its shared tiles went unreduced)
            call({"BLOCK_M": 32, "SPLIT_K": 2})


@pytest.mark.skipif(not _on_hopper(), reason="the Gluon kernel needs an sm_90 GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("k,n,group_size,symmetric,fractional", [
    (512, 200, 128, False, False),   # N off the 128-row tile
    (1024, 136, 256, True, False),   # group 256, symmetric
    (320, 72, -1, False, False),     # per-channel, K not a multiple of 128 (TMA fills x past K with zeros)
    (384, 64, 128, False, True),     # fractional zeros
    (256, 40, 64, True, False),      # group 64: two groups per 128-row block
    (320, 24, 32, False, True),      # group 32, K ends inside a block (its groups past K are not read)
    (256, 24, 16, False, False),     # group 16
])
@pytest.mark.parametrize("config", [
    {"BLOCK_M": 64, "num_stages": 3, "SPLIT_K": 1},
    {"BLOCK_M": 128, "num_stages": 4, "SPLIT_K": 3},
    {"BLOCK_M": 256, "num_stages": 2, "SPLIT_K": 2},
    {"BLOCK_M": 128, "num_stages": 3, "SPLIT_K": 4},  # the spread reduction where K's blocks split evenly (else counted)
    {"BLOCK_M": 128, "num_stages": 2, "SPLIT_K": 2, "CONSUMERS": 1, "maxnreg": 128},
    {"BLOCK_M": 128, "num_stages": 3, "PROGRAMS": 5},  # Stream-K: tiles shared by 2-3 programs, and whole ones
    {"BLOCK_M": 64, "num_stages": 4, "PROGRAMS": 7, "CONSUMERS": 1, "maxnreg": 128},
    # the next block unpacked under the MMAs: segments of odd and even lengths (split-K 3, Stream-K 5 / 7)
    {"BLOCK_M": 128, "num_stages": 3, "SPLIT_K": 3, "UNPACK_AHEAD": True},
    {"BLOCK_M": 128, "num_stages": 3, "PROGRAMS": 5, "UNPACK_AHEAD": True},
    {"BLOCK_M": 64, "num_stages": 4, "PROGRAMS": 7, "CONSUMERS": 1, "maxnreg": 128, "UNPACK_AHEAD": True},
    {"BLOCK_M": 256, "num_stages": 2, "SPLIT_K": 1, "UNPACK_AHEAD": True},
    # the words staged by the loader's TMA (row tiles past N read as zeros), rings deeper than a segment
    {"BLOCK_M": 64, "num_stages": 8, "SPLIT_K": 3, "WORDS_TMA": True},
    {"BLOCK_M": 128, "num_stages": 5, "PROGRAMS": 5, "WORDS_TMA": True},
    {"BLOCK_M": 256, "num_stages": 3, "SPLIT_K": 1, "WORDS_TMA": True},
    {"BLOCK_M": 64, "num_stages": 5, "PROGRAMS": 7, "CONSUMERS": 1, "maxnreg": 128, "WORDS_TMA": True},
    {"BLOCK_M": 128, "num_stages": 4, "SPLIT_K": 3, "UNPACK_AHEAD": True, "WORDS_TMA": True},
])
def test_pingpong_matches_reference(w4a16, dtype, k, n, group_size, symmetric, fractional, config):
    weight, ref = random_layer(w4a16, k, n, group_size, symmetric, dtype, "cuda", seed=21, fractional_zeros=fractional)
    assert_path_matches_reference(w4a16, weight, ref, ("pingpong", config), dtype, "cuda", (1, 3, 33, 64, 130, 257), seed=22)


@pytest.mark.skipif(not _on_hopper(), reason="the Gluon kernel needs an sm_90 GPU")
@pytest.mark.parametrize("programs,consumers,unpack_ahead,words_tma", [
    (37, 2, False, False), (132, 2, False, False), (264, 1, False, False), (37, 2, True, False), (264, 1, True, False),
    (37, 2, False, True), (132, 2, True, True), (264, 1, False, True)])
def test_pingpong_stream_k_many_contributors(w4a16, programs, consumers, unpack_ahead, words_tma):
    """A persistent grid on few tiles: each tile's 24 K blocks are shared by many programs (one or two units each),
    and segments cross tile boundaries; the reduction must still sum every partial once, in order."""
    weight, ref = random_layer(w4a16, 3072, 200, 128, False, torch.float16, "cuda", seed=31)
    config = {"BLOCK_M": 64, "num_stages": 4, "PROGRAMS": programs, "UNPACK_AHEAD": unpack_ahead, "WORDS_TMA": words_tma,
              **({"CONSUMERS": 1, "maxnreg": 128} if consumers == 1 else {})}
    assert_path_matches_reference(w4a16, weight, ref, ("pingpong", config), torch.float16, "cuda", (1, 64, 130), seed=32)


@pytest.mark.skipif(not _on_hopper(), reason="the Gluon kernel needs an sm_90 GPU")
@pytest.mark.parametrize("split,block_m,k", [(4, 128, 4096), (3, 128, 3072), (2, 64, 1024), (4, 256, 2048)])
def test_pingpong_spread_reduction(w4a16, split, block_m, k):
    """An aligned split-K whose programs all fit on the GPU takes the spread reduction (each contributor sums a share
    of the tile's 32-token chunks, shares of 1-2 chunks): right, and the same bits on every call."""
    weight, ref = random_layer(w4a16, k, 1000, 128, False, torch.float16, "cuda", seed=61)
    plan = w4a16.dispatch.Plan("pingpong", {"BLOCK_M": block_m, "num_stages": 3 if block_m < 256 else 2, "SPLIT_K": split}, "test")
    for m in (block_m, block_m - 27):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(device="cuda", dtype=torch.float16)
        runs = [w4a16.gemm_pingpong.launch_pingpong(x, weight.qweight, weight.scales, weight.zeros, k, 128, plan) for _ in range(30)]
        expected = x.double() @ ref.to(device="cuda", dtype=torch.float64)
        err = float((runs[0].double() - expected).norm() / expected.norm())
        assert err < TOL[torch.float16], f"M={m}: relative error {err:.2e}"
        assert all(torch.equal(run, runs[0]) for run in runs[1:]), f"M={m}: results differ between calls"
    assert any(spread == split for _, spread in next(iter(plan.launches.values())).kernels), "not the spread reduction"


@pytest.mark.skipif(not _on_hopper(), reason="the Gluon kernel needs an sm_90 GPU")
def test_pingpong_large_work_list(w4a16):
    """Programs x units past 2**31 (5888 whole tiles of 64 K blocks: the work-list bounds need int64): the first and
    last rows (the last programs' tiles) against the float64 reference."""
    k, n, m = 8192, 11776, 4096
    weight, ref = random_layer(w4a16, k, n, 128, False, torch.float16, "cuda", seed=41)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(42)).to(device="cuda", dtype=torch.float16)
    y = w4a16.matmul.w4a16_matmul(x, weight.qweight, weight.scales, weight.zeros, None, k, 128, path="pingpong",
                                  config={"BLOCK_M": 64, "num_stages": 4, "SPLIT_K": 1})
    rows = torch.cat([torch.arange(8), torch.arange(m - 8, m)])
    expected = x[rows].double() @ ref.to(device="cuda", dtype=torch.float64)
    err = float((y[rows].double() - expected).norm() / expected.norm())
    assert err < TOL[torch.float16], f"relative error {err:.2e}"


@pytest.mark.skipif(not _on_hopper(), reason="the Gluon kernel needs an sm_90 GPU")
def test_pingpong_repeat_calls_on_one_plan(w4a16):
    """Repeat calls on one plan (as the dispatcher's cached plans make them) take the prepared launch's fast path after
    the first of each specialisation: each with a new x (and its TMA descriptor), a new output, another M; then another
    x dtype (a new specialisation). Every call against the float64 reference."""
    plan = w4a16.dispatch.Plan("pingpong", {"BLOCK_M": 128, "num_stages": 3, "SPLIT_K": 2}, "test")
    gen = torch.Generator().manual_seed(52)
    for dtype in (torch.float16, torch.bfloat16, torch.float16):
        weight, ref = random_layer(w4a16, 1024, 192, 128, False, dtype, "cuda", seed=51)
        for m in (130, 130, 64, 257):
            x = torch.randn(m, 1024, generator=gen).to(device="cuda", dtype=dtype)
            y = w4a16.gemm_pingpong.launch_pingpong(x, weight.qweight, weight.scales, weight.zeros, 1024, 128, plan)
            expected = x.double() @ ref.to(device="cuda", dtype=torch.float64)
            err = float((y.double() - expected).norm() / expected.norm())
            assert err < TOL[dtype], f"{dtype} M={m}: relative error {err:.2e}"
