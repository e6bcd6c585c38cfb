#!/usr/bin/env bash
# The main job: bash scripts/run.sh
#   with a CUDA GPU: benchmarks/bench_gemm.py (W4A16 against cuBLAS fp16/bf16 and torch's int4 GEMM,
#                    eight Llama-3 shapes, decode M), printing a table;
#   without one:     scripts/demo.py (quantize a random layer, run the Triton kernels in the
#                    interpreter, report their error against a float64 reference).
source "$(dirname "$0")/_venv.sh"
if .venv/bin/python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    exec .venv/bin/python benchmarks/bench_gemm.py "$@"
fi
TRITON_INTERPRET=1 exec .venv/bin/python scripts/demo.py "$@"
