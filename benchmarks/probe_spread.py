"""Why does one shape's time move up to 20% between runs of the same plan (70B.down at M = 4 / 8, NOTES v29)?

    python benchmarks/probe_spread.py --shape 70B.down --m 4,8 --variants base,g64,pc --rounds 6 --out probe.json

Each round allocates fresh weight copies behind a pad allocation of a different size (so they land at other
addresses), then times every variant and M twice in a row with the benchmark's method (timing.gpu_time_us), and
cuBLAS fp16 on its own fresh copies as a control. Reading: if the two timings of one round agree and the rounds
disagree, the time depends on where the weights lie in memory (their placement across DRAM channels / L2 slices);
if the repeats within a round disagree as much, it is the machine's state over time (clocks, another tenant).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="70B.down")
    ap.add_argument("--m", default="4,8")
    ap.add_argument("--variants", default="base,g64,pc")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    kernel = timing.load_kernel()
    shape = timing.select_shapes(args.shape)[0]
    n, k = shape["N"], shape["K"]
    ms = [int(v) for v in args.m.split(",")]
    rows = []
    for r in range(args.rounds):
        pad = torch.empty(((r * 37) % 211 + 1) * 2**20, dtype=torch.uint8, device="cuda")  # shifts the weights' addresses
        for vname in args.variants.split(","):
            dtype, group_size, symmetric, act_order = timing.VARIANTS[vname]
            copies = timing.copies_needed(timing.w4_bytes(n, k, 1, group_size, symmetric))
            weights = timing.random_w4_weights(kernel, n, k, group_size, copies, symmetric, act_order, dtype)
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=dtype)
                calls = [lambda w=w: kernel.w4a16_linear(x, w) for w in weights]
                times = [timing.gpu_time_us(calls) for _ in range(2)]
                rows.append(dict(round=r, pad_mib=pad.numel() >> 20, variant=vname, M=m, us=times,
                                 address=weights[0].qweight.data_ptr(), plan=str(kernel.plan_for(weights[0], m, dtype))))
                print(f"round {r} {vname:9s} M={m:3d} {times[0]:7.2f} {times[1]:7.2f} us  {rows[-1]['plan']}", flush=True)
            del weights
        dense = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(timing.copies_needed(n * k * 2))]
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            times = [timing.gpu_time_us([lambda w=w: F.linear(x, w) for w in dense]) for _ in range(2)]
            rows.append(dict(round=r, pad_mib=pad.numel() >> 20, variant="fp16", M=m, us=times, address=dense[0].data_ptr()))
            print(f"round {r} {'fp16':9s} M={m:3d} {times[0]:7.2f} {times[1]:7.2f} us", flush=True)
        del dense, pad
        torch.cuda.empty_cache()
    print("\nper variant and M: rounds' first timings (min / median / max), and the largest repeat difference in a round")
    for vname in args.variants.split(",") + ["fp16"]:
        for m in ms:
            mine = [row for row in rows if row["variant"] == vname and row["M"] == m]
            first = [row["us"][0] for row in mine]
            repeat = max(abs(row["us"][1] - row["us"][0]) / row["us"][0] for row in mine)
            print(f"{vname:9s} M={m:3d} {min(first):7.2f} / {statistics.median(first):7.2f} / {max(first):7.2f} us"
                  f"   spread {max(first) / min(first) - 1:6.1%}   repeat {repeat:6.1%}")
    if args.out:
        Path(args.out).write_text(json.dumps({**timing.machine_info(), "shape": shape, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
