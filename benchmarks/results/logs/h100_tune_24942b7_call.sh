#!/usr/bin/env bash
# Two calls on one warm H100: call 1 as below with TUNE_SPECS="base:256,512,1024" TUNE_TIMEOUT=390 BENCH_M=256,512,1024 BENCH_TIMEOUT=150; call 2 as written (M = 128).
# one device call: branch on the GPU that came (see benchmarks/NOTES.md "Next GPU session")
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
case "$name" in
  *H100*) STEPS="tune bench" TUNE_TABLE=torch-ext/w4a16/tuned_nvidia_h100.json \
          TUNE_TABLE_ARGS="--applies-to H100 --overlays tuned_nvidia_h200.json" \
          TUNE_SHAPES=8B.qkv,8B.o,70B.qkv,8B.gate_up,8B.down,70B.gate_up,70B.o,70B.down \
          TUNE_SPECS="base:128" TUNE_TIMEOUT=170 BENCH_OUT=benchmarks/results/h100.json \
          BENCH_M=128 BENCH_TIMEOUT=80 bash scripts/gpu_session.sh ;;
  *) STEPS="bench" BENCH_M=32,128,256,512,1024,4096 BENCH_VARIANTS=sym,g64,act_order,bf16,pc \
          BENCH_TIMEOUT=530 bash scripts/gpu_session.sh ;;
esac
