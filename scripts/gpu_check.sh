#!/usr/bin/env bash
# The GPU check of the CUDA backend (models/cuda/): what a session with a GPU runs first, the one
# command that checks everything GPU-side. Without a GPU it records every step as skipped (77) in a
# few seconds and exits 77 (GPU_CHECK_FORCE=1 runs the steps anyway, to try the script itself).
#
#   scripts/gpu_check.sh [BUILD_DIR] [OUT_DIR]
#
# BUILD_DIR: a build configured with -DTRAINER_CUDA=ON (default build-cuda; in an unpacked bundle of
# that build, "build"). Run from the folder holding configs/ (the repository or the bundle root).
# OUT_DIR: where every log goes (default $OUT when set, else gpu_check_out).
#
# Time: the whole check runs within GPU_CHECK_BUDGET_S (default 450 s, under the 8 minutes a GPU
# session can give it). Every step runs under `timeout` (TERM, then KILL 5 s later): its own cap or
# what is left of the budget, whichever is less, so a hang costs at most that and never the rest.
# A step that would get under 10 s is recorded as skipped (77) with the reason in its log. The
# correctness checks come first, the benchmarks last (they get what is left).
#
# Results: OUT_DIR/NAME.log per step; OUT_DIR/summary.json holds every finished step's exit code
# (0 passed, 77 skipped, 124 or 137 timed out, else failed) and is rewritten after each step, so a
# run killed from outside keeps what it had; OUT_DIR/durations.tsv each step's seconds. Each step
# runs even when an earlier one failed; the script exits non-zero when any step failed.
#
# Steps: the GPU's description; cuda_backend_test (every CUDA op, the convolution algorithm choice,
# a resnet20/vgg16 step against the CPU backend) and the speech parity tests (sequence ops, CTC,
# LSTM, speller, DeepSpeech and LAS steps); cuda_precision_test (bf16 within its bound);
# compute-sanitizer's racecheck and synccheck over the batch norm, attention and compaction kernels'
# tests, memcheck over the compressors; cuda_compressors_test (sparse methods, PowerSGD and DiLoCo on
# device buffers against the CPU, on 1, 2 and 3 ranks) and each sparse op at the paper's 27.5M
# entries; cuda_low_bit_test; cuda_wire_test (casts and overlapped dense sync on a second stream, 1
# and 2 ranks); device_test's CUDA cases; staged_comm_test's CUDA cases on two ranks and its NCCL
# case on one; cuda_graph_test (recorded steps against eager ones, a graph recorded again after
# evaluations, two deterministic processes alike); short CIFAR runs on the GPU: recorded steps with
# an evaluation every 3 steps (re-recording), eager steps (whose sync phase must be under 5% of the
# step), bf16, tf32, the CPU beside them, two ranks; every sync method on two ranks; the speech
# quickstart and DeepSpeech when a corpus is here (SPEECH_CORPUS, below); then
# `trainer bench` (loader, sync at 27.5M, resnet20, vgg16, resnet18 in three precisions, DeepSpeech,
# LAS; PyTorch on the same GPU beside them when TORCH_PYTHON's torch has CUDA).
set -u
build=${1:-build-cuda}
out=${2:-${OUT:-gpu_check_out}}
budget=${GPU_CHECK_BUDGET_S:-450}
mkdir -p "$out"
: >"$out/durations.tsv"
declare -A codes
order=()

write_summary() {  # the codes so far, as JSON (rewritten after every step)
  {
    echo "{"
    local sep="" name
    for name in "${order[@]}"; do
      printf '%s  "%s": %d' "$sep" "$name" "${codes[$name]}"
      sep=$',\n'
    done
    printf '\n}\n'
  } >"$out/summary.json.tmp" && mv "$out/summary.json.tmp" "$out/summary.json"
}

record() {  # record NAME CODE SECONDS
  codes[$1]=$2
  order+=("$1")
  printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$out/durations.tsv"
  write_summary
}

skip() {  # skip NAME REASON: recorded as skipped (77), the reason in its log
  echo "skipped: $2" >"$out/$1.log"
  echo "== $1: skipped ($2)"
  record "$1" 77 0
}

have_gpu=1
nvidia-smi -L >/dev/null 2>&1 || have_gpu=0

