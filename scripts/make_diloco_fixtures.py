#!/usr/bin/env python3
"""Extracts torchft's recorded Streaming DiLoCo values into tests/fixtures/torchft_diloco.json.

    scripts/make_diloco_fixtures.py TORCHFT_GIT_DIR [--commit SHA]

TORCHFT_GIT_DIR is a clone of github.com/meta-pytorch/torchft (its .git folder or a bare mirror);
the files are read with `git show COMMIT:path`, so the work tree may be anything. The fixture in this
repository was made from commit 7eb7087885f7ffaf51148a9df3289d73b8709fbd (2026-04-03).

What torchft records (torchft/diloco_regression_test.py, DiLoCoMockedUpdateTest): two replicas, a
model of two 1x1 weights ("layers.0.weight", "layers.1.weight", one per fragment) starting at 1,
a constant gradient of 2, an inner optimizer p -= 1 * grad, an outer optimizer per fragment
p -= 2 * grad, sync_every = 6, 2 fragments. Per replica, in its train loop:
  history[k]                 the weights before inner step k + 1 (after k inner steps and the
                             syncs they triggered), k = 0 .. until the manager's step reaches 7;
  global_parameter_history[k]  the fragments' outer weights (original_parameters), recorded at the
                             first local step k at which a new manager step (= syncs committed) is seen.
The six test_diloco_mocked_updates runs are parameterized.expand's list, in order:
  (fragment_sync_delay, fragment_update_alpha) = (0, 0), (0, 0.5), (0, 1), (1, 0), (1, 0.5), (1, 1).
test_diloco_mocked_failure_recovery: delay 0, alpha 0; replica 1 fails at manager step 2, restarts
from fresh weights and heals from replica 0's state at its local step 3, so its record after that
is the job's state 6 steps further on (see tests/diloco_test.cpp).
"""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

DEFAULT_COMMIT = "7eb7087885f7ffaf51148a9df3289d73b8709fbd"
PREFIX = "test_fixtures/torchft.diloco_regression_test.DiLoCoMockedUpdateTest."
UPDATES = [(0, 0.0), (0, 0.5), (0, 1.0), (1, 0.0), (1, 0.5), (1, 1.0)]
TENSORS = ["layers.0.weight", "layers.1.weight"]


def show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def values(record: dict) -> list:
    """{step: {tensor: [[v]]}} -> [[step, v0, v1], ...] in step order."""
    rows = []
    for step, tensors in sorted(record.items(), key=lambda kv: int(kv[0])):
        row = [int(step)]
        for name in TENSORS:
            (inner,) = tensors[name]
            (v,) = inner
            row.append(float(v))
        rows.append(row)
    return rows


def run(git_dir: str, commit: str, name: str, delay: int, mixing: float) -> dict:
    replicas = json.loads(show(git_dir, commit, PREFIX + name + ".json"))
    out = []
    for replica in replicas:
        (entry,) = replica
        out.append({"history": values(entry["history"]), "outer": values(entry["global_parameter_history"])})
    return {"name": name, "sync_delay": delay, "mixing": mixing, "replicas": out}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("git_dir")
    parser.add_argument("--commit", default=DEFAULT_COMMIT)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "tests/fixtures/torchft_diloco.json"))
    args = parser.parse_args()
    runs = [run(args.git_dir, args.commit, f"test_diloco_mocked_updates_{i}", d, a) for i, (d, a) in enumerate(UPDATES)]
    runs.append(run(args.git_dir, args.commit, "test_diloco_mocked_failure_recovery_0", 0, 0.0))
    fixture = {
        "source": "github.com/meta-pytorch/torchft " + args.commit + " " + PREFIX + "*.json",
        "setup": {"replicas": 2, "initial": 1.0, "gradient": 2.0, "inner_lr": 1.0, "outer_lr": 2.0,
                  "sync_every": 6, "fragments": 2},
        "rows": "[local step k, layers.0.weight, layers.1.weight]",
        "runs": runs,
    }
    text = json.dumps(fixture, indent=1)
    # One row per line: collapse the innermost lists of numbers.
    text = re.sub(r"\[\s*([-0-9.,\s]+?)\s*\]", lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]", text)
    Path(args.out).write_text(text + "\n")
    print(f"wrote {args.out}: {len(runs)} runs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
