#!/usr/bin/env bash
# The GPU work of this project, in parts that each fit one 10-minute device command (a 12-layer GPT compiles for
# more than 200 s under Thunder 0.2.6 on the H200). Run from the project root on the device machine:
#
#     source .gpu/setup.sh && bash benchmarks/gpu_batch.sh PART...     # logs and JSON go to $OUT (or /tmp/out)
#
# Parts: tests (the quick `cuda` tests), repro, models-llama, models-gpt, overhead, overhead-tc, overhead-2, fidelity,
# real-gpt, real-llama, replay-gpt, bench-gpt,
# probe (gpt_crash_probe.py; PROBE_LAYERS, PROBE_VARIANTS), nvfuser-memory, cli-bench, ddp-nccl (needs 2 GPUs).
# See benchmarks/RESULTS.md for what each figure means.
set -uo pipefail
# Several parts run one after the other; on a 2-GPU machine, two lists can run side by side:
#     CUDA_VISIBLE_DEVICES=0 bash benchmarks/gpu_batch.sh overhead & CUDA_VISIBLE_DEVICES=1 bash benchmarks/gpu_batch.sh tests repro; wait
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
[ $# -gt 0 ] || { echo "which parts? tests, repro, models-llama, models-gpt, overhead, overhead-tc, overhead-2, fidelity, real-gpt, real-llama, replay-gpt, bench-gpt, probe, nvfuser-memory, cli-bench, ddp-nccl" >&2; exit 2; }
pytest=(python3 -m pytest -q -p no:cacheprovider -rA)
status=0
for part in "$@"; do
echo "=== $part: started $(date +%T)"
case "$part" in
  tests)        "${pytest[@]}" -m cuda tests/test_timing_cuda.py tests/test_cli.py 2>&1 | tee "$OUT/tests.log" ;;
  repro)        "${pytest[@]}" -m cuda tests/test_repro.py 2>&1 | tee "$OUT/repro.log" ;;
  models-llama) "${pytest[@]}" -m cuda tests/test_models_cuda.py -k llama 2>&1 | tee "$OUT/models_llama.log" ;;
  models-gpt)   "${pytest[@]}" -m cuda tests/test_models_cuda.py -k gpt 2>&1 | tee "$OUT/models_gpt.log" ;;
  overhead)     python3 benchmarks/overhead.py --with-real-models --json "$OUT/overhead.json" 2>&1 | tee "$OUT/overhead.log" ;;
  overhead-tc)  # The 12-layer GPT with Thunder's torch.compile executor fusing instead of nvFuser, whose build on the
                # H200 computes this model wrongly (RESULTS.md, "The GPT crash"): the backend's overhead on a correct run.
                python3 benchmarks/overhead.py --with-real-models --executors torchcompile,sdpa,torchcompile_xentropy \
                  --json "$OUT/overhead_tc.json" 2>&1 | tee "$OUT/overhead_tc.log" ;;
  overhead-2)   python3 benchmarks/overhead.py --layers 2 --with-real-models --json "$OUT/overhead_2.json" 2>&1 | tee "$OUT/overhead_2.log" ;;
  real-llama)   python3 benchmarks/real_models.py --model llama --steps 60 --timeout 280 --thunder-replay \
                  --json "$OUT/real_llama.json" 2>&1 | tee "$OUT/real_llama.log" ;;
  replay-gpt)   # Thunder's own report replay of the 12-layer GPT, what ReportingBackend's report is compared against
                # (issue 7). A replay, not a training run: it may not reach the steps where this machine's nvFuser fails.
                python3 benchmarks/real_models.py --model gpt --modes '' --thunder-replay --timeout 500 \
                  --json "$OUT/replay_gpt.json" 2>&1 | tee "$OUT/replay_gpt.log" ;;
  fidelity)     python3 benchmarks/fidelity.py --layers 2 --json "$OUT/fidelity.json" 2>&1 | tee "$OUT/fidelity.log" ;;
  real-gpt)     python3 benchmarks/real_models.py --model gpt --modes thunderfx,reporting --steps 60 --timeout 280 \
                  --json "$OUT/real_gpt.json" 2>&1 | tee "$OUT/real_gpt.log" ;;
  bench-gpt)    # The dump lives outside $OUT (only 8 files come back); its records, scripts, results and triage come back
                # as one archive. BENCH_GPUS=0,1 times on both GPUs of an x2 machine, one script per GPU at a time.
                dump=/tmp/gpt_dump; rm -rf "$dump"
                THUNDERFX_DEBUG_DIR="$dump" THUNDERFX_DEBUG_REPRO=split,fusion THUNDERFX_DEBUG_TIMING=fusion \
                  python3 benchmarks/real_models.py --model gpt --gpt-layers 2 --modes inductor,reporting --steps 20 \
                  --dump-dir "$dump" > "$OUT/bench_gpt_train.log" 2>&1
                python3 -m thunderfx_debug bench "$dump" --jobs 16 --timeout 120 ${BENCH_GPUS:+--gpus "$BENCH_GPUS"} \
                  --results-dir "$dump/bench_results" -o "$dump/triage.md" 2>&1 | tee "$OUT/bench_gpt.log"
                tar -czf "$OUT/bench_gpt.tgz" -C /tmp --exclude='*.pt' gpt_dump ;;
  probe)        python3 benchmarks/gpt_crash_probe.py --layers "${PROBE_LAYERS:-4}" --variants "${PROBE_VARIANTS:-default}" \
                  --json "$OUT/probe_${PROBE_LAYERS:-4}.json" 2>&1 | tee "$OUT/probe_${PROBE_LAYERS:-4}.log" ;;
  nvfuser-memory) # nvFuser and torch alone: does the GPT's first fusion overwrite a tensor it was not given?
                python3 benchmarks/nvfuser_memory_probe.py 2>&1 | tee "$OUT/nvfuser_memory.log" ;;
  cli-bench)    "${pytest[@]}" -m cuda tests/test_cli.py 2>&1 | tee "$OUT/cli_bench.log" ;;
  ddp-nccl)     "${pytest[@]}" tests/test_ddp.py -k nccl 2>&1 | tee "$OUT/ddp_nccl.log" ;;
  *)            echo "unknown part $part" >&2; exit 2 ;;
esac
rc=${PIPESTATUS[0]}
echo "=== $part: exit $rc at $(date +%T)"
[ "$rc" -eq 0 ] || status=1
done
exit $status
