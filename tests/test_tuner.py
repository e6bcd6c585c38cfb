"""benchmarks/tune.py's candidate lists: every configuration it would time is one the package accepts.

The tuner runs on the GPU and skips (logs) a candidate that raises, so a misspelt key or an option
offered where it does not apply would silently drop out of the table. These checks run on the CPU.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


def _tune_module():
    sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("w4a16_tune", REPO / "benchmarks" / "tune.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.kernels_ci
@pytest.mark.parametrize("m", [1, 2, 16, 33, 64, 128, 4096])
@pytest.mark.parametrize("n,k", [(4096, 4096), (57344, 8192), (8192, 28672)])
def test_candidates_are_accepted_configs(w4a16, m, n, k):
    tune = _tune_module()
    dispatch = w4a16.dispatch
    cpu = torch.device("cpu")
    plain = list(tune.candidates(m, n, k, sm_count=132))
    assert plain
    for path, config in plain:
        assert path in dispatch.PATHS
        assert set(config) <= set(dispatch.PATH_CONFIG_KEYS[path]), f"{path} {config}"
        # forced plans validate their keys exactly like the tuner's calls do
        plan = dispatch.plan_gemm(m, n, k, 128, torch.float16, cpu, path=path, config=config)
        assert plan.path == path and all(plan.config[key] == value for key, value in config.items())
        if config.get("ONE_TOKEN"):
            assert m == 1 and not config["SCALE_IN_OPERAND"]
    assert any(c.get("ONE_TOKEN") for _, c in plain) == (m == 1)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("regs_per_sm", [65536, 32768])
def test_stream_k_register_cap_fits_its_programs(regs_per_sm):
    """Stream-K needs all its programs resident: the capped scale-in-operand candidate at three programs
    per SM has the largest cap (a multiple of 8) with which three of them fit in the SM's registers."""
    tune = _tune_module()
    capped = [c for path, c in tune.candidates(1, 57344, 8192, sm_count=132, regs_per_sm=regs_per_sm)
              if path == "streamk" and "maxnreg" in c]
    assert len(capped) == 1 and capped[0]["SCALE_IN_OPERAND"] and capped[0]["PROGRAMS"] == 3 * 132
    threads = 3 * capped[0]["num_warps"] * 32
    cap = capped[0]["maxnreg"]
    assert cap % 8 == 0 and cap * threads <= regs_per_sm < (cap + 8) * threads
    assert cap == (168 if regs_per_sm == 65536 else 80)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("m", [1, 16, 128])
def test_around_plan_toggles_only_the_options(w4a16, m, act_order):
    """`tune.py --around-plan`: the plan's own configuration first, then (tensor-core plans) the same with
    DOT_PARTS set to each other value, at M = 1 on fold plans ONE_TOKEN flipped, for act-order GATHER_PDL
    flipped and on scale-in-operand plans STREAM_PARAMS flipped: one option changed per candidate, each a
    configuration the package accepts."""
    tune = _tune_module()
    dispatch = w4a16.dispatch
    cpu = torch.device("cpu")
    for path, config in [("splitk", {"BLOCK_N": 128, "BLOCK_M": 16, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4, "ONE_TOKEN": True}),
                         ("tiled", {"BLOCK_N": 128, "BLOCK_M": 16, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4,
                                    "SCALE_IN_OPERAND": True, "DOT_PARTS": 2}),
                         ("gemv", {"BLOCK_N": 128, "BLOCK_M": 1, "SPLIT_K": 8, "num_warps": 4, "num_stages": 3}),
                         ("dense", {})]:
        plan = dispatch.plan_gemm(m, 4096, 4096, 128, torch.float16, cpu, path=path, config=config)
        pairs = list(tune.around_plan(w4a16, plan, m, act_order))
        assert pairs[0] == (path, plan.config)
        tensor_core = path in dispatch.TENSOR_CORE_PATHS
        fold = tensor_core and not plan.config.get("SCALE_IN_OPERAND", False)
        assert len(pairs) == 1 + tensor_core * (3 + (m == 1 and fold) + act_order + (not fold)), pairs
        if tensor_core:
            assert sorted(c.get("DOT_PARTS", 1) for _, c in pairs[:4]) == [1, 2, 4, 8]
        assert any(c.get("GATHER_PDL") for _, c in pairs) == (tensor_core and act_order)
        assert any(c.get("STREAM_PARAMS") for _, c in pairs) == (tensor_core and not fold)
        defaults = {"ONE_TOKEN": False, "DOT_PARTS": 1, "GATHER_PDL": False, "STREAM_PARAMS": False}  # a config without the key
        for p, c in pairs[1:]:
            assert p == path
            assert {k: v for k, v in c.items() if k not in defaults} == {k: v for k, v in plan.config.items() if k not in defaults}
            changed = [key for key, value in defaults.items() if c.get(key, value) != plan.config.get(key, value)]
            assert len(changed) == 1, (c, plan.config)
            dispatch.plan_gemm(m, 4096, 4096, 128, torch.float16, cpu, path=p, config=c)  # accepted
    if m <= 16:  # decode plans: ZEROS_BY_X_SUM, ADJACENT_ROWS, X_AT_USE and EVICT_FIRST flipped, and for act-order GATHER_PDL
        plan = dispatch.plan_gemm(m, 4096, 4096, 128, torch.float16, cpu, path="decode",
                                  config={"num_warps": 8, "ROWS": 16, "AHEAD": 1, "maxnreg": 128})
        pairs = list(tune.around_plan(w4a16, plan, m, act_order))
        assert pairs == [("decode", plan.config), ("decode", {**plan.config, "ZEROS_BY_X_SUM": True}),
                         ("decode", {**plan.config, "ADJACENT_ROWS": True}), ("decode", {**plan.config, "X_AT_USE": True}),
                         ("decode", {**plan.config, "EVICT_FIRST": True})] + (
            [("decode", {**plan.config, "GATHER_PDL": True})] if act_order else [])


