"""Regenerate the shipped tuned configurations for the current GPU (run on that GPU).

    python benchmarks/tune.py [--out torch-ext/w4a16/tuned_nvidia_h200.json] [--m 1,2,4,...]

For each shape of shared/bench/shapes.json and each M bucket it times every candidate (path, tile,
split-K, warps, stages, scale mode) with the benchmark method of timing.py (CUDA graph over rotating weight
copies, fp16 activations, group 128, asymmetric by default) and keeps the fastest.

    python benchmarks/tune.py --variant bf16 --merge [--m 32,64]

tunes one other format of timing.VARIANTS (bf16, sym, g64, pc, act_order) and writes entries carrying its
`dtype`, `group_size`, `symmetric` (and `act_order`), which the dispatcher prefers for that format and
exactly those M buckets; every other format and bucket uses the base entries.

    python benchmarks/tune.py --around-plan | --incumbents-only | --try "KEY=INT,...;..." [--merge --m 32,64]

time far fewer candidates per entry (the current plan with one option changed; the current and neighbouring
plans; the current plan with each set of entries replaced): re-checks after a kernel change, and probes.
`--incumbents-only --unlike-base-only --variant V` re-checks only V's entries whose plan differs from the base
format's, the ones a re-tune of the base left behind.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402

M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


def split_counts(tiles: int, k: int, sm_count: int, most: int = 16, per_sm: int = 4) -> list[int]:
    """SPLIT_K values worth timing for a grid of `tiles` output tiles: 1, and every split whose CTAs fit `per_sm`
    per SM with at least two 128-row K blocks each; 3, 6 and 12 too: the right split fills whole waves of CTAs
    (no half-empty last wave)."""
    k_blocks = -(-k // 128)
    return [s for s in (1, 2, 3, 4, 6, 8, 12, 16)
            if s <= most and (s == 1 or (tiles * s <= per_sm * sm_count and k_blocks // s >= 2))]


def register_cap(regs_per_sm: int, ctas: int, num_warps: int) -> int:
    """The largest maxnreg (a multiple of 8) at which `ctas` CTAs of `num_warps` warps fit one SM's registers."""
    return regs_per_sm // (ctas * num_warps * 32) // 8 * 8


