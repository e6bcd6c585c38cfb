# does a programmatic dependent start before its primary ends? (timestamps from %globaltimer)
import torch, triton, triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait, globaltimer

@triton.jit
def primary(t_ptr, spin_ns, RELEASE: tl.constexpr):
    t0 = globaltimer()
    if RELEASE:
        gdc_launch_dependents()
    now = t0
    while now - t0 < spin_ns:
        now = globaltimer()
    tl.store(t_ptr + tl.program_id(0) * 2, t0)
    tl.store(t_ptr + tl.program_id(0) * 2 + 1, now)

@triton.jit
def dependent(t_ptr, WAIT: tl.constexpr):
    ta = globaltimer()
    if WAIT:
        gdc_wait()
    tb = globaltimer()
    tl.store(t_ptr, ta)
    tl.store(t_ptr + 1, tb)

for release in (False, True):
    for pdl in (False, True):
        for grid in (1, 8):
            tp = torch.zeros(2 * grid, dtype=torch.int64, device="cuda")
            td = torch.zeros(2, dtype=torch.int64, device="cuda")
            for _ in range(3):
                primary[(grid,)](tp, 50000, RELEASE=release)
                dependent[(1,)](td, WAIT=True, launch_pdl=pdl)
            torch.cuda.synchronize()
            t0, t1 = int(tp[0::2].min()), int(tp[1::2].max())
            ta, tb = int(td[0]), int(td[1])
            k = dependent.device_caches[0][0] if hasattr(dependent, "device_caches") else None
            print(f"release={release} launch_pdl={pdl} grid={grid}: dependent started {(ta - t0) / 1e3:7.1f} us after the primary "
                  f"(primary ran {(t1 - t0) / 1e3:.1f} us), past its wait at {(tb - t0) / 1e3:7.1f} us")
try:
    c = list(dependent.device_caches[0][0].values())
    print("compiled dependent metadata launch_pdl:", [getattr(x.metadata, "launch_pdl", None) for x in c])
except Exception as e:
    print("metadata:", e)
