"""Probe (GPU): a decode kernel on mma.sync with the K range split over the warps of one program (Gluon).

Design under test (NOTES v27): each program owns ROWS weight rows and all of K; its WARPS warps each take every
WARPS-th 128-row K block, so no program shares an output tile with another (no split-K workspace, no counters)
and the warps' partial tiles are summed through shared memory once at the end. In the loop nothing is shared:
each warp loads its words, x's block, scales and zeros straight into registers (AHEAD blocks in flight, an
unrolled register ring), unpacks the words into mma.sync A fragments of C + q (one shr + lop3 per word and
nibble, register relabelling only), and applies the zero as a second MMA on a constant operand: part =
(C + q) x - (C + z) x, accumulated in fp32 by the tensor core, then acc += s * part (one FFMA per output per
block). No block-wide barrier, no shared-memory hop, no asynchronous MMA wait.

Group size 128 only (one group per block), fp16 / bf16, zeros uint8 or float (ZEROS: 0 symmetric, 1 integer-valued,
2 fractional: the rounding residual of C + z as a third MMA), M <= 16.

    python benchmarks/probe_gluon_decode.py [--shapes 8B.o,70B.gate_up] [--m 1,16] [--out probe.json]
    python benchmarks/probe_gluon_decode.py --compile-only   # sm_90 compile on a machine without a GPU
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

_MAGIC = gl.constexpr((0x64006400, 0x43004300))  # C in both 16-bit halves: fp16 1024.0, bf16 128.0
_MAGIC_VALUE = gl.constexpr((1024.0, 128.0))


@gluon.constexpr_function
def _words_layout(WARPS, ROWS):
    # [WARPS, ROWS, 16] words, warp w on dim 0. Word column c = 4 t + 2 u + h (c bits 0-1 in registers: one 16-byte
    # load per row; bits 2-3 on lanes 0-1), row bits 0-2 on lanes 2-4, row bit 3 and the 16-row tile in registers:
    # the mma.sync m16n8k16 A fragment once the operand's columns are ordered as `_unpack` says.
    reg = [[0, 0, 1], [0, 0, 2], [0, 8, 0]] + [[0, 16 << i, 0] for i in range(int(math.log2(ROWS // 16)))]
    lane = [[0, 0, 4], [0, 0, 8], [0, 1, 0], [0, 2, 0], [0, 4, 0]]
    warp = [[1 << i, 0, 0] for i in range(int(math.log2(WARPS)))]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [WARPS, ROWS, 16])


@gluon.constexpr_function
def _x_layout(WARPS, BLOCK_M):
    # x^T block as 32-bit pairs [WARPS, 64, BLOCK_M]: pair j holds block rows 2 j, 2 j + 1 (j = 8 s + 2 t + u, block
    # row 16 s + 4 t + 2 u + b): u in registers (one 8-byte load), t on lanes 0-1, s in registers; tokens on lanes 2-4
    # (and a second 8 in registers). Kept as 32-bit words until used: carried across the loop as 16-bit halves they
    # cost a byte permute each.
    reg = [[0, 1, 0], [0, 8, 0], [0, 16, 0], [0, 32, 0]] + ([[0, 0, 8]] if BLOCK_M == 16 else [])
    lane = [[0, 2, 0], [0, 4, 0], [0, 0, 1], [0, 0, 2], [0, 0, 4]]
    warp = [[1 << i, 0, 0] for i in range(int(math.log2(WARPS)))]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [WARPS, 64, BLOCK_M])


@gluon.jit
def _unpack_half(words, a_layout: gl.constexpr, dtype: gl.constexpr, MAGIC: gl.constexpr):
    """One half h of a block: words [W, R, 8] uint32 (word columns c = 4 t + 2 u + h of one parity h) -> the A operand
    [W, R, 64] of C + q in dtype. Operand column kk = 16 q + 8 u + 2 t + b holds block row 64 h + 16 q + 4 t + 2 u + b
    (nibble q + 4 b): `_operand_x` orders x's rows the same way."""
    pairs = ()
    for q in gl.static_range(4):
        if q == 0:
            p = gl.inline_asm_elementwise(f"lop3.b32 $0, $1, 0x000F000F, {MAGIC}, 0xEA;", "=r,r", [words],
                                          dtype=gl.uint32, is_pure=True, pack=1)
        else:
            p = gl.inline_asm_elementwise(
                f"{{ .reg .b32 t; shr.b32 t, $1, {4 * q}; lop3.b32 $0, t, 0x000F000F, {MAGIC}, 0xEA; }}", "=r,r", [words],
                dtype=gl.uint32, is_pure=True, pack=1)
        pairs = pairs + (gl.join(p.to(gl.uint16), (p >> 16).to(gl.uint16)),)  # [W, R, 8, 2 (b)]
    j = gl.join(gl.join(pairs[0], pairs[1]), gl.join(pairs[2], pairs[3]))  # [W, R, 8, b, q0, q1]
    W: gl.constexpr = words.shape[0]
    R: gl.constexpr = words.shape[1]
    j = gl.reshape(j, [W, R, 2, 2, 2, 2, 2, 2])  # (w, n, t1, t0, u, b, q0, q1)
    j = gl.permute(j, (0, 1, 7, 6, 4, 2, 3, 5))  # (w, n, q1, q0, u, t1, t0, b)
    a = gl.reshape(j, [W, R, 64])
    return gl.convert_layout(a.to(dtype, bitcast=True), a_layout)


