"""Launch plumbing (launch.py): kept launches of eager repeat calls.

An eager call on a `W4A16Weight` keeps its launch (`weight.repeat_launches`) and later calls of the
same (M, dtype, stream) repeat it with new tensor addresses, skipping planning and argument building
(until the stream's split-K workspace is replaced by a larger one: the launch is then kept anew).
On the CPU a fake compiled kernel records what reaches Triton's launcher: the kept launch must pass
exactly the arguments the prepared launch would. On the GPU the repeats run and are checked against
the float64 reference, including the cases the kept launch must notice (in-place weight updates,
an unaligned x, another stream, a replaced workspace, a capture).
"""

import pytest
import torch

from test_gemm import TOL, random_layer


class _FakeLauncher:
    """Stands in for Triton's launcher of one compiled kernel: records each call's arguments."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False

    def __init__(self):
        self.calls = []

    def launch(self, *args):
        self.calls.append(("direct", args))

    def __call__(self, *args):
        self.calls.append(("run", args))


class _FakeCompiled:
    function, packed_metadata = 1234, (4, 1, 0)

    def __init__(self):
        self.run = _FakeLauncher()

    def launch_metadata(self, grid, stream, *args):
        return "metadata"


def test_bound_launch_passes_the_prepared_arguments(w4a16, monkeypatch):
    launch, gemm = w4a16.launch, w4a16.gemm
    compiled = _FakeCompiled()
    monkeypatch.setattr(launch, "_takes_fast_path", lambda tensor: True)
    monkeypatch.setattr(launch.PreparedLaunch, "_launch_through_triton", lambda self, grid, tensors, ints, descriptors=(): compiled)
    names = ("x_ptr", "qw_ptr", "s_ptr", "z_ptr", "y_ptr", "part_ptr", "lock_ptr")
    int_names = ("M", "N", "K", "stride_xm", "stride_ym", "num_groups", "SPLIT_K")
    prepared = launch.PreparedLaunch(gemm._w4a16_tc_kernel, {"BLOCK_N": 64, "BLOCK_M": 16}, {"num_warps": 4}, names, int_names)

    def tensors(count=7):
        return tuple(torch.empty(64, dtype=torch.float32) for _ in range(count))

    first, second = tensors(), tensors()
    ints, grid, stream = (3, 96, 512, 512, 96, 4, 2), (2, 1, 2), 77
    assert prepared.bind(grid, first, ints, stream, (0, 4)) is None  # nothing compiled for this specialisation yet
    prepared(grid, first, ints, stream)  # compiles (here: the fake) and keeps it
    prepared(grid, second, ints, stream)  # the prepared fast path
    kind, run_args = compiled.run.calls[-1]
    assert kind == "run" and run_args[:7] == (*grid, stream, compiled.function, compiled.packed_metadata, "metadata")
    prepared_args = list(run_args[9:])
    slots = {name: list(gemm._w4a16_tc_kernel.arg_names).index(name) for name in names + int_names}
    assert [prepared_args[slots[n]] for n in names] == [t.data_ptr() for t in second]
    assert [prepared_args[slots[n]] for n in int_names] == list(ints)

    bound = prepared.bind(grid, first, ints, stream, (0, 1, 2, 3, 4))
    bound(tuple(t.data_ptr() for t in second[:5]))
    kind, direct_args = compiled.run.calls[-1]
    # Triton's C launcher: grid, stream, function, cooperative, pdl, two scratch buffers, metadata,
    # launch metadata, enter / exit hooks (none registered), then every kernel parameter
    assert kind == "direct" and direct_args[:13] == (*grid, stream, compiled.function, False, False, None, None,
                                                     compiled.packed_metadata, None, None, None)
    # the repeat's tensors where it passes them anew, the kept call's scratch (slots 5, 6) otherwise
    expected = list(prepared_args)
    expected[slots["part_ptr"]], expected[slots["lock_ptr"]] = first[5].data_ptr(), first[6].data_ptr()
    assert list(direct_args[13:]) == expected
    assert all(any(t is k for k in bound.kept) for t in first[5:])  # the fixed tensors are held alive

    # with a launch hook registered (a profiler), repeats go through Triton's own launch with the hooks
    hooks = w4a16.launch.triton.knobs.runtime.launch_enter_hook
    hook = lambda metadata: None  # noqa: E731
    hooks.add(hook)
    try:
        bound(tuple(t.data_ptr() for t in second[:5]))
    finally:
        hooks.remove(hook)
    kind, hooked_args = compiled.run.calls[-1]
    assert kind == "run" and hooked_args[6] == "metadata" and list(hooked_args[9:]) == expected

    # an unaligned tensor is a different specialisation: never bound
    unaligned = (torch.empty(65, dtype=torch.float16)[1:],) + first[1:]
    prepared(grid, unaligned, ints, stream)
    assert prepared.bind(grid, unaligned, ints, stream, (0, 4)) is None


class _FakeDescriptor:
    """Stands in for a host-side TMA descriptor: what the prepared launch reads of one (base dtype, block shape)."""

    def __init__(self, dtype, block_shape):
        self.base, self.block_shape = torch.empty(16, dtype=dtype), block_shape


def test_prepared_launch_passes_descriptors(w4a16, monkeypatch):
    """The pingpong kernel's prepared launch: its x descriptor reaches the launcher in the kernel's x_desc slot, a
    descriptor of another dtype or block shape is another specialisation (Triton's path again), and a launch kept
    for repeats takes a new descriptor per call (it holds x's address)."""
    pingpong, launch = w4a16.gemm_pingpong, w4a16.launch
    if not pingpong.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    compiled, through_triton = _FakeCompiled(), []
    monkeypatch.setattr(launch, "_takes_fast_path", lambda tensor: True)
    monkeypatch.setattr(launch.PreparedLaunch, "_launch_through_triton",
                        lambda self, grid, tensors, ints, descriptors=(): through_triton.append(descriptors) or compiled)
    prepared = launch.PreparedLaunch(pingpong._pingpong_kernel, {"BLOCK_M": 128, "SHARED_TILES": True}, {}, pingpong._TENSOR_ARGS,
                                     pingpong._INT_ARGS, ("x_desc",))
    tensors = tuple(torch.empty(64, dtype=torch.float32) for _ in range(6))
    ints, grid, stream = (128, 4096, 4096, 128, 4096), (64,), 5
    first, second = _FakeDescriptor(torch.float16, [128, 64]), _FakeDescriptor(torch.float16, [128, 64])
    prepared(grid, tensors, ints, stream, (first,))  # compiles (here: the fake) and keeps it
    prepared(grid, tensors, ints, stream, (second,))  # the prepared fast path
    assert through_triton == [(first,)]
    kind, run_args = compiled.run.calls[-1]
    names = list(pingpong._pingpong_kernel.arg_names)
    assert kind == "run" and run_args[9 + names.index("x_desc")] is second
    assert run_args[9 + names.index("lock_ptr")] == tensors[5].data_ptr() and run_args[9 + names.index("M")] == 128
    for other in (_FakeDescriptor(torch.bfloat16, [128, 64]), _FakeDescriptor(torch.float16, [256, 64])):
        prepared(grid, tensors, ints, stream, (other,))
        assert through_triton[-1] == (other,)
    assert prepared.bind(grid, tensors, ints, stream, (0,)) is None  # no descriptor: not the launch's specialisation

    # kept for repeats (the eager pingpong call): a repeat passes the chosen tensors' addresses, then a new descriptor
    bound = prepared.bind(grid, tensors, ints, stream, (0, 3), (first,))
    later = tuple(torch.empty(64, dtype=torch.float32) for _ in range(2))
    third = _FakeDescriptor(torch.float16, [128, 64])
    bound((later[0].data_ptr(), later[1].data_ptr(), third))
    kind, direct_args = compiled.run.calls[-1]
    kernel_args = direct_args[13:]
    assert kind == "direct" and kernel_args[names.index("x_desc")] is third
    assert kernel_args[names.index("qw_ptr")] == later[0].data_ptr() and kernel_args[names.index("y_ptr")] == later[1].data_ptr()
    assert kernel_args[names.index("s_ptr")] == tensors[1].data_ptr() and kernel_args[names.index("M")] == 128


def test_kept_launches_drop_the_least_recently_used(w4a16):
    """A weight keeps launches for at most _KEPT_LAUNCHES_PER_WEIGHT keys; past that a new key drops the least
    recently used one (a key repeated since it was kept counts as recent), never refusing the new key."""
    matmul = w4a16.matmul
    cap = matmul._KEPT_LAUNCHES_PER_WEIGHT
    kept: dict = {}
    for m in range(cap):
        assert matmul._recently_used(kept, m) is None
        matmul._make_room(kept)
        kept[m] = f"launch {m}"
    assert matmul._recently_used(kept, 0) == "launch 0"  # key 0 repeated: now the most recent
    matmul._make_room(kept)
    kept[cap] = f"launch {cap}"
    assert len(kept) == cap and 1 not in kept and kept[0] == "launch 0" and list(kept)[-2:] == [0, cap]
    for m in range(cap + 1, 3 * cap):  # a stream of new keys keeps the newest cap of them
        matmul._make_room(kept)
        kept[m] = f"launch {m}"
    assert list(kept) == list(range(2 * cap, 3 * cap))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="kept launches are the eager CUDA path")
def test_more_batch_sizes_than_kept_launches(w4a16):
    """A weight called at more batch sizes than it keeps launches for: every call right, the kept launches bounded,
    and the batch size of the latest call kept (it would run the full path forever with a cache that stops filling)."""
    weight, ref = random_layer(w4a16, 512, 96, 128, False, torch.float16, "cuda", seed=26)
    cap = w4a16.matmul._KEPT_LAUNCHES_PER_WEIGHT
    stream = w4a16.launch.current_stream(torch.device("cuda"))
    for m in list(range(1, cap + 6)) + [1, 2]:
        for _ in range(2):
            x = torch.randn(m, 512, device="cuda", dtype=torch.float16)
            assert _relative_error(w4a16.w4a16_linear(x, weight), x.double() @ ref) < TOL[torch.float16], m
        assert len(weight.repeat_launches) <= cap
        if w4a16.launch._fast_launch:
            assert (m, torch.float16, stream, False, False) in weight.repeat_launches, m


def test_copies_of_a_weight_start_without_kept_launches(w4a16):
    """Kept launches hold the weight's scratch and compiled kernels: a copied, deep-copied or unpickled weight
    (or a module holding it) must not inherit them, and still compute the same."""
    import copy
    import pickle

    weight, ref = random_layer(w4a16, 256, 48, 128, False, torch.float16, "cpu", seed=23)
    weight.repeat_launches[(1, torch.float16, 0, False, False)] = object()  # what a GPU call would have kept
    for clone in (copy.copy(weight), copy.deepcopy(weight), pickle.loads(pickle.dumps(weight))):
        assert clone.repeat_launches == {}
        assert torch.equal(clone.qweight, weight.qweight) and torch.equal(clone.zeros, weight.zeros)
        assert (clone.in_features, clone.out_features, clone.group_size) == (weight.in_features, weight.out_features, 128)
    assert len(weight.repeat_launches) == 1
    x = torch.randn(2, 256).half()
    y = w4a16.w4a16_linear(x, copy.deepcopy(weight))
    assert _relative_error(y, x.double() @ ref) < TOL[torch.float16]


def _relative_error(y, expected):
    return float((y.double() - expected).norm() / expected.norm())


@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9),
                    reason="the pingpong kernel runs on sm_90")
