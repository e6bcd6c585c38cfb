#!/usr/bin/env bash
# What one device-machine call runs (see benchmarks/NOTES.md): install carried wheels, run the test
# suite on the GPU, then the steps named in $STEPS. Results go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1 OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
# The device tool returns at most 8 files from $OUT: past that, pack them all into one archive on exit.
trap '[ "$(find "$OUT" -type f | wc -l)" -gt 8 ] && tar czf /tmp/gpu_session_out.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/gpu_session_out.tgz "$OUT/out.tgz"' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
for step in ${STEPS:-tests}; do
    echo "=== $step"
    case "$step" in
        tests) timeout "${TESTS_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider ${TESTS_ARGS:-tests/} 2>&1 | tee "$OUT/pytest.txt" | tail -25 ;;
        probe) python3 benchmarks/tune.py --shapes "${PROBE_SHAPES:-8B.o,70B.gate_up}" --m "${PROBE_M:-1,4,16,64,1024}" --out "$OUT/tuned_probe.json" --log "$OUT/tune_probe_log.json" 2>&1 | tail -40 ;;
        # TUNE_SPECS: "variant:M,M,... variant:M,...:around ..." (variants of timing.VARIANTS; ":around" times
        # only the current plans with and without their options: tune.py --around-plan), each run with TUNE_TIMEOUT
        # TUNE_TABLE: the shipped table to merge into (another GPU's, e.g. tuned_nvidia_h100.json, with TUNE_TABLE_ARGS
        # "--applies-to H100 --overlays tuned_nvidia_h200.json" when it is new: tune.py refuses another GPU's file)
        tune) table="${TUNE_TABLE:-torch-ext/w4a16/tuned_nvidia_h200.json}"; table_before=$(sha256sum "$table" 2>/dev/null)
              for spec in ${TUNE_SPECS:-base:${TUNE_M:-1,2,4,8,16,32,64,128,256,512,1024,4096}}; do
                  IFS=: read -r variant tune_m mode <<< "$spec"
                  timeout "${TUNE_TIMEOUT:-540}" python3 benchmarks/tune.py --merge --variant "$variant" --shapes "${TUNE_SHAPES:-}" --m "$tune_m" \
                      ${mode:+--around-plan} ${TUNE_TABLE_ARGS:-} --out "$table" --log "$OUT/tune_log_${variant}_m${tune_m//,/_}${mode:+_$mode}.json" 2>&1 \
                      | tee -a "$OUT/tune.txt" | tail -60
              done; cp "$table" "$OUT/"
              # later steps run with the table this step wrote: say so in their results (only when it changed:
              # tune.py refuses to merge a run on another GPU, and then the shipped table is what they use)
              [ "$(sha256sum "$table" 2>/dev/null)" != "$table_before" ] \
                  && export W4A16_COMMIT="${W4A16_COMMIT:-unknown}+tuned-in-session" ;;
        # BENCH_OUT: the results file to merge into (bench_gemm.py refuses one measured on another GPU)
        bench) bench_out="${BENCH_OUT:-benchmarks/results/h200.json}"
               timeout "${BENCH_TIMEOUT:-420}" python3 benchmarks/bench_gemm.py --m "${BENCH_M:-1,2,4,8,16,32,64,128,256,512,1024,4096}" --variants "${BENCH_VARIANTS:-base}" --merge --out "$bench_out" 2>&1 | tee "$OUT/bench.txt" | tail -60; cp "$bench_out" "$OUT/" ;;
        layout) timeout "${LAYOUT_TIMEOUT:-420}" python3 benchmarks/probe_layout.py --m "${LAYOUT_M:-1,16}" --out "$OUT/probe_layout.json" 2>&1 | tee "$OUT/probe_layout.txt" | tail -80 ;;
        # NCU_SPECS: "shape:M ..."; each: one launch with ncu's full set and per-instruction (SASS) sampling,
        # the report, its details page and its source page (CSV: stall reasons per SASS instruction)
        ncu) for spec in ${NCU_SPECS:-70B.gate_up:1}; do
                 name="ncu_${spec%%:*}_${spec##*:}"
                 timeout "${NCU_TIMEOUT:-200}" ncu --kernel-name regex:_w4a16 --launch-skip 2 --launch-count 1 --set full \
                     --import-source yes -f -o "$OUT/$name" python3 benchmarks/profile_one.py --shape "${spec%%:*}" --m "${spec##*:}" \
                     > "$OUT/$name.log" 2>&1
                 ncu -i "$OUT/$name.ncu-rep" --page details > "$OUT/$name.txt" 2>&1
                 ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/${name}_sass.csv" 2>&1
                 grep -E "plan:" "$OUT/$name.log"
                 grep -E "Duration|Throughput|Issued|Eligible|Active Warps|Registers|Achieved Occ|Theoretical Occ|L2 Hit|Mem Busy" "$OUT/$name.txt" | head -24
             done ;;
        # AB_SOURCE: older trees' package sources, space-separated (git archive <sha> torch-ext/w4a16 | tar -x -C
        # .ab/<name>, carried as ".ab"); the bench alternates them with this tree's (run 1: each in order, run 2 again)
        # on AB_SHAPES x AB_M; rows are labelled with the tree's directory name ("new" for this tree)
        ab) for run in 1 2; do
                for src in ${AB_SOURCE:-} ""; do
                    side=$(basename "${src:-new}")
                    W4A16_SOURCE="$src" W4A16_COMMIT="${side}:${src:-HEAD}" timeout "${AB_TIMEOUT:-150}" python3 benchmarks/bench_gemm.py --rounds 1 \
                        --ours-only --shapes "${AB_SHAPES:-8B.gate_up}" --m "${AB_M:-2,4,8}" --out "$OUT/ab_${side}_${run}.json" 2>&1 \
                        | grep -F "w4a16[fp16 g128]" | sed "s/^/${side}${run} /"
                done
            done ;;
        # EAGER_SOURCE: older trees' package sources (as AB_SOURCE) timed in turn with this tree's, twice
        eager) for run in 1 2; do
                   for src in ${EAGER_SOURCE:-} ""; do
                       side=$(basename "${src:-new}"); label="${W4A16_COMMIT:-unknown}"; [ -n "$src" ] && label="$side"
                       W4A16_SOURCE="$src" W4A16_COMMIT="$label" timeout 120 python3 benchmarks/eager_overhead.py \
                           --out "$OUT/eager_overhead_${side}_${run}.json" 2>&1 | tail -10 | sed "s/^/${side}${run} /"
                   done
                   [ -z "${EAGER_SOURCE:-}" ] && break
               done ;;
        e2e) timeout "${E2E_TIMEOUT:-400}" python3 benchmarks/bench_e2e.py ${E2E_ARGS:-} --out "$OUT/h200_e2e.json" 2>&1 | tee "$OUT/e2e.txt" | tail -30 ;;
    esac
done
