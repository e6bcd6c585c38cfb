"""Turn a results file into README material: a markdown table and a roofline plot (runs anywhere).

    python benchmarks/report.py [--results benchmarks/results/h200.json] [--plot benchmarks/results/h200_roofline.png]

(Another GPU's results file, e.g. h100.json, draws no plot unless --plot names one, and its plot has a ceiling line
only where timing.MEASURED_CEILINGS holds that GPU's.)

Roofline: achieved TFLOP/s against arithmetic intensity (FLOP per byte actually required: W4 bytes
for the 4-bit kernels, fp16 bytes for cuBLAS), one panel per shape, M along each line, with the
H200 ceilings measured in PERFORMANCE.md (4.2 TB/s streaming read, ~790 TFLOP/s dense fp16).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402

def is_base(r) -> bool:
    return r["impl"] == "w4a16" and r.get("dtype") == "fp16" and r.get("group_size") == 128 and not r.get("symmetric") and not r.get("act_order")


def variant_name(r) -> str:
    if is_base(r):
        return "w4a16"
    return "w4a16 " + timing.format_label(r)


def nbytes(r) -> int:
    if r["impl"] in ("fp16", "bf16"):
        return timing.f16_bytes(r["N"], r["K"], r["M"])
    return timing.w4_bytes(r["N"], r["K"], r["M"], r.get("group_size", 128), r.get("symmetric", False))


def speedup(r, fp16: dict) -> float:
    """fp16 time / this row's time, against the fp16 time of the row's own run (`fp16_us`, written by
    bench_gemm.py) where it has one, else against the file's fp16 row for the shape and M."""
    return (r["fp16_us"] if "fp16_us" in r else fp16[(r["shape"], r["M"])]) / r["us"]


