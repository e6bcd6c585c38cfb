"""Act-order's gather of x on the GPU: torch's index_select / advanced indexing against the package's Triton
gather (`gather.gather_columns`), alone (against a plain copy of x, the bandwidth reference) at decode and
prefill M, and in front of the base GEMM, GPU time in a CUDA graph (timing.py).

    python benchmarks/probe_gather.py [--m 1,16,64,256,1024] [--chunks] [--out benchmarks/results/h200_gather_probe.json]

W4A16_SOURCE=<an older tree's package> times that tree's gather (timing.load_kernel).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402


def time_chunks(kernel, ms, out) -> None:
    """Every chunk from 1024 columns to the whole row block at every M, the one `gather_chunk` picks marked."""
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for k in (4096, 8192, 14336, 28672):
        block = kernel.gather._row_block(k)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            perm = torch.randperm(k, device="cuda")
            picked = kernel.gather.gather_chunk(m, k, sms)
            chunks = [1024 << i for i in range(16) if 1024 << i <= block]
            for chunk in chunks:
                gather = lambda c=chunk: kernel.gather.gather_columns(x, perm, chunk=c)  # noqa: E731
                assert torch.equal(gather(), x.index_select(1, perm))
                rows.append({"K": k, "M": m, "chunk": chunk, "picked": chunk == picked, "us": timing.gpu_time_us([gather] * 4)})
            print(k, m, " ".join(f"{r['chunk']}{'*' if r['picked'] else ''}={r['us']:.2f}" for r in rows[-len(chunks):]), flush=True)
    if out:
        Path(out).write_text(json.dumps({**timing.machine_info(), "rows": rows}, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--m", default="1,16")
    ap.add_argument("--out", default="")
    ap.add_argument("--chunks", action="store_true",
                    help="only time the package's gather at each chunk (output columns per program) at every --m")
    args = ap.parse_args()
    kernel = timing.load_kernel()
    rows = []
    if args.chunks:
        return time_chunks(kernel, [int(v) for v in args.m.split(",")], args.out)
    for k in (4096, 14336, 28672):
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            perm = torch.randperm(k, device="cuda")
            assert torch.equal(kernel.gather.gather_columns(x, perm), x.index_select(1, perm))
            for name, fn in (("index_select", lambda: x.index_select(1, perm)), ("getitem", lambda: x[:, perm]),
                             ("gather_columns", lambda: kernel.gather.gather_columns(x, perm)), ("copy", lambda: x.clone())):
                rows.append({"K": k, "M": m, "op": name, "us": timing.gpu_time_us([fn] * 4)})
            print(k, m, " ".join(f"{r['op']}={r['us']:.2f}" for r in rows[-4:]), flush=True)
    n, k = 6144, 4096
    copies = timing.copies_needed(timing.w4_bytes(n, k, 1, 128))
    plain = timing.random_w4_weights(kernel, n, k, 128, copies)
    ordered = timing.random_w4_weights(kernel, n, k, 128, copies, act_order=True)
    for m in (1, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        pairs = list(zip(plain, ordered))
        calls = {
            "base": [lambda w=w: kernel.w4a16_linear(x, w) for w, _ in pairs],
            "act_order": [lambda a=a: kernel.w4a16_linear(x, a) for _, a in pairs],
            "index_select+base": [lambda w=w, p=a.perm: kernel.w4a16_linear(x.index_select(1, p), w) for w, a in pairs],
            "gather_columns+base": [lambda w=w, p=a.perm: kernel.w4a16_linear(kernel.gather.gather_columns(x, p), w) for w, a in pairs],
        }
        for name, fns in calls.items():
            rows.append({"N": n, "K": k, "M": m, "op": name, "us": timing.gpu_time_us(fns)})
        print(f"{n}x{k} M={m}", " ".join(f"{r['op']}={r['us']:.2f}" for r in rows[-4:]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({**timing.machine_info(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
