"""Where the end-to-end benchmark's 4-bit error comes from, layer by layer (CPU, float32, no GPU needed).

    python benchmarks/quality_by_depth.py [--layers 32] [--batch 4] [--out benchmarks/results/cpu_quality_by_depth.json]

bench_e2e.py reports the W4A16 model's logits against the original fp16 model as a relative error of ~1.0 (top-1
agreement 0). This script shows whether that is the quantization or the model: the same Llama-3-8B-shaped decoder
blocks (bench_e2e.Block, random weights N(0, 0.02), 128-token random KV cache) are built one at a time in float32,
each linear weight also rounded to 4 bits by the package's own quantizer (group 128, asymmetric) and dequantized,
and one decode step's hidden state is carried through both models side by side. Per layer it prints
- `weights`: the relative error of that layer's dequantized weights (the 4-bit rounding itself),
- `local`: the relative error that layer adds to its output when both models get the same input,
- `carried`: the relative error of the hidden state after that many layers of the 4-bit model;
then the logits (final norm and an fp32 lm_head, not quantized, as in bench_e2e). Float32 throughout, so the
numbers are the quantization's, not fp16 rounding's; the kernels compute the dequantized weights' product to
~0.5% (bench_e2e's `rel_err_w4a16_vs_dequantized_fp16`).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_e2e  # noqa: E402
import timing  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def rounded_to_4_bits(kernel, block: torch.nn.Module, group_size: int) -> tuple[torch.nn.Module, float]:
    """A copy of `block` whose linear weights are quantized and dequantized by the package (plain torch);
    returns it and the relative error of all its linear weights together."""
    quantized = copy.deepcopy(block)
    num = den = 0.0
    for name, module in quantized.named_modules():
        if isinstance(module, torch.nn.Linear):
            w = module.weight.data.t().contiguous()  # [K, N], the package's orientation
            packed, scales, zeros = kernel.quantize_weight_int4_grouped(w, group_size=group_size, symmetric=False)
            dq = kernel.dequantize_int4_grouped(packed, scales, zeros, group_size, dtype=torch.float32)
            num += float((dq - w).pow(2).sum())
            den += float(w.pow(2).sum())
            module.weight.data.copy_(dq.t())
    return quantized, (num / den) ** 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=bench_e2e.LLAMA3_8B["layers"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.manual_seed(0)
    kernel = timing.load_kernel()
    cfg = bench_e2e.LLAMA3_8B
    max_seq = args.context + 8
    cos_table, sin_table = bench_e2e.rope_tables(cfg, max_seq)
    pos = torch.tensor([args.context])
    cos, sin = cos_table[pos], sin_table[pos]
    mask = bench_e2e.decode_mask(torch.arange(max_seq), pos)

    x_ref = torch.randn(args.batch, 1, cfg["dim"]) * 0.02  # embedding rows, as bench_e2e initialises them
    x_w4 = x_ref.clone()
    rows = []
    with torch.inference_mode():
        for layer in range(args.layers):
            block = bench_e2e.Block(cfg, args.batch, max_seq)
            for p in block.parameters():
                if p.dim() == 2:
                    p.data.normal_(0, 0.02)
            block.k_cache.normal_()
            block.v_cache.normal_()
            block_w4, weight_err = rounded_to_4_bits(kernel, block, args.group_size)
            # each block writes its cache slot: give both models the same cache state before each call
            caches = (block.k_cache.clone(), block.v_cache.clone())
            y_ref = block(x_ref, pos, cos, sin, mask)
            block_w4.k_cache.copy_(caches[0])
            block_w4.v_cache.copy_(caches[1])
            y_local = block_w4(x_ref, pos, cos, sin, mask)  # same input: the error this layer adds
            block_w4.k_cache.copy_(caches[0])
            block_w4.v_cache.copy_(caches[1])
            y_w4 = block_w4(x_w4, pos, cos, sin, mask)  # the 4-bit model's own hidden state
            row = dict(layer=layer + 1, weights=weight_err, local=rel(y_local, y_ref), carried=rel(y_w4, y_ref),
                       hidden_norm=float(y_ref.norm() / y_ref.numel() ** 0.5))
            rows.append(row)
            print(f"layer {row['layer']:2d}: weights {row['weights']:.4f}  local {row['local']:.4f}  carried {row['carried']:.4f}  "
                  f"hidden rms {row['hidden_norm']:.3g}", flush=True)
            x_ref, x_w4 = y_ref, y_w4
            del block, block_w4
        norm = bench_e2e.RMSNorm(cfg["dim"])
        lm_head = torch.nn.Linear(cfg["dim"], cfg["vocab"], bias=False)
        lm_head.weight.data.normal_(0, 0.02)
        logits_ref, logits_w4 = lm_head(norm(x_ref)), lm_head(norm(x_w4))
    logits = dict(rel_err=rel(logits_w4, logits_ref),
                  top1_agreement=float((logits_w4.argmax(-1) == logits_ref.argmax(-1)).float().mean()))
    print(f"logits after {args.layers} layers: relative error {logits['rel_err']:.4f}, top-1 agreement {logits['top1_agreement']:.2f}")
    if args.out:
        result = {"about": "benchmarks/quality_by_depth.py on the CPU (float32): bench_e2e's random Llama-3-8B-shaped blocks, "
                           "each linear weight rounded to 4 bits (group 128, asymmetric) by the package's quantizer",
                  "torch": torch.__version__, "commit": timing.tree_commit(), "date": datetime.date.today().isoformat(), "layers": args.layers,
                  "batch": args.batch, "context": args.context, "group_size": args.group_size, "rows": rows, "logits": logits}
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