@gluon.jit
def _operand_x(x_pairs, b_layout: gl.constexpr):
    """x^T pairs of one half [W, 32, BLOCK_M] (uint32, pair j = 8 s + 2 t + u of the half's 16 s + 4 t + 2 u + b) ->
    the B operand [W, 64, BLOCK_M] in x's dtype, rows in `_unpack_half`'s column order kk = 16 s + 8 u + 2 t + b."""
    W: gl.constexpr = x_pairs.shape[0]
    BM: gl.constexpr = x_pairs.shape[2]
    lo, hi = gl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [x_pairs], dtype=(gl.float16, gl.float16),
                                       is_pure=True, pack=1)
    j = gl.permute(gl.join(lo, hi), (0, 1, 3, 2))  # [W, 32 (j), 2 (b), BM]
    j = gl.reshape(j, [W, 4, 4, 2, 2, BM])  # (w, s, t, u, b, m)
    j = gl.permute(j, (0, 1, 3, 2, 4, 5))  # (w, s, u, t, b, m)
    return gl.convert_layout(gl.reshape(j, [W, 64, BM]), b_layout)


@gluon.jit
def _load_step(qw_base, x_base, s_base, z_base, step, kb_w, kb_x, kb_p, num_kb, N, WARPS: gl.constexpr, ZEROS: gl.constexpr):
    """Block kb = step * WARPS + w of every warp w: its words, x's [128, BLOCK_M] block, its rows' scales and zeros
    (zeros: the scale again when symmetric, never used). No masks (predicated loads cost a zeroing move per
    register): a block past K is read as the last block again and dropped by its scale (`_step_scale`); rows past N
    and tokens past M are clamped to the last one (read, never stored)."""
    words = gl.load(qw_base + gl.minimum(step * WARPS + kb_w, num_kb - 1) * 1024)
    x = gl.load(x_base + gl.minimum(step * WARPS + kb_x, num_kb - 1) * 64)  # 32-bit pairs of x
    kbp = gl.minimum(step * WARPS + kb_p, num_kb - 1)
    s = gl.load(s_base + kbp * N).to(gl.float32)  # (carried as fp32: 16-bit values cost permutes)
    if ZEROS == 0:
        z = s
    else:
        z = gl.load(z_base + kbp * N).to(gl.float32)
    return words, x, s, z


