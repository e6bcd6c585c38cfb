"""Path choice: which kernel and which launch configuration a GEMM of a given shape runs.

Configuration is data: `tuned_<gpu>.json` files shipped in this package, measured on that GPU by
`benchmarks/tune.py`. A file applies to the GPUs whose device name contains one of its
`applies_to` strings (the H100 and the H200 share the chip); a file may refine another (`overlays`: e.g. entries
re-tuned on an H100 over the H200's table, which serves both for everything not re-tuned; `load_tuned_table`). A
shape the table does not hold (another model's layers) takes the plan of the nearest tuned shape within
BORROW_RATIO in both N and K (`nearest_tuned_shape`: a plan is a launch configuration, valid for any shape its
kernel takes, and a near shape fills the GPU alike);
shapes farther off and GPUs without a table get a heuristic that fills the machine by split-K. `strict=True` turns
both fallbacks (anything but the shape's own tuned entry) into an error instead of a silent slowdown. Nothing is
tuned at run time, and plans are memoised per (M bucket, N, K, ...), so a call costs a dictionary look-up.

Paths:
    gemv       CUDA-core split-K kernel, tiny M
    splitk     tensor-core kernel with split-K, decode M
    streamk    tensor-core kernel on a persistent grid of PROGRAMS programs sharing the (tile, K block)
               work evenly (Stream-K), decode M
    tiled      tensor-core kernel without split-K, mid-size M
    decode     NVIDIA mma.sync kernel (Gluon, gemm_decode.py), M <= 16: one program per ROWS weight rows, BLOCK_M
               tokens and all of K, the K blocks split over its num_warps warps (no split-K workspace); ROWS,
               BLOCK_M, AHEAD (register ring depth), maxnreg, ZEROS_BY_X_SUM, ADJACENT_ROWS, X_AT_USE, EVICT_FIRST,
               TOKENS_FIRST, GATHER_PDL (act-order).
               Its entries carry FALLBACK, as pingpong's do (no Gluon, AMD)
    pingpong   Hopper warp-specialised kernel (Gluon, gemm_pingpong.py), mid and large M: consumer
               warpgroups (CONSUMERS, 2 or 1) unpack and multiply while a loader warp streams x by TMA;
               BLOCK_M, num_stages, SPLIT_K or PROGRAMS (a persistent Stream-K grid, as streamk's). Its
               entries carry FALLBACK, the plan for where it cannot run
               (no Gluon, not sm_90: AMD, older Tritons, other NVIDIA GPUs)
    dense      dequantize into a scratch [N, K] fp16/bf16 buffer (N*K*2 bytes, freed after the
               call) and call cuBLAS: prefill
    reference  plain torch (dequantize + matmul): CPU tensors

A call's `pdl=True` (not a tuned option: it states what the caller knows about the kernels around the GEMM) adds
the plan option PDL on sm_90+ to decode and tensor-core plans (PDL_PATHS): the GEMM is launched as a programmatic
dependent of the kernel before it, loads its first weight blocks before waiting for that kernel (griddepcontrol.wait)
and reads x only after, and lets the kernel after it launch early. The caller promises that the kernel before does not
write the weight's tensors (the model's activations, not its weights, come from there).
"""

from __future__ import annotations

import functools
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import gemm_decode, gemm_pingpong
from .gemm_decode import adjacent_rows_apply
from .gemm_decode import available as decode_available
from .gemm_pingpong import available as pingpong_available

__all__ = ["PATHS", "TENSOR_CORE_PATHS", "GLUON_PATHS", "Plan", "plan_gemm", "m_bucket", "load_tuned_table", "entry_key", "index_tuned_entries",
           "format_key", "tuned_row", "nearest_tuned_shape", "takes_shape", "wave_fill", "keeps_wave_fill", "stream_k_form", "BORROW_RATIO", "CONFIG_KEYS", "PATH_CONFIG_KEYS", "CONFIG_OPTIONS", "row_config", "programmatic_launch",
           "PDL_PATHS"]

logger = logging.getLogger(__name__)

