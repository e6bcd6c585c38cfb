"""Launch plumbing for the Triton kernels of gemm.py and the Gluon kernels of gemm_decode.py and gemm_pingpong.py:
per-stream split-K scratch and a repeat-launch fast path. No kernels here; nothing here changes what a kernel computes.

- `COMPILE_OPTIONS`: the compile options every kernel is built with, stated, so that a Triton release that
  changes a default does not change the code a kernel compiles to.
- `split_k_scratch`: the fp32 partial-sum workspace and the zeroed arrival counters a split-K launch
  needs, cached per (device, stream) so that a call allocates nothing and runs no memset.
- `PreparedLaunch`: a kernel with its constexprs and options fixed once; a call launches it with
  this call's tensors, ints (and TMA descriptors), skipping Triton's per-call dispatch on repeat
  launches (NVIDIA, the Triton versions it mirrors); everywhere else Triton's own path.
- `BoundLaunch`: one launch of a `PreparedLaunch` (compiled kernel, grid, stream, arguments) kept to
  be repeated with new addresses for some of its tensors (and new TMA descriptors).
- `RepeatLaunch`: a GEMM's `BoundLaunch` with its output allocation and alignment checks: the eager
  repeat call's host path (`matmul.matmul_weight`).
- `programmatic_dependence`: what a plan's GATHER_PDL / PDL options ask of a kernel (wait for the kernel before,
  release the kernel after), read by the launchers of gemm.py and gemm_decode.py alike.
- `compile_gluon_for_sm90`: a Gluon kernel compiled for sm_90 without a GPU, as a launch would specialise it (the
  CI check of the Gluon kernels, `compile_for_sm90` of gemm_decode.py and gemm_pingpong.py).
"""

from __future__ import annotations

import torch
import triton

__all__ = ["COMPILE_OPTIONS", "COUNTER_SLOT", "split_k_scratch", "workspace_entry", "current_stream", "PreparedLaunch",
           "BoundLaunch", "RepeatLaunch", "TRITON_TYPE_NAMES", "programmatic_dependence", "compile_gluon_for_sm90"]


# Compile options every kernel of the package is built with, stated rather than left to Triton's defaults:
# FMA contraction on (the fold's `acc += s * part` as one FFMA, and ptxas's fmad). Triton 3.9 still defaults to it
# but warns that 3.10 will not (TRITON_DEFAULT_FP_FUSION); 3.6 takes the same value by default.
COMPILE_OPTIONS = {"enable_fp_fusion": True}

COUNTER_SLOT = 16384  # split-K tiles per stream (N / BLOCK_N * M / BLOCK_M; 57344 / 64 * 4 = 3584)
_SCRATCH_STREAMS = 16  # streams per device with cached scratch (counter slot + workspace)
_counter_pools: dict = {}  # device -> zeroed int32 [_SCRATCH_STREAMS * COUNTER_SLOT]
_scratch: dict = {}  # (device, stream) -> [counter slot, fp32 workspace]


