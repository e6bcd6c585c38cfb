import sys, re, subprocess, tempfile, pathlib
sys.path.insert(0, "/work/main/benchmarks")
import timing
W = timing.load_kernel()
import triton, torch
gd = W.gemm_decode
cfg = dict(num_warps=4, ROWS=int(sys.argv[1]) if len(sys.argv) > 1 else 16, AHEAD=1, X_AT_USE=True)
block_m = int(sys.argv[2]) if len(sys.argv) > 2 else 8
ring = int(sys.argv[3]) if len(sys.argv) > 3 else 3
regs = int(sys.argv[4]) if len(sys.argv) > 4 else 128
launch_regs = int(sys.argv[5]) if len(sys.argv) > 5 else 0
constexprs, options = gd._launch_config(cfg, block_m, 4096, 4096, 128, False)
constexprs.update(X_RING=ring, WORKER_REGS=regs)
options = {"num_warps": 4, **({"maxnreg": launch_regs} if launch_regs else {})}
sig = {"x_ptr": "*fp16", "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*u8", "y_ptr": "*fp16", **{n: "i32" for n in gd._INT_ARGS}}
ck = W.launch.compile_gluon_for_sm90(gd._decode_ws_kernel, sig, constexprs, gd._TENSOR_ARGS + ("N", "K", "stride_xm", "stride_ym"), options)
ptx = ck.asm["ptx"]
nv = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin"
with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
    f.write(ck.asm["cubin"]); f.flush()
    sass = subprocess.run([str(nv / "nvdisasm"), "-c", f.name], capture_output=True, text=True).stdout
with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
    f.write(ck.asm["cubin"]); f.flush()
    res = subprocess.run([str(nv / "cuobjdump"), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
print(triton.__version__, "smem", ck.metadata.shared, "warps", ck.metadata.num_warps, re.findall(r"REG:\d+|STACK:\d+|SHARED:\d+|LOCAL:\d+", res))
for name, pat in (("bar.sync 0", r"\bbar\.sync\s+0;"), ("barrier.sync n", r"\bbarrier\.sync\s+\d+;"), ("bar.warp.sync", r"bar\.warp\.sync"),
                  ("cp.async", r"cp\.async\.c[ag]"), ("wait_group", r"cp\.async\.wait_group"), ("ld.shared", r"ld\.shared"), ("mma", r"mma\.sync"), ("setmaxnreg", r"setmaxnreg[^;]*")):
    print(f"  ptx {name}: {len(re.findall(pat, ptx))}")
print("  setmaxnreg:", sorted(set(re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+\d+", ptx))))
print("  SASS BAR:", len(re.findall(r"\bBAR\.SYNC", sass)), "WARPSYNC:", len(re.findall(r"WARPSYNC", sass)), "LDGSTS:", len(re.findall(r"LDGSTS", sass)), "LDS:", len(re.findall(r"\bLDS", sass)), "HMMA:", len(re.findall(r"HMMA", sass)), "lines:", len([l for l in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", l)]))
