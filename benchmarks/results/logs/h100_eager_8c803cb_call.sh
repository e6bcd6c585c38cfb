#!/usr/bin/env bash
# Session 45, call 1. On an H200: v50's re-tuned points into h200.json (NOTES "Next GPU session", first step).
# Elsewhere: the GPU suite at the refactor commit, then the eager host time of pingpong calls (never measured).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1 W4A16_COMMIT=${COMMIT}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && [ "${SKIP_BENCH:-0}" = 0 ]; then
  timeout 560 python3 benchmarks/bench_gemm.py --shapes 70B.o,70B.down,8B.o --m 1,2,64,256,512,1024 --variants base,sym,g64,act_order --merge --out benchmarks/results/h200.json 2>&1 | tee $OUT/bench.txt | tail -40
  cp benchmarks/results/h200.json $OUT/
else
  timeout 330 python3 -m pytest -q -p no:cacheprovider -n 12 -p xdist tests/ > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; tail -3 $OUT/pytest.txt
  for s in "1 6144 4096" "64 6144 4096" "128 6144 4096" "256 6144 4096" "64 28672 4096" "256 8192 8192"; do
    set -- $s; echo "== M=$1 N=$2 K=$3"; timeout 60 python3 benchmarks/eager_overhead.py --m $1 --n $2 --k $3 --rounds 8 --out $OUT/eager_m$1_$2x$3.json 2>&1 | tail -12
  done
fi
