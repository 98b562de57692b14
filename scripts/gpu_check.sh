#!/usr/bin/env bash
# The GPU check of the CUDA backend (models/cuda/): what a session with a GPU runs first. It cannot
# run where there is no GPU (everything here then skips or fails with "no usable GPU").
#
#   scripts/gpu_check.sh [BUILD_DIR] [OUT_DIR]
#
# BUILD_DIR: a build configured with -DTRAINER_CUDA=ON (default build-cuda; in an unpacked bundle of
# that build, "build"). Run from the folder holding configs/ (the repository or the bundle root).
# OUT_DIR: where every log goes (default $OUT when set, else gpu_check_out). Each step runs even
# when an earlier one failed; OUT_DIR/summary.json holds every step's exit code (77 = skipped), and
# the script exits non-zero when any step failed.
#
# Steps: the GPU's description; cuda_backend_test (every CUDA op and a resnet20/vgg16 step against
# the CPU backend) and the speech parity tests (sequence ops, CTC, LSTM, speller, DeepSpeech and LAS
# steps); cuda_precision_test (bf16 copies, convolutions and GEMMs within bf16's bound, a bf16
# ResNet-20 step); cuda_compressors_test (the sparse methods, PowerSGD and DiLoCo on device buffers,
# op by op and whole methods against the CPU, on 1, 2 and 3 ranks, and once under compute-sanitizer's
# memcheck); cuda_low_bit_test (DiLoCo's low-bit outer codec and its device sum, byte for byte
# against the CPU, on 1 and 2 ranks); cuda_wire_test (sync.wire_dtype's casts and dense sync on GPU
# buffers, overlapped on a second stream, against the CPU, on 1 and 2 ranks); device_test's CUDA
# cases; cuda_graph_test (recorded steps against eager ones); a short quickstart training run on the
# GPU (whose
# metrics must show the sync phase under 5% of the step); and
# the same on two ranks sharing the GPU (staged MPI), with staged_comm_test's GPU cases; every sync
# method on two ranks (and dense through fp16); and
# the speech quickstart on the GPU (one and two ranks) and DeepSpeech, when the corpus is here; and
# the CIFAR loader alone (`trainer bench loader`: augmented images/s at 1 and 2 workers); `trainer
# bench` of resnet20, vgg16 and resnet18 at batch 128, DeepSpeech and LAS at batch 8 on the GPU (with
# PyTorch on the same GPU beside it when torch imports: eager, one CUDA graph, and TF32 for images).
set -x
build=${1:-build-cuda}
out=${2:-${OUT:-gpu_check_out}}
mkdir -p "$out"
declare -A codes
order=()

step() {  # step NAME COMMAND...: runs COMMAND with its output in OUT/NAME.log, records the exit code
  local name=$1
  shift
  "$@" >"$out/$name.log" 2>&1
  codes[$name]=$?
  order+=("$name")
  tail -n 20 "$out/$name.log"
}

# The benchmarks come last and only while the check is within its budget (GPU_CHECK_BUDGET_S,
# default 420 s of the 8 minutes), so the correctness checks always run: a benchmark past it is
# recorded as skipped (77) with the reason in its log.
bench() {  # bench NAME COMMAND...: as step, within the budget
  if ((SECONDS >= ${GPU_CHECK_BUDGET_S:-420})); then
    echo "skipped: the check had run ${SECONDS} s (GPU_CHECK_BUDGET_S=${GPU_CHECK_BUDGET_S:-420})" >"$out/$1.log"
    codes[$1]=77
    order+=("$1")
    return
  fi
  step "$@"
}

step nvidia_smi nvidia-smi
step cuda_backend_test "$build/tests/cuda_backend_test" --durations yes
# The speech half: sequence ops and CTC, the cuDNN LSTM, the speller's ops, then whole DeepSpeech
# and LAS training steps against the CPU.
for t in cuda_sequence_test cuda_lstm_test cuda_speller_test cuda_speech_models_test cuda_precision_test; do
  step "$t" timeout 300 "$build/tests/$t" --durations yes
done
step device_test "$build/tests/device_test" "[cuda]"
# runtime.cuda_graph: six 10-step ResNet-20 runs (graph against eager, bit for bit), about a minute.
step cuda_graph_test timeout 300 "$build/tests/cuda_graph_test" --durations yes
step quickstart_cuda "$build/trainer" --config configs/quickstart_cifar.toml --set runtime.device=cuda \
  --set train.max_steps=40 --set train.log_every_steps=10 --set experiment.output_dir="$out/quickstart_run"
