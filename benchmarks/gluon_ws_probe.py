"""Gluon prototype (branch exp/gluon-ws, NOTES v17 lead 2): a warp-specialised tensor-core W4A16 GEMM for mid and
large M. A producer warpgroup dequantizes the weight tile into a shared-memory ring (and starts the TMA copy of the
matching x tile); the consumer warpgroup(s) issue wgmma with both operands in shared memory, so the unpack runs
while the tensor cores work instead of before them.

    y[M, N] = x[M, K] @ W[K, N],  W = (q - z) * s   (group 128, asymmetric, uint8 zeros; fp16)

x fp16 [M, K] through a TMA descriptor (block [BLOCK_M, 64]); qweight int32 [ceil(N/64), K/128, 64, 16] (layout.py:
word 2p + h of row n holds at nibble q + 4t the code of k = 128 b + 64 h + 16 q + 2 p + t); scales fp16 [K/128, N];
zeros uint8 [K/128, N]; y fp16 [M, N]. Grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)), BLOCK_N = 128 (the M tiles of one weight tile run side by side, so
the second reads it from L2).

    python benchmarks/gluon_ws_probe.py --shapes 8B.qkv,70B.qkv --m 128,256 --out ws.json      (GPU)
    python benchmarks/gluon_ws_probe.py --compile-only                                           (CPU: sm_90 SASS)
"""
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared  # renamed after Triton 3.6

BLOCK_N = gl.constexpr(128)
HALF_K = gl.constexpr(64)  # one shared-memory sub-tile: 64 fp16 = one 128-byte swizzle row


@gluon.jit
def _dequant_pairs(words, s2, r2, q: gl.constexpr):
    # nibbles q, q + 4 of each word -> (C + q) fp16 pair (shr + lop3) -> (c - R) * s (sub + mul on f16x2); t = lo / hi
    pairs = gl.inline_asm_elementwise(
        f"{{ .reg .b32 t; shr.b32 t, $1, {4 * q}; lop3.b32 t, t, 0x000F000F, 0x64006400, 0xEA; sub.f16x2 t, t, $3; mul.rn.f16x2 $0, t, $2; }}",
        "=r,r,r,r", [words, s2, r2], dtype=gl.uint32, is_pure=True, pack=1)
    lo = pairs.to(gl.uint16).to(gl.float16, bitcast=True)
    hi = (pairs >> 16).to(gl.uint16).to(gl.float16, bitcast=True)
    return gl.join(lo, hi)


@gluon.jit
def _dequant_half(words, s2, r2):
    # words [BLOCK_N, 8] (p = 0..7 of one h) -> weights [BLOCK_N, 64], k = 32 q1 + 16 q0 + 2 p + t; s2, r2 [BLOCK_N]
    row_layout: gl.constexpr = gl.SliceLayout(1, words.type.layout)
    s2 = gl.expand_dims(gl.convert_layout(s2, row_layout), 1)
    r2 = gl.expand_dims(gl.convert_layout(r2, row_layout), 1)
    j = gl.join(gl.join(_dequant_pairs(words, s2, r2, 0), _dequant_pairs(words, s2, r2, 1)),
                gl.join(_dequant_pairs(words, s2, r2, 2), _dequant_pairs(words, s2, r2, 3)))  # (n, p, t, q0, q1)
    j = gl.reshape(j, [BLOCK_N, 8, 2, 2, 2])
    j = gl.permute(j, (0, 4, 3, 1, 2))  # (n, q1, q0, p, t)
    return gl.reshape(j, [BLOCK_N, 64])


@gluon.jit
def _pack_pair(v):
    bits = v.to(gl.uint16, bitcast=True).to(gl.uint32)
    return bits | (bits << 16)