def markdown_tables(rows) -> str:
    fp16 = {(r["shape"], r["M"]): r["us"] for r in rows if r["impl"] == "fp16"}
    int4 = {(r["shape"], r["M"]): r for r in rows if r["impl"] == "torch_int4"}
    ours = {(r["shape"], r["M"]): r for r in rows if is_base(r)}
    ms = sorted({m for _, m in ours})
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    out = ["| shape (N x K) | " + " | ".join(f"M={m}" for m in ms) + " |", "|---|" + "---|" * len(ms)]
    for s in shapes:
        n, k = next((r["N"], r["K"]) for r in rows if r["shape"] == s)
        cells = []
        for m in ms:
            r = ours.get((s, m))
            cells.append("" if r is None else f"{r['us']:.1f} us ({speedup(r, fp16):.2f}x)")
        out.append(f"| {s} {n}x{k} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("Geometric mean over the eight shapes of fp16 time / time (higher is better):")
    out.append("")
    variants = sorted({variant_name(r) for r in rows if r["impl"] == "w4a16"}, key=lambda v: (v != "w4a16", v))
    out.append("| impl | " + " | ".join(f"M={m}" for m in ms) + " |")
    out.append("|---|" + "---|" * len(ms))
    for impl in ["torch_int4"] + variants:
        cells = []
        for m in ms:
            if impl == "torch_int4":
                vals = [speedup(int4[(s, m)], fp16) for s in shapes if (s, m) in int4]
            else:
                vals = [speedup(r, fp16) for r in rows if r["impl"] == "w4a16" and r["M"] == m and variant_name(r) == impl]
            cells.append(f"{statistics.geometric_mean(vals):.2f}" if vals else "")
        out.append(f"| {impl} | " + " | ".join(cells) + " |")
    eager = {(r["shape"], r["impl"]): r["us"] for r in rows if r["impl"].endswith("_eager")}
    if eager:
        out.append("")
        out.append("Eager wall time per call at M = 1 (host loop, us): " + ", ".join(
            f"{s}: fp16 {eager.get((s, 'fp16_eager'), float('nan')):.0f} / torch_int4 {eager.get((s, 'torch_int4_eager'), float('nan')):.0f} / w4a16 {eager.get((s, 'w4a16_eager'), float('nan')):.0f}"
            for s in shapes[:2]) + ".")
    return "\n".join(out)


FORMAT_COLUMNS = (("M = 1..16", (1, 2, 4, 8, 16)), ("M = 32, 64", (32, 64)), ("M = 128..4096", (128, 256, 512, 1024, 4096)))
FORMATS = (("bf16", "bf16 g128"), ("symmetric", "fp16 g128 sym"), ("group 64", "fp16 g64"), ("act-order", "fp16 g128 act-order"),
           ("per-channel", "fp16 per-channel"))


def same_run(a: dict, b: dict) -> bool:
    """Whether two rows of a results file were measured in one bench_gemm.py run: rows of one run carry the same
    cuBLAS time (`fp16_us`, that run's fp16 row); rows without it (older files), the same commit."""
    if "fp16_us" in a and "fp16_us" in b:
        return a["fp16_us"] == b["fp16_us"] and a.get("commit") == b.get("commit")
    return a.get("commit") == b.get("commit")


def format_table(rows) -> str:
    """Each format against fp16 g128 asymmetric: the base's time / the format's time per shape and M (both our
    kernels, which repeat within 1-3% between runs; a ratio of speed-ups over cuBLAS would carry cuBLAS's
    spread between the two rows' runs, 2-13% in v17); per column the range of the geometric means over the
    shapes at each M, and the worst single (shape, M) in brackets, marked * where its two rows were measured in
    different runs (`same_run`: the ratio then carries the machine's drift between the runs too)."""
    base = {(r["shape"], r["M"]): r for r in rows if is_base(r)}
    out = ["| format | " + " | ".join(name for name, _ in FORMAT_COLUMNS) + " |", "|---|" + "---|" * len(FORMAT_COLUMNS)]
    marked = False
    for name, label in FORMATS:
        own = {(r["shape"], r["M"]): r for r in rows
               if r["impl"] == "w4a16" and timing.format_label(r) == label and (r["shape"], r["M"]) in base}
        ratios = {key: base[key]["us"] / r["us"] for key, r in own.items()}
        cells = []
        for _, ms in FORMAT_COLUMNS:
            means = []
            for m in ms:
                vals = [v for (s, mm), v in ratios.items() if mm == m]
                if vals:
                    means.append(statistics.geometric_mean(vals))
            if not means:
                cells.append("")
                continue
            (shape, m), worst = min(((k, v) for k, v in ratios.items() if k[1] in ms), key=lambda kv: kv[1])
            low, high = f"{min(means):.2f}", f"{max(means):.2f}"
            last = max(mm for (_, mm) in ratios if mm in ms)
            upto = f"; to M={last}" if last != ms[-1] else ""
            two_runs = not same_run(own[(shape, m)], base[(shape, m)])
            marked |= two_runs
            cells.append(f"{low if low == high else low + '-' + high} ({worst:.2f}{'*' if two_runs else ''}, {shape} M={m}{upto})")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    if marked:
        out += ["", "*: the format's row and the base's were measured in different runs."]
    return "\n".join(out)


def roofline(rows, path: Path, gpu: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig, axes = plt.subplots(2, 4, figsize=(18, 8.5), sharex=True, sharey=True)
    ceilings = timing.measured_ceilings(gpu)  # none drawn for a GPU without measured ones
    read_tbps, peak_tflops = ceilings or (None, None)
    styles = {"fp16": ("tab:gray", "s"), "torch_int4": ("tab:orange", "^"), "w4a16": ("tab:blue", "o")}
    for ax, s in zip(axes.flat, shapes):
        ai = [10 ** (e / 10) for e in range(-10, 41)]
        if ceilings:
            ax.plot(ai, [min(peak_tflops, a * read_tbps) for a in ai], "k--", lw=1, label=f"ceiling ({read_tbps} TB/s, {peak_tflops:.0f} TFLOP/s)")
        for impl, (color, marker) in styles.items():
            pts = sorted((r for r in rows if (r["impl"] == impl if impl != "w4a16" else is_base(r)) and r["shape"] == s), key=lambda r: r["M"])
            if not pts:
                continue
            flops = [2 * r["M"] * r["N"] * r["K"] for r in pts]
            x = [f / nbytes(r) for f, r in zip(flops, pts)]
            y = [f / (r["us"] * 1e-6) / 1e12 for f, r in zip(flops, pts)]
            ax.plot(x, y, marker=marker, color=color, label={"fp16": "cuBLAS fp16", "torch_int4": "torch int4 (tinygemm, bf16)", "w4a16": "w4a16 (ours, fp16 g128)"}[impl])
            for xi, yi, r in zip(x, y, pts):
                if r["M"] in (1, 16, 64, 256, 4096):
                    ax.annotate(str(r["M"]), (xi, yi), fontsize=7, xytext=(3, -9), textcoords="offset points", color=color)
        n, k = next((r["N"], r["K"]) for r in rows if r["shape"] == s)
        ax.set_title(f"{s} ({n} x {k})", fontsize=10)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.2)
    for ax in axes[1]:
        ax.set_xlabel("FLOP per required byte")
    for ax in axes[:, 0]:
        ax.set_ylabel("achieved TFLOP/s")
    axes.flat[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"W4A16 GEMM roofline on {gpu}: labels are M (tokens); GPU time from CUDA-graph replay", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", default=str(timing.REPO / "benchmarks" / "results" / "h200.json"))
    ap.add_argument("--plot", default=None, help="PNG to draw (default: benchmarks/results/h200_roofline.png for a "
                    "results file measured on an H200, none for another GPU's, so it cannot overwrite the H200 plot)")
    args = ap.parse_args()
    data = json.loads(Path(args.results).read_text())
    if args.plot is None:
        args.plot = str(timing.REPO / "benchmarks" / "results" / "h200_roofline.png") if "H200" in data["gpu"] else ""
    print(f"{data['gpu']}, torch {data['torch']}, Triton {data['triton']}, {data['date']}, commit {data['commit']}\n")
    print(markdown_tables(data["rows"]))
    if any(r["impl"] == "w4a16" and not is_base(r) for r in data["rows"]):
        print("\nFormats against fp16 g128 asymmetric (its time / the format's time):\n")
        print(format_table(data["rows"]))
    if args.plot:
        roofline(data["rows"], Path(args.plot), data["gpu"])
        print(f"\nwrote {args.plot}")


if __name__ == "__main__":
    main()