def test_repeat_pingpong_calls_match_reference(w4a16):
    """An eager pingpong call (a tuned shape at M = 128 / 256 / 200: split tiles, whole tiles, a ragged M) keeps its
    launch too; repeats make x's descriptor anew and stay right, and bitwise equal to the full path."""
    weight, ref = random_layer(w4a16, 4096, 4096, 128, False, torch.float16, "cuda", seed=24)
    stream = w4a16.launch.current_stream(torch.device("cuda"))
    for m in (128, 256, 200):
        assert w4a16.plan_for(weight, m, torch.float16).path == "pingpong", m
        for call in range(3):  # the first call keeps its launch, the others repeat it
            x = torch.randn(m, 4096, device="cuda", dtype=torch.float16)
            y = w4a16.w4a16_linear(x, weight)
            assert _relative_error(y, x.double() @ ref) < TOL[torch.float16], (m, call)
            full = w4a16.matmul.w4a16_matmul(x, weight.qweight, weight.scales, weight.zeros, None, 4096, 128)
            assert torch.equal(y, full), (m, call)
        if w4a16.launch._fast_launch:
            kept = weight.repeat_launches[(m, torch.float16, stream, False, False)]
            assert isinstance(kept, w4a16.launch.RepeatLaunch) and kept.descriptors is not None


