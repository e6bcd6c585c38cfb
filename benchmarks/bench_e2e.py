"""End-to-end decode: a Llama-3-8B-shaped decoder, fp16 against W4A16, CUDA-graph decode steps (GPU).

    python benchmarks/bench_e2e.py [--batches 1,16] [--layers 32] [--compile] [--lm-head fp16,w4a16] [--pdl off,on]
                                   [--out benchmarks/results/h200_e2e.json]

The model is a compact Llama decoder written here (RMSNorm, fused qkv with GQA and RoPE, SDPA over a
static KV cache, fused gate_up with SiLU, down; random weights, no downloads) with Llama-3-8B's
shapes. One decode step (one new token per sequence, a KV cache of `--context` tokens) is captured
in a CUDA graph and replayed (`method` "cuda_graph"); with --compile each decoder block is also
compiled by torch.compile (Inductor fuses the norms, RoPE and SiLU that otherwise cost a kernel per
op; the W4A16 GEMM stays our custom op) and the compiled step is captured and replayed the same way
(`method` "compile+cuda_graph"), for fp16 and W4A16 alike. Quality: the W4A16 model's logits against the same model with the
dequantized weights in fp16 (must agree to kernel tolerance) and against the original fp16 model
(the 4-bit quantization error, reported; in this random model it compounds over the blocks to ~1.0, which
benchmarks/quality_by_depth.py shows block by block on the CPU).

--pdl off,on also times the compiled step with programmatic dependent launch (rows' `pdl`): Inductor's kernels
launched as programmatic dependents and releasing their own early (torch._inductor.config.triton.enable_pdl, a
setting of this script's process, for the fp16 and the W4A16 model alike), and every W4A16 layer converted with
pdl=True (its GEMM a programmatic dependent of the kernel before, releasing the one after). Eager modules in a
graph (method cuda_graph) are timed without it: their torch kernels release nothing, and pdl=True alone was 3%
slower there (benchmarks/probe_pdl_e2e.py, NOTES v39).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402

LLAMA3_8B = dict(dim=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256, rope_theta=500000.0)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Block(nn.Module):
    def __init__(self, cfg, batch, max_seq):
        super().__init__()
        d, h, kvh = cfg["dim"], cfg["heads"], cfg["kv_heads"]
        self.h, self.kvh, self.hd = h, kvh, d // h
        self.attn_norm, self.mlp_norm = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, (h + 2 * kvh) * self.hd, bias=False)
        self.o = nn.Linear(h * self.hd, d, bias=False)
        self.gate_up = nn.Linear(d, 2 * cfg["ffn"], bias=False)
        self.down = nn.Linear(cfg["ffn"], d, bias=False)
        self.register_buffer("k_cache", torch.zeros(batch, kvh, max_seq, self.hd), persistent=False)
        self.register_buffer("v_cache", torch.zeros(batch, kvh, max_seq, self.hd), persistent=False)

    def forward(self, x, pos, cos, sin, mask):
        b = x.shape[0]
        q, k, v = self.qkv(self.attn_norm(x)).split([self.h * self.hd, self.kvh * self.hd, self.kvh * self.hd], dim=-1)
        q = rope(q.view(b, 1, self.h, self.hd).transpose(1, 2), cos, sin)
        k = rope(k.view(b, 1, self.kvh, self.hd).transpose(1, 2), cos, sin)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v.view(b, 1, self.kvh, self.hd).transpose(1, 2))
        attn = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=True)
        x = x + self.o(attn.transpose(1, 2).reshape(b, 1, self.h * self.hd))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def rope_tables(cfg, max_seq):
    """RoPE cos / sin [max_seq, head_dim / 2] for cfg's head size and theta."""
    hd = cfg["dim"] // cfg["heads"]
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.outer(torch.arange(max_seq).float(), inv)
    return ang.cos(), ang.sin()


def decode_mask(positions, pos):
    """The attention mask of one decode step at position `pos` over a cache of len(positions) slots."""
    return (positions <= pos).view(1, 1, 1, -1)


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Decoder(nn.Module):
    def __init__(self, cfg, batch, max_seq):
        super().__init__()
        self.embed = nn.Embedding(cfg["vocab"], cfg["dim"])
        self.blocks = nn.ModuleList(Block(cfg, batch, max_seq) for _ in range(cfg["layers"]))
        self.norm = RMSNorm(cfg["dim"])
        self.lm_head = nn.Linear(cfg["dim"], cfg["vocab"], bias=False)
        cos, sin = rope_tables(cfg, max_seq)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.register_buffer("positions", torch.arange(max_seq), persistent=False)

    def forward(self, tokens, pos):
        """One decode step: tokens [B, 1], pos int64 [1] (device tensor: graph-safe)."""
        x = self.embed(tokens)
        cos, sin = self.cos[pos].to(x.dtype), self.sin[pos].to(x.dtype)
        mask = decode_mask(self.positions, pos)
        for block in self.blocks:
            x = block(x, pos, cos, sin, mask)
        return self.lm_head(self.norm(x)).float()


