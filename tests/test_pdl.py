"""A call's `pdl=True`: the GEMM launched as a programmatic dependent of the kernel before it (sm_90+).

The plan gets the option PDL where it applies (decode and tensor-core paths on an NVIDIA GPU of sm_90+), the kernels
compile with griddepcontrol.launch_dependents first and griddepcontrol.wait before x's loads (checked for sm_90 on the
CPU), and on the GPU a GEMM launched right after a kernel that releases its dependents at once and writes x only tens
of microseconds later still reads the new x (back to back and in a CUDA graph), while a plain programmatic dependent
without the wait reads the old one (the control: the early launch really happens). Elsewhere `pdl` changes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_gemm import TOL, random_layer

REPO = Path(__file__).resolve().parent.parent


# small forced plans of the tensor-core paths (N = 256, K = 512, M = 16)
_TENSOR_CORE_CONFIGS = (("splitk", {"BLOCK_N": 64, "BLOCK_M": 16, "SPLIT_K": 2}), ("streamk", {"BLOCK_N": 64, "BLOCK_M": 16, "PROGRAMS": 8}),
                        ("tiled", {"BLOCK_N": 64, "BLOCK_M": 32}))


def test_pdl_is_a_plan_option_where_it_applies(w4a16, device):
    dispatch = w4a16.dispatch
    dev = torch.device(device)
    capable = dispatch.programmatic_launch(dev)
    for path in dispatch.PATHS:
        plan = dispatch.plan_gemm(4, 96, 512, 128, torch.float16, dev, path=path, pdl=True)
        assert plan.config.get("PDL", False) == (capable and path in dispatch.PDL_PATHS), path
        assert "PDL" not in dispatch.plan_gemm(4, 96, 512, 128, torch.float16, dev, path=path).config, path
    auto = dispatch.plan_gemm(1, 4096, 4096, 128, torch.float16, dev, pdl=True)
    assert auto.config.get("PDL", False) == (capable and auto.path in dispatch.PDL_PATHS)
    assert auto.path in dispatch.PDL_PATHS or not capable  # (the H200 table's M = 1 plan is the decode kernel)
    # PDL is the call's, never a configuration's (a tuned entry cannot carry it)
    with pytest.raises(ValueError, match="config keys for path 'decode' must be among"):
        dispatch.plan_gemm(4, 96, 512, 128, torch.float16, dev, path="decode", config={"PDL": True})


@pytest.mark.kernels_ci
def test_pdl_kernels_compile_for_sm90(w4a16, pristine_triton_language):
    """The decode kernel (Gluon) and the tensor-core kernels (Triton) with the plan option PDL, compiled for sm_90 on
    any machine: the next kernel released before any load, a programmatic launch, and x read only after the wait
    (the decode kernel issues its first weight blocks' loads before it); without PDL neither instruction."""
    decode = w4a16.gemm_decode
    if decode.HAVE_GLUON:
        for pdl in (False, True):
            compiled = decode.compile_for_sm90({"num_warps": 4, "ROWS": 16, "AHEAD": 2, "PDL": pdl}, torch.float16, 8)
            ptx = compiled.asm["ptx"]
            assert ("griddepcontrol.launch_dependents" in ptx) == pdl and ("griddepcontrol.wait" in ptx) == pdl
            assert bool(getattr(compiled.metadata, "launch_pdl", False)) == pdl
            if pdl:
                release, wait = ptx.index("griddepcontrol.launch_dependents"), ptx.index("griddepcontrol.wait")
                assert release < ptx.index("ld.global") < wait
                # before the wait only the words (16-byte loads) and the parameters, never x (8-byte row pairs)
                assert "ld.global.v2.b32" not in ptx[:wait] and "ld.global.v2.b32" in ptx[wait:]
    # the Triton kernels: in a process of their own, where Triton compiles rather than interprets them
    script = f"""
import json, os, re, sys
sys.path.insert(0, {str(REPO / "benchmarks")!r})
import sass_report, timing
kernel = timing.load_kernel()
out = {{}}
for path, config in {_TENSOR_CORE_CONFIGS!r}:
    for pdl in (False, True):
        plan = kernel.dispatch.Plan(path, {{**config, **({{"PDL": True}} if pdl else {{}})}}, "forced")
        prepared, tensors, ints = sass_report.captured_launch(kernel, plan, 16, 256, 512, "base")
        ptx = sass_report.compile_for_sm90(prepared, tensors, ints).asm["ptx"]
        release, wait = ptx.find("griddepcontrol.launch_dependents"), ptx.find("griddepcontrol.wait")
        out[f"{{path}} {{pdl}}"] = dict(release=release, wait=wait, launch_pdl=bool(prepared.options.get("launch_pdl")),
                                      loads_before_wait=bool(re.search(r"ld\\.global|cp\\.async", ptx[:max(wait, 0)])))
print(json.dumps(out))
"""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for path, _ in _TENSOR_CORE_CONFIGS:
        for pdl in (False, True):
            r = results[f"{path} {pdl}"]
            assert (r["release"] >= 0) == pdl and (r["wait"] >= 0) == pdl and r["launch_pdl"] == pdl, (path, pdl, r)
            if pdl:  # released first, and nothing loaded before the wait (the Triton kernels wait first)
                assert r["release"] < r["wait"] and not r["loads_before_wait"], (path, r)


@pytest.mark.parametrize("path", ["splitk", "streamk", "tiled", "decode"])
def test_pdl_gemm_reads_x_only_after_the_kernel_before(w4a16, device, path):
    """On an sm_90+ GPU: x written by a kernel that releases its dependents first and writes x ~200 us later; the
    GEMM with pdl=True, launched right after it, must see the new x (float64 reference), back to back and in a CUDA
    graph. Control: a programmatic dependent that copies x without waiting sees the old x, so the GEMM did start early.
    On the CPU (Triton's interpreter, splitk only: no Gluon there) pdl changes nothing."""
    cuda = device == "cuda"
    if not cuda:
        if path != "splitk":
            pytest.skip("on the CPU one interpreted path shows that pdl is ignored")
        weight, ref = random_layer(w4a16, 256, 40, 64, False, torch.float16, device, seed=5)
        x = torch.randn(3, 256, dtype=torch.float16)
        args = (weight.qweight, weight.scales, weight.zeros, None, weight.in_features, weight.group_size)
        assert torch.equal(w4a16.matmul.w4a16_matmul(x, *args, path=path, pdl=True), w4a16.matmul.w4a16_matmul(x, *args, path=path))
        return
    if not w4a16.dispatch.programmatic_launch(torch.device(device)):
        pytest.skip("programmatic dependent launch needs sm_90+")
    if path == "decode" and not w4a16.gemm_decode.available(torch.device(device)):
        pytest.skip("the decode kernel needs Gluon")
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, globaltimer

    @triton.jit
    def late_copy(src_ptr, dst_ptr, n, spin_ns, BLOCK: tl.constexpr):
        gdc_launch_dependents()  # the next kernel may start now ...
        start = globaltimer()
        now = start
        while now - start < spin_ns:  # ... and this one writes dst only spin_ns later
            now = globaltimer()
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(src_ptr + offs, mask=offs < n)
        tl.store(dst_ptr + offs, tl.where(now - start >= spin_ns, v, -v), mask=offs < n)  # (stored after the spin)

    @triton.jit
    def copy_without_wait(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)

    weight, ref = random_layer(w4a16, 1024, 96, 128, False, torch.float16, device, seed=31)
    config = {"BLOCK_N": 64, "BLOCK_M": 16, "SPLIT_K": 4} if path == "splitk" else \
        {"BLOCK_N": 64, "BLOCK_M": 16, "PROGRAMS": 12} if path == "streamk" else \
        {"BLOCK_N": 64, "BLOCK_M": 32} if path == "tiled" else {"ROWS": 16, "AHEAD": 2}
    plan = w4a16.dispatch.plan_gemm(16, 96, 1024, 128, torch.float16, torch.device(device), path=path, config=config, pdl=True)
    assert plan.config.get("PDL")
    spin_ns = 200_000  # (a programmatic dependent started 14-23 us after its primary released it on the H200)

    def write_then_gemm(src, x, m):
        n = x.numel()
        late_copy[(triton.cdiv(n, 1024),)](src, x, n, spin_ns, BLOCK=1024)
        return w4a16.matmul.w4a16_matmul(x, weight.qweight, weight.scales, weight.zeros, None, weight.in_features,
                                         weight.group_size, path=path, config=config, pdl=True)

    def check(src, y, what):
        expected = src.double() @ ref
        assert float((y.double() - expected).norm() / expected.norm()) < TOL[torch.float16], (path, what)

    for m in ((1, 3, 16) if path == "decode" else (1, 16, 64)):
        src = torch.randn(m, 1024, device=device, dtype=torch.float16)
        x = torch.randn(m, 1024, device=device, dtype=torch.float16)  # the old x: what a missing wait would read
        seen = torch.empty_like(x)
        stale = x.clone()
        for _ in range(2):  # (the first pass compiles both kernels: launched only then, the control could not start early)
            x.copy_(stale)
            late_copy[(triton.cdiv(x.numel(), 1024),)](src, x, x.numel(), spin_ns, BLOCK=1024)
            copy_without_wait[(triton.cdiv(x.numel(), 1024),)](x, seen, x.numel(), BLOCK=1024, launch_pdl=True)
            torch.cuda.synchronize()
        assert torch.equal(x, src)
        assert torch.equal(seen, stale), "the control read the new x: no programmatic early launch happened"
        write_then_gemm(src, x, m)  # (the GEMM compiled and planned before the calls that count)
        torch.cuda.synchronize()
        x.copy_(stale)
        check(src, write_then_gemm(src, x, m), "back to back")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = write_then_gemm(src, x, m)
        for _ in range(2):
            x.copy_(stale)
            src.copy_(torch.randn_like(src))
            graph.replay()
            torch.cuda.synchronize()
            check(src, y, "graph replay")


def test_pdl_on_layers_and_conversion(w4a16, device):
    """`pdl` is a W4A16Linear attribute (not state: the state_dict keys stay the format's), set by the constructors
    and convert_to_w4a16, shown by extra_repr, refused unless a bool; the layer's output does not change with it."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(256, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32, bias=False)).half().to(device)
    plain = torch.nn.Sequential(*[m for m in model])
    import copy

    ref_model = copy.deepcopy(model)
    w4a16.convert_to_w4a16(ref_model, group_size=64, skip=())
    summary = w4a16.convert_to_w4a16(model, group_size=64, skip=(), pdl=True)
    assert summary.converted == ["0", "2"]
    assert all(layer.pdl for layer in model if isinstance(layer, w4a16.W4A16Linear))
    assert not any(layer.pdl for layer in ref_model if isinstance(layer, w4a16.W4A16Linear))
    assert "pdl=True" in repr(model[0]) and "pdl" not in repr(ref_model[0])
    assert set(model.state_dict()) == set(ref_model.state_dict())
    x = torch.randn(5, 256, device=device, dtype=torch.float16)
    with torch.inference_mode():
        torch.testing.assert_close(model(x), ref_model(x), rtol=0, atol=0)
        # traced, the forward reads `pdl` as eagerly (from the module's __dict__) without a graph break
        torch.testing.assert_close(torch.compile(model, fullgraph=True)(x), ref_model(x), rtol=0, atol=0)
    layer = w4a16.W4A16Linear.from_linear(plain[2], group_size=64, pdl=True)
    assert layer.pdl and not w4a16.W4A16Linear.from_weight(layer.weight_view()).pdl
    for bad in (1, "yes", None):
        with pytest.raises(TypeError, match="pdl must be True or False"):
            w4a16.W4A16Linear(256, 64, pdl=bad)
        with pytest.raises(TypeError, match="pdl must be True or False"):
            w4a16.convert_to_w4a16(copy.deepcopy(plain), pdl=bad)