# One process on one GPU has nothing to wait for: the phases are timed where the device spends
# them, so the sync share of the step must be small (issue: it read 55-65% while the GPU's backward
# landed in the sync phase).
step sync_share_1gpu /usr/bin/python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "t_sync_ms" in l]
rows = rows[1:] or rows  # the first interval holds the algorithm search
sync = sum(r["t_sync_ms"] for r in rows)
step = sum(r["t_data_ms"] + r["t_compute_ms"] + r["t_sync_ms"] + r["t_optim_ms"] for r in rows)
print(f"sync {sync:.1f} ms of {step:.1f} ms: {100 * sync / step:.1f}%")
sys.exit(0 if sync < 0.05 * step else 1)' "$out/quickstart_run/metrics.jsonl"
# runtime.precision on the GPU: the same run in bf16 and in tf32 (the loss curves beside fp32's).
for precision in bf16 tf32; do
  step "quickstart_cuda_$precision" "$build/trainer" --config configs/quickstart_cifar.toml --set runtime.device=cuda \
    --set runtime.precision=$precision --set train.max_steps=40 --set train.log_every_steps=10 \
    --set experiment.output_dir="$out/quickstart_run_$precision"
done
# The same short run on the CPU, for the loss curve side by side (same seed, same data).
step quickstart_cpu "$build/trainer" --config configs/quickstart_cifar.toml --set runtime.device=cpu \
  --set train.max_steps=40 --set train.log_every_steps=10 --set experiment.output_dir="$out/quickstart_run_cpu"
# Two ranks on the one GPU: gradients through MPI with pinned host staging (NCCL refuses two ranks on
# one GPU). staged_comm_test's [cuda] cases compare staged collectives on GPU memory with MPI's.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The sparse methods on device buffers: ops and methods against the CPU, the exchanges real on 2 and
# 3 ranks sharing the GPU; memcheck over the single-rank run (out-of-bounds compaction writes).
step cuda_compressors_test timeout 300 "$build/tests/cuda_compressors_test" --durations yes
step cuda_compressors_test_2 timeout 300 mpirun --oversubscribe -n 2 "$build/tests/cuda_compressors_test"
step cuda_compressors_test_3 timeout 300 mpirun --oversubscribe -n 3 "$build/tests/cuda_compressors_test"
if command -v compute-sanitizer >/dev/null || [[ -x /usr/local/cuda/bin/compute-sanitizer ]]; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  step cuda_compressors_memcheck timeout 300 "$sanitizer" --tool memcheck --error-exitcode 1 \
    "$build/tests/cuda_compressors_test" "~[methods]"
fi
# DiLoCo's low-bit outer codec: each op and the whole device sum against the CPU, byte for byte, on
# 1 and 2 ranks sharing the GPU (staged MPI).
step cuda_low_bit_test timeout 120 "$build/tests/cuda_low_bit_test" --durations yes
step cuda_low_bit_test_2 timeout 120 mpirun --oversubscribe -n 2 "$build/tests/cuda_low_bit_test"
# sync.wire_dtype and sync.overlap on device buffers: the 16-bit casts against the CPU bit for bit,
# the second stream's ordering, and dense sync on GPU buffers (overlapped or not) against the CPU's,
# alone and on 2 ranks sharing the GPU (staged MPI: the communication thread waits for each event).
step cuda_wire_test timeout 120 "$build/tests/cuda_wire_test" --durations yes
step cuda_wire_test_2 timeout 120 mpirun --oversubscribe -n 2 "$build/tests/cuda_wire_test"
step staged_comm_test_2 mpirun --oversubscribe -n 2 "$build/tests/staged_comm_test"
step quickstart_cuda_2ranks mpirun --oversubscribe -n 2 "$build/trainer" --config configs/quickstart_cifar.toml \
  --set runtime.device=cuda --set train.max_steps=40 --set train.log_every_steps=10 \
  --set experiment.output_dir="$out/quickstart_run_2ranks"
# Every sync method on two ranks sharing the GPU, each on device buffers (the sparse ones' lists over
# MPI, async_ps's worker staging its push and pull); 30 steps each after a 5-step dense warmup; and
# Streaming DiLoCo (two fragments, a delay of one step overlapped on a host copy, fp8 on the wire).
for method in dense local_sgd diloco oktopk topka gaussiank gtopk powersgd async_ps; do
  step "method_$method" mpirun --oversubscribe -n 2 "$build/trainer" --config configs/quickstart_cifar.toml \
    --set runtime.device=cuda --set train.max_steps=30 --set train.log_every_steps=10 --set sync.method=$method \
    --set sync.dense_warmup_steps=5 --set sync.period=4 --set sync.outer_momentum=0.5 --set sync.density=0.05 \
    --set sync.deterministic=true --set experiment.output_dir="$out/method_$method"
