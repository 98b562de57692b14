#!/usr/bin/env bash
# The main job on its small built-in default: builds trainer, then trains ResNet-20 on a synthetic
# CIFAR-10-format dataset (generated on first use). Extra arguments go to trainer, e.g.
#   scripts/quickstart.sh --set train.epochs=2
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
exec build/trainer --config configs/quickstart_cifar.toml "$@"
