#!/usr/bin/env bash
# one device call (session 52; benchmarks/NOTES.md "Next GPU session"): branch on the GPU that came.
# H200: the formats' entries at M = 128..1024 whose plan differs from the base's re-checked against their
#       neighbours and the base's plan (tune.py --incumbents-only --unlike-base-only), then base + formats benched
#       in one run at M = 128..1024.
# H100: base + formats at M = 128..1024 in one run, into h100.json (the base's rows there were re-benched alone
#       after the H100 base re-tune of this session; this puts the formats' rows in the same run again).
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
case "$name" in
  *H100*) STEPS="bench" BENCH_OUT=benchmarks/results/h100.json BENCH_M=128,256,512,1024 \
          BENCH_VARIANTS=base,sym,g64,act_order,bf16,pc BENCH_TIMEOUT=400 bash scripts/gpu_session.sh ;;
  *) STEPS="tune bench" TUNE_TABLE_ARGS="--incumbents-only --unlike-base-only" \
     TUNE_SPECS="sym:128,256,512,1024 g64:128,256,512,1024 act_order:128,256,512,1024 bf16:128,256,512,1024 pc:128,256,512,1024" \
     TUNE_TIMEOUT=80 BENCH_M=128,256,512,1024 BENCH_VARIANTS=base,sym,g64,act_order,bf16,pc BENCH_TIMEOUT=190 \
     bash scripts/gpu_session.sh ;;
esac
