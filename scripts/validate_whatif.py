#!/usr/bin/env python3
"""Checks `trainer whatif` against real runs under scripts/netem (BENCHMARKS.md, "What-if with a
calibrated network" and "Overlap with backward"): paired rounds, so that the machine's load moves
prediction and measurement alike.

    sudo scripts/validate_whatif.py --model resnet20 --ranks 2 --bandwidth 100mbit --overlap true [--rounds 3]

One round: an unshaped run (plain mpiexec), `trainer calibrate` under scripts/netem, the same run under
scripts/netem (the measurement), a second unshaped run. The prediction is the mean of `trainer whatif
--calibration` over the two unshaped runs; the nominal one (the link's rate as given) beside it. One
table row per round, and the median error.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {
    # 1.08 MB gradient; synthetic CIFAR-10 made on first use
    "resnet20": ["--config", "configs/quickstart_cifar.toml", "--set", "data.batch_size=32",
                 "--set", "train.max_steps=30", "--set", "runtime.threads=1", "--set", "data.loader_threads=1"],
    # 6.35 MB gradient; corpus: scripts/make_speech_corpus --out datasets/an4_quickstart --train 800 --test 100
    "las": ["--config", "configs/quickstart_an4.toml", "--set", "train.max_steps=40",
            "--set", "train.eval_at_start=false", "--set", "model.beam_width=1"],
}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="resnet20")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--bandwidth", default="100mbit")
    ap.add_argument("--overlap", default="true", choices=["true", "false"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "validate_whatif"))
    ap.add_argument("--reuse", action="store_true",
                    help="predict again from the runs and calibrations already in --out (a changed model)")
    return ap.parse_args()


def sh(cmd):
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit(f"validate_whatif: failed: {' '.join(cmd)}\n{p.stdout[-2000:]}")
    return p.stdout


def step_ms(out):
    steps = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"t_data_ms"' in l][3:]
    return statistics.median(m["t_data_ms"] + m["t_compute_ms"] + m["t_sync_ms"] + m["t_optim_ms"] for m in steps)


def train(args, out, shaped):
    if args.reuse:
        return step_ms(out)
    shutil.rmtree(out, ignore_errors=True)
    launch = ([os.path.join(ROOT, "scripts", "netem"), "--ranks", str(args.ranks), "--bandwidth", args.bandwidth, "--"]
              if shaped else ["mpiexec", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                              "-n", str(args.ranks)])
    sh(launch + [os.path.join(ROOT, "build", "trainer")] + MODELS[args.model] +
       ["--set", "sync.method=dense", f"--set", f"sync.overlap={args.overlap}", "--set", "train.log_every_steps=1",
        "--set", f"experiment.output_dir={out}"])
    return step_ms(out)


def whatif(run, network):
    out = sh([os.path.join(ROOT, "build", "trainer"), "whatif", run, "--json"] + network)
    phase = next(p for p in json.loads(out)["phases"] if p["phase"] == "dense")
    return phase["step_ms"]


def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    tag = f"{args.model}-p{args.ranks}-{args.bandwidth}-overlap{args.overlap}"
    rows = []
    for r in range(args.rounds):
        base = os.path.join(args.out, f"{tag}-{r}")
        cal = base + "-cal.json"
        before = train(args, base + "-unshaped-a", shaped=False)
        if not args.reuse:
            sh([os.path.join(ROOT, "scripts", "netem"), "--ranks", str(args.ranks), "--bandwidth", args.bandwidth, "--",
                os.path.join(ROOT, "build", "trainer"), "calibrate", "--out", cal, "--nominal", args.bandwidth])
        measured = train(args, base + "-shaped", shaped=True)
        after = train(args, base + "-unshaped-b", shaped=False)
        runs = [base + "-unshaped-a", base + "-unshaped-b"]
        calibrated = statistics.mean(whatif(u, ["--calibration", cal]) for u in runs)
        nominal = statistics.mean(whatif(u, ["--bandwidth", args.bandwidth]) for u in runs)
        rows.append((nominal, calibrated, measured, statistics.mean([before, after])))
        print(f"round {r}: nominal {nominal:.0f} ms, calibrated {calibrated:.0f} ms, measured {measured:.0f} ms "
              f"(unshaped {before:.0f} / {after:.0f})", file=sys.stderr, flush=True)
    print(f"\n{tag}\n\n| round | predicted nominal | predicted calibrated | measured | error nominal | error calibrated |")
    print("|---|---:|---:|---:|---:|---:|")
    for i, (nominal, calibrated, measured, _) in enumerate(rows):
        print(f"| {i} | {nominal:.0f} | {calibrated:.0f} | {measured:.0f} | {100 * (nominal / measured - 1):+.0f}% "
              f"| {100 * (calibrated / measured - 1):+.0f}% |")
    errors = sorted(100 * (c / m - 1) for _, c, m, _ in rows)
    print(f"\nmedian calibrated error {statistics.median(errors):+.1f}% (all: {', '.join(f'{e:+.0f}%' for e in errors)})")


if __name__ == "__main__":
    main()