PATHS = ("gemv", "splitk", "streamk", "tiled", "decode", "pingpong", "dense", "reference")
TENSOR_CORE_PATHS = ("splitk", "streamk", "tiled")  # the paths of the tensor-core kernels (their options apply)
GLUON_PATHS = ("decode", "pingpong")  # kernels written in Gluon: their tuned entries carry a FALLBACK plan
# kernels that can be a programmatic dependent (griddepcontrol.wait): of act-order's gather (GATHER_PDL) or of any
# kernel (a call's `pdl`: PDL)
PDL_PATHS = TENSOR_CORE_PATHS + ("decode",)
_M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
_TUNED_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Plan:
    """What one GEMM call runs: the path, its launch configuration, and where the choice came from."""

    path: str
    config: dict = field(default_factory=dict, hash=False, compare=False)
    source: str = "heuristic"  # "tuned:<file>", "heuristic", "forced", "cpu"
    # The launches gemm.py prepares for this plan, per weight format: kept on the plan, which the
    # dispatcher memoises, so preparing happens once per (shape bucket, format).
    launches: dict = field(default_factory=dict, hash=False, compare=False, repr=False)

    def __str__(self) -> str:
        cfg = " ".join(f"{k}={v}" for k, v in sorted(self.config.items()))
        return f"{self.path} ({self.source}) {cfg}".strip()


def m_bucket(m: int) -> int:
    """The smallest tuned M bucket >= m (M beyond the last bucket uses the last)."""
    for b in _M_BUCKETS:
        if m <= b:
            return b
    return _M_BUCKETS[-1]


def format_key(dtype: torch.dtype, group_size: int, symmetric: bool, act_order: bool = False) -> tuple[str, int, bool, bool]:
    """How tuned entries name a weight format: (activation dtype, group size, symmetric, act-order)."""
    return str(dtype).replace("torch.", ""), group_size, symmetric, act_order


@functools.lru_cache(maxsize=None)
def load_tuned_table(device_name: str, directory: Path = _TUNED_DIR) -> tuple[str, dict, dict, int | None] | None:
    """The tuned tables in `directory` (the shipped ones) whose `applies_to` matches this device name, as one table:
    (file, {(N, K): rows sorted by M}, {(N, K, format_key): {M: row}}, the SM count it was measured on).

    A table may name in `overlays` another shipped table that it refines: its entries replace that table's for the
    same (N, K, M bucket, format) (`entry_key`) and the other's entries serve everything else. Of the tables that
    match, the one no other matching table overlays is used, with the chain it overlays; `file` names it, and every
    row carries `table`, the file it comes from (a plan's source says which). Tables of one chain must agree on the
    base group size and the SM count, and two matching tables outside one chain are ambiguous (a ValueError names the
    files)."""
    tables = {path.name: json.loads(path.read_text()) for path in sorted(directory.glob("tuned_*.json"))}
    for name, data in tables.items():
        if data.get("overlays") not in (None, *(other for other in tables if other != name)):
            raise ValueError(f"{name}: `overlays` must name another tuned table in {directory}, got {data['overlays']!r}")
    matching = [name for name, data in tables.items() if any(tag in device_name for tag in data["applies_to"])]
    overlaid = {tables[name].get("overlays") for name in matching}
    tops = [name for name in matching if name not in overlaid]
    if not tops and matching:
        raise ValueError(f"tuned tables {matching} overlay one another in a cycle")
    if not tops:
        return None
    if len(tops) > 1:  # two tables for one GPU, neither refining the other: which one serves it is not data's choice
        raise ValueError(f"tuned tables {tops} all apply to {device_name!r}: one must name the other in `overlays`, "
                         f"or their `applies_to` must not overlap")
    chain = [tops[0]]
    while (below := tables[chain[-1]].get("overlays")) is not None:
        if below in chain:  # a cycle below the top (tables there need not match the GPU)
            raise ValueError(f"tuned tables {chain} overlay one another in a cycle")
        for key in ("group_size", "sm_count"):
            if tables[below].get(key) != tables[chain[0]].get(key):
                raise ValueError(f"{chain[0]} overlays {below}: their {key} must agree, got "
                                 f"{tables[chain[0]].get(key)} and {tables[below].get(key)}")
        chain.append(below)
    rows = {}
    for name in reversed(chain):  # the refining table's entries last, replacing the same keys
        rows.update({entry_key(row): {**row, "table": name} for row in tables[name]["entries"]})
    top = tables[chain[0]]
    return (chain[0], *index_tuned_entries({"group_size": top["group_size"], "entries": list(rows.values())}),
            top.get("sm_count"))


