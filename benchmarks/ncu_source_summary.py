"""Summarise ncu's per-instruction warp-stall sampling of one kernel (runs anywhere, no GPU):

    python benchmarks/ncu_source_summary.py benchmarks/results/ncu/ncu_<commit>_<shape>_<M>_sass.csv.gz

Input: `ncu -i report.ncu-rep --page source --csv --print-source sass` (gpu_session.sh's ncu step writes it).
Prints the share of samples per stall reason, the hot loop (the instructions executed most often) and, per
opcode in that loop, its instruction count, share of samples and top stall reasons.
"""

from __future__ import annotations

import collections
import csv
import gzip
import io
import sys


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def main(path: str) -> None:
    raw = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    rows = list(csv.reader(io.StringIO(raw.read())))
    header, data = rows[1], rows[2:]  # row 0 names the kernel
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    samples = col["Warp Stall Sampling (All Samples)"]
    total = sum(_number(r[samples]) for r in data)
    executed = [_number(r[col["Instructions Executed"]]) for r in data]
    hot = [i for i, e in enumerate(executed) if e >= 0.9 * max(executed)]
    first, last = hot[0], hot[-1]
    in_loop = sum(_number(data[i][samples]) for i in range(first, last + 1))
    print(f"{rows[0][1]}: {len(data)} instructions, hot loop {last - first + 1} [{first}, {last}] with {in_loop / total:.0%} of the samples")
    by_reason = collections.Counter()
    for r in data:
        for h in reasons:
            by_reason[h] += _number(r[col[h]])
    print("stall reasons: " + ", ".join(f"{h[6:]} {v / total:.0%}" for h, v in by_reason.most_common(9)))
    by_opcode, count = collections.defaultdict(collections.Counter), collections.Counter()
    for r in data[first:last + 1]:
        words = r[col["Source"]].split()
        opcode = (words[1] if words[0].startswith("@") else words[0]).split(".")[0] if words else "?"
        count[opcode] += 1
        for h in reasons:
            by_opcode[opcode][h] += _number(r[col[h]])
    print("hot loop by opcode: instructions, share of all samples, top stall reasons")
    for opcode in sorted(by_opcode, key=lambda o: -sum(by_opcode[o].values()))[:14]:
        share = sum(by_opcode[opcode].values()) / total
        top = ", ".join(f"{h[6:]} {v / total:.1%}" for h, v in by_opcode[opcode].most_common(3))
        print(f"  {opcode:10s} {count[opcode]:4d} {share:6.1%}  {top}")


if __name__ == "__main__":
    main(sys.argv[1])
