"""CPU demo of the main job: quantize a random layer, run every Triton kernel path in Triton's
interpreter through the Hub loader, and report the error against a float64 reference.

    TRITON_INTERPRET=1 python scripts/demo.py     (scripts/run.sh does this without a GPU)
"""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import timing  # noqa: E402


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("set TRITON_INTERPRET=1 (no GPU: the Triton kernels run in the interpreter)")
    w4a16 = timing.load_kernel()  # get_kernel("w4a16-kernels/w4a16", version=1) on a fresh local build
    torch.manual_seed(0)
    k, n, group_size = 512, 96, 128
    weight = torch.randn(k, n) * 0.02  # [in_features, out_features]
    packed, scales, zeros = w4a16.quantize_weight_int4_grouped(weight, group_size)
    prepared = w4a16.prepare_weight(packed, scales, zeros, group_size)
    reference_weight = w4a16.dequantize_int4_grouped(packed, scales, zeros, group_size, torch.float64)
    print(f"layer K={k} N={n}: {prepared.describe()}; "
          f"4-bit weight error vs original: {float((reference_weight - weight.double()).norm() / weight.norm()):.3%}")
    print(f"{'path':22s} {'M':>4s}  relative error vs float64 (x @ dequantized W)")
    # The tensor-core paths in both scale modes (fold: per group on the fp32 accumulator; operand:
    # dequantized in the MMA operand; fold-one-token: the M = 1 fold option the tuner may pick, the plain
    # fold at other M); the dispatcher picks per shape from the tuned table.
    fold, operand = {"SCALE_IN_OPERAND": False}, {"SCALE_IN_OPERAND": True}
    for name, path, config in (("gemv", "gemv", None), ("splitk:fold", "splitk", fold),
                               ("splitk:fold-one-token", "splitk", {**fold, "ONE_TOKEN": True}), ("splitk:operand", "splitk", operand),
                               ("streamk:fold", "streamk", fold), ("tiled:fold", "tiled", fold), ("tiled:operand", "tiled", operand),
                               ("dense", "dense", None)):
        for m in (1, 16, 33):
            x = torch.randn(m, k, dtype=torch.float16)
            y = w4a16.matmul.w4a16_matmul(x, prepared.qweight, prepared.scales, prepared.zeros, prepared.perm, k, group_size,
                                        path=path, config=config)
            ref = x.double() @ reference_weight
            print(f"{name:22s} {m:4d}  {float((y.double() - ref).norm() / ref.norm()):.2e}")
    # act-order: x[:, perm] gathered by a small kernel before the GEMM
    g_idx = torch.randperm(k) // group_size
    ordered = w4a16.prepare_weight(packed, scales, zeros, group_size, g_idx=g_idx.to(torch.int32))
    reference_ordered = ordered.dequantize(torch.float64)
    for name, config in (("splitk act-order", None), ("splitk act-order oper.", operand)):
        for m in (1, 16):
            x = torch.randn(m, k, dtype=torch.float16)
            y = w4a16.matmul.w4a16_matmul(x, ordered.qweight, ordered.scales, ordered.zeros, ordered.perm, k, group_size,
                                        path="splitk", config=config)
            ref = x.double() @ reference_ordered
            print(f"{name:22s} {m:4d}  {float((y.double() - ref).norm() / ref.norm()):.2e}")
    print("On a GPU, scripts/run.sh runs benchmarks/bench_gemm.py instead.")


if __name__ == "__main__":
    main()