@gluon.jit
def _producer(x_desc, qw_ptr, s_ptr, z_ptr, w_smem, x_smem, w_ready, x_ready, empty, N, num_kb,
              BLOCK_M: gl.constexpr, STAGES: gl.constexpr):
    """4 warps: per K block, wait for a free stage, start x's TMA copy into it, dequantize the [128, 128] weight tile
    into it (each thread one output row: its 16 words are 64 contiguous bytes), signal w_ready. Words, scales and
    zeros are loaded two blocks ahead."""
    tile_m = gl.program_id(0)
    tile_n = gl.program_id(1)
    words_layout: gl.constexpr = gl.BlockedLayout([1, 16], [32, 1], [4, 1], [1, 0])
    row_layout: gl.constexpr = gl.SliceLayout(1, words_layout)
    n = tile_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=row_layout)
    cols = gl.arange(0, 16, layout=gl.SliceLayout(0, words_layout))
    n_ok = n < N
    word_ptrs = qw_ptr + ((n // 64) * num_kb * 1024 + (n % 64) * 16)[:, None] + cols[None, :]

    w0 = gl.load(word_ptrs, mask=n_ok[:, None], other=0)
    s0 = gl.load(s_ptr + n, mask=n_ok, other=0.0)
    z0 = gl.load(z_ptr + n, mask=n_ok, other=0)
    nxt = gl.minimum(1, num_kb - 1)
    w1 = gl.load(word_ptrs + nxt * 1024, mask=n_ok[:, None], other=0)
    s1 = gl.load(s_ptr + nxt * N + n, mask=n_ok, other=0.0)
    z1 = gl.load(z_ptr + nxt * N + n, mask=n_ok, other=0)
    for kb in range(num_kb):
        stage = kb % STAGES
        phase = (kb // STAGES) & 1
        words = w0.to(gl.uint32, bitcast=True)
        s = s0
        z = z0
        w0 = w1
        s0 = s1
        z0 = z1
        nxt = gl.minimum(kb + 2, num_kb - 1)
        w1 = gl.load(word_ptrs + nxt * 1024, mask=n_ok[:, None], other=0)
        s1 = gl.load(s_ptr + nxt * N + n, mask=n_ok, other=0.0)
        z1 = gl.load(z_ptr + nxt * N + n, mask=n_ok, other=0)

        mbarrier.wait(empty.index(stage), phase ^ 1)
        mbarrier.expect(x_ready.index(stage), 2 * x_desc.block_type.nbytes)
        _tma_load(x_desc, [tile_m * BLOCK_M, kb * 128], x_ready.index(stage), x_smem.index(2 * stage))
        _tma_load(x_desc, [tile_m * BLOCK_M, kb * 128 + 64], x_ready.index(stage),
                                        x_smem.index(2 * stage + 1))
        s2 = _pack_pair(s)
        r2 = _pack_pair((z.to(gl.float32) + 1024.0).to(gl.float16))
        halves = gl.split(gl.reshape(words, [BLOCK_N, 8, 2]))  # word 2p + h -> (h = 0, h = 1)
        w_smem.index(2 * stage).store(_dequant_half(halves[0], s2, r2))
        w_smem.index(2 * stage + 1).store(_dequant_half(halves[1], s2, r2))
        fence_async_shared()
        mbarrier.arrive(w_ready.index(stage), count=1)


@gluon.jit
def _consumer(w_smem, x_smem, w_ready, x_ready, empty, y_ptr, M, N, stride_ym, num_kb,
              BLOCK_M: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """num_warps (4 or 8) warps: acc[n, m] += W tile . x tile^T per K block (two wgmma of K = 64, both operands in
    shared memory), one block's MMAs in flight while the next waits; then y = acc^T in fp16."""
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_M, 16])
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma_layout)
    for kb in range(num_kb):
        stage = kb % STAGES
        phase = (kb // STAGES) & 1
        mbarrier.wait(w_ready.index(stage), phase)
        mbarrier.wait(x_ready.index(stage), phase)
        acc = warpgroup_mma(w_smem.index(2 * stage), x_smem.index(2 * stage).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(w_smem.index(2 * stage + 1), x_smem.index(2 * stage + 1).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=2, deps=[acc])  # the previous block's MMAs are done
        mbarrier.arrive(empty.index((kb + STAGES - 1) % STAGES), count=1, pred=kb > 0)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])

    out_layout: gl.constexpr = gl.BlockedLayout([8, 1], [16, 2], [1, num_warps], [0, 1])
    out = gl.convert_layout(acc.to(gl.float16), out_layout)
    offs_n = gl.program_id(1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, out_layout))
    offs_m = gl.program_id(0) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, out_layout))
    gl.store(y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None], out, mask=(offs_m[None, :] < M) & (offs_n[:, None] < N))


