#!/usr/bin/env bash
# Session 52's device calls (NOTES v58), each named kind nvidia-h200, carry [".whl", ".ab"], this file as .ab/call.sh.
# Every start was an H100, so only the H100 branch ever ran:
#   call 1 (5490efe): H100 branch = STEPS="bench" BENCH_OUT=benchmarks/results/h100.json BENCH_M=1,2,4,8,16,32
#                     BENCH_VARIANTS=base,sym,g64,act_order,bf16,pc
#   call 2 (warm, 5490efe, a plain gpu_session.sh call): STEPS="tune bench" TUNE_TABLE=torch-ext/w4a16/tuned_nvidia_h100.json
#                     TUNE_SPECS="base:256,512,1024" TUNE_TIMEOUT=380 BENCH_OUT=benchmarks/results/h100.json BENCH_M=256,512,1024
#   call 3 (2a1a8dc): H100 branch = STEPS="bench" BENCH_OUT=benchmarks/results/h100.json BENCH_M=128,256,512,1024
#                     BENCH_VARIANTS=base,sym,g64,act_order,bf16,pc
#   call 4 / 5: no machine
#   call 6 (cb9e250): the H100 branch below (the GPU suite)
# The H200 branch is the owed step of NOTES "Next GPU session", shrunk to three formats to fit the device time left.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
case "$name" in
  *H100*) STEPS="tests" TESTS_TIMEOUT=420 TESTS_ARGS="-n 12 -p xdist tests/" bash scripts/gpu_session.sh ;;
  *) STEPS="tune bench" TUNE_TABLE_ARGS="--incumbents-only --unlike-base-only" \
     TUNE_SPECS="sym:128,256,512,1024 g64:128,256,512,1024 act_order:128,256,512,1024" \
     TUNE_TIMEOUT=70 BENCH_M=128,256,512,1024 BENCH_VARIANTS=base,sym,g64,act_order,bf16,pc BENCH_TIMEOUT=190 \
     bash scripts/gpu_session.sh ;;
esac