# step NAME CAP COMMAND...: COMMAND with its output in OUT/NAME.log, under a timeout of CAP seconds
# or what is left of the budget, whichever is less; its exit code recorded.
step() {
  local name=$1 cap=$2
  shift 2
  if ((!have_gpu)) && [[ -z ${GPU_CHECK_FORCE:-} ]]; then
    skip "$name" "no GPU here (nvidia-smi -L failed)"
    return
  fi
  local left=$((budget - SECONDS))
  local limit=$((cap < left ? cap : left))
  if ((limit < 10)); then
    skip "$name" "the check had run ${SECONDS} s of its ${budget} s (GPU_CHECK_BUDGET_S)"
    return
  fi
  local start=$SECONDS code
  echo "== $name (timeout ${limit} s; ${SECONDS} s of ${budget} s spent)"
  timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
  code=$?
  ((code == 124 || code == 137)) && echo "timed out after ${limit} s" >>"$out/$name.log"
  record "$name" "$code" $((SECONDS - start))
  tail -n 5 "$out/$name.log"
}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
mpi=(mpirun --oversubscribe)
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
cifar=(--config configs/quickstart_cifar.toml --set train.log_every_steps=10)

if ((have_gpu)); then
  step nvidia_smi 20 nvidia-smi
else
  skip nvidia_smi "no GPU here (nvidia-smi -L failed)"
fi

# ---- The CUDA ops against the CPU backend.
step cuda_backend_test 120 "$build/tests/cuda_backend_test" --durations yes
# The speech half: sequence ops and CTC, the cuDNN LSTM, the speller's ops, whole DeepSpeech and LAS
# training steps; then bf16.
for t in cuda_sequence_test cuda_lstm_test cuda_speller_test cuda_speech_models_test cuda_precision_test; do
  step "$t" 90 "$build/tests/$t" --durations yes
done
step device_test 30 "$build/tests/device_test" "[cuda]"

# ---- Sync on device buffers. Two and three ranks share the one GPU through staged MPI (NCCL refuses
# two ranks on one GPU); NCCL itself runs at one rank.
step cuda_compressors_test 90 "$build/tests/cuda_compressors_test" --durations yes
step cuda_compressors_test_2 90 "${mpi[@]}" -n 2 "$build/tests/cuda_compressors_test"
step cuda_compressors_test_3 90 "${mpi[@]}" -n 3 "$build/tests/cuda_compressors_test"
# Each sparse op at the paper's gradient size (27,569,568 entries) against the CPU.
step cuda_sparse_27m 90 "$build/tests/cuda_compressors_test" "[large]" --durations yes
step cuda_low_bit_test 60 "$build/tests/cuda_low_bit_test" --durations yes
step cuda_low_bit_test_2 60 "${mpi[@]}" -n 2 "$build/tests/cuda_low_bit_test"
step cuda_wire_test 60 "$build/tests/cuda_wire_test" --durations yes
step cuda_wire_test_2 60 "${mpi[@]}" -n 2 "$build/tests/cuda_wire_test"
step staged_comm_test_2 60 "${mpi[@]}" -n 2 "$build/tests/staged_comm_test" "~[.],[cuda]"
# One rank: the NCCL case's calls run on NCCL and are logged as MPI's (with two it only checks the refusal).
step staged_comm_test_nccl_1 60 "${mpi[@]}" -n 1 "$build/tests/staged_comm_test" "[cuda]"

# ---- Whole steps: recorded CUDA graphs against eager steps, bit for bit (a constant rate, a
# schedule, Adam with a skipped step, recorded again after evaluations), and two deterministic
# processes alike.
step cuda_graph_test 180 "$build/tests/cuda_graph_test" --durations yes

# ---- Short training runs on the GPU.
# Recorded steps (runtime.cuda_graph, the default) with an evaluation every 3 steps: each evaluation
# moves buffers, so the graph is recorded again after it.
step quickstart_cuda 60 "$build/trainer" "${cifar[@]}" --set runtime.device=cuda --set train.max_steps=40 \
  --set train.eval_every_steps=3 --set experiment.output_dir="$out/quickstart_run"
# Eager steps: the phases are timed where the device spends them, so one process on one GPU (nothing
# to wait for) must show a small sync share. Recorded steps report no sync time, so this takes the
# eager run.
step quickstart_cuda_eager 60 "$build/trainer" "${cifar[@]}" --set runtime.device=cuda --set runtime.cuda_graph=false \
  --set train.max_steps=40 --set experiment.output_dir="$out/quickstart_run_eager"
