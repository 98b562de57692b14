#!/usr/bin/env bash
# Every sync method's checkpoint from two trainer binaries, byte for byte: for a refactoring that
# must not change what any method computes or saves. Each method trains a 30-step ResNet-20 run on 2
# ranks of a small synthetic CIFAR-10 (one thread each) with each binary, and every file of the two
# final checkpoints (weights, each rank's state, the manifest) must be identical. Each state file
# holds the config's hash, which covers every key: binaries with different key sets differ there
# (and in the manifest's checksums) even when every weight and every method's state is the same.
#   scripts/compare_checkpoints.sh OLD_TRAINER NEW_TRAINER [METHOD...]
# Prints one line per method; exits 1 when any checkpoint differs. Scratch space under /tmp.
#   scripts/compare_checkpoints.sh --ignore-config-hash OLD NEW [METHOD...]
# compares everything but the config's hash (and the manifest's checksums of the files that hold
# it): for binaries whose key sets differ (a key renamed), every weight and every state byte must match.
set -euo pipefail
cd "$(dirname "$0")/.."
ignore_hash=0
if [[ ${1:-} == --ignore-config-hash ]]; then
  ignore_hash=1
  shift
fi
(($# >= 2)) || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
old=$(realpath "$1") new=$(realpath "$2")
shift 2
methods=("$@")
((${#methods[@]})) || methods=(dense local_sgd diloco sparseloco oktopk oktopk+dgc topka gaussiank gtopk powersgd async_ps)
# Each method with settings that exercise its state: a dense warmup, DiLoCo's fragments and delay,
# the parameter server in its repeatable mode.
declare -A extra=(
  [local_sgd]="--set sync.period=4"
  [diloco]="--set sync.period=4 --set sync.fragments=2 --set sync.sync_delay=1 --set sync.outer_momentum=0.5"
  [sparseloco]="--set sync.period=4 --set sync.fragments=2 --set sync.sync_delay=1"
  [async_ps]="--set sync.deterministic=true"
  [oktopk]="--set sync.local_threshold_every=4 --set sync.region_every=8"
  [oktopk+dgc]="--set sync.dgc=true"
)
# The flat spellings of the methods' keys above are read by binaries before and after their tables
# ([sync.<method>], with a note). A name METHOD+dgc is METHOD with its extra settings.
scratch=$(mktemp -d /tmp/compare_checkpoints.XXXXXX)
[[ -n ${KEEP_SCRATCH:-} ]] || trap 'rm -rf "$scratch"' EXIT
"$new" --config configs/quickstart_cifar.toml --set data.root="$scratch/data" --set data.synthetic_train_size=640 \
  --set data.synthetic_test_size=100 --set data.synthesize_if_missing=true --set train.max_steps=1 \
  --set experiment.output_dir="$scratch/make_data" >/dev/null

run() {  # binary, method, output folder
  mpiexec --allow-run-as-root --oversubscribe --bind-to none -n 2 "$1" --config configs/quickstart_cifar.toml \
    --set data.root="$scratch/data" --set data.batch_size=8 --set data.eval_batch_size=50 --set train.max_steps=30 \
    --set train.eval_every_steps=1000 --set runtime.threads=1 --set data.loader_threads=1 \
    --set sync.method="${2%%+*}" --set sync.dense_warmup_steps=5 --set sync.density=0.05 ${extra[$2]:-} \
    --set experiment.output_dir="$3" >"$scratch/$2.log" 2>&1 ||
    { echo "$2: the run failed, see $scratch/$2.log" >&2; return 1; }
}

# Two checkpoint folders equal but for the config hash: safetensors headers compared as JSON without
# it, tensor bytes exactly, the manifest without the hash and its checksums.
same_but_hash() {
  /usr/bin/python3 - "$1" "$2" <<'EOF'
import json, os, struct, sys
a, b = sys.argv[1:]
def read(path):
    data = open(path, "rb").read()
    if path.endswith((".safetensors", ".state")):  # rank<R>.state is safetensors too
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        header.get("__metadata__", {}).pop("config_hash", None)
        return header, data[8 + n:]
    if path.endswith("manifest.json"):
        m = json.loads(data)
        for key in ("config_hash", "manifest_crc32"):
            m.pop(key, None)
        for entry in m.get("files", {}).values():
            entry.pop("crc32", None)
        return m
    return data
names = sorted(os.listdir(a))
if names != sorted(os.listdir(b)):
    sys.exit("different files")
bad = [n for n in names if read(os.path.join(a, n)) != read(os.path.join(b, n))]
if bad:
    sys.exit("differ: " + " ".join(bad))
EOF
}

status=0
for method in "${methods[@]}"; do
  # The same output folder for both (it is part of the config, whose hash the checkpoint holds).
  run "$old" "$method" "$scratch/run" && mv "$scratch/run" "$scratch/old_$method"
  run "$new" "$method" "$scratch/run" && mv "$scratch/run" "$scratch/new_$method"
  a="$scratch/old_$method/checkpoints/step_30" b="$scratch/new_$method/checkpoints/step_30"
  if [[ ! -d $a || ! -d $b ]]; then
    echo "$method: no checkpoint at step 30"
    status=1
  elif ((ignore_hash == 0)) && diff -r "$a" "$b" >/dev/null; then
    echo "$method: identical ($(ls "$a" | wc -l) files, $(du -sb "$a" | cut -f1) bytes)"
  elif ((ignore_hash)) && same_but_hash "$a" "$b"; then
    echo "$method: identical but for the config hash ($(ls "$a" | wc -l) files, $(du -sb "$a" | cut -f1) bytes)"
  else
    echo "$method: DIFFERENT: $(diff -rq "$a" "$b" | tr '\n' ' ')"
    status=1
  fi
done
exit $status