def entry_key(row: dict) -> tuple:
    """A tuned entry's identity, (N, K, M bucket, format fields): base-format entries have no format fields."""
    return (row["N"], row["K"], row["M"], row.get("dtype", ""), row.get("group_size", 0), row.get("symmetric", False),
            row.get("act_order", False))


def index_tuned_entries(data: dict) -> tuple[dict, dict]:
    """A tuned table's entries as ({(N, K): rows sorted by M}, {(N, K, format_key): {M: row}}), `tuned_row`'s input.

    Entries without `dtype` / `group_size` / `symmetric` / `act_order` fields were tuned on the table's
    base format (fp16 activations, the table's `group_size`, asymmetric) and serve every format; entries
    with them were tuned on that format and take precedence for their exact M bucket.
    """
    base: dict = {}
    by_format: dict = {}
    for row in data["entries"]:
        if any(key in row for key in ("dtype", "group_size", "symmetric", "act_order")):
            fmt = (row.get("dtype", "float16"), row.get("group_size", data["group_size"]), row.get("symmetric", False),
                   row.get("act_order", False))
            by_format.setdefault((row["N"], row["K"], fmt), {})[row["M"]] = row
        else:
            base.setdefault((row["N"], row["K"]), []).append(row)
    for rows in base.values():
        rows.sort(key=lambda r: r["M"])
    return base, by_format


def programs_for_device(programs: int, table_sm_count: int | None, sm_count: int) -> int:
    """A Stream-K entry's PROGRAMS (measured with table_sm_count SMs) for a GPU with sm_count SMs: the same
    programs per SM (a table applies to a chip family, e.g. H100 SXM 132 SMs and PCIe 114; a persistent
    grid sized for more SMs than the GPU has would leave programs waiting for a second wave)."""
    if not table_sm_count or table_sm_count == sm_count:
        return programs
    return max(1, round(programs * sm_count / table_sm_count))


def tuned_row(table: dict, by_format: dict, mb: int, n: int, k: int, fmt: tuple) -> dict | None:
    """The tuned entry for M bucket mb of an N x K weight in format fmt (see `load_tuned_table`):
    the format's own entry for exactly this bucket (for act-order, else that of the same format
    without it), else the base entry of the first bucket >= mb, else None (shape not tuned, or tuned
    only for smaller M: a decode-sized plan must not serve prefill)."""
    row = by_format.get((n, k, fmt), {}).get(mb)
    if row is None and fmt[3]:
        row = by_format.get((n, k, (*fmt[:3], False)), {}).get(mb)
    if row is None:
        row = next((r for r in table.get((n, k), ()) if r["M"] >= mb), None)
    return row


BORROW_RATIO = 2.0  # how far (a factor in N and in K) an untuned shape may be from the tuned shape whose plan it takes


def nearest_tuned_shape(table: dict, n: int, k: int, mb: int) -> tuple[int, int] | None:
    """The tuned shape (N0, K0) whose plan an untuned N x K weight takes at M bucket mb: among the table's base
    shapes tuned at a bucket >= mb and within BORROW_RATIO of N and of K, the nearest by |log N / N0| + |log K / K0|
    (ties: the smaller shape); None if there is none."""
    limit = math.log(BORROW_RATIO) + 1e-9
    best = None
    for (n0, k0), rows in table.items():
        dn, dk = abs(math.log(n / n0)), abs(math.log(k / k0))
        if dn <= limit and dk <= limit and rows and rows[-1]["M"] >= mb:
            key = (dn + dk, n0, k0)
            best = key if best is None or key < best else best
    return None if best is None else best[1:]


