"""A/B of the pingpong kernel's AHEAD (words of AHEAD blocks in flight, slots refilled in place) against the
rotating pair (AHEAD absent), at the table's pingpong plans (M >= 128) and at M = 64 with pingpong plans, all
eight shapes, each output checked against the dense path. Prints a table; JSON to $OUT."""
import json, os, sys, time
sys.path.insert(0, 'benchmarks')
import torch
import timing

kernel = timing.load_kernel()
info = timing.machine_info()
shapes = timing.select_shapes(os.environ.get('SHAPES', ''))
ms = [int(v) for v in os.environ.get('MS', '64,128,256').split(',')]
aheads = [int(v) for v in os.environ.get('AHEADS', '0,2,3').split(',')]
rows = []
t0 = time.time()
for shape in shapes:
    n, k = shape['N'], shape['K']
    copies = timing.copies_needed(timing.w4_bytes(n, k, 1, 128))
    weights = timing.random_w4_weights(kernel, n, k, 128, copies)
    w0 = weights[0]
    for m in ms:
        x = torch.randn(m, k, device='cuda', dtype=torch.float16)
        ref = kernel.matmul.w4a16_matmul(x, w0.qweight, w0.scales, w0.zeros, None, k, 128, path='dense').float()
        table = kernel.plan_for(w0, m, torch.float16)
        plans = []
        if table.path == 'pingpong':
            plans.append(('table', dict(table.config)))
        else:
            plans.append(('table', dict(table.config)))
        up = kernel.plan_for(w0, max(128, m), torch.float16)
        if table.path != 'pingpong' and up.path == 'pingpong':
            base = {kk: v for kk, v in up.config.items() if kk != 'UNPACK_AHEAD'}
            base['BLOCK_M'] = min(base.get('BLOCK_M', 128), 64 if m <= 64 else 128)
            plans.append(('up', base))
            plans.append(('up132', {kk: v for kk, v in base.items() if kk != 'SPLIT_K'} | {'PROGRAMS': 132}))
        for label, cfg in plans:
            path = table.path if label == 'table' else 'pingpong'
            variants = [(0, cfg)] if path != 'pingpong' else [
                (a, {kk: v for kk, v in cfg.items() if kk not in ('AHEAD', 'UNPACK_AHEAD')} | ({'AHEAD': a} if a else {}))
                for a in aheads] + ([(-1, cfg)] if cfg.get('UNPACK_AHEAD') else [])
            for a, c in variants:
                def call(w, c=c, path=path):
                    return kernel.matmul.w4a16_matmul(x, w.qweight, w.scales, w.zeros, None, k, 128, path=path, config=c)
                try:
                    err = float((call(w0).float() - ref).norm() / ref.norm())
                    us = [timing.gpu_time_us([lambda w=w: call(w) for w in weights], replays=7) for _ in range(2)]
                except Exception as exc:
                    rows.append(dict(shape=shape['name'], M=m, label=label, path=path, ahead=a, config=c, error=repr(exc)[:300]))
                    print(shape['name'], m, label, a, 'ERROR', repr(exc)[:200], flush=True)
                    continue
                rows.append(dict(shape=shape['name'], M=m, label=label, path=path, ahead=a, config=c, us=us, err=err))
                print(f"{shape['name']:12s} M={m:5d} {label:6s} {path:8s} AHEAD={a:2d} {min(us):8.2f} us ({us[0]:.2f}/{us[1]:.2f}) err {err:.1e}  {c}", flush=True)
    del weights
    torch.cuda.empty_cache()
out = os.environ.get('OUT', '/tmp')
json.dump({**info, 'rows': rows}, open(os.path.join(out, 'probe_ahead.json'), 'w'), indent=1)
print('done in', round(time.time() - t0), 's')
