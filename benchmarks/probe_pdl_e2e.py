"""Probe (GPU): does programmatic dependent launch (PDL) shorten the compiled decode step of bench_e2e.py's model?

    python benchmarks/probe_pdl_e2e.py [--batches 1,16] [--layers 32] [--rounds 2] [--out probe.json]

Settings, each timed on the fp16 and the W4A16 model (LM head quantized) as bench_e2e.py's compile+cuda_graph
rows are (every block torch.compile'd, one step captured in a CUDA graph, mean of 30 replays):

    none       as bench_e2e.py
    inductor   torch._inductor.config.triton.enable_pdl: Inductor's kernels are launched as programmatic dependents
               of the kernel before them and release their own dependents once their loads are issued
    wait       inductor, and every W4A16 GEMM of a decode or Triton tensor-core plan launched as a programmatic
               dependent too, without releasing its own dependents (the kernels' WAIT_PRIOR form, which act-order's
               GATHER_PDL plans use after the gather; made here by patching the dispatcher so that every such plan
               carries GATHER_PDL)
    pdl        inductor, and the model converted with pdl=True (the package's switch: WAIT_PRIOR, and the kernel after
               the GEMM released at its start)
    pdl_only   pdl=True without Inductor's PDL

The W4A16 logits of every setting are compared with those of "none" (same kernels: a difference beyond rounding
would be a missing wait).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_e2e  # noqa: E402
import timing  # noqa: E402

SETTINGS = ("none", "inductor", "wait", "pdl", "pdl_only")
_INDUCTOR_PDL = ("inductor", "wait", "pdl")


def use_setting(kernel, setting: str, w4) -> None:
    """Inductor's PDL switch and the layers' `pdl` for `setting` (`bench_e2e.use_pdl`), and the dispatcher patch;
    compiled code and memoised plans dropped."""
    bench_e2e.use_pdl(kernel, [("w4a16", {}, w4)], setting in _INDUCTOR_PDL, setting in ("pdl", "pdl_only"))
    dispatch = kernel.dispatch
    if not hasattr(dispatch, "_probe_original_applicable"):
        dispatch._probe_original_applicable = dispatch._applicable
    original = dispatch._probe_original_applicable
    if setting == "wait":
        def applicable(plan, act_order, device, group_size, k, pdl=False):
            if plan.path in dispatch.PDL_PATHS:
                plan = dispatch.Plan(plan.path, {**plan.config, "GATHER_PDL": True}, plan.source)
                act_order = True  # (keeps GATHER_PDL; the call gathers nothing: its weight has no perm)
            return original(plan, act_order, device, group_size, k, pdl)
        dispatch._applicable = applicable
    else:
        dispatch._applicable = original
    dispatch._plan_cached.cache_clear()


def step(model, tokens, pos) -> tuple[float, torch.Tensor]:
    """(ms per graph replay of one compiled decode step, the step's logits)."""
    for block in model.blocks:
        block.compile(fullgraph=True)
    return bench_e2e.graph_step(model, tokens, pos)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--layers", type=int, default=bench_e2e.LLAMA3_8B["layers"])
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import torch._inductor.config as inductor_config

    if not hasattr(inductor_config.triton, "enable_pdl"):
        raise SystemExit(f"torch {torch.__version__}: Inductor has no triton.enable_pdl")
    kernel = timing.load_kernel()
    cfg = dict(bench_e2e.LLAMA3_8B, layers=args.layers)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        torch.manual_seed(0)
        fp16, tokens, pos = bench_e2e.random_decoder(cfg, batch, args.context)
        w4 = copy.deepcopy(fp16)
        kernel.layers.convert_to_w4a16(w4, group_size=128, skip=())
        reference = {}
        for rnd in range(args.rounds):
            for setting in SETTINGS:
                use_setting(kernel, setting, w4)
                for impl, model in (("fp16", fp16), ("w4a16", w4)):
                    if impl == "fp16" and setting not in ("none", "inductor"):
                        continue  # (the same as "inductor" or "none": no W4A16 GEMM in it)
                    ms, logits = step(model, tokens, pos)
                    ref = reference.setdefault(impl, logits)
                    diff = float((logits - ref).abs().max() / ref.abs().max())
                    rows.append(dict(batch=batch, impl=impl, setting=setting, round=rnd, ms_per_step=ms,
                                     tokens_per_s=batch * 1000.0 / ms, max_rel_diff_vs_none=diff))
                    print(f"batch {batch:3d} round {rnd} {impl:6s} {setting:9s} {ms:7.3f} ms/step "
                          f"{batch * 1000.0 / ms:8.1f} tok/s  logits vs none {diff:.2e}", flush=True)
                    if args.out:  # (written as it goes: a call cut short keeps what it measured)
                        Path(args.out).write_text(json.dumps({**timing.machine_info(), "rows": rows}, indent=1) + "\n")
        del fp16, w4
        torch.cuda.empty_cache()
    use_setting(kernel, "none", torch.nn.Module())
    for b in dict.fromkeys(r["batch"] for r in rows):
        best = {}
        for r in rows:
            if r["batch"] == b:
                key = (r["impl"], r["setting"])
                best[key] = min(best.get(key, 1e9), r["ms_per_step"])
        fp = {s: best.get(("fp16", s)) for s in ("none", "inductor")}
        for s in SETTINGS:
            w = best.get(("w4a16", s))
            f = fp["inductor" if s in _INDUCTOR_PDL else "none"]
            print(f"batch {b:3d} {s:9s} fp16 {f:.3f} ms  w4a16 {w:.3f} ms  {f / w:.2f}x  (best of rounds)")
    if args.out:
        Path(args.out).write_text(json.dumps({**timing.machine_info(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