done
# Dense through a 16-bit wire on the GPU, overlapped on the second stream (the default sync.overlap).
step method_dense_fp16 mpirun --oversubscribe -n 2 "$build/trainer" --config configs/quickstart_cifar.toml \
  --set runtime.device=cuda --set train.max_steps=30 --set train.log_every_steps=10 --set sync.method=dense \
  --set sync.wire_dtype=fp16 --set experiment.output_dir="$out/method_dense_fp16"
step method_diloco_streaming mpirun --oversubscribe -n 2 "$build/trainer" --config configs/quickstart_cifar.toml \
  --set runtime.device=cuda --set train.max_steps=30 --set train.log_every_steps=10 --set sync.method=diloco \
  --set sync.dense_warmup_steps=5 --set sync.period=4 --set sync.outer_momentum=0.5 --set sync.fragments=2 \
  --set sync.sync_delay=1 --set sync.mixing=0.5 --set sync.outer_dtype=fp8 \
  --set experiment.output_dir="$out/method_diloco_streaming"
# The speech quickstart (LAS, Ok-Top-k after a dense warmup) for 60 steps on the GPU, on one rank and
# on two sharing it, and DeepSpeech on the same corpus. The corpus is synthesized with espeak-ng and
# sox, which GPU machines lack: bring datasets/an4_quickstart along (scripts/quickstart.sh makes it).
if [[ -d datasets/an4_quickstart ]]; then
  speech=(--config configs/quickstart_an4.toml --set runtime.device=cuda --set train.max_steps=60
          --set train.log_every_steps=10 --set train.eval_every_steps=60 --set sync.dense_warmup_steps=30)
  step speech_quickstart_cuda timeout 300 "$build/trainer" "${speech[@]}" \
    --set experiment.output_dir="$out/speech_quickstart"
  step speech_quickstart_cuda_2ranks timeout 300 mpirun --oversubscribe -n 2 "$build/trainer" "${speech[@]}" \
    --set experiment.output_dir="$out/speech_quickstart_2ranks"
  step deepspeech_cuda timeout 300 "$build/trainer" "${speech[@]}" --set model.arch=deepspeech \
    --set sync.method=dense --set optim.lr=0.01 --set train.max_steps=30 --set experiment.output_dir="$out/deepspeech"
else
  echo "no datasets/an4_quickstart here: the speech runs are skipped"
fi
# TORCH_PYTHON: a Python whose torch has CUDA (default /usr/bin/python3).
torch_python=(--torch-python "${TORCH_PYTHON:-/usr/bin/python3}")
bench bench_loader timeout 120 "$build/trainer" bench loader --threads 1 2
# The sync methods on device buffers at the paper's size (n = 27,569,568, density 0.02), PyTorch's
# compression on the same GPU beside them (issue 29's benchmark).
bench bench_sync_cuda timeout 300 "$build/trainer" bench sync --device cuda "${torch_python[@]}"
bench bench_resnet20 "$build/trainer" bench --model resnet20 --batch 128 --device cuda "${torch_python[@]}"
bench bench_vgg16 timeout 300 "$build/trainer" bench --model vgg16 --batch 128 --device cuda "${torch_python[@]}"
for precision in fp32 bf16 tf32; do
  bench "bench_resnet18_$precision" timeout 300 "$build/trainer" bench --model resnet18 --batch 128 --device cuda \
    --precision $precision "${torch_python[@]}"
done
bench bench_deepspeech timeout 300 "$build/trainer" bench --model deepspeech --batch 8 --device cuda "${torch_python[@]}"
bench bench_las timeout 300 "$build/trainer" bench --model las --batch 8 --device cuda "${torch_python[@]}"

{
  echo "{"
  sep=""
  for name in "${order[@]}"; do
    printf '%s  "%s": %d' "$sep" "$name" "${codes[$name]}"
    sep=$',\n'
  done
  printf '\n}\n'
} >"$out/summary.json"
cat "$out/summary.json"

failed=0
for name in "${order[@]}"; do
  c=${codes[$name]}
  [[ $c -ne 0 && $c -ne 77 ]] && failed=1
done
exit $failed
