"""Where Gluon puts barriers around a shared-memory ring filled by cp.async (CPU only: compiles for sm_90, no GPU).

    python benchmarks/probe_x_ring_barriers.py

Question (NOTES v40): can the decode kernel stage x's blocks in shared memory (16-byte cp.async lines instead of
8-byte register loads in the MMA layout, NOTES v38) without a block-wide barrier in its loop? Each warp copies and reads
only its own K blocks, so the data flow needs none; Gluon's membar pass decides what is emitted. Two probe kernels run
the same warp-private ring of [8 tokens, 64 row pairs] uint32 stages, 3 deep:

    cta        one program of 4 warps, one ring per warp (the warp index on the ring's leading dimension)
    partitions `gl.warp_specialize` with four one-warp worker partitions, each with its own ring, and an idle default
               partition of 4 warps (Triton asks for a multiple of 4 there)

and the script counts the barrier instructions in their PTX. On Triton 3.6 and 3.9 alike: `cta` has a `bar.sync 0`
after its loop's `cp.async.wait_group` (and more in the prologue), `partitions` only `bar.warp.sync` in its loops (after
the wait, and before a copy into a stage just read); its named `barrier.sync 1` sit at the partitions' entry and exit
(with their `setmaxnreg`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402

import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import async_copy  # noqa: E402

BLOCK_M, STAGES = 8, 3
_copy = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared  # renamed after Triton 3.6


@gluon.jit
def _ring_loop(x_ptr, y_ptr, ring, K, WARP: gl.constexpr, WARPS: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr):
    """One warp's loop: x's blocks WARP, WARP + WARPS, ... ([BM, 64] uint32 row pairs) copied STAGES - 1 steps ahead
    into its ring and read back two pairs a lane (the decode kernel's x operand access)."""
    copy: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [1, 1], [1, 0])  # 16 bytes a lane, a token's 256 bytes per 16 lanes
    read: gl.constexpr = gl.BlockedLayout([1, 2], [8, 4], [1, 1], [1, 0])
    m = gl.arange(0, BM, layout=gl.SliceLayout(1, copy))
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, copy))
    src = x_ptr + WARP * 64 + gl.expand_dims(m, 1) * (K // 2) + gl.expand_dims(c, 0)
    for j in gl.static_range(STAGES - 1):
        _copy(ring.index(j), src + j * WARPS * 64)
        async_copy.commit_group()
    acc = gl.zeros([BM, 64], gl.uint32, read)
    for i in range(K // (128 * WARPS)):
        _copy(ring.index((i + STAGES - 1) % STAGES), src + (i + STAGES - 1) * WARPS * 64)
        async_copy.commit_group()
        async_copy.wait_group(STAGES - 1)
        acc = acc ^ ring.index(i % STAGES).load(read)
    rm = gl.arange(0, BM, layout=gl.SliceLayout(1, read))
    rc = gl.arange(0, 64, layout=gl.SliceLayout(0, read))
    gl.store(y_ptr + WARP * BM * 64 + gl.expand_dims(rm, 1) * 64 + gl.expand_dims(rc, 0), acc)


@gluon.jit
def _cta_kernel(x_ptr, y_ptr, K, BM: gl.constexpr, STAGES: gl.constexpr):
    copy: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 2, 16], [4, 1, 1], [2, 1, 0])
    read: gl.constexpr = gl.BlockedLayout([1, 1, 2], [1, 8, 4], [4, 1, 1], [2, 1, 0])
    ring = gl.allocate_shared_memory(gl.uint32, [STAGES, 4, BM, 64],
                                     gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=4, order=[2, 1, 0]))
    w = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, copy)))
    m = gl.arange(0, BM, layout=gl.SliceLayout(0, gl.SliceLayout(2, copy)))
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(1, copy)))
    src = (x_ptr + gl.expand_dims(gl.expand_dims(w, 1), 2) * 64 + gl.expand_dims(gl.expand_dims(m, 0), 2) * (K // 2)
           + gl.expand_dims(gl.expand_dims(c, 0), 1))
    for j in gl.static_range(STAGES - 1):
        _copy(ring.index(j), src + j * 4 * 64)
        async_copy.commit_group()
    acc = gl.zeros([4, BM, 64], gl.uint32, read)
    for i in range(K // 512):
        _copy(ring.index((i + STAGES - 1) % STAGES), src + (i + STAGES - 1) * 4 * 64)
        async_copy.commit_group()
        async_copy.wait_group(STAGES - 1)
        acc = acc ^ ring.index(i % STAGES).load(read)
    rw = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, read)))
    rm = gl.arange(0, BM, layout=gl.SliceLayout(0, gl.SliceLayout(2, read)))
    rc = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(1, read)))
    gl.store(y_ptr + gl.expand_dims(gl.expand_dims(rw, 1), 2) * BM * 64 + gl.expand_dims(gl.expand_dims(rm, 0), 2) * 64
             + gl.expand_dims(gl.expand_dims(rc, 0), 1), acc)


@gluon.jit
def _idle(K):
    pass


@gluon.jit
def _partition_kernel(x_ptr, y_ptr, K, BM: gl.constexpr, STAGES: gl.constexpr):
    ring_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=4, order=[1, 0])
    r0 = gl.allocate_shared_memory(gl.uint32, [STAGES, BM, 64], ring_layout)
    r1 = gl.allocate_shared_memory(gl.uint32, [STAGES, BM, 64], ring_layout)
    r2 = gl.allocate_shared_memory(gl.uint32, [STAGES, BM, 64], ring_layout)
    r3 = gl.allocate_shared_memory(gl.uint32, [STAGES, BM, 64], ring_layout)
    gl.warp_specialize([
        (_idle, (K,)),
        (_ring_loop, (x_ptr, y_ptr, r0, K, 0, 4, BM, STAGES)),
        (_ring_loop, (x_ptr, y_ptr, r1, K, 1, 4, BM, STAGES)),
        (_ring_loop, (x_ptr, y_ptr, r2, K, 2, 4, BM, STAGES)),
        (_ring_loop, (x_ptr, y_ptr, r3, K, 3, 4, BM, STAGES)),
    ], [1, 1, 1, 1], [128, 128, 128, 128])


def barrier_counts(ptx: str) -> dict:
    return {name: len(re.findall(pattern, ptx)) for name, pattern in
            (("bar.sync 0 (block)", r"\bbar\.sync\s+0;"), ("barrier.sync n (named)", r"\bbarrier\.sync\s+\d+;"),
             ("bar.warp.sync", r"\bbar\.warp\.sync\b"), ("cp.async.wait_group", r"cp\.async\.wait_group"))}


def main() -> None:
    kernel = timing.load_kernel()
    signature = {"x_ptr": "*u32", "y_ptr": "*u32", "K": "i32"}
    print(f"Triton {triton.__version__}, sm_90, BLOCK_M {BLOCK_M}, {STAGES} stages")
    for name, fn in (("cta", _cta_kernel), ("partitions", _partition_kernel)):
        compiled = kernel.launch.compile_gluon_for_sm90(fn, signature, dict(BM=BLOCK_M, STAGES=STAGES),
                                                        ("x_ptr", "y_ptr", "K"), {"num_warps": 4})
        print(f"{name:11s}", ", ".join(f"{k} {v}" for k, v in barrier_counts(compiled.asm["ptx"]).items()))


if __name__ == "__main__":
    main()
