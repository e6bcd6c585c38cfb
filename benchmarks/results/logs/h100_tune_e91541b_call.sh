#!/usr/bin/env bash
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
