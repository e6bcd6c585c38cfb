#!/usr/bin/env bash
# v57: call 1 ran this script (W4A16_COMMIT=e91541b; its H100 branch). On the same warm H100, with the returned table
# copied into the tree first, call 2 ran gpu_session.sh with STEPS="tune bench" TUNE_TABLE=torch-ext/w4a16/tuned_nvidia_h100.json
# TUNE_TABLE_ARGS="--incumbents-only" TUNE_SPECS="bf16:128,256,512,1024 pc:128,256,512,1024" TUNE_TIMEOUT=100
# BENCH_OUT=benchmarks/results/h100.json BENCH_M=256,1024 BENCH_VARIANTS=base,sym,g64,act_order,bf16,pc BENCH_TIMEOUT=230
# W4A16_COMMIT=e91541b+h100-formats-incumbents; calls 3 and 4 STEPS="bench" with BENCH_M=128,512 and BENCH_M=64,4096.
# one device call: branch on the GPU that came (see benchmarks/NOTES.md "Next GPU session")
# H200: the formats' entries at M = 128..1024 re-checked against their neighbours and the base's (newer, WORDS_TMA)
# plans (tune.py --incumbents-only), then base + those formats benched in one run (same-run format / base ratios).
# H100: the same check of the formats into the H100's own table (its base entries at M = 128..1024 are its own).
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
F="${FORMATS_A:-sym g64 act_order}"
specs=""; for f in $F; do specs="$specs $f:128,256 $f:512,1024"; done
case "$name" in
  *H100*) STEPS="tune" TUNE_TABLE=torch-ext/w4a16/tuned_nvidia_h100.json TUNE_TABLE_ARGS="--incumbents-only" \
          TUNE_SPECS="$specs" TUNE_TIMEOUT=80 bash scripts/gpu_session.sh ;;
  *) STEPS="tune bench" TUNE_TABLE_ARGS="--incumbents-only" TUNE_SPECS="$specs" TUNE_TIMEOUT=65 \
          BENCH_M=128,256,512,1024 BENCH_VARIANTS=base,${F// /,} BENCH_TIMEOUT=190 bash scripts/gpu_session.sh ;;
esac
