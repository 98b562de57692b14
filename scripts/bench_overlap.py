#!/usr/bin/env python3
"""Does overlap (and does compression) pay on this link? Real training steps of the trainer and of
PyTorch DDP on gloo under the same emulated network (scripts/netem), side by side (BENCHMARKS.md,
"Overlap with backward").

    sudo scripts/bench_overlap.py --model resnet20 --ranks 2 --bandwidth 1gbit [--steps 12 --warmup 4]

Rows, one network and rank count at a time, each a real run of --warmup + --steps steps:
  (a) dense, sync.overlap = false      every bucket after backward
  (b) dense, sync.overlap = true       buckets during backward (the default)
  (c) PyTorch DDP on gloo              scripts/bench_ddp.py, today's PyTorch (--torch-python) and
                                       Debian's 1.13 (/usr/bin/python3): same model, batch, bucket
                                       size and threads
  (d) dense, bf16 on the wire, overlap
  (e) powersgd rank 2 (per bucket, its factors exchanged during backward)
  (f) oktopk, density 0.01

Per row: step time (median over the timed steps: metrics.jsonl's data + compute + sync + optimizer
for ours), compute (the same step without communication: (a)'s data + compute + optimizer for ours,
DDP under no_sync for PyTorch), communication ((a)'s sync time; DDP's buckets allreduced alone) and
the share of communication hidden = (compute + communication - step) / communication, clamped to
[0, 1], computed the same way for both. For ours the comm log's own measure (the part of the wire
time during forward and backward, `trainer report`) is given beside it.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import report_analysis as ra  # noqa: E402

MB_IN_MIB = 1e6 / 2**20


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet20", choices=["resnet20", "resnet18"])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--bandwidth", default="1gbit", help="scripts/netem --bandwidth (none: no netem, loopback)")
    ap.add_argument("--delay", default="0ms", help="scripts/netem --delay (one way; kernels without the netem qdisc: 0 only)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="compute threads per rank")
    ap.add_argument("--bucket-mb", type=float, default=8.0, help="ours and DDP's (the trainer's default)")
    ap.add_argument("--first-bucket-mb", type=float, default=1.0, help="the first bucket backward fills")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--rows", default="a,b,c,d,e,f", help="which rows (c runs both PyTorch versions)")
    ap.add_argument("--torch-python", default="/work/torchvenv/bin/python", help="today's PyTorch (a venv)")
    ap.add_argument("--trainer", default=os.path.join(ROOT, "build", "trainer"))
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "bench_overlap"))
    ap.add_argument("--json", help="append one JSON line per row to this file")
    return ap.parse_args()


def launcher(args):
    if args.bandwidth == "none":
        return ["mpiexec", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n", str(args.ranks)]
    return [os.path.join(ROOT, "scripts", "netem"), "--ranks", str(args.ranks), "--bandwidth", args.bandwidth,
            "--delay", args.delay, "--"]


def run(cmd, label):
    print(f"  {label}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit(f"bench_overlap: {label} failed (exit {p.returncode}):\n{p.stdout[-3000:]}")
    return p.stdout


def ours(args, name, settings):
    out = os.path.join(args.out, f"{args.model}-p{args.ranks}-{args.bandwidth}-{name}")
    cmd = launcher(args) + [
        args.trainer, "--config", os.path.join(ROOT, "configs", "quickstart_cifar.toml"),
        "--set", f"model.arch={args.model}", "--set", f"data.batch_size={args.batch}",
        "--set", f"runtime.threads={args.threads}", "--set", "data.loader_threads=1",
        "--set", f"sync.bucket_mb={args.bucket_mb}", "--set", f"sync.first_bucket_mb={args.first_bucket_mb}",
        "--set", f"train.max_steps={args.warmup + args.steps}", "--set", "train.log_every_steps=1",
        "--set", "train.eval_every_steps=100000", "--set", "train.eval_at_start=false",
        "--set", "train.checkpoint_every=0", "--set", f"experiment.output_dir={out}"]
    for s in settings:
        cmd += ["--set", s]
    run(cmd, name)
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl")) if '"t_data_ms"' in line]
    timed = [r for r in records if r["step"] > args.warmup]
    step = statistics.median(r["t_data_ms"] + r["t_compute_ms"] + r["t_sync_ms"] + r["t_optim_ms"] for r in timed)
    compute = statistics.median(r["t_data_ms"] + r["t_compute_ms"] + r["t_optim_ms"] for r in timed)
    comm = statistics.median(r["t_sync_ms"] for r in timed)
    hidden_log = None
    try:
        h = ra.hidden_share(ra.Run(out))
        totals = [sum(v[k] for v in h.values()) for k in ("comm_us", "hidden_us")] if h else None
        hidden_log = totals[1] / totals[0] if totals and totals[0] else None
    except ra.RunError:
        pass
    return {"row": name, "framework": "trainer", "step_ms": step, "compute_ms": compute, "comm_ms": comm,
            "hidden_by_log": hidden_log}


def ddp(args, python, name):
    out = run(launcher(args) + [python, os.path.join(ROOT, "scripts", "bench_ddp.py"), "--model", args.model,
                                "--batch", str(args.batch), "--threads", str(args.threads),
                                # PyTorch's MB are MiB, ours 10^6 bytes: the same byte caps.
                                "--bucket-mb", f"{args.bucket_mb * MB_IN_MIB:.6f}",
                                "--first-bucket-mb", f"{args.first_bucket_mb * MB_IN_MIB:.6f}", "--steps", str(args.steps),
                                "--warmup", str(args.warmup), "--network", args.bandwidth], name)
    line = next(l for l in reversed(out.splitlines()) if l.startswith("{"))
    r = json.loads(line)
    step = r["step_ms"]["median"] if isinstance(r["step_ms"], dict) else r["step_ms"]
    compute = r["compute_ms"]["median"] if isinstance(r["compute_ms"], dict) else r["compute_ms"]
    comm = r["comm_ms"]["median"] if isinstance(r["comm_ms"], dict) else r["comm_ms"]
    return {"row": name, "framework": f"pytorch {r.get('torch_version', r.get('torch', '?'))}", "step_ms": step,
            "compute_ms": compute, "comm_ms": comm, "hidden_by_log": None}


def main():
    args = parse_args()
    rows = set(args.rows.split(","))
    results = []
    if "a" in rows or "b" in rows:
        a = ours(args, "a-dense", ["sync.method=dense", "sync.overlap=false"])
        results.append(a)
    if "b" in rows:
        b = ours(args, "b-dense-overlap", ["sync.method=dense", "sync.overlap=true"])
        # Compute and communication of the same step measured apart: (a)'s.
        b["compute_ms"], b["comm_ms"] = a["compute_ms"], a["comm_ms"]
        results.append(b)
    if "c" in rows:
        results.append(ddp(args, args.torch_python, "c-ddp"))
        results.append(ddp(args, "/usr/bin/python3", "c-ddp-1.13"))
    if "d" in rows:
        results.append(ours(args, "d-bf16-overlap", ["sync.method=dense", "sync.wire_dtype=bf16"]))
    if "e" in rows:
        results.append(ours(args, "e-powersgd-r2", ["sync.method=powersgd", "sync.rank=2"]))
    if "f" in rows:
        results.append(ours(args, "f-oktopk-1pct", ["sync.method=oktopk", "sync.density=0.01"]))
    cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], stdout=subprocess.PIPE,
                         text=True).stdout.strip()
    print(f"\n{args.model}, P = {args.ranks}, {args.bandwidth} (delay {args.delay}), batch {args.batch} per rank, "
          f"{args.threads} thread(s) per rank, {args.bucket_mb:g} MB buckets (first {args.first_bucket_mb:g}); {cpu}\n")
    print("| row | framework | step ms | compute ms | comm ms | hidden | hidden (comm log) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        hidden = None
        if r["comm_ms"] > 0:
            hidden = max(0.0, min(1.0, (r["compute_ms"] + r["comm_ms"] - r["step_ms"]) / r["comm_ms"]))
        r["hidden"] = hidden
        log = "-" if r["hidden_by_log"] is None else f"{100 * r['hidden_by_log']:.0f}%"
        shown = "-" if hidden is None or r["row"].startswith(("a-", "d-", "e-", "f-")) else f"{100 * hidden:.0f}%"
        print(f"| {r['row']} | {r['framework']} | {r['step_ms']:.0f} | {r['compute_ms']:.0f} | {r['comm_ms']:.0f} "
              f"| {shown} | {log} |")
    if args.json:
        with open(args.json, "a") as f:
            for r in results:
                f.write(json.dumps(dict(r, model=args.model, ranks=args.ranks, bandwidth=args.bandwidth,
                                        batch=args.batch, threads=args.threads, cpu=cpu)) + "\n")


if __name__ == "__main__":
    main()