@gluon.jit
def w4a16_ws_kernel(x_desc, qw_ptr, s_ptr, z_ptr, y_ptr, M, N, K, stride_ym,
                    BLOCK_M: gl.constexpr, STAGES: gl.constexpr, PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr):
    w_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    w_smem = gl.allocate_shared_memory(gl.float16, [2 * STAGES, BLOCK_N, HALF_K], w_layout)
    x_smem = gl.allocate_shared_memory(gl.float16, [2 * STAGES, BLOCK_M, HALF_K], x_desc.layout)
    w_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    x_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(w_ready.index(i), count=1)
        mbarrier.init(x_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    num_kb = K // 128
    gl.warp_specialize([
        (_consumer, (w_smem, x_smem, w_ready, x_ready, empty, y_ptr, M, N, stride_ym, num_kb, BLOCK_M, STAGES, num_warps)),
        (_producer, (x_desc, qw_ptr, s_ptr, z_ptr, w_smem, x_smem, w_ready, x_ready, empty, N, num_kb, BLOCK_M, STAGES)),
    ], [4], [PRODUCER_REGS])


@gluon.constexpr_function
def operand_words_layout():
    # [64 rows, 16 words] whose unpacking lands in the m64 wgmma A-operand layout of one warpgroup by register
    # relabelling (word column c = 2p + h: c bits 0 and 3 in registers, 1 and 2 on lanes; row bit 3 in registers)
    return gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 8], [8, 0]], lane_bases=[[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 16])


@gluon.jit
def _operand(words, s2, r2, a_layout: gl.constexpr):
    # words [64, 16] -> two A operands [64, 64] of (q - z) * s (h = 0, 1), k = 32 q1 + 16 q0 + 8 p2 + 4 p1 + 2 p0 + t
    j = gl.join(gl.join(_dequant_pairs(words, s2, r2, 0), _dequant_pairs(words, s2, r2, 1)),
                gl.join(_dequant_pairs(words, s2, r2, 2), _dequant_pairs(words, s2, r2, 3)))  # (n, c, t, q0, q1)
    j = gl.reshape(j, [64, 2, 2, 2, 2, 2, 2, 2])  # (n, p2, p1, p0, h, t, q0, q1)
    j = gl.permute(j, (0, 7, 6, 1, 2, 3, 5, 4))  # (n, q1, q0, p2, p1, p0, t, h)
    lo, hi = gl.split(gl.reshape(j, [64, 64, 2]))
    return gl.convert_layout(lo, a_layout, assert_trivial=True), gl.convert_layout(hi, a_layout, assert_trivial=True)


@gluon.jit
def _pingpong_consumer(qw_ptr, s_ptr, z_ptr, y_ptr, x_smem, x_ready, empty, M, N, stride_ym, num_kb,
                       HALF: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr):
    """One warpgroup: rows HALF * 64 .. + 63 of the program's 128-row weight tile. Per K block: its words (loaded two
    blocks ahead into registers) unpacked straight into the A-operand registers as (q - z) * s, one wgmma against
    x's tile in shared memory (B), wait, release the stage. The two warpgroups drift apart, so one unpacks while the
    other's MMA runs (ping-pong without explicit ordering)."""
    tile_m = gl.program_id(0)
    tile_n = gl.program_id(1)
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    w_layout: gl.constexpr = operand_words_layout()
    n = tile_n * 128 + HALF * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, w_layout))
    cols = gl.arange(0, 16, layout=gl.SliceLayout(0, w_layout))
    n_ok = n < N
    word_ptrs = qw_ptr + ((n // 64) * num_kb * 1024 + (n % 64) * 16)[:, None] + cols[None, :]
    w0 = gl.load(word_ptrs, mask=n_ok[:, None], other=0)
    s0 = gl.load(s_ptr + n, mask=n_ok, other=0.0)
    z0 = gl.load(z_ptr + n, mask=n_ok, other=0)
    nxt = gl.minimum(1, num_kb - 1)
    w1 = gl.load(word_ptrs + nxt * 1024, mask=n_ok[:, None], other=0)
    s1 = gl.load(s_ptr + nxt * N + n, mask=n_ok, other=0.0)
    z1 = gl.load(z_ptr + nxt * N + n, mask=n_ok, other=0)
    acc = gl.zeros([64, BLOCK_M], gl.float32, layout=mma_layout)
    for kb in range(num_kb):
        stage = kb % STAGES
        phase = (kb // STAGES) & 1
        words = w0.to(gl.uint32, bitcast=True)
        s = s0
        z = z0
        w0 = w1
        s0 = s1
        z0 = z1
        nxt = gl.minimum(kb + 2, num_kb - 1)
        w1 = gl.load(word_ptrs + nxt * 1024, mask=n_ok[:, None], other=0)
        s1 = gl.load(s_ptr + nxt * N + n, mask=n_ok, other=0.0)
        z1 = gl.load(z_ptr + nxt * N + n, mask=n_ok, other=0)
        s2 = gl.expand_dims(_pack_pair(s), 1)
        r2 = gl.expand_dims(_pack_pair((z.to(gl.float32) + 1024.0).to(gl.float16)), 1)
        a_lo, a_hi = _operand(words, s2, r2, a_layout)
        mbarrier.wait(x_ready.index(stage), phase)
        acc = warpgroup_mma(a_lo, x_smem.index(2 * stage).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(a_hi, x_smem.index(2 * stage + 1).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        mbarrier.arrive(empty.index(stage), count=1)

    out_layout: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1])
    out = gl.convert_layout(acc.to(gl.float16), out_layout)
    offs_n = tile_n * 128 + HALF * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, out_layout))
    offs_m = tile_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, out_layout))
    gl.store(y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None], out, mask=(offs_m[None, :] < M) & (offs_n[:, None] < N))