def split_k_scratch(device: torch.device, stream: int, tiles: int, partials: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 workspace of >= `partials` elements, zeroed int32 arrival counters for `tiles` tiles).

    Both are kept per (device, stream) and reused, so a split-K call allocates nothing. GEMMs on one
    stream run in order and never share them in flight; two streams never share them. The kernel's
    last arriving split resets its tile's counter, so the counters are zero again after every launch.
    Counter slots come from one pool per device, zeroed when it is made, eagerly. The first
    _SCRATCH_STREAMS streams of a device get cached scratch; later streams, a pool not yet made
    (CUDA-graph capture before any eager call on the device) or more tiles than a slot holds get a
    fresh workspace and freshly zeroed counters per call (a memset, which a graph then replays).
    """
    entry = _scratch.get((device, stream))
    if entry is None:
        pool = _counter_pools.get(device)
        if pool is None and not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            pool = _counter_pools[device] = torch.zeros(_SCRATCH_STREAMS * COUNTER_SLOT, device=device, dtype=torch.int32)
        used = sum(1 for d, _ in _scratch if d == device)
        if pool is None or used >= _SCRATCH_STREAMS or tiles > COUNTER_SLOT:
            return (torch.empty(partials, device=device, dtype=torch.float32),
                    torch.zeros(tiles, device=device, dtype=torch.int32))
        entry = _scratch[(device, stream)] = [pool[used * COUNTER_SLOT: (used + 1) * COUNTER_SLOT],
                                              torch.empty(0, device=device, dtype=torch.float32)]
    slot, work = entry
    if work.numel() < partials:
        work = entry[1] = torch.empty(partials, device=device, dtype=torch.float32)
    if tiles > COUNTER_SLOT:
        return work, torch.zeros(tiles, device=device, dtype=torch.int32)
    return work, slot


def workspace_entry(device: torch.device, stream: int) -> list | None:
    """The cached [counter slot, workspace] pair of (device, stream), or None. Its workspace is replaced
    (a larger one) when a call needs more: a kept launch compares it with the workspace it bound."""
    return _scratch.get((device, stream))


def current_stream(device: torch.device) -> int:
    """The raw current stream of `device` (0 off CUDA); a device without an index means the current one."""
    if device.type != "cuda":
        return 0
    return triton.runtime.driver.active.get_current_stream(torch.cuda.current_device() if device.index is None else device.index)


# The repeat-launch fast path below mirrors what `JITFunction.run` does after its cache look-up in
# these Triton versions (the dispatch around it costs tens of microseconds per call on a slow host).
# Checked on NVIDIA only (ROCm builds of torch also report device type "cuda": they take Triton's path).
_FAST_LAUNCH_TRITON = ("3.6.",)
_fast_launch = triton.__version__.startswith(_FAST_LAUNCH_TRITON) and torch.version.hip is None


def _takes_fast_path(tensor: torch.Tensor) -> bool:
    """Whether launches with `tensor` first may skip Triton's dispatch (NVIDIA GPU, mirrored Triton)."""
    return _fast_launch and tensor.is_cuda


class PreparedLaunch:
    """One Triton kernel with its constexprs and launch options fixed (made once per plan and format):
    calling it launches the kernel on a grid with this call's tensors and run-time ints.

    `tensor_names` / `int_names` name the kernel parameters that the call passes by position, and
    `descriptor_names` its host-side TMA descriptors (Triton's launcher encodes each per call; a
    descriptor specialises the kernel on its dtype, block shape and layout: the launch's key has the
    first two, the caller keeps the layout fixed). The first launch of each specialisation (device;
    tensor dtypes and 16-byte alignment; each int's width, == 1 and divisibility by 16; descriptors'
    dtype and block shape: what Triton specialises on) goes through `kernel[grid](...)`,
    compiling if needed, and keeps the compiled kernel; later ones fill a pre-ordered argument list
    and call its launcher directly with the stream and hooks Triton would pass. Tensors reach the
    launcher as their addresses: given tensors it would call `data_ptr()` and ask the driver to
    validate each address per call, which the caller's device checks (matmul.py, layout.py) cover. Off NVIDIA GPUs, under the interpreter, or on other Triton versions: Triton's own path.
    """

    def __init__(self, kernel, constexprs: dict, options: dict, tensor_names: tuple, int_names: tuple,
                 descriptor_names: tuple = ()):
        self.kernel, self.constexprs, self.options = kernel, constexprs, {**COMPILE_OPTIONS, **options}
        self.tensor_names, self.int_names, self.descriptor_names = tensor_names, int_names, descriptor_names
        names = list(kernel.arg_names)
        self._template = [constexprs.get(name) for name in names]  # constexpr slots filled once
        self._tensor_slots = [names.index(name) for name in tensor_names]
        self._int_slots = [names.index(name) for name in int_names]
        self._descriptor_slots = [names.index(name) for name in descriptor_names]
        self._compiled: dict = {}

    def __call__(self, grid: tuple, tensors: tuple, ints: tuple, stream: int, descriptors: tuple = ()) -> None:
        if not _takes_fast_path(tensors[0]):
            self._launch_through_triton(grid, tensors, ints, descriptors)
            return
        addresses = [t.data_ptr() for t in tensors]
        spec = self._spec(tensors, addresses, ints, descriptors)
        compiled = self._compiled.get(spec)
        if compiled is None:
            self._compiled[spec] = self._launch_through_triton(grid, tensors, ints, descriptors)
            return
        args = self._arguments(addresses, ints)
        for slot, descriptor in zip(self._descriptor_slots, descriptors):
            args[slot] = descriptor
        _run_compiled(compiled, grid, stream, args)

    def bind(self, grid: tuple, tensors: tuple, ints: tuple, stream: int, call_slots: tuple,
             descriptors: tuple = ()) -> BoundLaunch | None:
        """This launch (as `__call__` would run it) kept for repeating, or None where the fast path
        does not apply: not NVIDIA / not these Triton versions, not compiled yet for this
        specialisation, or a tensor address not 16-byte aligned. `call_slots` name the positions in
        `tensors` whose addresses each repeat passes anew; the others are fixed, and kept alive. A repeat
        passes every descriptor anew too (each holds an address), after the addresses, and must keep their
        dtype and block shape (the specialisation bound here)."""
        if not _takes_fast_path(tensors[0]):
            return None
        addresses = [t.data_ptr() for t in tensors]
        spec = self._spec(tensors, addresses, ints, descriptors)
        compiled = self._compiled.get(spec)
        if compiled is None or any(a % 16 for a in addresses):
            return None
        kept = tuple(t for i, t in enumerate(tensors) if i not in call_slots)
        return BoundLaunch(compiled, grid, stream, self._arguments(addresses, ints),
                           tuple(self._tensor_slots[i] for i in call_slots) + tuple(self._descriptor_slots), kept)

    @staticmethod
    def _spec(tensors: tuple, addresses: list, ints: tuple, descriptors: tuple) -> tuple:
        # what Triton specialises a kernel on: device; tensor dtypes and 16-byte alignment; each
        # int's width, == 1 and divisibility by 16; each descriptor's dtype and block shape
        return (tensors[0].get_device(), *[t.dtype for t in tensors], *[a % 16 == 0 for a in addresses],
                *[(-(2**31) <= v < 2**31, v == 1, v % 16 == 0) for v in ints],
                *[(d.base.dtype, tuple(d.block_shape)) for d in descriptors])

    def _arguments(self, addresses: list, ints: tuple) -> list:
        """The launcher's argument list: every kernel parameter in order (constexprs included)."""
        args = self._template.copy()
        for slot, address in zip(self._tensor_slots, addresses):
            args[slot] = address
        for slot, value in zip(self._int_slots, ints):
            args[slot] = value
        return args

    def _launch_through_triton(self, grid: tuple, tensors: tuple, ints: tuple, descriptors: tuple = ()):
        return self.kernel[grid](**dict(zip(self.tensor_names, tensors)), **dict(zip(self.int_names, ints)),
                                 **dict(zip(self.descriptor_names, descriptors)), **self.constexprs, **self.options)