def takes_shape(row: dict, n: int, k: int) -> bool:
    """Whether a tuned entry's plan, taken by another shape (`nearest_tuned_shape`), can run on N x K: the decode
    kernel needs K a multiple of 128 and, with TOKENS_FIRST, at most 65535 weight tiles (the grid's second axis);
    every other path takes any shape (`gemm_decode.takes_shape`)."""
    return row["path"] != "decode" or gemm_decode.takes_shape(row, n, k)


def wave_fill(row: dict, mb: int, n: int, k: int, sm_count: int) -> tuple[int, float] | None:
    """(waves, fill) of a plan's grid for M bucket mb on an N x K weight: the waves of resident-program slots it takes
    and the share of those slots its programs fill (1.0: the last wave is full); None where the plan fixes neither
    (the kernels' `resident_programs`, `grid_programs`: decode under maxnreg, pingpong without PROGRAMS)."""
    if row["path"] == "decode":
        per_sm, programs = gemm_decode.resident_programs(row), gemm_decode.grid_programs(row, mb, n)
    elif row["path"] == "pingpong":
        per_sm, programs = gemm_pingpong.resident_programs(row), gemm_pingpong.grid_programs(row, mb, n, k)
    else:
        return None
    if per_sm is None or programs is None:
        return None
    slots = per_sm * sm_count
    waves = -(-programs // slots)
    return waves, programs / (waves * slots)


WAVE_FILL_KEPT = 0.75  # a borrowed plan that spills into another wave may lose at most this factor of its fill
WAVE_GUARD_FROM_M = 16  # ... from this M bucket: below it the decode kernel's lead over split-K is larger (NOTES v51)


def keeps_wave_fill(row: dict, mb: int, shape: tuple[int, int], tuned_shape: tuple[int, int], sm_count: int) -> bool:
    """Whether a plan tuned on tuned_shape (N0, K0), taken at M bucket mb by an N x K weight (`nearest_tuned_shape`),
    keeps its waves full (`wave_fill`): False where its grid needs more waves on N x K than on N0 x K0 and fills them
    less than WAVE_FILL_KEPT as well, i.e. a grid that fit one wave on the tuned shape and spills a few programs into a
    second on a slightly wider one. Measured (NOTES v51, H100): 4608 x 3584 taking 4096 x 4096's plans ran 10% slower
    than the split-K heuristic at M = 16 (decode, 288 programs on 264 slots), 21% at M = 256 (pingpong, 144 on 132),
    tied at M = 64, and 27% faster at M = 1 (hence WAVE_GUARD_FROM_M). True where the fill is not known."""
    if mb < WAVE_GUARD_FROM_M:
        return True
    got, tuned = wave_fill(row, mb, *shape, sm_count), wave_fill(row, mb, *tuned_shape, sm_count)
    if got is None or tuned is None:
        return True
    return got[0] <= tuned[0] or got[1] >= WAVE_FILL_KEPT * tuned[1]


def stream_k_form(row: dict, sm_count: int) -> dict:
    """A pingpong entry's plan on a persistent Stream-K grid of one wave (PROGRAMS = resident programs x sm_count, no
    SPLIT_K): the same tiles and pipeline, the work shared evenly over the programs, so no last wave goes part-empty."""
    return {**{key: v for key, v in row.items() if key != "SPLIT_K"},
            "PROGRAMS": gemm_pingpong.resident_programs(row) * sm_count}


@functools.lru_cache(maxsize=None)
def _device_info(device: torch.device) -> tuple[str, int]:
    props = torch.cuda.get_device_properties(device)
    return props.name, props.multi_processor_count


def sm_count(device: torch.device) -> int:
    """The device's streaming multiprocessors (1 for a CPU device: Triton's interpreter)."""
    return _device_info(device)[1] if device.type == "cuda" else 1


@functools.lru_cache(maxsize=None)
def programmatic_launch(device: torch.device) -> bool:
    """Whether a kernel may be launched as a programmatic dependent of the one before it (griddepcontrol):
    NVIDIA sm_90+ only (not AMD, not CPU tensors, which Triton's interpreter runs)."""
    return device.type == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability(device)[0] >= 9


def _applicable(plan: Plan, act_order: bool, device: torch.device, group_size: int, k: int, pdl: bool = False) -> Plan:
    """`plan` without the options that do not apply to this call and with the call's PDL, decided once per plan (not
    per call), so that the plan says what runs: GATHER_PDL (act-order's GEMM launched as a programmatic dependent of
    the gather of x) needs act-order weights, a path of PDL_PATHS and `programmatic_launch`; ADJACENT_ROWS (the
    decode kernel's row order for its per-block scale and zero loads) needs `gemm_decode.adjacent_rows_apply` (not
    per-channel); PDL (the call's `pdl`: module docstring) is added for a path of PDL_PATHS under `programmatic_launch`."""
    dropped = set()
    if plan.config.get("GATHER_PDL") and not (act_order and plan.path in PDL_PATHS and programmatic_launch(device)):
        dropped.add("GATHER_PDL")
    if plan.config.get("ADJACENT_ROWS") and not adjacent_rows_apply(group_size, k):
        dropped.add("ADJACENT_ROWS")
    added = {"PDL": True} if pdl and plan.path in PDL_PATHS and programmatic_launch(device) else {}
    if dropped or added:
        return Plan(plan.path, {**{key: v for key, v in plan.config.items() if key not in dropped}, **added}, plan.source)
    return plan


def _split_for(tiles: int, k_blocks: int, sm_count: int, max_split: int = 16) -> int:
    """Enough K splits that tiles * split covers the SMs about twice, and at least 2 blocks per split."""
    want = max(1, (2 * sm_count + tiles - 1) // tiles)
    return max(1, min(want, max_split, k_blocks // 2 or 1))


def _heuristic(m: int, n: int, k: int, sm_count: int) -> Plan:
    k_blocks = -(-k // 128)
    if m <= 16:
        block_n, block_m = 64, 16
        path = "splitk"
    elif m <= 128:
        block_n, block_m = 128, (32 if m <= 32 else 64)
        path = "tiled"
    else:
        return Plan("dense", {}, "heuristic")
    tiles = -(-n // block_n) * -(-m // block_m)
    split = _split_for(tiles, k_blocks, sm_count)
    if split > 1:
        path = "splitk"
    # The fold at M <= 32, scale-in-operand above: the H200's split at the time of v4 (benchmarks/NOTES.md). Since
    # the uint8-zero kernels the H200's decode entries are mostly scale-in-operand at BLOCK_N = 128 (v15); at this
    # BLOCK_N = 64 scale-in-operand would re-lay the operand out through shared memory, so the fold stays here.
    cfg = {"BLOCK_N": block_n, "BLOCK_M": block_m, "SPLIT_K": split, "num_warps": 4, "num_stages": 3, "SCALE_IN_OPERAND": m > 32}
    return Plan(path, cfg, "heuristic")


# The configuration keys each path's launcher reads. A forced config with any other key is refused (`_forced`), so
# that an option given to a path that never reads it (tune.py --try, a test) is an error, not a silent no-op that a
# tuned entry would then record; tests/test_gemm.py holds the shipped table's entries to the same sets.
_TILE_KEYS = ("BLOCK_N", "BLOCK_M", "SPLIT_K", "num_warps", "num_stages", "maxnreg")
_TENSOR_CORE_KEYS = _TILE_KEYS + ("SCALE_IN_OPERAND", "ONE_TOKEN", "DOT_PARTS", "GATHER_PDL", "STREAM_PARAMS")
PATH_CONFIG_KEYS = {
    "gemv": _TILE_KEYS,
    "splitk": _TENSOR_CORE_KEYS,
    "tiled": _TENSOR_CORE_KEYS,
    "streamk": tuple(key for key in _TENSOR_CORE_KEYS if key != "SPLIT_K") + ("PROGRAMS",),  # PROGRAMS replaces SPLIT_K
    "decode": ("BLOCK_M", "num_warps", "maxnreg", "ROWS", "AHEAD", "ZEROS_BY_X_SUM", "ADJACENT_ROWS", "X_AT_USE",
               "EVICT_FIRST", "TOKENS_FIRST", "GATHER_PDL"),
    "pingpong": ("BLOCK_M", "SPLIT_K", "PROGRAMS", "num_stages", "maxnreg", "CONSUMERS", "UNPACK_AHEAD", "WORDS_TMA"),
    "dense": (),
    "reference": (),
}
CONFIG_KEYS = tuple(dict.fromkeys(key for keys in PATH_CONFIG_KEYS.values() for key in keys))  # every path's, once


# the on / off options among them: bools (a forced config is checked in `_forced`, the one place caller-given
# configurations enter; the shipped table's entries by tests/test_gemm.py's table test)
CONFIG_OPTIONS = ("SCALE_IN_OPERAND", "ONE_TOKEN", "GATHER_PDL", "STREAM_PARAMS", "UNPACK_AHEAD", "WORDS_TMA", "ZEROS_BY_X_SUM",
                  "ADJACENT_ROWS", "X_AT_USE", "EVICT_FIRST", "TOKENS_FIRST")


def row_config(row: dict) -> dict:
    """The launch configuration a tuned entry holds (its keys of CONFIG_KEYS; not its path, time or notes)."""
    return {key: row[key] for key in CONFIG_KEYS if key in row}


def runnable_row(row: dict, gluon_ok: dict) -> dict | None:
    """The tuned row to run: `row`, or for a row of a Gluon path that cannot run here (`gluon_ok[path]` False: no
    Gluon, another GPU) the plan it carries as FALLBACK (None if it has none)."""
    if row["path"] in GLUON_PATHS and not gluon_ok[row["path"]]:
        return row.get("FALLBACK")
    return row


def _forced(path: str, m: int, n: int, k: int, config: dict | None = None) -> Plan:
    """Small, always-valid configurations for a path named by the caller (tests, benchmarks), with
    `config`'s entries (keys of CONFIG_KEYS) replacing the defaults."""
    if path not in PATHS:
        raise ValueError(f"path must be 'auto' or one of {PATHS}, got {path!r}")
    plan = _forced_default(path, m)
    if config:
        unknown = set(config) - set(PATH_CONFIG_KEYS[path])
        if unknown:
            raise ValueError(f"config keys for path {path!r} must be among {PATH_CONFIG_KEYS[path]}, got {sorted(unknown)}")
        for key in CONFIG_OPTIONS:
            if key in config and not isinstance(config[key], bool):
                raise ValueError(f"config {key} must be True or False, got {config[key]!r}")
        plan = Plan(path, {**plan.config, **config}, "forced")
    return plan


def _forced_default(path: str, m: int) -> Plan:
    if path == "gemv":
        block_m = 1 << max(0, (min(m, 4) - 1).bit_length())
        return Plan(path, {"BLOCK_N": 32, "BLOCK_M": block_m, "SPLIT_K": 2, "num_warps": 4, "num_stages": 2}, "forced")
    if path == "splitk":
        return Plan(path, {"BLOCK_N": 32, "BLOCK_M": 16, "SPLIT_K": 2, "num_warps": 4, "num_stages": 2}, "forced")
    if path == "streamk":  # 3 programs: tiles shared by two or three programs, and whole ones, at test sizes
        return Plan(path, {"BLOCK_N": 32, "BLOCK_M": 16, "PROGRAMS": 3, "num_warps": 4, "num_stages": 2}, "forced")
    if path == "tiled":
        return Plan(path, {"BLOCK_N": 32, "BLOCK_M": 32 if m > 16 else 16, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2}, "forced")
    if path == "pingpong":
        return Plan(path, {"BLOCK_M": 64, "SPLIT_K": 1, "num_stages": 3}, "forced")
    if path == "decode":
        return Plan(path, {"num_warps": 4, "ROWS": 16, "AHEAD": 1}, "forced")
    return Plan(path, {}, "forced")


@functools.lru_cache(maxsize=4096)
def _plan_cached(mb: int, n: int, k: int, group_size: int, dtype: torch.dtype, device: torch.device, symmetric: bool,
                 act_order: bool, pdl: bool = False) -> Plan:
    name, sm_count = _device_info(device)
    tuned = load_tuned_table(name)
    plan, near, refused = None, None, ""
    if tuned is not None:
        _, table, by_format, table_sm_count = tuned
        fmt = format_key(dtype, group_size, symmetric, act_order)
        row = tuned_row(table, by_format, mb, n, k, fmt)
        if row is None and (near := nearest_tuned_shape(table, n, k, mb)) is not None:
            n0, k0 = near
            # (per-channel formats are keyed by their group size, K: the near shape's own K)
            row = tuned_row(table, by_format, mb, n0, k0, (fmt[0], k0, *fmt[2:]) if group_size == k else fmt)
        # (every row names its file: load_tuned_table)
        source = "" if row is None else f"tuned:{row['table']}" if near is None else f"nearest:{row['table']} {near[0]}x{near[1]}"
        gluon_ok = {"decode": decode_available(device), "pingpong": pingpong_available(device)}
        runnable = None if row is None else runnable_row(row, gluon_ok)
        if runnable is not None and not takes_shape(runnable, n, k):
            runnable = row.get("FALLBACK") if runnable is row else None
        if runnable is not None and runnable is not row:
            source += f" (FALLBACK of a {row['path']} entry)"
        if runnable is not None and near is not None and not keeps_wave_fill(runnable, mb, (n, k), near, sm_count):
            if runnable["path"] == "pingpong":  # in the table's SM count, as a tuned Stream-K entry (programs_for_device)
                runnable = stream_k_form(runnable, table_sm_count or sm_count)
                source += ", Stream-K: its split-K grid would spill a wave"
            else:
                runnable, refused = None, f" ({source}: its {runnable['path']} plan would spill a wave)"
        if runnable is not None:
            cfg = row_config(runnable)
            if "PROGRAMS" in cfg:
                cfg["PROGRAMS"] = programs_for_device(cfg["PROGRAMS"], table_sm_count, sm_count)
            plan = Plan(runnable["path"], cfg, source)
    if plan is None:  # no table for this GPU, no entry for this shape or a near one, or none that can run here
        plan = _heuristic(mb, n, k, sm_count)
        if refused:
            plan = Plan(plan.path, plan.config, plan.source + refused)
    plan = _applicable(plan, act_order, device, group_size, k, pdl)
    logger.debug("w4a16 plan M<=%d N=%d K=%d G=%d %s sym=%s act-order=%s on %s: %s", mb, n, k, group_size, dtype, symmetric,
                 act_order, name, plan)
    return plan


def plan_gemm(
    m: int,
    n: int,
    k: int,
    group_size: int,
    dtype: torch.dtype,
    device: torch.device,
    path: str = "auto",
    symmetric: bool = False,
    strict: bool = False,
    config: dict | None = None,
    act_order: bool = False,
    pdl: bool = False,
) -> Plan:
    """The plan for y[m, n] = x[m, k] @ W. `path` other than "auto" forces a path (and `config`
    may then override its launch configuration: tests and benchmarks). `pdl`: the call's programmatic launch
    (module docstring), plan option PDL where it applies.

    With `strict=True`, a plan that does not come from a tuned table's entry for this GPU and shape (the
    nearest tuned shape's plan, the heuristic) raises RuntimeError (so a deployment notices a silent fallback to a
    configuration not measured on its shapes). `device` may be given as a
    string ("cuda:0").
    """
    if isinstance(device, str):
        device = torch.device(device)
    elif not isinstance(device, torch.device):
        raise TypeError(f"device must be a torch.device or a device string, got {type(device).__name__}")
    if path != "auto":
        return _applicable(_forced(path, m, n, k, config), act_order, device, group_size, k, pdl)
    if config is not None:
        raise ValueError("config may only be given together with a forced path (path='splitk', ...)")
    if device.type != "cuda":
        if strict:
            raise RuntimeError(f"w4a16: no Triton path for tensors on {device} (strict): only the plain torch reference runs there")
        return Plan("reference", {}, "cpu")
    plan = _plan_cached(m_bucket(m), n, k, group_size, dtype, device, symmetric, act_order, pdl)
    if strict and not plan.source.startswith("tuned"):
        raise RuntimeError(
            f"w4a16: no tuned configuration for M={m} N={n} K={k} on {_device_info(device)[0]} (strict); "
            f"the plan would be {plan}. Tune with benchmarks/tune.py or pass strict=False."
        )
    return plan
