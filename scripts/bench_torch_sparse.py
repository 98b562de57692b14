#!/usr/bin/env python3
"""PyTorch's side of `trainer bench sync --device cuda`: the compression of a sparse gradient-sync
step on the same device, the work our sparse passes do (comm/sync/methods/sparse/sparse_passes.h), written the way
a practitioner writes it in PyTorch:

  threshold pipeline (Ok-Top-k's reuse step):  acc = grad + residual (in place);
      idx = nonzero(|acc| >= t); val = acc[idx]; residual[idx] = 0
  exact pipeline (top-k):  the same with idx from torch.topk(|acc|, k)
  read: one read of the gradient (a sum), the memory-bound floor

Each is timed with CUDA events (wall clock on the CPU) over --steps steps after warmup; the
threshold pipeline also under torch.compile when it compiles. The threshold t is the exact k-th
largest magnitude of the first acc, so a reuse step selects about k entries. Prints one JSON line.
"""
import argparse
import json
import statistics
import time

import torch


def timed(fn, steps, device):
    for _ in range(3):
        fn()
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--n", type=int, default=27569568)
    p.add_argument("--density", type=float, default=0.02)
    p.add_argument("--steps", type=int, default=50)
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_torch_sparse.py: torch sees no GPU (torch %s)" % torch.__version__)
    device = torch.device("cuda:0" if a.device == "cuda" else a.device)
    k = max(1, min(a.n, int(-(-a.density * a.n // 1))))
    g = torch.Generator(device=device).manual_seed(1)
    grad = torch.randn(a.n, device=device, generator=g)
    residual = torch.randn(a.n, device=device, generator=g) * 0.1
    t = torch.topk((grad + residual).abs(), k, sorted=False).values.min()

    def threshold_step():
        acc = residual.add_(grad)
        idx = torch.nonzero(acc.abs() >= t).squeeze(1)
        val = acc[idx]
        residual[idx] = 0
        return idx, val

    def topk_step():
        acc = residual.add_(grad)
        idx = torch.topk(acc.abs(), k, sorted=False).indices
        val = acc[idx]
        residual[idx] = 0
        return idx, val

    out = {
        "torch_version": torch.__version__,
        "device": a.device,
        "n": a.n,
        "k": k,
        "threshold_ms": timed(threshold_step, a.steps, device),
        "topk_ms": timed(topk_step, a.steps, device),
        "read_ms": timed(lambda: grad.sum(), a.steps, device),
    }
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    try:
        compiled = torch.compile(threshold_step)
        out["threshold_compiled_ms"] = timed(compiled, a.steps, device)
    except Exception as e:  # no compiler toolchain, an old torch: eager only
        out["threshold_compiled_error"] = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