def _run_compiled(compiled, grid: tuple, stream: int, args: list) -> None:
    """Launch a compiled kernel as `JITFunction.run` does after its cache look-up (Triton 3.6)."""
    knobs = triton.knobs.runtime
    grid_x, grid_y, grid_z = (*grid, 1, 1)[:3]  # a 1-D grid (Stream-K) is (P, 1, 1) to the launcher
    compiled.run(grid_x, grid_y, grid_z, stream, compiled.function, compiled.packed_metadata,
                 compiled.launch_metadata(grid, stream, *args), knobs.launch_enter_hook, knobs.launch_exit_hook, *args)


class BoundLaunch:
    """A compiled kernel's launch with grid, stream and arguments fixed: a call passes new values for the
    parameters at `call_slots` (kernel parameter positions: tensor addresses, then any TMA descriptors) and
    launches. Made by `PreparedLaunch.bind` after a launch of the same specialisation; the caller guarantees
    that the repeat matches it (same shapes, strides, dtypes; every address 16-byte aligned; descriptors of
    the same dtype, block shape and layout).

    With no launch hooks registered (no profiler attached) it calls Triton's C launcher directly
    (no launch metadata, no hook calls, no scratch allocation: the kernels need none; a descriptor is
    encoded by the launcher's own wrapper, as on Triton's path); otherwise, or if the compiled kernel
    wants global scratch, it launches as `JITFunction.run` would.
    """

    __slots__ = ("compiled", "grid", "stream", "args", "call_slots", "kept", "_direct")

    def __init__(self, compiled, grid: tuple, stream: int, args: list, call_slots: tuple, kept: tuple):
        self.compiled, self.grid, self.stream, self.args = compiled, (*grid, 1, 1)[:3], stream, args
        self.call_slots, self.kept = call_slots, kept  # kept: the fixed tensors (scratch), held alive
        launcher = compiled.run
        self._direct = None
        if getattr(launcher, "global_scratch_size", 1) == 0 and getattr(launcher, "profile_scratch_size", 1) == 0:
            self._direct = (launcher.launch, launcher.launch_cooperative_grid, launcher.launch_pdl)

    def __call__(self, values: tuple) -> None:
        args = self.args.copy()
        for slot, value in zip(self.call_slots, values):
            args[slot] = value
        knobs = triton.knobs.runtime
        if self._direct is None or knobs.launch_enter_hook.calls or knobs.launch_exit_hook.calls:
            _run_compiled(self.compiled, self.grid, self.stream, args)
            return
        launch, cooperative, pdl = self._direct
        launch(*self.grid, self.stream, self.compiled.function, cooperative, pdl, None, None, self.compiled.packed_metadata,
               None, None, None, *args)