@gluon.jit
def _decode_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
                   WARPS: gl.constexpr, ROWS: gl.constexpr, BLOCK_M: gl.constexpr, AHEAD: gl.constexpr,
                   ZEROS: gl.constexpr):
    """y[M, N] = x @ W for M <= BLOCK_M (8 or 16), G = 128. Grid (cdiv(N, ROWS), cdiv(M, BLOCK_M)), WARPS warps."""
    dtype: gl.constexpr = x_ptr.dtype.element_ty
    MAGIC: gl.constexpr = _MAGIC[0] if dtype == gl.float16 else _MAGIC[1]
    C: gl.constexpr = _MAGIC_VALUE[0] if dtype == gl.float16 else _MAGIC_VALUE[1]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1, 1], instr_shape=[1, 16, 8])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_layout: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    w_layout: gl.constexpr = _words_layout(WARPS, ROWS)
    x_layout: gl.constexpr = _x_layout(WARPS, BLOCK_M)
    p_layout: gl.constexpr = gl.SliceLayout(2, mma)  # [W, R]: a row's scale / zero, as the accumulator's rows

    n0 = gl.program_id(0) * ROWS
    m0 = gl.program_id(1) * BLOCK_M
    num_kb = (K + 127) // 128

    # words: qweight[n // 64, kb, n % 64, c]
    w_w = gl.arange(0, WARPS, layout=gl.SliceLayout(1, gl.SliceLayout(2, w_layout)))
    w_r = gl.arange(0, ROWS, layout=gl.SliceLayout(0, gl.SliceLayout(2, w_layout)))
    w_c = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, w_layout)))
    n_w = gl.expand_dims(gl.expand_dims(n0 + w_r, 0), 2)
    qw_base = qw_ptr + (n_w // 64) * (num_kb * 1024) + (n_w % 64) * 16 + gl.expand_dims(gl.expand_dims(w_c, 0), 1)
    kb_w = gl.expand_dims(gl.expand_dims(w_w, 1), 2)
    # x^T blocks [W, 128, BLOCK_M], block-row order
    x_w = gl.arange(0, WARPS, layout=gl.SliceLayout(1, gl.SliceLayout(2, x_layout)))
    x_k = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(2, x_layout)))
    x_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, gl.SliceLayout(1, x_layout)))
    tok = gl.expand_dims(gl.expand_dims(gl.minimum(m0 + x_m, M - 1), 0), 1)
    # (x rows are 4-byte aligned: stride_xm even and x 4-byte aligned, the launcher checks)
    x_base = x_ptr.to(gl.pointer_type(gl.uint32), bitcast=True) + tok * (stride_xm // 2) + gl.expand_dims(gl.expand_dims(x_k, 0), 2)
    kb_x = gl.expand_dims(gl.expand_dims(x_w, 1), 2)
    # scales / zeros [W, R] (group = K block)
    p_w = gl.arange(0, WARPS, layout=gl.SliceLayout(1, p_layout))
    p_r = gl.arange(0, ROWS, layout=gl.SliceLayout(0, p_layout))
    n_p = gl.expand_dims(gl.minimum(n0 + p_r, N - 1), 0)
    kb_p = gl.expand_dims(p_w, 1)
    s_base = s_ptr + n_p
    z_base = z_ptr + n_p

    steps = (num_kb + WARPS - 1) // WARPS
    # register ring: each step's loads are issued AHEAD steps before its use. The loop is unrolled by AHEAD + 1 so
    # that every ring slot is refilled in place (a loop-carried tuple rotated by one costs a move per register)
    ring = ()
    for j in gl.static_range(AHEAD):
        ring = ring + (_load_step(qw_base, x_base, s_base, z_base, j, kb_w, kb_x, kb_p, num_kb, N, WARPS, ZEROS),)
    ones = gl.full([WARPS, ROWS, 64], 1.0, dtype, layout=a_layout)
    acc = gl.zeros([WARPS, ROWS, BLOCK_M], gl.float32, layout=mma)
    for i0 in range(0, steps, AHEAD + 1):
        for j in gl.static_range(AHEAD + 1):
            fresh = _load_step(qw_base, x_base, s_base, z_base, i0 + j + AHEAD, kb_w, kb_x, kb_p, num_kb, N, WARPS, ZEROS)
            if j == 0:
                current = ring[0]
                extra = fresh
            else:
                if j == AHEAD:
                    current = extra
                else:
                    current = ring[j]
                new_ring = ()
                for t in gl.static_range(AHEAD):
                    if t == j - 1:
                        new_ring = new_ring + (fresh,)
                    else:
                        new_ring = new_ring + (ring[t],)
                ring = new_ring
            words, x, s, z = current
            # the block as two halves h (word columns of parity h, block rows 64 h ..): each half's operands are
            # built right before its MMAs
            w0, w1 = gl.split(gl.reshape(words.to(gl.uint32, bitcast=True), [WARPS, ROWS, 8, 2]))
            x0, x1 = gl.split(gl.permute(gl.reshape(x, [WARPS, 2, 32, BLOCK_M]), (0, 2, 3, 1)))
            xb0 = _operand_x(x0, b_layout).to(dtype, bitcast=True)
            xb1 = _operand_x(x1, b_layout).to(dtype, bitcast=True)
            zero_acc = gl.zeros([WARPS, ROWS, BLOCK_M], gl.float32, layout=mma)
            part = mma_v2(_unpack_half(w0, a_layout, dtype, MAGIC), xb0, zero_acc)  # sum_k (C + q) x
            part = mma_v2(_unpack_half(w1, a_layout, dtype, MAGIC), xb1, part)
            x_sum = mma_v2(ones, xb1, mma_v2(ones, xb0, zero_acc))  # sum_k x, in every row
            s32 = gl.where((i0 + j) * WARPS + kb_p < num_kb, s, 0.0)  # a step past K adds nothing
            if ZEROS == 0:
                shifted = s32 * (C + 8.0)
            else:
                shifted = s32 * (z + C)
            acc += gl.expand_dims(s32, 2) * part
            acc -= gl.expand_dims(shifted, 2) * x_sum
    total = gl.sum(acc, axis=0)  # [ROWS, BLOCK_M]: the warps' K shares
    out: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [WARPS, 1], [0, 1])
    total = gl.convert_layout(total, out)
    o_n = n0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, out))
    o_m = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, out))
    ptrs = y_ptr + gl.expand_dims(o_m, 0) * stride_ym + gl.expand_dims(o_n, 1)
    gl.store(ptrs, total.to(dtype), mask=(gl.expand_dims(o_n, 1) < N) & (gl.expand_dims(o_m, 0) < M))