@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9),
                    reason="the pingpong kernel runs on sm_90")
def test_repeat_pingpong_words_tma_reads_each_calls_weight(w4a16):
    """A kept WORDS_TMA launch makes the weight's descriptor per call too: repeats on another weight of the same shape
    (and back) give that weight's product, bitwise equal to a full launch on it."""
    pingpong = w4a16.gemm_pingpong
    layers = [random_layer(w4a16, 1024, 320, 128, False, torch.float16, "cuda", seed=seed) for seed in (41, 42)]
    plan = w4a16.dispatch.Plan("pingpong", {"BLOCK_M": 128, "num_stages": 5, "SPLIT_K": 2, "WORDS_TMA": True}, "test")
    first = layers[0][0]
    x = torch.randn(128, 1024, device="cuda", dtype=torch.float16)
    _, kept = pingpong.launch_pingpong_kept(x, first.qweight, first.scales, first.zeros, 1024, 128, plan)
    if kept is None:
        assert not w4a16.launch._fast_launch
        pytest.skip("no fast launch path on this Triton")
    for weight, ref in layers[1:] + layers:
        x = torch.randn(128, 1024, device="cuda", dtype=torch.float16)
        y = kept(x, weight.qweight, weight.scales, weight.zeros)
        assert _relative_error(y, x.double() @ ref.to(device="cuda", dtype=torch.float64)) < TOL[torch.float16]
        assert torch.equal(y, pingpong.launch_pingpong(x, weight.qweight, weight.scales, weight.zeros, 1024, 128, plan))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="kept launches are the eager CUDA path")
