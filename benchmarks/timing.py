"""Shared benchmark plumbing: load the kernel through the Hub loader, time with CUDA graphs, describe
the machine. Method (PERFORMANCE.md section 6): GPU time from CUDA events around a CUDA-graph replay
of many calls that rotate over enough weight copies to exceed 3x the L2, median of replays.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
REPO_ID = "w4a16-kernels/w4a16"
SHAPES_FILE_CANDIDATES = (REPO / "shared" / "bench" / "shapes.json", REPO.parent / "shared" / "bench" / "shapes.json")
# Ceilings measured in PERFORMANCE.md, by GPU model: streaming read (TB/s) and dense fp16 (TFLOP/s). A GPU without
# an entry gets none, so its tables and plots show no ceiling rather than the H200's.
MEASURED_CEILINGS = {"H200": (4.2, 790.0)}


def measured_ceilings(gpu: str) -> tuple[float, float] | None:
    """(read TB/s, fp16 TFLOP/s) measured for the GPU named `gpu` (torch's device name), or None."""
    return next((ceilings for model, ceilings in MEASURED_CEILINGS.items() if model in gpu), None)


def load_kernel():
    """Build the variants into a temp dir and load them with get_kernel, as users do. The environment
    variable W4A16_SOURCE names other package sources to build instead of torch-ext/w4a16 (an older
    commit's, for an A/B comparison in one GPU call: gpu_session.sh's `ab` step)."""
    spec = importlib.util.spec_from_file_location("build_variants", REPO / "scripts" / "build_variants.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    out = Path(tempfile.mkdtemp(prefix="w4a16-build-"))
    builder.build_variants(out, src=os.environ.get("W4A16_SOURCE") or None)
    os.environ["LOCAL_KERNELS"] = f"{REPO_ID}={out}"
    from kernels import get_kernel

    return get_kernel(REPO_ID, version=1)


def load_shapes() -> dict:
    for path in SHAPES_FILE_CANDIDATES:
        if path.exists():
            return json.loads(path.read_text())
    # The eight Llama-3 shapes of shared/bench/shapes.json, for machines without shared/.
    names = [("8B.qkv", 6144, 4096), ("8B.o", 4096, 4096), ("8B.gate_up", 28672, 4096), ("8B.down", 4096, 14336),
             ("70B.qkv", 10240, 8192), ("70B.o", 8192, 8192), ("70B.gate_up", 57344, 8192), ("70B.down", 8192, 28672)]
    return {"shapes": [{"name": n, "N": a, "K": b} for n, a, b in names], "group_size": 128,
            "decode_M": [1, 2, 4, 8, 16], "batch_M": [32, 64, 128, 256, 512, 1024, 4096]}


def select_shapes(spec: str, shapes_data: dict | None = None) -> list[dict]:
    """The shapes a comma list names: names of the shapes file (empty list: all of them) and literal
    `name=NxK` entries for shapes outside it (e.g. `8B.lm_head=128256x4096`, the LM head of bench_e2e)."""
    known = (shapes_data or load_shapes())["shapes"]
    names = [s for s in spec.split(",") if s]
    if not names:
        return list(known)
    by_name = {s["name"]: s for s in known}
    chosen = []
    for name in names:
        if "=" in name:
            label, dims = name.split("=", 1)
            n, _, k = dims.lower().partition("x")
            if not (n.isdigit() and k.isdigit()):
                raise SystemExit(f"--shapes: {name!r} is not name=NxK (e.g. 8B.lm_head=128256x4096)")
            chosen.append({"name": label, "N": int(n), "K": int(k)})
        elif name in by_name:
            chosen.append(by_name[name])
        else:
            raise SystemExit(f"--shapes: unknown shape {name!r}; known: {', '.join(by_name)}, or name=NxK")
    return chosen


def copies_needed(bytes_per_copy: int, l2_bytes: int | None = None) -> int:
    """Weight copies whose total exceeds 3x the L2, so every call streams from HBM."""
    if l2_bytes is None:
        l2_bytes = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
    return max(2, -(-3 * l2_bytes // max(1, bytes_per_copy)) + 1)


def round_order(items: list, r: int, rounds: int) -> list:
    """`items` in the order round r (of `rounds`) times them: started r / rounds of the way into the list, so that over
    the rounds every item is timed early, midway and late. Under the H200's power cap the first timings of a sequence
    ran up to 13% faster than the same kernel later in it (NOTES v46): a fixed order favours whatever goes first."""
    shift = r * len(items) // rounds
    return items[shift:] + items[:shift]


def gpu_time_us(calls, replays: int = 15, min_calls: int = 24, warm_s: float = 0.03) -> float:
    """Median GPU time per call (us) of a CUDA graph that runs `calls` round-robin, after replaying it
    for `warm_s` seconds (the first shape/M measured after building weights came out ~10% slow on the
    H200 without it: 70B.gate_up M = 1, 121.7 us in the benchmark against 109 us for the same
    configuration in tune.py; clocks ramping up from idle is the likely cause)."""
    n = max(min_calls, len(calls))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:  # warm-up: compile, allocate outside capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n):
            calls[i % len(calls)]()
    graph.replay()
    torch.cuda.synchronize()
    warm_until = time.perf_counter() + warm_s
    while time.perf_counter() < warm_until:
        graph.replay()
        torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / n)
    del graph
    return statistics.median(times)


# clocks_event_reasons bits that mean the SM clock was held down: SW power cap, HW slowdown, SW thermal, HW thermal,
# HW power brake (nvidia-smi -q names them; idle and application-clock settings are not limits)
CLOCK_LIMIT_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def parse_clock_sample(line: str):
    """One line of `nvidia-smi --query-gpu=timestamp,clocks.sm,clocks_event_reasons.active --format=csv,noheader,
    nounits` -> (epoch seconds, SM MHz, reasons bitmask), or None for anything else (a header, an error line)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 3:
        return None
    try:
        t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        return t, float(parts[1]), int(parts[2], 16)
    except ValueError:
        return None


class ClockLog:
    """The GPU's SM clock and clock-limit reasons sampled every `period_ms` by `nvidia-smi -lms` in the background,
    so that each timing can say at what clock it ran: under the benchmark's back-to-back replays the H200 hits its
    power cap and the SM clock moves between ~1.5 and 1.98 GHz (NOTES v38). A no-op where nvidia-smi is missing, and
    without samples where it does not know the query (older drivers name the reasons clocks_throttle_reasons).
    Use as a context manager; `window(t0, t1)` (time.time() bounds) summarises the samples between them."""

    QUERY = "timestamp,clocks.sm,clocks_event_reasons.active"

    def __init__(self, period_ms: int = 50):
        self.period_ms = period_ms
        self.samples: list = []
        self._proc = None
        self._reader = None

    def __enter__(self):
        smi = shutil.which("nvidia-smi")
        if smi is not None and torch.cuda.is_available():
            uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
            select = ["-i", f"GPU-{uuid}"] if uuid is not None else []
            line_buffered = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []  # (samples as they come, not at exit)
            self._proc = subprocess.Popen(line_buffered + [smi, *select, f"--query-gpu={self.QUERY}",
                                                           "--format=csv,noheader,nounits", "-lms", str(self.period_ms)],
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        return self

    def _read(self):
        for line in self._proc.stdout:
            sample = parse_clock_sample(line)
            if sample is not None:
                self.samples.append(sample)

    def __exit__(self, *exc):
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()
            self._reader.join(timeout=5)
        return False

    def settle(self) -> None:
        """Wait two sampling periods, so that the samples of a timing that just ended have arrived."""
        if self._proc is not None:
            time.sleep(2 * self.period_ms / 1000)

    def window(self, t0: float, t1: float):
        """{"sm_mhz": mean SM clock, "limited": share of samples with a power / thermal clock limit} of the samples in
        [t0, t1], or of the first one within a period after t1 when none fell inside (a timing shorter than the
        period: the clock just after it), or None."""
        samples = list(self.samples)
        inside = [(mhz, reasons) for t, mhz, reasons in samples if t0 <= t <= t1]
        if not inside:
            inside = [(mhz, reasons) for t, mhz, reasons in samples if t1 < t <= t1 + self.period_ms / 1000][:1]
        if not inside:
            return None
        return {"sm_mhz": round(statistics.fmean(mhz for mhz, _ in inside)),
                "limited": round(sum(1 for _, r in inside if r & CLOCK_LIMIT_BITS) / len(inside), 2)}


def eager_wall_us(fn, iters: int = 200, repeats: int = 5) -> float:
    """Host wall time per call of an eager loop (Python dispatch + launch), GPU synchronised at the end
    of each loop; the best of `repeats` loops (host timings are noisy, the best is the cost)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) * 1e6 / iters)
    return best


VARIANTS = {  # weight/activation formats benchmarked and tuned: name -> (activation dtype, group size, symmetric, act_order)
    "base": (torch.float16, 128, False, False),
    "bf16": (torch.bfloat16, 128, False, False),
    "sym": (torch.float16, 128, True, False),
    "g64": (torch.float16, 64, False, False),
    "act_order": (torch.float16, 128, False, True),
    "pc": (torch.float16, -1, False, False),  # per-channel: one group spanning K (-1, the usual spelling)
}


def config_overrides(spec: str, kernel) -> dict:
    """`--set KEY=INT,...` of the profiling scripts as configuration entries: 0 / 1 as bools for the on / off
    options (`kernel.dispatch.CONFIG_OPTIONS`, which a forced config must give as bools), ints otherwise."""
    options = kernel.dispatch.CONFIG_OPTIONS
    overrides = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        if not key or not value.lstrip("-").isdigit():
            raise SystemExit(f"--set / --try: each entry must be KEY=INT (0 / 1 for {', '.join(options)}), got {item!r}")
        overrides[key] = bool(int(value)) if key in options else int(value)
    return overrides


def effective_group_size(group_size: int, k: int) -> int:
    """G as the kernels take it: -1 (the usual spelling of per-channel) means one group spanning K."""
    return k if group_size == -1 else group_size


def format_label(row: dict) -> str:
    """A results row's weight format, e.g. "fp16 g128", "bf16 per-channel sym act-order"."""
    g = row.get("group_size", 128)
    parts = [row.get("dtype", "fp16"), "per-channel" if g == -1 else f"g{g}"]
    return " ".join(parts + (["sym"] if row.get("symmetric") else []) + (["act-order"] if row.get("act_order") else []))


def random_w4_weights(kernel, n: int, k: int, group_size: int, copies: int, symmetric: bool = False,
                      act_order: bool = False, scale_dtype=torch.float16) -> list:
    """`copies` kernel-native W4A16Weight objects with random codes (any int32 pattern is valid) and
    random integer zeros as the tree's `prepare_weight` stores them (`stored_zeros`)."""
    shape = kernel.layout.native_qweight_shape(n, k)
    group_size = effective_group_size(group_size, k)
    return [
        kernel.W4A16Weight(
            qweight=torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int32, device="cuda"),
            scales=(torch.rand(k // group_size, n, device="cuda") * 0.02 + 0.001).to(scale_dtype),
            zeros=None if symmetric else stored_zeros(kernel, torch.randint(0, 16, (k // group_size, n), device="cuda").to(scale_dtype)),
            perm=torch.randperm(k, device="cuda", dtype=torch.int32) if act_order else None,
            in_features=k, out_features=n, group_size=group_size,
        )
        for _ in range(copies)
    ]


def stored_zeros(kernel, zeros: torch.Tensor) -> torch.Tensor:
    """Integer-valued float zeros in the form the tree's `prepare_weight` stores them: uint8 (layout.py),
    or unchanged for an older tree under W4A16_SOURCE, which kept them in the scales' dtype."""
    return getattr(kernel.layout, "integer_zeros_as_uint8", lambda z: z)(zeros)


def w4_bytes(n: int, k: int, m: int, group_size: int, symmetric: bool = False) -> int:
    """Bytes a W4A16 GEMM must move: 4-bit codes, 16-bit scales, uint8 zeros (asymmetric), x and y.
    (Rows measured before zeros were stored as uint8 moved one byte more per zero: their GB/s is
    understated by <= 1.5% at group 128.)"""
    groups = k // effective_group_size(group_size, k)
    return n * k // 2 + n * groups * (2 if symmetric else 3) + m * k * 2 + m * n * 2


def f16_bytes(n: int, k: int, m: int) -> int:
    return n * k * 2 + m * k * 2 + m * n * 2


def tree_commit() -> str:
    """The commit results are labelled with: W4A16_COMMIT when set (scripts/gpu_session.sh: the device
    machine's copy of the tree carries a git directory whose status is not reliable there; the session
    marks what it changed itself, a tune step), else this tree's HEAD, "-dirty" with uncommitted changes."""
    if "W4A16_COMMIT" in os.environ:
        return os.environ["W4A16_COMMIT"]
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def load_for_merge(path: str, merge: bool, gpu: str, empty: dict) -> dict:
    """The results file or tuned table that a --merge run adds to (`empty` when not merging or the file does not
    exist yet). A file measured on another GPU (its `gpu`, or a table's `measured_on.gpu`) is refused before
    anything is timed: one file's rows and ratios, and a shipped table, come from one kind of card (H100 runs had
    to be kept out of h200.json by hand, NOTES v51)."""
    if not (merge and path and Path(path).exists()):
        return empty
    data = json.loads(Path(path).read_text())
    recorded = data.get("gpu") or data.get("measured_on", {}).get("gpu")
    if recorded and recorded != gpu:
        raise SystemExit(f"--merge: {path} was measured on {recorded!r} and this machine's GPU is {gpu!r}; merging "
                         f"would mix two cards' timings in one file: write this run to another --out")
    return data


def machine_info() -> dict:
    import triton

    return {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "commit": tree_commit(),
        "date": datetime.date.today().isoformat(),
    }
