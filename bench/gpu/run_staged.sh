#!/usr/bin/env bash
# Runs the staged CUDA backend test on a GPU machine (see stage.sh), then the same MatMul f16 and
# RmsNorm shapes through PyTorch on the same GPU as the reference, then the whole-model test
# (cuda_model_test: parity, offload splits, decode/prefill bench), an Nsight Compute profile of
# two 7B decode steps when ncu is there, the F32 GEMV's parity and bench (PDSERVE_CUDA_GEMV=f32),
# CUDA graphs' recorded-step test and the model checks with PDSERVE_CUDA_GRAPHS=1, and prints
# the tables:
# ours, PyTorch, the ratio, and the physical limit (HBM bytes / bandwidth for the memory-bound
# shapes, FLOPs / dense F16 tensor peak for the large one).
#
#   STAGE/run_staged.sh            # writes $OUT/gpu_checks.log too when OUT is set
#
# Exit status: 0 passed; 1 a test failed; 2 no cuBLAS 13 found; 3 no usable GPU.
set -uo pipefail
STAGE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -n "${OUT:-}" ]]; then mkdir -p "$OUT"; exec > >(tee -a "$OUT/gpu_checks.log") 2>&1; fi
echo "==== machine ($(date -u +%FT%TZ))"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
nproc; uname -r
# cuBLAS/cudart of the GPU machine.
source "$STAGE/cuda_libs.sh"
export LD_LIBRARY_PATH="$STAGE/lib$CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "==== cuda_backend_test"
"$STAGE/cuda_backend_test" --gtest_color=no 2>&1 | tee "$STAGE/test.log"
RC=${PIPESTATUS[0]}
grep -q "needs a CUDA GPU:" "$STAGE/test.log" && { grep -m1 "needs a CUDA GPU:" "$STAGE/test.log"; exit 3; }
echo "==== reference (PyTorch) and table"
python3 "$STAGE/torch_reference.py" "$STAGE/test.log" || echo "(PyTorch reference failed: see above)"
# Whole models: GPU against CPU, offload splits against the planner, the decode/prefill bench.
# Synthetic models are written (once) into PD_GPU_MODEL_DIR; the step is capped at 300 s so the
# whole script stays under 8 minutes.
echo "==== cuda_model_test (models, placement, bench)"
export PD_GPU_MODEL_DIR="${PD_GPU_MODEL_DIR:-/tmp/pd-gpu-models}" PD_GPU_BENCH=1
timeout 300 "$STAGE/cuda_model_test" --gtest_color=no 2>&1 | tee "$STAGE/model_test.log"
RC2=${PIPESTATUS[0]}
# Where a decode step's time goes: Nsight Compute (ncu, when the machine has it) times each kernel
# of two batch-1 steps of llama-7b q4_K (the model is already written by the bench above).
NCU="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
if [[ -x "$NCU" ]]; then
  echo "==== ncu: kernels of two llama-7b q4_K decode steps"
  PD_GPU_PROFILE=1 timeout 150 "$NCU" --profile-from-start off --metrics gpu__time_duration.sum \
    --csv --log-file "$STAGE/ncu.csv" "$STAGE/cuda_model_test" --gtest_color=no \
    --gtest_filter='*ProfileDecodeStep*' 2>&1 | grep -E '^\[profile\]|FAILED|PASSED'
  python3 "$STAGE/ncu_summary.py" "$STAGE/ncu.csv" 2 || echo "(no ncu table: see above)"
  [[ -n "${OUT:-}" ]] && cp "$STAGE/ncu.csv" "$OUT/" 2>/dev/null
else
  echo "==== ncu not found: no per-kernel profile"
fi
# The F32 GEMV (PDSERVE_CUDA_GEMV=f32, matmul_quant.cu; the default is the int8 GEMV since
# 2026-12-04): its quantized MatMul parity and timings, then whole-model parity and the decode
# bench with it, so the log holds both GEMVs' tables side by side.
echo "==== f32 GEMV: cuda_backend_test (MatMul parity, timings)"
PDSERVE_CUDA_GEMV=f32 "$STAGE/cuda_backend_test" --gtest_color=no \
  --gtest_filter='*QuantMatMul*:*MatMulGroup*:*Gemv*:CudaBackendTest.Timing' 2>&1 |
  grep -E '^\[timing\] (backend|MatMul)|FAILED|PASSED|Failure|vs (reference|cpu)'
RC3=${PIPESTATUS[0]}
echo "==== f32 GEMV: cuda_model_test (parity, bench)"
PDSERVE_CUDA_GEMV=f32 timeout 200 "$STAGE/cuda_model_test" --gtest_color=no \
  --gtest_filter='*ForwardMatches*:*Bench*' 2>&1 | tee "$STAGE/model_test_f32.log"
RC4=${PIPESTATUS[0]}
# CUDA graphs (PDSERVE_CUDA_GRAPHS=1, off by default until this passes): the recorded-step test
# and its launch-cost timing, then whole-model parity and the decode bench with every decode step
# of up to 8 rows recorded and launched as one graph.
echo "==== graphs: cuda_backend_test (recorded steps, launch cost)"
"$STAGE/cuda_backend_test" --gtest_color=no --gtest_filter='*Captured*:*MatMulGroup*' 2>&1 |
  grep -E '^\[timing\]|FAILED|PASSED|Failure|Expected|Which is|actual'
RC5=${PIPESTATUS[0]}
echo "==== graphs: cuda_model_test (parity, bench)"
PDSERVE_CUDA_GRAPHS=1 timeout 200 "$STAGE/cuda_model_test" --gtest_color=no \
  --gtest_filter='*ForwardMatches*:*Bench*' 2>&1 | tee "$STAGE/model_test_graphs.log"
RC6=${PIPESTATUS[0]}
((RC == 0)) || { echo "cuda_backend_test FAILED (exit $RC)"; exit 1; }
((RC2 == 0)) || { echo "cuda_model_test FAILED (exit $RC2; 124 = over its 300 s)"; exit 1; }
((RC3 == 0)) || { echo "f32 GEMV: cuda_backend_test FAILED (exit $RC3)"; exit 1; }
((RC4 == 0)) || { echo "f32 GEMV: cuda_model_test FAILED (exit $RC4; 124 = over its 200 s)"; exit 1; }
((RC5 == 0)) || { echo "graphs: cuda_backend_test FAILED (exit $RC5)"; exit 1; }
((RC6 == 0)) || { echo "graphs: cuda_model_test FAILED (exit $RC6; 124 = over its 200 s)"; exit 1; }
echo "GPU CHECKS PASSED"