def test_repeat_calls_match_reference(w4a16):
    weight, ref = random_layer(w4a16, 512, 96, 128, False, torch.float16, "cuda", seed=21)
    fast = w4a16.launch._fast_launch
    for m in (1, 2, 3, 16, 33):
        for _ in range(3):  # the first call keeps its launch, the others repeat it
            x = torch.randn(m, 512, device="cuda", dtype=torch.float16)
            assert _relative_error(w4a16.w4a16_linear(x, weight), x.double() @ ref) < TOL[torch.float16], m
    stream = w4a16.launch.current_stream(torch.device("cuda"))
    if fast:
        assert {(1, 2, 3, 16, 33)} == {tuple(sorted(key[0] for key in weight.repeat_launches if key[2] == stream))}

    # leading dims, and bf16 activations on the same weight (another key)
    x3 = torch.randn(2, 3, 512, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        y3 = w4a16.w4a16_linear(x3, weight)
        assert y3.shape == (2, 3, 96) and y3.dtype == torch.bfloat16
        assert _relative_error(y3, x3.double() @ ref) < TOL[torch.bfloat16]

    # in-place weight updates (what load_state_dict does) are followed: new codes, scales, zeros
    other, other_ref = random_layer(w4a16, 512, 96, 128, False, torch.float16, "cuda", seed=22)
    for mine, theirs in ((weight.qweight, other.qweight), (weight.scales, other.scales), (weight.zeros, other.zeros)):
        mine.copy_(theirs)
    x = torch.randn(16, 512, device="cuda", dtype=torch.float16)
    assert _relative_error(w4a16.w4a16_linear(x, weight), x.double() @ other_ref) < TOL[torch.float16]

    # an x that is not 16-byte aligned takes the full path (the kept kernel assumes alignment)
    buffer = torch.randn(16 * 512 + 1, device="cuda", dtype=torch.float16)
    x_unaligned = buffer[1:].view(16, 512)
    assert x_unaligned.data_ptr() % 16 != 0
    assert _relative_error(w4a16.w4a16_linear(x_unaligned, weight), x_unaligned.double() @ other_ref) < TOL[torch.float16]

    # another stream has its own kept launch (and split-K scratch)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ys = [w4a16.w4a16_linear(x, weight) for _ in range(3)]
    torch.cuda.current_stream().wait_stream(side)
    for y in ys:
        assert _relative_error(y, x.double() @ other_ref) < TOL[torch.float16]
    if fast:
        assert any(key[2] == side.cuda_stream for key in weight.repeat_launches)

    # a larger call on a fresh stream replaces the stream's split-K workspace: the kept launch bound to the old
    # one turns stale and is kept anew (it must not hold the old workspace), and results stay right
    fresh = torch.cuda.Stream()
    fresh.wait_stream(torch.cuda.current_stream())
    x_small, x_big = (torch.randn(m, 512, device="cuda", dtype=torch.float16) for m in (1, 64))
    with torch.cuda.stream(fresh):
        w4a16.w4a16_linear(x_small, weight)
        first = weight.repeat_launches.get((1, torch.float16, fresh.cuda_stream, False, False))
        ys = [w4a16.w4a16_linear(x, weight) for x in (x_small, x_big, x_small, x_small)]
    torch.cuda.current_stream().wait_stream(fresh)
    for y, x in zip(ys, (x_small, x_big, x_small, x_small)):
        assert _relative_error(y, x.double() @ other_ref) < TOL[torch.float16], x.shape
    if fast:
        assert first is not None and first.scratch is not None  # a split-K plan (2 splits on this untuned shape)
        assert first.stale() and weight.repeat_launches[(1, torch.float16, fresh.cuda_stream, False, False)] is not first

    # a deep copy (as of a model) starts without kept launches and computes on its own tensors
    import copy

    twin = copy.deepcopy(weight)
    assert len(twin.repeat_launches) == 0 and len(weight.repeat_launches) > 0
    for _ in range(2):
        assert _relative_error(w4a16.w4a16_linear(x, twin), x.double() @ other_ref) < TOL[torch.float16]

    # captured into a CUDA graph on the stream whose launch is kept: the replay follows the input
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w4a16.w4a16_linear(x, weight)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        y_graph = w4a16.w4a16_linear(x, weight)
    for seed in (1, 2):
        x.copy_(torch.randn(x.shape, device="cuda", dtype=x.dtype, generator=torch.Generator(device="cuda").manual_seed(seed)))
        graph.replay()
        torch.cuda.synchronize()
        assert _relative_error(y_graph, x.double() @ other_ref) < TOL[torch.float16], seed