class RepeatLaunch:
    """One GEMM launch kept to be repeated on new tensors of the same shapes and dtypes: the eager host path of
    repeat calls (no planning, no argument building). Made by `gemm.launch_gemm_kept` and
    `gemm_pingpong.launch_pingpong_kept`.

    A call takes x2 [M, K] (contiguous, the kept call's dtype) and the weight's tensors, allocates y [M, N] and
    launches; it returns None (launching nothing) when an address is not 16-byte aligned, which the kept
    compiled kernel assumes. x reaches the kernel as its address, or with `descriptors` (a function of x2 and
    qweight) as the TMA descriptors it makes per call. The split-K scratch of the kept call stays bound (and alive): calls on
    one stream run in order, as they would sharing the stream's scratch. Once the stream's cached workspace
    (`scratch`: its [counter slot, workspace] entry, `workspace_entry`) has been replaced by a larger one the kept
    launch is `stale` and its owner drops it, so that it does not keep the old workspace alive.
    """

    __slots__ = ("launch", "shape", "dtype", "device", "scratch", "workspace", "descriptors")

    def __init__(self, launch: BoundLaunch, shape: tuple, dtype: torch.dtype, device: torch.device, scratch: list | None,
                 workspace: torch.Tensor, descriptors=None):
        self.launch, self.shape, self.dtype, self.device = launch, shape, dtype, device
        self.scratch, self.workspace = scratch, workspace  # the stream's scratch entry, the bound workspace
        self.descriptors = descriptors

    def stale(self) -> bool:
        return self.scratch is not None and self.scratch[1] is not self.workspace

    def __call__(self, x2, qweight, scales, zeros) -> torch.Tensor | None:
        y = torch.empty(self.shape, device=self.device, dtype=self.dtype)
        x_address = x2.data_ptr()
        addresses = (qweight.data_ptr(), scales.data_ptr(), (scales if zeros is None else zeros).data_ptr(), y.data_ptr())
        if (x_address | addresses[0] | addresses[1] | addresses[2] | addresses[3]) & 15:
            return None
        if self.descriptors is None:
            self.launch((x_address,) + addresses)
        else:
            self.launch(addresses + self.descriptors(x2, qweight))
        return y


def programmatic_dependence(config: dict) -> tuple[bool, bool]:
    """(wait_prior, release_dependents) for a plan's launch configuration: a kernel launched as a programmatic
    dependent waits (griddepcontrol.wait) for the kernel before it, after act-order's gather (GATHER_PDL) or after any
    kernel (PDL, a call's `pdl`); with PDL it also releases the kernel after it (griddepcontrol.launch_dependents).
    The dispatcher keeps either option only where it applies (`dispatch._applicable`)."""
    pdl = bool(config.get("PDL", False))
    return bool(config.get("GATHER_PDL", False)) or pdl, pdl


TRITON_TYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.uint8: "u8"}


def compile_gluon_for_sm90(kernel, signature: dict, constexprs: dict, divisible: tuple, options: dict):
    """`kernel` (a Gluon JIT function) compiled for sm_90 on any machine (no GPU: Gluon API changes between Triton
    releases surface here, in CI). `signature`: each runtime parameter's Triton type ("*fp16", "i32", a TMA descriptor's
    kind); `constexprs`: the others' values; `divisible`: the parameters a launch specialises as 16-byte aligned /
    divisible by 16; `options`: compile options on top of COMPILE_OPTIONS. Returns Triton's compiled kernel (asm:
    ttgir, ptx, cubin)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    names = kernel.arg_names  # (positions as the kernel declares its parameters)
    full_signature = {name: signature[name] if name in signature else "constexpr" for name in names}
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in divisible}
    source = GluonASTSource(kernel, full_signature, {(names.index(name),): v for name, v in constexprs.items()}, attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={**COMPILE_OPTIONS, **options})