def launch(x2, qweight, scales, zeros, warps=4, rows=32, ahead=1, maxnreg=None, out=None):
    m, k = x2.shape
    n = scales.shape[1]
    assert scales.shape[0] * 128 == k, "group size 128 only"
    block_m = 8 if m <= 8 else 16
    assert m <= 16 and k % 128 == 0
    zeros_kind = 0 if zeros is None else (1 if zeros.dtype == torch.uint8 else 2)
    y = torch.empty((m, n), device=x2.device, dtype=x2.dtype) if out is None else out
    grid = (triton.cdiv(n, rows), triton.cdiv(m, block_m))
    _decode_kernel[grid](x2, qweight, scales, scales if zeros is None else zeros, y, m, n, k, x2.stride(0), y.stride(0),
                         WARPS=warps, ROWS=rows, BLOCK_M=block_m, AHEAD=ahead, ZEROS=zeros_kind, num_warps=warps,
                         **({"maxnreg": maxnreg} if maxnreg else {}))
    return y


def compile_sm90(warps=4, rows=32, ahead=1, block_m=8, zeros=1, dtype="fp16"):
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    zt = {0: dtype, 1: "u8", 2: dtype}[zeros]
    signature = {"x_ptr": f"*{dtype}", "qw_ptr": "*i32", "s_ptr": f"*{dtype}", "z_ptr": f"*{zt}", "y_ptr": f"*{dtype}",
                 "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_ym": "i32"}
    constexprs = {"WARPS": warps, "ROWS": rows, "BLOCK_M": block_m, "AHEAD": ahead, "ZEROS": zeros}
    names = list(signature) + list(constexprs)
    signature.update({name: "constexpr" for name in constexprs})
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in ("x_ptr", "qw_ptr", "s_ptr", "z_ptr", "y_ptr", "N", "K",
                                                                      "stride_xm", "stride_ym")}
    source = GluonASTSource(_decode_kernel, signature, {(names.index(k),): v for k, v in constexprs.items()}, attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--shapes", default="")
    ap.add_argument("--m", default="1,16")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.compile_only:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from sass_report import hot_loop_summary
        for cfg in ({}, {"rows": 64}, {"ahead": 3}, {"zeros": 2}, {"zeros": 0}, {"block_m": 16}, {"warps": 8}):
            kernel = compile_sm90(**cfg)
            summary = hot_loop_summary(kernel.asm["cubin"])
            summary.pop("mma_positions", None)
            print(cfg, "smem", kernel.metadata.shared, summary)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import timing

    kernel = timing.load_kernel()
    rows_out = []
    for n, k, m, dt, zeros_kind in ((200, 384, 3, torch.float16, "frac"), (256, 1024, 5, torch.bfloat16, "uint8"),
                                    (130, 256, 1, torch.float16, "sym"), (192, 640, 16, torch.bfloat16, "frac"),
                                    (64, 128, 2, torch.float16, "uint8")):
        shape = kernel.layout.native_qweight_shape(n, k)
        zeros = {"sym": None, "uint8": torch.randint(0, 16, (k // 128, n), device="cuda").to(torch.uint8),
                 "frac": (torch.rand(k // 128, n, device="cuda") * 15).to(dt)}[zeros_kind]
        w = kernel.W4A16Weight(qweight=torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int32, device="cuda"),
                               scales=(torch.rand(k // 128, n, device="cuda") * 0.02 + 0.001).to(dt), zeros=zeros, perm=None,
                               in_features=k, out_features=n, group_size=128)
        x = torch.randn(m, k, device="cuda", dtype=dt)
        ref = (x.double() @ w.dequantize(torch.float64)).float()  # float64 reference, W [K, N]
        for cfg in (dict(warps=4, rows=16), dict(warps=8, rows=32, ahead=2)):
            y = launch(x, w.qweight, w.scales, w.zeros, **cfg).float()
            err = ((y - ref).abs().max() / ref.abs().max()).item()
            print(f"check N={n} K={k} M={m} {dt} zeros={zeros_kind} {cfg}: rel err {err:.1e}", flush=True)
            rows_out.append({"check": [n, k, m, str(dt), zeros_kind], **cfg, "rel_err": err})
    ms = [int(v) for v in args.m.split(",")]
    print(f"{'shape':12s} {'M':>3s} {'w4a16':>8s} {'best':>8s} {'ratio':>6s}  best config / err", flush=True)
    for shape in timing.select_shapes(args.shapes):
        n, k = shape["N"], shape["K"]
        copies = timing.copies_needed(timing.w4_bytes(n, k, 16, 128))
        weights = timing.random_w4_weights(kernel, n, k, 128, copies)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            ref = kernel.w4a16_linear(x, weights[0]).float()
            ours = timing.gpu_time_us([lambda w=w: kernel.w4a16_linear(x, w) for w in weights])
            rows_out.append({"shape": shape["name"], "N": n, "K": k, "M": m, "impl": "w4a16", "us": ours})
            caps = (128, 96, 80) if m <= 8 else (None, 128, 96)
            configs = [dict(warps=w, rows=r, ahead=a, maxnreg=cap) for w in (4, 8) for r in (16, 32) for a in (1, 2) for cap in caps]
            best = None
            for cfg in configs:
                try:
                    w0 = weights[0]
                    y = launch(x, w0.qweight, w0.scales, w0.zeros, **cfg).float()
                    err = ((y - ref).abs().max() / ref.abs().max()).item()
                    us = timing.gpu_time_us([lambda w=w: launch(x, w.qweight, w.scales, w.zeros, **cfg) for w in weights])
                except Exception as exc:  # a config that does not compile or launch: report, go on
                    print(f"  {shape['name']} M={m} {cfg}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                rows_out.append({"shape": shape["name"], "N": n, "K": k, "M": m, "impl": "gluon_decode", **cfg, "us": us,
                                 "rel_err": err})
                if best is None or us < best[0]:
                    best = (us, cfg, err)
            if best:
                print(f"{shape['name']:12s} {m:3d} {ours:8.2f} {best[0]:8.2f} {ours / best[0]:6.2f}  {best[1]} err {best[2]:.1e}",
                      flush=True)
        del weights
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps({**timing.machine_info(), "rows": rows_out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