@gluon.jit
def _x_loader(x_desc, x_smem, x_ready, empty, num_kb, BLOCK_M: gl.constexpr, STAGES: gl.constexpr):
    """One warp: x's [BLOCK_M, 128] tile of each K block into the ring by TMA (two 64-column boxes), once both
    consumers have released the stage."""
    tile_m = gl.program_id(0)
    for kb in range(num_kb):
        stage = kb % STAGES
        phase = (kb // STAGES) & 1
        mbarrier.wait(empty.index(stage), phase ^ 1)
        mbarrier.expect(x_ready.index(stage), 2 * x_desc.block_type.nbytes)
        _tma_load(x_desc, [tile_m * BLOCK_M, kb * 128], x_ready.index(stage), x_smem.index(2 * stage))
        _tma_load(x_desc, [tile_m * BLOCK_M, kb * 128 + 64], x_ready.index(stage),
                                        x_smem.index(2 * stage + 1))


@gluon.jit
def w4a16_pingpong_kernel(x_desc, qw_ptr, s_ptr, z_ptr, y_ptr, M, N, K, stride_ym,
                          BLOCK_M: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    x_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    x_smem = gl.allocate_shared_memory(gl.float16, [2 * STAGES, BLOCK_M, 64], x_layout)
    x_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(x_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    num_kb = K // 128
    gl.warp_specialize([
        (_pingpong_consumer, (qw_ptr, s_ptr, z_ptr, y_ptr, x_smem, x_ready, empty, M, N, stride_ym, num_kb, 0, BLOCK_M, STAGES)),
        (_pingpong_consumer, (qw_ptr, s_ptr, z_ptr, y_ptr, x_smem, x_ready, empty, M, N, stride_ym, num_kb, 1, BLOCK_M, STAGES)),
        (_x_loader, (x_desc, x_smem, x_ready, empty, num_kb, BLOCK_M, STAGES)),
    ], [4, 1], [CONSUMER_REGS, 24])




def x_descriptor(x, block_m):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    return TensorDescriptor.from_tensor(x, [block_m, 64], layout)


def launch(x, qweight, scales, zeros, y, block_m=128, stages=3, regs=168, num_warps=4, fn=None):
    m, k = x.shape
    n = y.shape[1]
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, 128))
    fn = fn or w4a16_ws_kernel
    return fn[grid](x_descriptor(x, block_m), qweight, scales, zeros, y, m, n, k, y.stride(0), block_m, stages, regs,
                    num_warps=num_warps)


def compile_only(block_m=128, stages=3, producer_regs=168, num_warps=4, maxnreg=None, fn=None):
    """sm_90 compile on a machine without a GPU: ptx / sass text to /tmp/ws/."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import JITFunction  # noqa: F401

    x = torch.empty(256, 4096, dtype=torch.float16)
    desc = x_descriptor(x, block_m)
    fn = fn or w4a16_ws_kernel
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend
    kind, _ = native_specialize_impl(CUDABackend, desc, False, True, True)
    sig = {"x_desc": kind, "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*u8", "y_ptr": "*fp16", "M": "i32", "N": "i32",
           "K": "i32", "stride_ym": "i32", "BLOCK_M": "constexpr", "STAGES": "constexpr", (fn.arg_names[-2]): "constexpr",
           "num_warps": "constexpr"}
    names = list(sig)
    constexprs = {(names.index("BLOCK_M"),): block_m, (names.index("STAGES"),): stages,
                  (names.index(fn.arg_names[-2]),): producer_regs, (names.index("num_warps"),): num_warps}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in ("qw_ptr", "s_ptr", "z_ptr", "y_ptr", "N", "K", "stride_ym")}
    opts = {"num_warps": num_warps}
    if maxnreg:
        opts["maxnreg"] = maxnreg
    return triton.compile(GluonASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32), options=opts)


VARIANTS = [  # (kernel, BLOCK_M, STAGES, worker registers, num_warps)
    ("ws", 128, 3, 168, 4),
    ("pp", 64, 6, 232, 4), ("pp", 128, 4, 232, 4), ("pp", 128, 3, 232, 4), ("pp", 256, 3, 232, 4), ("pp", 256, 2, 232, 4),
]


def main() -> None:
    import argparse
    import json
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, "benchmarks")
    import timing

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="8B.qkv,8B.o,8B.gate_up,8B.down,70B.qkv,70B.o,70B.gate_up,70B.down")
    ap.add_argument("--m", default="64,128,256,512")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    kernel = timing.load_kernel()
    wanted = set(args.shapes.split(","))
    rows = []
    for shape in timing.load_shapes()["shapes"]:
        if shape["name"] not in wanted:
            continue
        n, k = shape["N"], shape["K"]
        copies = timing.copies_needed(timing.w4_bytes(n, k, 1, 128))
        weights = timing.random_w4_weights(kernel, n, k, 128, copies)
        dense = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(timing.copies_needed(n * k * 2))]
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            w0 = weights[0]
            reference = kernel.matmul.w4a16_matmul(x, w0.qweight, w0.scales, w0.zeros, None, k, 128, path="dense").float()
            ours = timing.gpu_time_us([lambda w=w: kernel.w4a16_linear(x, w) for w in weights])
            fp16 = timing.gpu_time_us([lambda w=w: torch.nn.functional.linear(x, w) for w in dense])
            best = None
            for name, block_m, stages, regs, warps in VARIANTS:
                fn = {"ws": w4a16_ws_kernel, "pp": w4a16_pingpong_kernel}[name]
                if block_m > max(64, triton.next_power_of_2(m)):
                    continue
                y = torch.empty(m, n, device="cuda", dtype=torch.float16)
                try:
                    launch(x, w0.qweight, w0.scales, w0.zeros, y, block_m, stages, regs, warps, fn)
                    torch.cuda.synchronize()
                    err = float((y.float() - reference).norm() / reference.norm())
                    us = timing.gpu_time_us([lambda w=w: launch(x, w.qweight, w.scales, w.zeros, y, block_m, stages, regs, warps, fn)
                                             for w in weights])
                except Exception as exc:  # a variant that does not compile / fit is reported, not fatal
                    print(f"{shape['name']:12s} M={m:4d} BM={block_m} ST={stages} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                row = {"shape": shape["name"], "N": n, "K": k, "M": m, "kernel": name, "BLOCK_M": block_m, "STAGES": stages, "worker_regs": regs,
                       "num_warps": warps, "rel_err": err, "ws_us": us, "w4a16_us": ours, "fp16_us": fp16,
                       "w4a16_plan": str(kernel.plan_for(w0, m))}
                rows.append(row)
                if err < 1e-2 and (best is None or us < best):
                    best = us
                print(f"{shape['name']:12s} M={m:4d} {name} BM={block_m:3d} ST={stages} W={warps} err={err:.1e} ws {us:8.2f} | w4a16 {ours:8.2f} "
                      f"| fp16 {fp16:8.2f} us", flush=True)
            if best:
                print(f"== {shape['name']:12s} M={m:4d} best ws {best:8.2f} w4a16 {ours:8.2f} fp16 {fp16:8.2f}: fp16/ws {fp16 / best:.2f} "
                      f"(w4a16 {fp16 / ours:.2f})", flush=True)
        del weights, dense
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps({**timing.machine_info(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    import sys
    if "--compile-only" in sys.argv:
        import os
        os.makedirs("/tmp/ws", exist_ok=True)
        k = compile_only()
        for ext in ("ttgir", "ptx"):
            open(f"/tmp/ws/ws.{ext}", "w").write(k.asm[ext])
        open("/tmp/ws/ws.cubin", "wb").write(k.asm["cubin"])
        print("shared", k.metadata.shared)
    else:
        main()
