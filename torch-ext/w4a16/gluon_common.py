"""What the two Gluon kernels (gemm_decode.py, gemm_pingpong.py) share: Gluon's names that moved between Triton
releases, the magic-number constants in a form their kernels can read, and the lookup of a K block's scale groups.

Gluon is experimental: absent before Triton 3.5 (HAVE_GLUON False, nothing else defined), and each kernel module
imports its architecture's own pieces (mma_v2, wgmma, TMA) itself.
"""

from __future__ import annotations

import torch

from .dequant import MAGIC_PAIR, MAGIC_VALUE

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # renamed after Triton 3.6
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - exercised only with an old Triton
    HAVE_GLUON = False

__all__ = ["HAVE_GLUON", "cta_barrier", "MAGIC_PAIRS", "MAGIC_VALUES", "scale_group"]

if HAVE_GLUON:
    # dequant.py's magic number for fp16 / bf16 (index 0 / 1): C in both 16-bit halves, and C
    MAGIC_PAIRS = gl.constexpr((MAGIC_PAIR[torch.float16], MAGIC_PAIR[torch.bfloat16]))
    MAGIC_VALUES = gl.constexpr((MAGIC_VALUE[torch.float16], MAGIC_VALUE[torch.bfloat16]))

    @gluon.jit
    def scale_group(kb, j, GROUPS: gl.constexpr, BLOCKS_PER_GROUP: gl.constexpr):
        """The scale group of group piece j of K block kb (GROUPS, BLOCKS_PER_GROUP: `layout.groups_per_block`,
        `layout.blocks_per_group`)."""
        if GROUPS > 1:
            g = kb * GROUPS + j
        elif BLOCKS_PER_GROUP == 0:  # per-channel: one group spans K
            g = kb * 0
        else:  # a constexpr divisor: a shift or a multiply-high, not the runtime division of a group-size argument
            g = kb // BLOCKS_PER_GROUP
        return g