SIO_16 = {"BLOCK_N": 128, "BLOCK_M": 16, "SPLIT_K": 8, "num_warps": 4, "num_stages": 3, "SCALE_IN_OPERAND": True}
SIO_32 = {**SIO_16, "BLOCK_M": 32, "SPLIT_K": 4}
SIO_64 = {**SIO_16, "BLOCK_M": 64, "SPLIT_K": 4, "num_stages": 4}


@pytest.mark.kernels_ci
@pytest.mark.parametrize("path,config,m,n,k,ctas,grown", [
    ("splitk", SIO_16, 1, 4096, 4096, 4, 16),
    ("splitk", SIO_16, 16, 6144, 4096, 4, None),  # split 12 would not fit
    ("splitk", SIO_16, 64, 4096, 4096, 4, None),  # 128 tiles: no larger split fits
    ("streamk", {**{x: v for x, v in SIO_16.items() if x != "SPLIT_K"}, "PROGRAMS": 3 * 132}, 1, 57344, 8192, 4, "programs"),
    ("splitk", SIO_32, 32, 4096, 4096, 4, 16),
    ("splitk", SIO_64, 64, 4096, 4096, 3, 12),
    ("tiled", {**SIO_64, "SPLIT_K": 1}, 64, 4096, 4096, 3, 12),
    ("streamk", {**{x: v for x, v in SIO_32.items() if x != "SPLIT_K"}, "PROGRAMS": 2 * 132}, 32, 57344, 8192, 4, "programs"),
    ("splitk", {**SIO_64, "maxnreg": 168}, 64, 4096, 4096, 0, None),  # capped already
    ("splitk", {**SIO_16, "SCALE_IN_OPERAND": False}, 16, 4096, 4096, 0, None),  # fold
    ("tiled", {**SIO_16, "SPLIT_K": 1, "BLOCK_N": 256, "num_warps": 8}, 16, 28672, 4096, 0, None),  # 8 warps
])
def test_around_plan_offers_one_more_cta_per_sm(w4a16, path, config, m, n, k, ctas, grown):
    """--around-plan on an uncapped 4-warp scale-in-operand plan (132 SMs, 64K registers) also times the register
    cap at which `ctas` CTAs fit (BLOCK_M = 16: 128, four CTAs; 32: 128, four; 64: 168, three), for BLOCK_M >= 32
    with four dot parts and three stages (the cap alone spills there), then the same with STREAM_PARAMS, then with
    the grid grown to fill `ctas` per SM (the largest offered split that fits, or that many Stream-K programs);
    each a configuration the package accepts. Capped, fold and 8-warp plans get no such candidate."""
    tune = _tune_module()
    dispatch = w4a16.dispatch
    cpu = torch.device("cpu")
    plan = dispatch.plan_gemm(m, n, k, 128, torch.float16, cpu, path=path, config=config)
    pairs = [(p, c) for p, c in tune.around_plan(w4a16, plan, m, False, n, k, 132) if c.get("maxnreg") != config.get("maxnreg")]
    if not ctas:
        assert pairs == []
        return
    cap = tune.register_cap(65536, ctas, 4)
    assert cap % 8 == 0 and cap * ctas * 4 * 32 <= 65536 < (cap + 8) * ctas * 4 * 32
    wide = {"DOT_PARTS": 4, "num_stages": 3} if config["BLOCK_M"] > 16 else {}
    capped = {**config, "maxnreg": cap, **wide}
    expected = [(path, capped), (path, {**capped, "STREAM_PARAMS": True})]
    if grown == "programs":
        expected.append((path, {**capped, "PROGRAMS": ctas * 132}))
    elif grown:
        tiles = -(-n // config["BLOCK_N"]) * -(-m // config["BLOCK_M"])
        assert tiles * grown <= ctas * 132
        expected.append(("splitk", {**capped, "SPLIT_K": grown}))
    assert pairs == expected
    for p, c in pairs:
        dispatch.plan_gemm(m, n, k, 128, torch.float16, cpu, path=p, config=c)  # accepted


@pytest.mark.kernels_ci
def test_full_search_times_the_incumbent_first(w4a16):
    """A full search (no --around-plan) times the table's current plan first and each candidate once more
    only if it differs, so an entry is replaced only by a plan that beat it in the same run (also one whose
    DOT_PARTS the candidate list does not offer); the CPU reference plan is no incumbent."""
    tune = _tune_module()
    dispatch = w4a16.dispatch
    cpu = torch.device("cpu")
    candidates = list(tune.candidates(16, 4096, 4096, sm_count=132))
    inside = candidates[3]
    outside = (inside[0], {**inside[1], "DOT_PARTS": 4})  # an option the candidate list leaves out
    for path, config, expected_first in [(*inside, inside), (*outside, outside)]:
        plan = dispatch.plan_gemm(16, 4096, 4096, 128, torch.float16, cpu, path=path, config=config)
        pairs = list(tune.with_incumbent(plan, iter(candidates)))
        assert pairs[0] == (plan.path, plan.config) == expected_first
        assert pairs.count(pairs[0]) == 1
        assert pairs[1:] == [p for p in candidates if p != pairs[0]]
    reference = dispatch.plan_gemm(16, 4096, 4096, 128, torch.float16, cpu)
    assert reference.path == "reference"
    assert list(tune.with_incumbent(reference, iter(candidates))) == candidates


@pytest.mark.kernels_ci
def test_search_times_the_neighbouring_buckets_plans(w4a16):
    """The plans the table holds at the neighbouring M buckets are timed right after the incumbent, each
    pair once, also when the candidate list (narrowed by --paths) does not offer them."""
    tune = _tune_module()
    dispatch = w4a16.dispatch
    cpu = torch.device("cpu")
    assert tune.neighbour_buckets(1) == [2] and tune.neighbour_buckets(4) == [2, 8] and tune.neighbour_buckets(4096) == [1024]
    assert tune.neighbour_buckets(3) == []
    streamk = [p for p in tune.candidates(4, 57344, 8192, sm_count=132) if p[0] == "streamk"]
    fold = {"BLOCK_N": 256, "BLOCK_M": 16, "SPLIT_K": 1, "num_warps": 8, "num_stages": 3, "maxnreg": 128, "DOT_PARTS": 2}
    plan = lambda path, config: dispatch.plan_gemm(4, 57344, 8192, 128, torch.float16, cpu, path=path, config=config)  # noqa: E731
    incumbent = plan(*streamk[-1])
    neighbours = [plan("tiled", fold), plan("tiled", fold), plan(*streamk[-1])]  # M = 2 and 8 alike; one equal to the incumbent
    pairs = list(tune.with_incumbent(incumbent, iter(streamk), neighbours))
    assert pairs[0] == (incumbent.path, incumbent.config) and pairs[1] == ("tiled", neighbours[0].config)
    assert len(pairs) == len(streamk) + 1 and all(pairs.count(p) == 1 for p in pairs)
    reference = dispatch.plan_gemm(4, 57344, 8192, 128, torch.float16, cpu)
    assert list(tune.with_incumbent(reference, iter(streamk), [reference])) == streamk


def test_unlike_base_only_compares_whole_plans_and_needs_a_format_check(w4a16, monkeypatch, capsys):
    """--unlike-base-only skips a format's entry only when its plan is the base's exactly (path and every config entry),
    and is refused outside --incumbents-only for a format other than the base (before any GPU work)."""
    tune = _tune_module()
    cpu = torch.device("cpu")
    plan = lambda path, config: w4a16.dispatch.plan_gemm(256, 4096, 4096, 128, torch.float16, cpu, path=path, config=config)  # noqa: E731
    pingpong = {"BLOCK_M": 128, "SPLIT_K": 2, "num_stages": 3}
    assert tune.plan_pair(plan("pingpong", pingpong)) == tune.plan_pair(plan("pingpong", dict(pingpong))) == ("pingpong", pingpong)
    assert tune.plan_pair(plan("pingpong", pingpong)) != tune.plan_pair(plan("pingpong", {**pingpong, "WORDS_TMA": True}))
    assert tune.plan_pair(plan("pingpong", pingpong)) != tune.plan_pair(plan("dense", {}))
    for argv in (["--unlike-base-only", "--variant", "sym"], ["--unlike-base-only", "--incumbents-only"]):
        monkeypatch.setattr(sys, "argv", ["tune.py", *argv])
        with pytest.raises(SystemExit):
            tune.main()
        assert "--unlike-base-only needs --incumbents-only and a --variant other than base" in capsys.readouterr().err


@pytest.mark.kernels_ci
@pytest.mark.parametrize("m,k,variant", [(1, 4096, "base"), (16, 14336, "base"), (16, 4096, "act_order"), (128, 4096, "bf16"),
                                         (4096, 4096, "base")])
def test_sass_report_records_the_launch(w4a16, m, k, variant):
    """benchmarks/sass_report.py compiles what a GPU call would launch: its recording of a call names
    every parameter of the kernel once, for the tuned plan's own prepared launch (none for the dense path and the
    Gluon kernels, which have compile_for_sm90 of their own)."""
    report = _benchmark_module("sass_report")
    plan, _ = report.tuned_call(w4a16, m, 4096, k, variant)
    launch = report.captured_launch(w4a16, plan, m, 4096, k, variant)
    if plan.path == "dense" or plan.path in w4a16.dispatch.GLUON_PATHS:
        assert launch is None and (m, k) != (16, 14336)  # (4096 x 14336 at M = 16: a Triton plan in the H200 table)
        return
    prepared, tensors, ints = launch
    named = list(prepared.tensor_names + prepared.int_names) + list(prepared.constexprs)
    assert sorted(named) == sorted(prepared.kernel.arg_names)  # every parameter exactly once
    assert len(tensors) == len(prepared.tensor_names) and len(ints) == len(prepared.int_names)
    assert prepared.constexprs["USE_ASM"] is True  # prepared as for a GPU
    assert any(prepared is launch.kernel for launch in plan.launches.values())  # the plan's own prepared launch


@pytest.mark.kernels_ci
def test_sass_report_compiles_decode_plans_with_their_gpu_options(w4a16, pristine_triton_language):
    """sass_report.py compiles a decode plan's Gluon kernel with the table entry's own options: planning on the CPU
    drops GATHER_PDL (it needs a GPU), but the act-order kernel the H200 launches waits for its gather."""
    if not w4a16.gemm_decode.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    report = _benchmark_module("sass_report")
    plan, config = report.tuned_call(w4a16, 1, 4096, 4096, "act_order")
    assert plan.path == "decode" and config.get("GATHER_PDL") and not plan.config.get("GATHER_PDL")
    compiled, warps = report.compile_decode_for_sm90(w4a16, 1, 4096, 4096, "act_order", config)
    assert "griddepcontrol.wait" in compiled.asm["ptx"] and warps == config["num_warps"]
    _, base_config = report.tuned_call(w4a16, 1, 4096, 4096, "base")
    plain, _ = report.compile_decode_for_sm90(w4a16, 1, 4096, 4096, "base", base_config)
    assert "griddepcontrol.wait" not in plain.asm["ptx"]


def _benchmark_module(name: str):
    sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location(f"w4a16_{name}", REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would: a dataclass there looks its module up by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.kernels_ci
def test_bench_results_keep_each_rows_own_fp16_time(tmp_path, monkeypatch):
    """bench_gemm.py's merge replaces the fp16 rows of the shapes it re-runs; a row kept from an older run
    keeps that run's fp16 time (`fp16_us`), a new row gets its own run's, and report.py's ratios use them
    (cuBLAS moves up to ~10% between runs: a ratio must not divide times of two runs)."""
    bench = _benchmark_module("bench_gemm")
    report = _benchmark_module("report")
    monkeypatch.setattr(bench.timing, "machine_info", lambda: {"gpu": "test GPU", "commit": "new"})
    shape = {"shape": "8B.o", "N": 4096, "K": 4096, "M": 1}
    fmt = {"dtype": "fp16", "symmetric": False, "act_order": False}
    old = [dict(shape, impl="fp16", us=10.0, commit="old"), dict(shape, impl="w4a16", us=5.0, group_size=128, **fmt, commit="old"),
           dict(shape, impl="w4a16", us=8.0, group_size=64, **fmt, commit="old"), dict(shape, impl="w4a16_eager", us=30.0, commit="old")]
    new = [dict(shape, impl="fp16", us=12.0), dict(shape, impl="w4a16", us=4.0, group_size=128, **fmt)]
    out = tmp_path / "results.json"
    bench.write_results(out, new, old, "old")
    rows = {(r["impl"], r.get("group_size"), r["commit"]): r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {("fp16", None, "new"), ("w4a16", 128, "new"), ("w4a16", 64, "old"), ("w4a16_eager", None, "old")}
    assert rows[("w4a16", 128, "new")]["fp16_us"] == 12.0
    assert rows[("w4a16", 64, "old")]["fp16_us"] == 10.0
    assert "fp16_us" not in rows[("w4a16_eager", None, "old")] and "fp16_us" not in rows[("fp16", None, "new")]
    latest_fp16 = {("8B.o", 1): 12.0}
    assert report.speedup(rows[("w4a16", 64, "old")], latest_fp16) == pytest.approx(10.0 / 8.0)
    assert report.speedup(rows[("w4a16", 128, "new")], latest_fp16) == pytest.approx(3.0)
    assert report.speedup(dict(shape, impl="w4a16", us=6.0), latest_fp16) == pytest.approx(2.0)  # older files: the file's fp16 row


def test_tuned_table_written_for_another_gpu_overlays_the_shipped_one(w4a16, tmp_path):
    """tune.py --applies-to H100 --overlays tuned_b.json: the table it writes (and re-writes on --merge, keeping its
    scope) refines the other one on an H100 only, entry by entry (`dispatch.load_tuned_table`)."""
    import argparse

    tune = _tune_module()
    shared = {"group_size": 128, "sm_count": 132}
    (tmp_path / "tuned_b.json").write_text(json.dumps({"applies_to": ["H200", "H100"], **shared, "entries": [
        {"N": 64, "K": 256, "M": m, "path": "splitk", "SPLIT_K": 2} for m in (256, 512)]}))
    assert tune.table_scope("", "", {"entries": []}) == (["H200", "H100"], None)
    scope = tune.table_scope("H100", "tuned_b.json", {"entries": []})
    args = argparse.Namespace(out=str(tmp_path / "tuned_a.json"), log="")
    info = {"gpu": "NVIDIA H100 80GB HBM3", "commit": "abc1234"}
    first = [{"N": 64, "K": 256, "M": 256, "path": "tiled", "us": 9.0}]
    tune.write_table(args, info, 128, 132, tune.merged([], first, w4a16.dispatch.entry_key), [], *scope)
    kept_table = json.loads((tmp_path / "tuned_a.json").read_text())
    assert tune.table_scope("", "", kept_table) == (["H100"], "tuned_b.json")  # a --merge run keeps the scope
    again = [{"N": 64, "K": 256, "M": 256, "path": "dense", "us": 8.0}, {"N": 64, "K": 256, "M": 1, "path": "gemv", "us": 3.0}]
    entries = tune.merged(kept_table["entries"], again, w4a16.dispatch.entry_key)
    assert [(e["M"], e["path"]) for e in entries] == [(1, "gemv"), (256, "dense")]
    tune.write_table(args, info, 128, 132, entries, [], *tune.table_scope("", "", kept_table))
    _, table, _, _ = w4a16.dispatch.load_tuned_table("NVIDIA H100 80GB HBM3", tmp_path)
    assert [(r["M"], r["path"], r["table"]) for r in table[(64, 256)]] == [
        (1, "gemv", "tuned_a.json"), (256, "dense", "tuned_a.json"), (512, "splitk", "tuned_b.json")]
    _, table, _, _ = w4a16.dispatch.load_tuned_table("NVIDIA H200", tmp_path)
    assert [r["path"] for r in table[(64, 256)]] == ["splitk", "splitk"]


@pytest.mark.kernels_ci
def test_merge_refuses_a_file_measured_on_another_gpu(tmp_path):
    """bench_gemm.py / tune.py --merge: a results file or tuned table measured on another GPU is refused (before
    anything is timed) rather than mixed with this card's timings; the same GPU, a new file or no --merge pass."""
    timing = _benchmark_module("timing")
    results, table = tmp_path / "h200.json", tmp_path / "tuned.json"
    results.write_text(json.dumps({"gpu": "NVIDIA H200", "rows": [{"shape": "8B.o", "us": 5.0}]}))
    table.write_text(json.dumps({"measured_on": {"gpu": "NVIDIA H200"}, "entries": [{"N": 4096}]}))
    for path, empty in ((results, {"rows": []}), (table, {"entries": []})):
        with pytest.raises(SystemExit, match="measured on 'NVIDIA H200' and this machine's GPU is 'NVIDIA H100 80GB HBM3'"):
            timing.load_for_merge(str(path), True, "NVIDIA H100 80GB HBM3", empty)
        kept = timing.load_for_merge(str(path), True, "NVIDIA H200", empty)
        assert kept == json.loads(path.read_text()) and kept != empty
        assert timing.load_for_merge(str(path), False, "NVIDIA H100 80GB HBM3", empty) is empty
    assert timing.load_for_merge(str(tmp_path / "new.json"), True, "NVIDIA H100 80GB HBM3", {"rows": []}) == {"rows": []}


@pytest.mark.kernels_ci
def test_shape_selection_takes_names_and_literal_shapes():
    """--shapes of tune.py / bench_gemm.py: names of the shapes file, `name=NxK` for a shape outside it (the LM
    head of bench_e2e), all shapes for an empty list; anything else is refused with the known names."""
    _tune_module()  # puts benchmarks/ on sys.path
    import timing

    data = {"shapes": [{"name": "8B.qkv", "N": 6144, "K": 4096}, {"name": "8B.o", "N": 4096, "K": 4096}]}
    assert timing.select_shapes("", data) == data["shapes"]
    assert timing.select_shapes("8B.o,8B.lm_head=128256x4096", data) == [
        {"name": "8B.o", "N": 4096, "K": 4096}, {"name": "8B.lm_head", "N": 128256, "K": 4096}]
    for bad in ("8B.nope", "head=128256*4096", "head=x4096"):
        with pytest.raises(SystemExit, match="--shapes"):
            timing.select_shapes(bad, data)


def test_round_order_moves_every_item_through_the_positions():
    """bench_gemm.py's / probe_symmetric.py's order per round: over `rounds` rounds each item is timed at positions
    spread through the list (not always first), every round holding every item once."""
    _tune_module()  # puts benchmarks/ on sys.path
    import timing

    items = list("abcdefghi")
    orders = [timing.round_order(items, r, 3) for r in range(3)]
    assert orders == [list("abcdefghi"), list("defghiabc"), list("ghiabcdef")]
    for item in items:
        assert sorted(order.index(item) for order in orders) in ([0, 3, 6], [1, 4, 7], [2, 5, 8])
    assert [timing.round_order(["a", "b"], r, 2) for r in range(2)] == [["a", "b"], ["b", "a"]]
    assert timing.round_order(items, 0, 1) == items


@pytest.mark.kernels_ci
def test_clock_log_summarises_the_samples_of_each_timing():
    """bench_gemm.py's clock record: nvidia-smi's CSV lines parse into (time, SM MHz, limit reasons), anything else is
    skipped; a timing's window gives the mean clock and the share of samples held down by a power or thermal limit
    (SW power cap 0x4 is one; idle 0x1 is not), the first sample after it when none fell inside and that one came
    within a period, else None; without nvidia-smi or a GPU the log is a no-op."""
    _tune_module()  # puts benchmarks/ on sys.path
    import datetime

    import timing

    t, mhz, reasons = timing.parse_clock_sample("2026/12/01 07:11:30.885, 1965, 0x0000000000000004\n")
    assert t == pytest.approx(datetime.datetime(2026, 12, 1, 7, 11, 30, 885000).timestamp())
    assert (mhz, reasons) == (1965.0, 4)
    for other in ("timestamp, clocks.current.sm [MHz], clocks_event_reasons.active", "No devices were found", ""):
        assert timing.parse_clock_sample(other) is None
    log = timing.ClockLog()
    log.samples = [(10.0, 1980.0, 0x1), (10.1, 1800.0, 0x4), (10.2, 1500.0, 0x4 | 0x1), (10.3, 1980.0, 0x0),
                   (11.0, 900.0, 0x4)]
    assert log.window(10.0, 10.3) == {"sm_mhz": 1815, "limited": 0.5}
    assert log.window(10.05, 10.15) == {"sm_mhz": 1800, "limited": 1.0}
    assert log.window(10.16, 10.18) == {"sm_mhz": 1500, "limited": 1.0}  # none inside: the next one, 20 ms later
    assert log.window(10.4, 10.9) is None  # none inside, the next one 100 ms later (more than a 50 ms period)
    if shutil.which("nvidia-smi") is None:
        with timing.ClockLog() as idle:
            idle.settle()
        assert idle.samples == [] and idle.window(0.0, 1e12) is None


@pytest.mark.kernels_ci
def test_set_overrides_type_options_as_bools(w4a16):
    """--set of sass_report.py / profile_one.py: the on / off options become bools (the dispatcher refuses
    STREAM_PARAMS=1 by name), every other entry an int; the prepared launch accepts the result."""
    _tune_module()  # puts benchmarks/ on sys.path
    import timing

    overrides = timing.config_overrides("num_stages=3,maxnreg=168,STREAM_PARAMS=1,DOT_PARTS=4,SCALE_IN_OPERAND=1", w4a16)
    assert overrides == {"num_stages": 3, "maxnreg": 168, "STREAM_PARAMS": True, "DOT_PARTS": 4, "SCALE_IN_OPERAND": True}
    assert all(type(overrides[key]) is bool for key in w4a16.dispatch.CONFIG_OPTIONS if key in overrides)
    assert set(w4a16.dispatch.CONFIG_OPTIONS) <= set(w4a16.dispatch.CONFIG_KEYS)
    assert timing.config_overrides("", w4a16) == {}
    for bad in ("num_warps", "num_warps=eight", "=4", "DOT_PARTS=2.5"):
        with pytest.raises(SystemExit, match="KEY=INT"):
            timing.config_overrides(bad, w4a16)
    plan = w4a16.dispatch.plan_gemm(64, 4096, 4096, 128, torch.float16, torch.device("cpu"), path="splitk", config=overrides)
    launch = w4a16.gemm._prepare_matmul_launch(plan, torch.float16, "cuda", False, 4096, 128, False, True)  # accepted
    assert launch.kernel.constexprs["STREAM_PARAMS"] is True and launch.kernel.constexprs["DOT_PARTS"] == 4
    assert launch.kernel.options["maxnreg"] == 168 and launch.kernel.options["num_stages"] == 3


@pytest.mark.kernels_ci
def test_try_times_the_plan_with_each_override_set(w4a16):
    """tune.py --try: the current plan first, then the same plan with each ';'-separated set of entries replaced
    (through `with_incumbent`, as main() builds it), each a configuration the package accepts."""
    tune = _tune_module()
    import timing

    cpu = torch.device("cpu")
    plan = w4a16.dispatch.plan_gemm(64, 4096, 4096, 128, torch.float16, cpu, path="splitk", config=SIO_64)
    sets = [timing.config_overrides(spec, w4a16) for spec in "num_warps=8;num_warps=8,num_stages=3,STREAM_PARAMS=1".split(";")]
    pairs = list(tune.with_incumbent(plan, [(plan.path, {**plan.config, **overrides}) for overrides in sets]))  # as main() does
    assert pairs == [("splitk", plan.config), ("splitk", {**plan.config, "num_warps": 8}),
                     ("splitk", {**plan.config, "num_warps": 8, "num_stages": 3, "STREAM_PARAMS": True})]
    for path, config in pairs:
        w4a16.dispatch.plan_gemm(64, 4096, 4096, 128, torch.float16, cpu, path=path, config=config)  # accepted


@pytest.mark.kernels_ci
def test_confirmed_keeps_the_incumbent_unless_the_win_repeats():
    """An entry changes only if the search's fastest candidate still beats the table's plan by the margin after both
    are timed again, alternately: a lucky first timing (noise, NOTES v23) leaves the entry as it is."""
    tune = _tune_module()
    incumbent, best = (100.0, "splitk", {"SPLIT_K": 4}), (95.0, "splitk", {"SPLIT_K": 8})

    def timer(times):  # the next timing of each candidate, from a script
        order = []

        def time_pair(pair):
            order.append(pair)
            return times[pair[1]["SPLIT_K"]].pop(0)
        return time_pair, order

    lucky, order = timer({4: [99.0, 98.5], 8: [101.0, 100.5]})  # the candidate's 95 was luck: medians 99 against 100.5
    winner, extra = tune.confirmed(lucky, incumbent, best, rounds=2, margin=0.02)
    assert winner == (99.0, "splitk", {"SPLIT_K": 4})
    assert order == [incumbent[1:], best[1:], incumbent[1:], best[1:]] and [us for _, us in extra] == [99.0, 101.0, 98.5, 100.5]
    real, _ = timer({4: [100.5, 99.5], 8: [94.0, 96.0]})  # medians 100 against 95
    assert tune.confirmed(real, incumbent, best, rounds=2, margin=0.02)[0] == (95.0, "splitk", {"SPLIT_K": 8})
    close, _ = timer({4: [99.0], 8: [98.0]})  # medians 99.5 against 96.5: 3% faster, not the 5% margin asked for
    assert tune.confirmed(close, incumbent, best, rounds=1, margin=0.05)[0] == (99.5, "splitk", {"SPLIT_K": 4})
    assert tune.confirmed(close, incumbent, best, rounds=0, margin=0.02) == (best, [])  # no re-check: the search's pick


@pytest.mark.kernels_ci
def test_compare_table_times_the_other_tables_plan(w4a16):
    """--compare-table: the current plan, then the plan another table file holds for the same call (its own format's
    entry where it has one, else its base entry), only if it differs."""
    tune = _tune_module()
    dispatch = w4a16.dispatch
    data = {"group_size": 128, "entries": [
        {"N": 4096, "K": 4096, "M": 16, "path": "splitk", **SIO_16, "us": 9.0},
        {"N": 4096, "K": 4096, "M": 16, "dtype": "float16", "group_size": 128, "symmetric": True, "path": "splitk",
         **{**SIO_16, "DOT_PARTS": 2}, "us": 8.5}]}
    indexed = dispatch.index_tuned_entries(data)
    plan = lambda config: dispatch.plan_gemm(16, 4096, 4096, 128, torch.float16, torch.device("cpu"), path="splitk", config=config)  # noqa: E731
    other = tune.table_plan(w4a16, indexed, 9, 4096, 4096, 128, torch.float16, True, False)  # M = 9: the M = 16 bucket
    assert (other.path, other.config["DOT_PARTS"]) == ("splitk", 2)
    base = tune.table_plan(w4a16, indexed, 16, 4096, 4096, 128, torch.float16, False, False)
    assert base.config == {**plan(SIO_16).config}
    assert tune.table_plan(w4a16, indexed, 16, 8192, 4096, 128, torch.float16, False, False) is None
    current = plan({**SIO_16, "SPLIT_K": 2})
    assert list(tune.with_incumbent(current, (), [other])) == [("splitk", current.config), ("splitk", other.config)]  # as main()
    assert list(tune.with_incumbent(current, (), [])) == list(tune.with_incumbent(current, (), [current])) == [("splitk", current.config)]


@pytest.mark.kernels_ci
@pytest.mark.parametrize("config,changed", [
    ({"BLOCK_M": 128, "num_stages": 3, "SPLIT_K": 2}, {"UNPACK_AHEAD": True}),
    ({"BLOCK_M": 64, "num_stages": 4, "PROGRAMS": 264, "CONSUMERS": 1, "maxnreg": 128, "UNPACK_AHEAD": True},
     {"UNPACK_AHEAD": None}),
    # a second operand set does not fit beside a 256-token accumulator: offered at 128 tokens
    ({"BLOCK_M": 256, "num_stages": 2, "PROGRAMS": 132}, {"BLOCK_M": 128, "num_stages": 4, "UNPACK_AHEAD": True}),
])
def test_around_plan_flips_unpack_ahead_on_pingpong_plans(w4a16, config, changed):
    """--around-plan on a pingpong plan: the plan, then the same with UNPACK_AHEAD flipped (None: the key left out,
    as tuned entries write a default), each a configuration the package accepts."""
    tune = _tune_module()
    dispatch = w4a16.dispatch
    cpu = torch.device("cpu")
    plan = dispatch.plan_gemm(256, 4096, 4096, 128, torch.float16, cpu, path="pingpong", config=config)
    expected = {k: v for k, v in {**plan.config, **changed}.items() if v is not None}
    assert list(tune.around_plan(w4a16, plan, 256)) == [("pingpong", plan.config), ("pingpong", expected)]
    dispatch.plan_gemm(256, 4096, 4096, 128, torch.float16, cpu, path="pingpong", config=expected)  # accepted


@pytest.mark.kernels_ci
def test_report_draws_the_h200_plot_only_from_an_h200_file(tmp_path, monkeypatch):
    """report.py's default plot is the H200 roofline README shows: a results file measured on another GPU (h100.json)
    draws none unless --plot names one, so reporting it cannot overwrite the H200 picture."""
    report = _benchmark_module("report")
    monkeypatch.setattr(report.timing, "REPO", tmp_path)
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    plot = tmp_path / "benchmarks" / "results" / "h200_roofline.png"
    shape = {"shape": "8B.o", "N": 4096, "K": 4096}
    rows = [dict(shape, M=m, impl=impl, us=us * m ** 0.5) for m in (1, 16) for impl, us in (("fp16", 13.0), ("w4a16", 5.0))]
    results = tmp_path / "results.json"
    for gpu, drawn in (("NVIDIA H100 80GB HBM3", False), ("NVIDIA H200", True)):
        results.write_text(json.dumps({"gpu": gpu, "torch": "t", "triton": "t", "date": "d", "commit": "c", "rows": rows}))
        monkeypatch.setattr(sys, "argv", ["report.py", "--results", str(results)])
        report.main()
        assert plot.exists() == drawn, gpu


@pytest.mark.kernels_ci
def test_bench_table_shows_a_ceiling_share_only_for_a_gpu_with_measured_ceilings(capsys):
    """bench_gemm.py's table gives each row's share of the read ceiling measured for the GPU (PERFORMANCE.md: the
    H200's 4.2 TB/s); on another GPU (an H100) it prints no share rather than one of the H200's ceiling."""
    bench = _benchmark_module("bench_gemm")
    rows = [{"shape": "8B.o", "N": 4096, "K": 4096, "M": 1, "impl": "fp16", "us": 8.0}]
    share = 100 * (2 * 4096 * 4096 + 2 * 4096 + 2 * 4096) / 8e-6 / 1e9 / 4.2e3  # f16_bytes: weight, x and y
    for gpu, expected in (("NVIDIA H200", f"{share:.1f}%"), ("NVIDIA H100 80GB HBM3", None)):
        bench.print_table(rows, gpu)
        header, line = capsys.readouterr().out.splitlines()
        if expected:
            assert "%4.2TB/s" in header and line.endswith(expected), (gpu, line)
        else:
            assert "%" not in header + line, (gpu, line)


def test_formats_table_marks_a_worst_point_whose_rows_come_from_two_runs():
    """report.py's formats table: a format's worst (shape, M) is starred where its row and the base's were measured in
    different runs (`same_run`: their cuBLAS times `fp16_us` or their commits differ), with a footnote; a comparison
    within one run is not."""
    report = _benchmark_module("report")
    sym = {"dtype": "fp16", "group_size": 128, "symmetric": True}

    def row(m, us, fp16_us, commit, **fmt):
        return {"shape": "8B.o", "N": 4096, "K": 4096, "M": m, "impl": "w4a16", "us": us, "fp16_us": fp16_us,
                "commit": commit, **fmt}

    base = {"dtype": "fp16", "group_size": 128}
    one_run = [row(1, 5.0, 13.0, "a", **base), row(1, 5.5, 13.0, "a", **sym)]
    table = report.format_table(one_run)
    assert "(0.91, 8B.o M=1;" in table and "*" not in table
    two_runs = [row(1, 5.0, 13.0, "b", **base), row(1, 5.5, 12.5, "a", **sym)]
    table = report.format_table(two_runs)
    assert "(0.91*, 8B.o M=1;" in table and table.endswith("*: the format's row and the base's were measured in different runs.")
    # same commit, another run (another cuBLAS time), and rows of older files without fp16_us: by commit
    assert not report.same_run(row(1, 5.0, 13.0, "a"), row(1, 5.0, 12.9, "a"))
    assert report.same_run({"commit": "a"}, {"commit": "a"}) and not report.same_run({"commit": "a"}, {"commit": "b"})