def weight_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for n, t in list(model.named_parameters()) + list(model.named_buffers())
               if "cache" not in n and n not in ("cos", "sin", "positions") and not n.endswith((".cos", ".sin", ".positions")))


def random_decoder(cfg, batch: int, context: int):
    """The fp16 decoder with random weights (N(0, 0.02)) and a filled KV cache of random keys / values (room for 8
    more tokens), one decode step's tokens [batch, 1] and position (the first free slot, a device tensor)."""
    with torch.device("cuda"):
        model = Decoder(cfg, batch, context + 8).half()
    for p in model.parameters():
        if p.dim() == 2:
            p.data.normal_(0, 0.02)
    for block in model.blocks:
        block.k_cache.normal_()
        block.v_cache.normal_()
    tokens = torch.randint(0, cfg["vocab"], (batch, 1), device="cuda")
    return model, tokens, torch.tensor([context], device="cuda")


def graph_step(model, tokens, pos, replays=30) -> tuple[float, torch.Tensor]:
    """(ms per replay of one decode step captured in a CUDA graph, mean of `replays`; the step's logits)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.inference_mode():
        for _ in range(3):
            model(tokens, pos)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.inference_mode():
        logits = model(tokens, pos)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays, logits.clone()


def rel_err(a, b) -> float:
    return float((a - b).norm() / b.norm())


def use_pdl(kernel, models, inductor: bool, layers: bool | None = None) -> None:
    """Programmatic dependent launch for the compiled steps (module docstring): Inductor's switch (`inductor`) and
    every W4A16 layer's `pdl` (`layers`, default: as `inductor`) in `models` ((impl, fields, model) triples),
    compiled code dropped so that the next compile follows them."""
    import torch._dynamo
    import torch._inductor.config as inductor_config

    if inductor and not hasattr(inductor_config.triton, "enable_pdl"):
        raise SystemExit(f"torch {torch.__version__}'s Inductor has no triton.enable_pdl")
    torch._dynamo.reset()
    if hasattr(inductor_config.triton, "enable_pdl"):
        inductor_config.triton.enable_pdl = inductor
    for _, _, model in models:
        for module in model.modules():
            if isinstance(module, kernel.W4A16Linear):
                module.pdl = inductor if layers is None else layers


def time_step(rows: list, batch: int, method: str, impl: str, model, tokens, pos, **fields) -> None:
    """Time one decode step of `model` (compiling its blocks first for compile+cuda_graph) and add the row."""
    if method != "cuda_graph":
        for block in model.blocks:
            block.compile(fullgraph=True)  # identical blocks share one compiled graph
    try:
        ms = graph_step(model, tokens, pos)[0]
    except Exception as exc:  # noqa: BLE001 - a failed compile is reported, the eager rows still count
        print(f"batch {batch:3d} {impl:6s} {method}: FAILED {exc!r}"[:600], flush=True)
        return
    rows.append(dict(batch=batch, impl=impl, method=method, **fields, tokens_per_s=batch * 1000.0 / ms, ms_per_step=ms,
                     weight_bytes=weight_bytes(model)))
    label = " ".join(f"{k} {v}" for k, v in fields.items())
    print(f"batch {batch:3d} {impl:6s} {method:18s} {label:23s} {ms:7.3f} ms/step {batch * 1000.0 / ms:9.1f} tok/s "
          f"weights {weight_bytes(model) / 2**30:.2f} GiB", flush=True)


def check_quality(fp16, w4, converted, tokens, pos) -> dict:
    """The W4A16 model's logits against the same model with the dequantized weights in fp16 (kernel
    tolerance) and against the original fp16 model (the 4-bit rounding error, reported)."""
    dequantized = copy.deepcopy(fp16)
    with torch.inference_mode():
        for name in converted:
            dequantized.get_submodule(name).weight.copy_(w4.get_submodule(name).dequantized_weight(torch.float16))
        logits_w4, logits_fp16, logits_deq = w4(tokens, pos), fp16(tokens, pos), dequantized(tokens, pos)
    del dequantized
    quality = {
        "rel_err_w4a16_vs_dequantized_fp16": rel_err(logits_w4, logits_deq),
        "rel_err_w4a16_vs_original_fp16": rel_err(logits_w4, logits_fp16),
        "top1_agreement_vs_original_fp16": float((logits_w4.argmax(-1) == logits_fp16.argmax(-1)).float().mean()),
    }
    print(quality, flush=True)
    assert quality["rel_err_w4a16_vs_dequantized_fp16"] < 2e-2, quality
    return quality


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--layers", type=int, default=LLAMA3_8B["layers"])
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--out", default="")
    ap.add_argument("--compile", action="store_true", help="also time the step with every block torch.compile'd")
    ap.add_argument("--lm-head", default="fp16", help="comma list of the LM head's format in the W4A16 model: fp16 (kept, "
                    "the usual recipe) and / or w4a16 (quantized too, a model-quality choice); one W4A16 model per entry")
    ap.add_argument("--pdl", default="off", help="comma list of off / on: the compiled steps without and / or with "
                    "programmatic dependent launch (module docstring)")
    args = ap.parse_args()
    heads = args.lm_head.split(",")
    if not heads or set(heads) - {"fp16", "w4a16"}:
        raise SystemExit(f"--lm-head: expected a comma list of fp16 / w4a16, got {args.lm_head!r}")
    pdl_settings = args.pdl.split(",")
    if not pdl_settings or set(pdl_settings) - {"off", "on"}:
        raise SystemExit(f"--pdl: expected a comma list of off / on, got {args.pdl!r}")

    kernel = timing.load_kernel()
    cfg = dict(LLAMA3_8B, layers=args.layers)
    batches = [int(b) for b in args.batches.split(",")]
    torch.manual_seed(0)
    rows, quality = [], {}
    for batch in batches:
        fp16, tokens, pos = random_decoder(cfg, batch, args.context)
        # every W4A16 model is converted (and checked) before any block is compiled: a deep copy of the fp16
        # model must not carry a compiled forward
        models = [("fp16", {}, fp16)]
        for head in heads:
            w4 = copy.deepcopy(fp16)
            summary = kernel.layers.convert_to_w4a16(w4, group_size=128, skip=("lm_head",) if head == "fp16" else ())
            print(f"lm_head {head}: {summary}", flush=True)
            if batch == batches[0]:
                quality[f"lm_head_{head}"] = check_quality(fp16, w4, summary.converted, tokens, pos)
            models.append(("w4a16", {"lm_head": head}, w4))
        for method in ("cuda_graph", "compile+cuda_graph") if args.compile else ("cuda_graph",):
            for pdl in (pdl_settings if method == "compile+cuda_graph" else ("off",)):
                use_pdl(kernel, models, pdl == "on")
                for impl, fields, model in models:
                    time_step(rows, batch, method, impl, model, tokens, pos, **fields,
                              **({"pdl": pdl == "on"} if method == "compile+cuda_graph" else {}))
        use_pdl(kernel, models, False)
        del fp16, w4, models
        torch.cuda.empty_cache()
    for b in batches:
        for method, pdl in dict.fromkeys((r["method"], r.get("pdl")) for r in rows):
            f = next((r for r in rows if r["batch"] == b and r["impl"] == "fp16" and r["method"] == method and r.get("pdl") == pdl), None)
            for w in (r for r in rows if f and r["batch"] == b and r["impl"] == "w4a16" and r["method"] == method and r.get("pdl") == pdl):
                print(f"batch {b} {method}{' pdl' if pdl else ''} lm_head {w['lm_head']}: W4A16 "
                      f"{w['tokens_per_s'] / f['tokens_per_s']:.2f}x fp16 tokens/s")
    if args.out:
        result = {**timing.machine_info(), "model": f"Llama-3-8B-shaped decoder ({cfg['layers']} layers, random weights, KV context {args.context}); "
                                                      "w4a16 rows' `lm_head`: the LM head kept fp16 or quantized too",
                  "method": "one decode step captured in a CUDA graph, mean of 30 replays; rows' `method`: cuda_graph "
                            "(eager modules) or compile+cuda_graph (each block torch.compile'd first); compiled rows' `pdl`: with "
                            "programmatic dependent launch (Inductor's enable_pdl for both models, the W4A16 layers' pdl=True)",
                  "quality": quality, "rows": rows}
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
