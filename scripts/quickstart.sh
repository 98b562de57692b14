#!/usr/bin/env bash
# The main job on its small built-in default: builds trainer, synthesizes a small speech corpus in
# AN4's layout (espeak-ng + sox, first use only), then trains a small Listen-Attend-Spell on it with
# 4 processes and Ok-Top-k sparse allreduce, and ends with the test CER/WER, the communication
# summary and the run's report (trainer report: runs/<name>/report/report.md). A few minutes on 2
# cores. Extra arguments go to trainer, e.g.
#   scripts/quickstart.sh --set train.epochs=5
#   scripts/quickstart.sh cifar        # the image quickstart instead: ResNet-20, synthetic CIFAR-10
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh --target trainer  # the program alone; scripts/test.sh builds the tests
# The run folder: experiment.output_dir as resolved (a --set among the arguments is honoured).
output_dir() {
  build/trainer --config "$@" --dry-run | sed -n 's/^output: //p'
}
if [[ "${1:-}" == cifar ]]; then
  shift
  config=configs/quickstart_cifar.toml
  build/trainer --config $config "$@"
else
  config=configs/quickstart_an4.toml
  corpus=datasets/an4_quickstart  # data.root of configs/quickstart_an4.toml
  if [[ ! -f "$corpus/etc/an4_train.fileids" ]]; then
    scripts/make_speech_corpus --out "$corpus" --train 800 --test 100 --force
  fi
  mpi_flags=(--oversubscribe --bind-to none -x OMP_WAIT_POLICY=passive)
  [[ $(id -u) -eq 0 ]] && mpi_flags+=(--allow-run-as-root)
  mpiexec -n 4 "${mpi_flags[@]}" build/trainer --config $config "$@"
fi
run=$(output_dir $config "$@")
build/trainer report "$run" >/dev/null
echo "report: $run/report/report.md (figures beside it)"