def candidates(m: int, n: int, k: int, sm_count: int, regs_per_sm: int = 65536, decode_plans: list | None = None):
    """(path, config) pairs worth timing for this shape; split-K only where it can fill the SMs. `decode_plans`
    (configs of the decode path) replaces the decode candidates."""

    def splits(tiles, most=16):
        return split_counts(tiles, k, sm_count, most)

    def cfg(bn, bm, w, st, split, operand=False, maxnreg=None):
        """A tile plan; operand None: no SCALE_IN_OPERAND key (the GEMV has no scale-in-operand form)."""
        c = {"BLOCK_N": bn, "BLOCK_M": bm, "SPLIT_K": split, "num_warps": w, "num_stages": st}
        if operand is not None:
            c["SCALE_IN_OPERAND"] = operand
        return {**c, "maxnreg": maxnreg} if maxnreg else c

    if m <= 2:
        bm = 1 << (m - 1).bit_length()
        for bn, w, st in ((128, 4, 3), (256, 8, 3)):
            for split in splits(-(-n // bn)):
                yield "gemv", cfg(bn, bm, w, st, split, operand=None)
    if m <= 64:
        bm = 16 if m <= 16 else (32 if m <= 32 else 64)
        # ONE_TOKEN (M = 1, fold): the fold's x sums from x's single row (sm_90 SASS: loop 358 -> 310
        # instructions at BLOCK_N = 128, but one more block-wide barrier); timed against the plain fold.
        # Scale in the operand wants 128 weight rows per warpgroup (else the operand is re-laid out
        # through shared memory): BLOCK_N = 128 with 4 warps, 256 with 8 (or 64 on mma.sync, 2 warps).
        # maxnreg=128: the fold at BLOCK_N = 128 / 256 fits in 128 registers without spilling (sm_90,
        # Triton 3.6), one more CTA per SM than uncapped. (maxnreg=80 fold configs also fit, 20-24 warps
        # per SM, but were 3-13% slower on every shape at M = 1 and 16: results/logs/h200_tune_m1_m16_maxnreg80.json.)
        for bn, w, st, operand, maxnreg in ((64, 4, 4, False, None), (128, 4, 4, False, None), (128, 8, 4, False, None),
                                            (256, 8, 3, False, None), (128, 4, 4, False, 128), (256, 8, 3, False, 128),
                                            (256, 8, 4, False, 128), (128, 4, 4, True, None), (128, 4, 3, True, None),
                                            (256, 8, 4, True, None), (64, 2, 4, True, None)):
            tiles = -(-n // bn) * -(-m // bm)
            for split in splits(tiles):
                for one_token in ((False, True) if (m == 1 and not operand) else (False,)):
                    yield ("splitk" if split > 1 else "tiled"), _with_option(cfg(bn, bm, w, st, split, operand, maxnreg), "ONE_TOKEN",
                                                                             one_token, default=False)
        # Stream-K: a persistent grid of 1-3 programs per SM sharing the (tile, K block) work evenly. All
        # its programs must be resident at once: scale in operand at BLOCK_N = 128 takes ~172 registers
        # (Triton 3.6, sm_90), two 4-warp programs per SM; three also with a register cap that fits them
        # (168 on a 64K-register SM; sm_90 SASS: no spills, the loop as long).
        for bn, w, st, operand in ((128, 4, 4, False), (256, 8, 3, False), (128, 4, 4, True)):
            for per_sm in (1, 2, 3):
                caps = (None, register_cap(regs_per_sm, per_sm, w)) if (operand and per_sm == 3) else (None,)
                for one_token, maxnreg in itertools.product((False, True) if (m == 1 and not operand) else (False,), caps):
                    c = cfg(bn, bm, w, st, 1, operand, maxnreg)
                    del c["SPLIT_K"]
                    yield "streamk", _with_option({**c, "PROGRAMS": per_sm * sm_count}, "ONE_TOKEN", one_token, default=False)
    if m <= 16:
        # decode (Gluon, gemm_decode.py): one program per ROWS weight rows and all of K, its warps sharing the K blocks.
        # Register caps decide how many warps an SM holds (NOTES v27); the zero in the operand or through the x sums
        # (ZEROS_BY_X_SUM) wins by M (NOTES v28); x loaded at use (X_AT_USE) won on the small shapes from M = 2, and a
        # deeper ring under it (AHEAD 2 / 3) lost 5-50%, so it is searched at AHEAD 1 (NOTES v31).
        if decode_plans is not None:
            yield from (("decode", dict(config)) for config in decode_plans)
        else:
            for w, rows, (ahead, x_at_use), cap, by_x_sum in itertools.product(
                    (4, 8), (16, 32), ((1, False), (1, True), (2, False)), (None, 128, 96), (False, True)):
                yield "decode", {"num_warps": w, "ROWS": rows, "AHEAD": ahead, **({"maxnreg": cap} if cap else {}),
                                 **({"ZEROS_BY_X_SUM": True} if by_x_sum else {}), **({"X_AT_USE": True} if x_at_use else {})}
            if m > 8:  # two programs of 8 tokens per weight tile, launched together (TOKENS_FIRST): won on the small
                # shapes at M = 16 (NOTES v37)
                for w, rows, x_at_use, by_x_sum in itertools.product((4, 8), (16, 32), (False, True), (False, True)):
                    yield "decode", {"num_warps": w, "ROWS": rows, "AHEAD": 1, "maxnreg": 128, "BLOCK_M": 8, "TOKENS_FIRST": True,
                                     **({"ZEROS_BY_X_SUM": True} if by_x_sum else {}), **({"X_AT_USE": True} if x_at_use else {})}
    if m >= 64:
        for bn, bm, w, st, operand in ((128, 64, 4, 3, False), (128, 128, 8, 3, False), (256, 64, 8, 3, False),
                                       (256, 128, 8, 3, False), (128, 64, 4, 4, True), (128, 128, 8, 3, True),
                                       (256, 64, 8, 3, True), (256, 128, 8, 3, True), (128, 256, 8, 3, True),
                                       (128, 256, 8, 2, True)):
            if bm > 2 * m:
                continue
            tiles = -(-n // bn) * -(-m // bm)
            for split in splits(tiles, most=4):
                # DOT_PARTS = 2 (scale in operand): the block's dot as two chained 64-row dots, each operand
                # half unpacked right before its MMAs; it won on most M = 64..256 entries on the H200 (NOTES
                # v10). Other values, and DOT_PARTS on fold plans, are left to --around-plan.
                for parts in ((1, 2) if operand else (1,)):
                    yield ("splitk" if split > 1 else "tiled"), _with_option(cfg(bn, bm, w, st, split, operand), "DOT_PARTS", parts,
                                                                             default=1)
    if m >= 64:
        # pingpong (sm_90, Gluon: gemm_pingpong.py), x's ring STAGES deep in shared memory (BLOCK_M x 128 x 2 bytes per
        # stage). Two consumers (128 weight rows) per program, one program per SM, ring <= ~200 KB; or one consumer (64
        # rows) per program, two programs per SM: registers capped at 128 per thread at launch (the consumer takes 232 of
        # its program's share back), ring <= ~110 KB. Each with split-K and with Stream-K (one persistent program per
        # program slot sharing the (tile, K block) units evenly: no half-empty last wave). WORDS_TMA forms stage the
        # weight words in the ring too (8 KB more per stage with two consumers, 4 KB with one), as deep as it fits.
        for rows, per_sm, forms, words_tma_forms, extra in (
                (128, 1, ((64, 3), (64, 4), (64, 6), (128, 3), (128, 4), (256, 2), (256, 3)), ((64, 8), (128, 5), (256, 3)), {}),
                (64, 2, ((64, 4), (128, 2)), ((64, 5), (128, 3)), {"CONSUMERS": 1, "maxnreg": 128})):
            for bm, stages, words_tma in [(*form, False) for form in forms] + [(*form, True) for form in words_tma_forms]:
                if bm > 2 * m:
                    continue
                # (UNPACK_AHEAD is left to --around-plan: it won on 1 of 29 pingpong entries, NOTES v24)
                config = {"BLOCK_M": bm, "num_stages": stages, **extra, **({"WORDS_TMA": True} if words_tma else {})}
                for split in split_counts(-(-n // rows) * -(-m // bm), k, per_sm * sm_count, most=4):
                    yield "pingpong", {**config, "SPLIT_K": split}
                yield "pingpong", {**config, "PROGRAMS": per_sm * sm_count}
    if m >= 64:  # the dense path (dequantize + cuBLAS): the H200 table picks it at M = 512 on four shapes, M >= 1024 on all
        yield "dense", {}


def around_plan(kernel, plan, m: int, act_order: bool = False, n: int = 0, k: int = 0, sm_count: int = 0,
                regs_per_sm: int = 65536):
    """`--around-plan`: the dispatcher's current plan for the call as it is, then with one option changed
    at a time (tensor-core plans): DOT_PARTS set to each other value of 1, 2, 4, 8, at M = 1 (fold
    plans) ONE_TOKEN flipped, for act-order GATHER_PDL flipped (the GEMM launched as a programmatic
    dependent of the gather of x), for scale-in-operand plans STREAM_PARAMS flipped (s / z streamed as
    32-bit words), and for uncapped 4-warp scale-in-operand plans a register cap (with BLOCK_M >= 32 also
    four dot parts and three stages) that fits one more CTA per SM, with and without a grown grid
    (`more_ctas_per_sm`); for pingpong plans UNPACK_AHEAD flipped (`unpack_ahead_forms`); for decode plans
    ZEROS_BY_X_SUM, ADJACENT_ROWS, X_AT_USE and EVICT_FIRST flipped and for act-order GATHER_PDL flipped. Decides the
    options in a few timings where a full search would take minutes per shape."""
    config = dict(plan.config)
    yield plan.path, config
    if plan.path == "pingpong":
        yield from unpack_ahead_forms(config)
        return
    if plan.path == "decode":
        yield plan.path, _with_option(config, "ZEROS_BY_X_SUM", not config.get("ZEROS_BY_X_SUM", False), default=False)
        yield plan.path, _with_option(config, "ADJACENT_ROWS", not config.get("ADJACENT_ROWS", False), default=False)
        yield plan.path, _with_option(config, "X_AT_USE", not config.get("X_AT_USE", False), default=False)
        yield plan.path, _with_option(config, "EVICT_FIRST", not config.get("EVICT_FIRST", False), default=False)
        if act_order:
            yield plan.path, _with_option(config, "GATHER_PDL", not config.get("GATHER_PDL", False), default=False)
        return
    if plan.path not in kernel.dispatch.TENSOR_CORE_PATHS:
        return
    for parts in (1, 2, 4, 8):
        if parts != config.get("DOT_PARTS", 1):
            yield plan.path, _with_option(config, "DOT_PARTS", parts, default=1)
    if m == 1 and not config.get("SCALE_IN_OPERAND", False):
        yield plan.path, _with_option(config, "ONE_TOKEN", not config.get("ONE_TOKEN", False), default=False)
    if act_order:
        yield plan.path, _with_option(config, "GATHER_PDL", not config.get("GATHER_PDL", False), default=False)
    if config.get("SCALE_IN_OPERAND", False):
        yield plan.path, _with_option(config, "STREAM_PARAMS", not config.get("STREAM_PARAMS", False), default=False)
    if n and k and sm_count:
        yield from more_ctas_per_sm(plan.path, config, m, n, k, sm_count, regs_per_sm)


def unpack_ahead_forms(config: dict):
    """("pingpong", config) pairs with the next K block unpacked under the current block's MMAs (UNPACK_AHEAD), or
    without it where the plan has it. The second operand set costs 32 registers per consumer thread: BLOCK_M = 256
    then spills (sm_90, Triton 3.6: 82 spill instructions), so such a plan is offered at BLOCK_M = 128 instead."""
    if config.get("UNPACK_AHEAD"):
        yield "pingpong", _with_option(config, "UNPACK_AHEAD", False, default=False)
    elif config.get("BLOCK_M", 128) <= 128:
        yield "pingpong", {**config, "UNPACK_AHEAD": True}
    else:
        yield "pingpong", {**config, "BLOCK_M": 128, "num_stages": 4, "UNPACK_AHEAD": True}


def more_ctas_per_sm(path: str, config: dict, m: int, n: int, k: int, sm_count: int, regs_per_sm: int = 65536):
    """(path, config) pairs that fit one more CTA per SM than an uncapped 4-warp scale-in-operand plan, for a loop
    that ncu finds latency-bound, its dependency waits hidden only by other resident warps (NOTES v14, v22):
    - BLOCK_M = 16 (~132 registers, three CTAs): capped at 128 four fit (sm_90 SASS, Triton 3.6: no spills, 420
      loop instructions against 413; NOTES v17: within 1% but for 10240 x 8192 at M = 4, 8 with the split grown);
    - BLOCK_M = 32 (~166 registers, three CTAs) and 64 (~222 registers and 88.5 KB of shared memory at four
      stages, two CTAs): capped at 128 / 168 with the block's dot as four chained parts (DOT_PARTS = 4: a quarter
      of the operand live at once; the cap alone spills 4 / 54 instructions) and three stages, four / three fit
      with no spills (NOTES v23).
    Each as is, with STREAM_PARAMS on (it paid with three warps per scheduler, not two: NOTES v22) and with the
    grid grown to use the extra CTA: the largest split whose CTAs still fit, or that many Stream-K programs per SM.
    On the H200 (NOTES v23) the BLOCK_M = 32 / 64 candidates ran 8-20% slower than their plans on 14 of the base
    format's 16 entries at M = 32 / 64 (DOT_PARTS = 4 alone costs as much; the extra CTA wins back 0-2%): the loop
    there is bound by unpacking its weight block, not by resident warps. One won (8B.gate_up M = 64, 4%)."""
    if not config.get("SCALE_IN_OPERAND") or config.get("maxnreg") or config.get("num_warps", 4) != 4:
        return
    block_m = config["BLOCK_M"]
    ctas = 4 if block_m <= 32 else 3
    capped = {**config, "maxnreg": register_cap(regs_per_sm, ctas, 4)}
    if block_m > 16:
        capped.update(DOT_PARTS=4, num_stages=3)
    yield path, capped
    if not config.get("STREAM_PARAMS"):
        yield path, {**capped, "STREAM_PARAMS": True}
    if path == "streamk":
        if config["PROGRAMS"] < ctas * sm_count:
            yield path, {**capped, "PROGRAMS": ctas * sm_count}
        return
    tiles = -(-n // config["BLOCK_N"]) * -(-m // block_m)
    grown = [s for s in split_counts(tiles, k, sm_count, per_sm=ctas) if s > config.get("SPLIT_K", 1)]
    if grown:
        yield "splitk", {**capped, "SPLIT_K": grown[-1]}


def confirmed(time_pair, incumbent: tuple, best: tuple, rounds: int, margin: float) -> tuple[tuple, list]:
    """The entry's decision between its incumbent (the table's plan) and the search's fastest other candidate,
    each given as (us, path, config) from the search: both timed `rounds` more times, alternately (incumbent,
    best, incumbent, best, ...), and `best` kept only if the median of its timings beats the incumbent's median
    by `margin` (a fraction). Why: one timing each swings up to 5% within a run (10% on 57344 x 8192 at M = 32 /
    64: NOTES v23), and the search keeps whichever candidate drew the fastest timing, so a lucky one must not
    change an entry. Returns the winner as (median us, path, config) and the extra timings as (pair, us) for the
    log. `time_pair((path, config))` times one candidate."""
    times = {"incumbent": [incumbent[0]], "best": [best[0]]}
    extra = []
    for _ in range(rounds):
        for name, pick in (("incumbent", incumbent), ("best", best)):
            us = time_pair(pick[1:])
            times[name].append(us)
            extra.append((pick[1:], us))
    incumbent_us, best_us = statistics.median(times["incumbent"]), statistics.median(times["best"])
    if best_us <= (1.0 - margin) * incumbent_us:
        return (best_us, *best[1:]), extra
    return (incumbent_us, *incumbent[1:]), extra


def plan_pair(plan) -> tuple[str, dict]:
    """A dispatcher plan as the (path, config) pair the tuner times and writes: equal pairs launch the same kernel with
    the same configuration, whatever table or format the plans came from."""
    return plan.path, dict(plan.config)


def with_incumbent(plan, pairs, neighbours=()):
    """The dispatcher's current plan for the call, then other plans worth timing against it (`neighbours`: the
    plans of the neighbouring M buckets, or another table's plan for --compare-table), then `pairs` (a search's
    candidates, or --try's variants of the plan), each pair once: a full search then replaces an entry only by a candidate
    that beats it in the same run, also where the entry carries options the candidate list leaves to
    --around-plan (DOT_PARTS; maxnreg on Stream-K) or was borrowed from another format's entries; and a
    search narrowed by --paths still times the plans that won next door (v16: per-channel M = 4 kept a
    Stream-K plan, 91.6 us, because the tiled fold that won at M = 2 and 8, 81 us, was never timed)."""
    seen = []
    for candidate in ([plan] if plan.path != "reference" else []) + [p for p in neighbours if p.path != "reference"]:
        pair = plan_pair(candidate)
        if pair not in seen:
            seen.append(pair)
            yield pair
    for pair in pairs:
        if pair not in seen:
            yield pair


def neighbour_buckets(m: int) -> list[int]:
    """The M buckets next to m's (below and above) in M_BUCKETS."""
    if m not in M_BUCKETS:
        return []
    i = M_BUCKETS.index(m)
    return [M_BUCKETS[j] for j in (i - 1, i + 1) if 0 <= j < len(M_BUCKETS)]


def _with_option(config: dict, key: str, value, default) -> dict:
    """config with `key` set to `value`; left out when that is the kernel's default, as tuned entries write it."""
    return {**{k: v for k, v in config.items() if k != key}, **({} if value == default else {key: value})}


def table_plan(kernel, indexed: tuple, m: int, n: int, k: int, group_size: int, dtype, symmetric: bool, act_order: bool):
    """The plan another table (`dispatch.index_tuned_entries` of its JSON) holds for this call, or None."""
    dispatch = kernel.dispatch
    row = dispatch.tuned_row(*indexed, dispatch.m_bucket(m), n, k, dispatch.format_key(dtype, group_size, symmetric, act_order))
    if row is None:
        return None
    return dispatch.plan_gemm(m, n, k, group_size, dtype, torch.device("cuda"), path=row["path"], config=dispatch.row_config(row),
                              symmetric=symmetric, act_order=act_order)


def fallback_plan(kernel, best_other, n: int, k: int, m: int, fmt_key: tuple) -> dict:
    """A Gluon (decode, pingpong) entry's FALLBACK: the best other plan timed now, else the one the table's entry
    (for format `fmt_key`, `dispatch.format_key`) carries."""
    if best_other is not None:
        return {"path": best_other[1], **best_other[2], "us": round(best_other[0], 2)}
    tuned = kernel.dispatch.load_tuned_table(torch.cuda.get_device_name(0))
    row = kernel.dispatch.tuned_row(tuned[1], tuned[2], m, n, k, fmt_key) if tuned else None
    if not row or "FALLBACK" not in row:
        raise ValueError(f"no plan other than a Gluon one for N={n} K={k} M={m}: time one (e.g. --paths pingpong,tiled)")
    return row["FALLBACK"]


def time_candidate(kernel, weights, x, k, group_size, path, config, reference=None) -> float:
    """GPU time of one candidate; with `reference` (the dense path's output on weights[0]) a candidate
    whose output differs from it by more than 2% (relative) raises instead, so a wrong kernel
    configuration can never be the fastest entry of the table."""
    def call(w):  # the forced path with exactly this configuration, through the package's own entry point
        return kernel.matmul.w4a16_matmul(x, w.qweight, w.scales, w.zeros, w.perm, k, group_size, path=path, config=config)

    if reference is not None:
        err = float((call(weights[0]).float() - reference).norm() / reference.norm())
        if not err < 2e-2:
            raise ValueError(f"wrong output: relative error {err:.2e} against the dense path")
    return timing.gpu_time_us([lambda w=w: call(w) for w in weights], replays=7)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(timing.REPO / "torch-ext" / "w4a16" / "tuned_nvidia_h200.json"))
    ap.add_argument("--m", default=",".join(map(str, M_BUCKETS)))
    ap.add_argument("--shapes", default="", help="comma list of shape names or name=NxK (default: all)")
    ap.add_argument("--log", default="", help="write every timing here (JSON)")
    ap.add_argument("--merge", action="store_true", help="keep the --out table's entries for (N, K, M, format) not tuned now")
    ap.add_argument("--applies-to", default="",
                    help="comma list of device-name parts the --out table serves (default: the merged file's, else H200,H100)")
    ap.add_argument("--overlays", default="",
                    help="the shipped table the --out table refines (dispatch.load_tuned_table), e.g. an H100's entries "
                         "over tuned_nvidia_h200.json (default: the merged file's, else none)")
    ap.add_argument("--variant", default="base", choices=list(timing.VARIANTS),
                    help="weight format to tune (timing.VARIANTS)")
    ap.add_argument("--paths", default="", help="comma list: time only candidates of these paths (the current plan is timed first in any case)")
    narrowed = ap.add_mutually_exclusive_group()  # searches that time a few candidates per entry
    narrowed.add_argument("--around-plan", action="store_true",
                    help="time only the current plan and the same with one option changed (DOT_PARTS; ONE_TOKEN at M = 1; "
                         "GATHER_PDL for act-order; STREAM_PARAMS and one more CTA per SM for scale-in-operand plans; "
                         "UNPACK_AHEAD for pingpong plans; ZEROS_BY_X_SUM, ADJACENT_ROWS, X_AT_USE and EVICT_FIRST for decode plans)")
    narrowed.add_argument("--try", dest="tries", default="",
                          help="time only the current plan and the same with each ';'-separated KEY=INT,... set of entries "
                               "replaced (0 / 1 for options), whatever the plan's path, e.g. 'num_warps=8;num_warps=8,num_stages=3'")
    narrowed.add_argument("--compare-table", default="",
                          help="time only the current plan and the plan this other table file holds for the same call "
                               "(e.g. the table of an older commit, to re-check its changes)")
    narrowed.add_argument("--incumbents-only", action="store_true",
                    help="time only the current plan, the neighbouring M buckets' plans and (a format other than the base) "
                         "the base format's plan for the same shape and M: a cheap check of stale entries")
    ap.add_argument("--unlike-base-only", action="store_true",
                    help="with --incumbents-only, a format other than the base: skip entries whose plan already is the base "
                         "format's for the same shape and M (after a base re-tune, only the entries it left behind)")
    ap.add_argument("--decode-plans", default="",
                    help="time these decode plans instead of the default set: ';'-separated KEY=INT,... configs, e.g. "
                         "'num_warps=4,ROWS=16,AHEAD=1;num_warps=8,ROWS=32,AHEAD=1,maxnreg=128'")
    ap.add_argument("--confirm", type=int, default=2,
                    help="where a candidate beat the entry's current plan: time both this many more times, alternately, "
                         "and change the entry only if the candidate's median time still wins by --margin (0: no re-check)")
    ap.add_argument("--margin", type=float, default=0.02,
                    help="fraction by which a confirmed candidate's median must beat the current plan's (default 0.02)")
    args = ap.parse_args()
    if args.unlike_base_only and not (args.incumbents_only and args.variant != "base"):
        ap.error("--unlike-base-only needs --incumbents-only and a --variant other than base")

    kernel = timing.load_kernel()
    info = timing.machine_info()
    props = torch.cuda.get_device_properties(0)
    sm_count, regs_per_sm = props.multi_processor_count, getattr(props, "regs_per_multiprocessor", 65536)
    paths = set(filter(None, args.paths.split(",")))
    shapes = timing.load_shapes()
    table_group_size = shapes.get("group_size", 128)
    dtype, group_size, symmetric, act_order = timing.VARIANTS[args.variant]
    # entries of a format other than the table's base carry it (dispatch.load_tuned_table), with the
    # effective group size (K for per-channel)
    def format_fields(k: int) -> dict:
        if args.variant == "base":
            return {}
        key = kernel.dispatch.format_key(dtype, timing.effective_group_size(group_size, k), symmetric, act_order)
        fields = dict(zip(("dtype", "group_size", "symmetric"), key[:3]))
        return {**fields, "act_order": True} if act_order else fields
    ms = [int(v) for v in args.m.split(",")]
    compared = kernel.dispatch.index_tuned_entries(json.loads(Path(args.compare_table).read_text())) if args.compare_table else None
    try_sets = [timing.config_overrides(spec, kernel) for spec in args.tries.split(";")] if args.tries else []
    decode_plans = [timing.config_overrides(spec, kernel) for spec in args.decode_plans.split(";")] if args.decode_plans else None
    entries, log = [], []
    kept_table = timing.load_for_merge(args.out, args.merge, info["gpu"], {"entries": []})
    kept = kept_table["entries"]
    applies_to, overlays = table_scope(args.applies_to, args.overlays, kept_table)
    for shape in timing.select_shapes(args.shapes, shapes):
        n, k = shape["N"], shape["K"]
        fmt = format_fields(k)
        g = timing.effective_group_size(group_size, k)
        copies = timing.copies_needed(timing.w4_bytes(n, k, 1, group_size, symmetric))
        weights = timing.random_w4_weights(kernel, n, k, group_size, copies, symmetric, act_order, dtype)
        for m in ms:
            w0 = weights[0]
            current = kernel.plan_for(w0, m, dtype)
            neighbours = [kernel.plan_for(w0, mm, dtype) for mm in neighbour_buckets(m)]
            if args.variant != "base":  # a format can always run the base format's plan (v17: stale symmetric entries)
                base_plan = kernel.dispatch.plan_gemm(m, n, k, table_group_size, torch.float16, w0.qweight.device)
                if args.unlike_base_only and plan_pair(current) == plan_pair(base_plan):
                    print(f"{shape['name']:12s} {args.variant:5s} M={m:5d} skipped: its plan is the base's", flush=True)
                    continue
                neighbours.append(base_plan)
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            reference = kernel.matmul.w4a16_matmul(x, w0.qweight, w0.scales, w0.zeros, w0.perm, k, g, path="dense").float()
            best = best_other = None
            searched = () if args.incumbents_only else (
                pair for pair in candidates(m, n, k, sm_count, regs_per_sm, decode_plans) if not paths or pair[0] in paths)
            if try_sets:  # the current plan with each set of entries replaced
                pairs = with_incumbent(current, [(current.path, {**current.config, **entries}) for entries in try_sets])
            elif args.around_plan:
                pairs = around_plan(kernel, current, m, act_order, n, k, sm_count, regs_per_sm)
            elif compared is not None:  # the current plan, then the other table's for the same call
                other = table_plan(kernel, compared, m, n, k, g, dtype, symmetric, act_order)
                pairs = with_incumbent(current, (), [other] if other is not None else [])
            else:
                pairs = with_incumbent(current, searched, neighbours)
            incumbent = None
            for path, config in pairs:
                try:
                    us = time_candidate(kernel, weights, x, k, g, path, config, reference)
                except Exception as exc:  # a config that does not compile or fit is skipped, and logged
                    log.append({"shape": shape["name"], "M": m, **fmt, "path": path, "config": config, "error": repr(exc)[:300]})
                    continue
                log.append({"shape": shape["name"], "M": m, **fmt, "path": path, "config": config, "us": us})
                timed = (us, path, config)
                if (path, config) == plan_pair(current):
                    incumbent = timed
                if best is None or us < best[0]:
                    best = timed
                if path not in kernel.dispatch.GLUON_PATHS and (best_other is None or us < best_other[0]):
                    best_other = timed
            if best is None:
                continue
            if args.confirm and incumbent is not None and best is not incumbent:
                def time_pair(pair, weights=weights, x=x):  # (bound now: the loop deletes `weights` per shape)
                    return time_candidate(kernel, weights, x, k, g, *pair)
                best, extra = confirmed(time_pair, incumbent, best, args.confirm, args.margin)
                log.extend({"shape": shape["name"], "M": m, **fmt, "path": p, "config": c, "us": t, "confirm": True}
                           for (p, c), t in extra)
            us, path, config = best
            if path in kernel.dispatch.GLUON_PATHS:  # where the Gluon kernel cannot run, the best other plan (runnable_row)
                fmt_key = kernel.dispatch.format_key(dtype, g, symmetric, act_order)
                config = {**config, "FALLBACK": fallback_plan(kernel, best_other, n, k, m, fmt_key)}
            # tuned_at: the tree the entry was measured on, so an entry older than a kernel change shows
            entries.append({"N": n, "K": k, "M": m, **fmt, "path": path, **config, "us": round(us, 2), "tuned_at": info["commit"]})
            print(f"{shape['name']:12s} {args.variant:5s} M={m:5d} best {path:7s} {config} {us:8.2f} us", flush=True)
            # after every entry: a run cut short by its time limit keeps everything it decided
            write_table(args, info, table_group_size, sm_count, merged(kept, entries, kernel.dispatch.entry_key), log,
                        applies_to, overlays)
        del weights
        torch.cuda.empty_cache()
    print(f"wrote {args.out} ({len(entries)} entries)")


def table_scope(applies_to: str, overlays: str, kept_table: dict) -> tuple[list, str | None]:
    """The GPUs the written table serves and the table it refines (`dispatch.load_tuned_table`): the command line's
    (comma list, file name), else those of the table being merged into, else the H200 table's (H200 and H100, none)."""
    return (applies_to.split(",") if applies_to else kept_table.get("applies_to", ["H200", "H100"]),
            overlays or kept_table.get("overlays"))


def merged(kept: list, entries: list, entry_key) -> list:
    """The kept table's entries with those tuned now replacing the same (N, K, M, format) (`dispatch.entry_key`)."""
    new = {entry_key(e) for e in entries}
    return sorted([e for e in kept if entry_key(e) not in new] + entries, key=entry_key)


def write_table(args, info, group_size, sm_count, entries, log, applies_to: list, overlays: str | None) -> None:
    """Written after every entry, so a run cut short still leaves what it measured."""
    table = {
        "about": ("Fastest measured path and launch configuration per (N, K, M bucket); regenerate with benchmarks/tune.py. "
                  "`tuned_at`: the commit of the tree an entry was measured on (entries without it predate the field); "
                  "the searches' logs are benchmarks/results/logs/<gpu>_tune_*."),
        "applies_to": applies_to,
        **({"overlays": overlays} if overlays else {}),
        "measured_on": info,
        "sm_count": sm_count,  # Stream-K's PROGRAMS scale with it (dispatch.programs_for_device)
        "group_size": group_size,
        "entries": entries,
    }
    Path(args.out).write_text(json.dumps(table, indent=1) + "\n")
    if args.log:
        Path(args.log).write_text(json.dumps(log, indent=1) + "\n")


if __name__ == "__main__":
    main()