step sync_share_1gpu 10 /usr/bin/python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "t_sync_ms" in l]
rows = rows[1:] or rows  # the first interval holds the algorithm search
sync = sum(r["t_sync_ms"] for r in rows)
step = sum(r["t_data_ms"] + r["t_compute_ms"] + r["t_sync_ms"] + r["t_optim_ms"] for r in rows)
print(f"sync {sync:.1f} ms of {step:.1f} ms: {100 * sync / step:.1f}%")
sys.exit(0 if 0 < step and sync < 0.05 * step else 1)' "$out/quickstart_run_eager/metrics.jsonl"
# runtime.precision on the GPU (the loss curves beside fp32's), and the CPU's run beside them.
for precision in bf16 tf32; do
  step "quickstart_cuda_$precision" 60 "$build/trainer" "${cifar[@]}" --set runtime.device=cuda \
    --set runtime.precision=$precision --set train.max_steps=40 --set experiment.output_dir="$out/quickstart_run_$precision"
done
step quickstart_cpu 90 "$build/trainer" "${cifar[@]}" --set runtime.device=cpu --set train.max_steps=40 \
  --set experiment.output_dir="$out/quickstart_run_cpu"
step quickstart_cuda_2ranks 60 "${mpi[@]}" -n 2 "$build/trainer" "${cifar[@]}" --set runtime.device=cuda \
  --set train.max_steps=40 --set experiment.output_dir="$out/quickstart_run_2ranks"
# Every sync method on two ranks sharing the GPU, each on device buffers (the sparse ones' lists over
# MPI, async_ps's worker staging its push and pull); 30 steps each after a 5-step dense warmup; dense
# through fp16 (overlapped on the second stream); Streaming DiLoCo (two fragments, a delay of one
# step overlapped on a host copy, fp8 on the wire).
for method in dense local_sgd diloco oktopk topka gaussiank gtopk powersgd async_ps; do
  step "method_$method" 45 "${mpi[@]}" -n 2 "$build/trainer" "${cifar[@]}" --set runtime.device=cuda \
    --set train.max_steps=30 --set sync.method=$method --set sync.dense_warmup_steps=5 --set sync.period=4 \
    --set sync.outer_momentum=0.5 --set sync.density=0.05 --set sync.deterministic=true \
    --set experiment.output_dir="$out/method_$method"
done
step method_dense_fp16 45 "${mpi[@]}" -n 2 "$build/trainer" "${cifar[@]}" --set runtime.device=cuda \
  --set train.max_steps=30 --set sync.method=dense --set sync.wire_dtype=fp16 \
  --set experiment.output_dir="$out/method_dense_fp16"
step method_diloco_streaming 45 "${mpi[@]}" -n 2 "$build/trainer" "${cifar[@]}" --set runtime.device=cuda \
  --set train.max_steps=30 --set sync.method=diloco --set sync.dense_warmup_steps=5 --set sync.period=4 \
  --set sync.outer_momentum=0.5 --set sync.fragments=2 --set sync.sync_delay=1 --set sync.mixing=0.5 \
  --set sync.outer_dtype=fp8 --set experiment.output_dir="$out/method_diloco_streaming"

# ---- Speech end to end: LAS (Ok-Top-k after a dense warmup) on one rank and two, and DeepSpeech.
# The corpus is synthesized with espeak-ng and sox, which GPU machines lack: bring one along.
# SPEECH_CORPUS: an AN4-layout folder, or scripts/make_gpu_speech_corpus's archive (8.6 MB, unpacked
# into OUT_DIR); by default .device/speech_corpus.tar.xz or datasets/an4_quickstart, where present.
corpus=${SPEECH_CORPUS:-}
if [[ -z $corpus ]]; then
  for c in .device/speech_corpus.tar.xz datasets/an4_quickstart; do
    if [[ -e $c ]]; then
      corpus=$c
      break
    fi
  done
fi
# (Not without a GPU: nothing would read it.)
if [[ $corpus == *.tar.xz && -f $corpus ]] && { ((have_gpu)) || [[ -n ${GPU_CHECK_FORCE:-} ]]; }; then
  rm -rf "$out/speech_corpus"
  if timeout 60 tar -xJf "$corpus" -C "$out" && [[ -d $out/speech_corpus ]]; then
    corpus=$out/speech_corpus
  else
    echo "could not unpack $corpus"
  fi
fi
if [[ -n $corpus && -d $corpus ]]; then
  speech=(--config configs/quickstart_an4.toml --set data.root="$corpus" --set runtime.device=cuda
          --set train.max_steps=60 --set train.log_every_steps=10 --set train.eval_every_steps=60
          --set sync.dense_warmup_steps=30)
  step speech_quickstart_cuda 90 "$build/trainer" "${speech[@]}" --set experiment.output_dir="$out/speech_quickstart"
  step speech_quickstart_cuda_2ranks 90 "${mpi[@]}" -n 2 "$build/trainer" "${speech[@]}" \
    --set experiment.output_dir="$out/speech_quickstart_2ranks"
  step deepspeech_cuda 90 "$build/trainer" "${speech[@]}" --set model.arch=deepspeech --set sync.method=dense \
    --set optim.lr=0.01 --set train.max_steps=30 --set experiment.output_dir="$out/deepspeech"
else
  for name in speech_quickstart_cuda speech_quickstart_cuda_2ranks deepspeech_cuda; do
    skip "$name" "no speech corpus (SPEECH_CORPUS=${corpus:-unset}; scripts/make_gpu_speech_corpus makes one)"
  done
fi

# ---- compute-sanitizer (after the runs above: slow, and each capped): shared-memory races
# (racecheck) and barrier misuse (synccheck) in the kernels that share memory and synchronize blocks: batch norm's statistics and gradients (the
# small-shape case and the many-chunk one), the attention, and the sparse compaction.
if [[ -x $sanitizer ]]; then
  for tool in racecheck synccheck; do
    step "batch_norm_$tool" 45 "$sanitizer" --tool $tool --error-exitcode 1 "$build/tests/cuda_backend_test" \
      "CUDA batch norm matches the CPU*" "CUDA batch norm: a large mean offset*"
    step "attention_$tool" 45 "$sanitizer" --tool $tool --error-exitcode 1 "$build/tests/cuda_speller_test" \
      "CUDA attention*"
    step "compaction_$tool" 45 "$sanitizer" --tool $tool --error-exitcode 1 "$build/tests/cuda_compressors_test" \
      "select_at_least*"
  done
  # Out-of-bounds accesses over the compressors' ops (compaction writes above all).
  step cuda_compressors_memcheck 60 "$sanitizer" --tool memcheck --error-exitcode 1 \
    "$build/tests/cuda_compressors_test" "~[methods]"
else
  for name in batch_norm_racecheck attention_racecheck compaction_racecheck batch_norm_synccheck \
      attention_synccheck compaction_synccheck cuda_compressors_memcheck; do
    skip "$name" "no compute-sanitizer"
  done
fi

# ---- Benchmarks, with what is left. TORCH_PYTHON: a Python whose torch has CUDA.
torch_python=(--torch-python "${TORCH_PYTHON:-/usr/bin/python3}")
step bench_loader 30 "$build/trainer" bench loader --threads 1 2
# The sync methods on device buffers at the paper's size (n = 27,569,568, density 0.02), PyTorch's
# compression on the same GPU beside them (issue 29's benchmark).
step bench_sync_cuda 60 "$build/trainer" bench sync --device cuda "${torch_python[@]}"
step bench_resnet20 60 "$build/trainer" bench --model resnet20 --batch 128 --device cuda "${torch_python[@]}"
step bench_vgg16 60 "$build/trainer" bench --model vgg16 --batch 128 --device cuda "${torch_python[@]}"
for precision in fp32 bf16 tf32; do
  step "bench_resnet18_$precision" 60 "$build/trainer" bench --model resnet18 --batch 128 --device cuda \
    --precision $precision "${torch_python[@]}"
done
step bench_deepspeech 60 "$build/trainer" bench --model deepspeech --batch 8 --device cuda "${torch_python[@]}"
step bench_las 60 "$build/trainer" bench --model las --batch 8 --device cuda "${torch_python[@]}"

write_summary
cat "$out/summary.json"
echo "gpu_check: ${SECONDS} s of ${budget} s"
((!have_gpu)) && [[ -z ${GPU_CHECK_FORCE:-} ]] && exit 77
failed=0
for name in "${order[@]}"; do
  c=${codes[$name]}
  ((c != 0 && c != 77)) && failed=1
done
exit $failed
