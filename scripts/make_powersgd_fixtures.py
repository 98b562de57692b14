#!/usr/bin/python3
"""Reference fixture for the PowerSGD sync method (tests/fixtures/powersgd_reference.safetensors).

    /usr/bin/python3 scripts/make_powersgd_fixtures.py          # writes into tests/fixtures/

Two ranks, a few tensors shaped like a tiny model's (conv, two same-shape linear weights, biases,
batch norm, a 1 x 40 row), dense warmup steps then PowerSGD steps. The reference is the algorithm
written out in float64 NumPy (comm/sync/methods/powersgd/powersgd.h, steps 1-7), starting from the same first Q as
the C++ code (seeded_uniform of comm/sync/methods/powersgd/low_rank.h, reproduced bit for bit below). Before
writing, the script checks that reference against PyTorch's own DDP powerSGD_hook (two gloo
processes on CPU, the same gradients, the hook's Q memory preset to that first Q): the fixture is
only written when the hook agrees, so the C++ test compares against PyTorch's semantics.

Fixture contents: grad.rank<R> [steps, n] F32, rank R's gradient each step (flat, tensors back to
back); per case c (r2: rank 2, min_compression_rate 2; r3: rank 3, rate 1, the QR path):
  c.out               [steps, n] F64   what every rank applies each step (the reference)
  c.residual.rank<R>  [n] F64          rank R's residual after the last step (0 on dense tensors)
metadata: views (JSON [[name, shape], ...]), and per case rank, rate, warmup, steps, seed, world.
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_torch_fixtures import write_safetensors  # noqa: E402

VIEWS = [("conv.weight", [6, 3, 3, 3]), ("conv.bias", [6]), ("fc1.weight", [10, 24]), ("row.weight", [1, 40]),
         ("fc2.weight", [10, 24]), ("bn.weight", [10]), ("big.weight", [16, 20])]
CASES = {"r2": dict(rank=2, rate=2.0), "r3": dict(rank=3, rate=1.0)}
WORLD, WARMUP, STEPS, SEED = 2, 2, 6, 7


def seeded_uniform(seed, stream, count):
    """comm/sync/methods/powersgd/low_rank.h's seeded_uniform, bit for bit (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        z = (np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + (np.uint64(stream) << np.uint64(32))
             + np.arange(count, dtype=np.uint64))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return ((z >> np.uint64(40)).astype(np.float64) * 2.0 ** -23 - 1.0).astype(np.float32)


def layout(rank, rate):
    """[(view index, offset, n, m, r or None for dense)] in view order, and the total size."""
    out, offset = [], 0
    for v, (_, shape) in enumerate(VIEWS):
        numel = int(np.prod(shape))
        n = shape[0]
        m = numel // n
        r = min(n, m, rank)
        out.append((v, offset, n, m, r if (n + m) * r * rate < n * m else None))
        offset += numel
    return out, offset


def gradients(n):
    rng = np.random.default_rng(2026)
    return rng.standard_normal((WORLD, STEPS, n)).astype(np.float32)


def orthonormalize(a):
    """Columns of a made orthonormal (Gram-Schmidt; equal to QR's Q up to column signs)."""
    a = a.copy()
    for j in range(a.shape[1]):
        for k in range(j):
            a[:, j] -= (a[:, k] @ a[:, j]) * a[:, k]
        a[:, j] /= np.linalg.norm(a[:, j])
    return a


def reference(grads, rank, rate):
    plan, n = layout(rank, rate)
    outs = np.zeros((STEPS, n))
    e = np.zeros((WORLD, n))
    q = {v: seeded_uniform(SEED, v, m * r).astype(np.float64).reshape(m, r) for v, _, _, m, r in plan if r}
    for t in range(STEPS):
        g = grads[:, t, :].astype(np.float64)
        if t < WARMUP:
            outs[t] = g.mean(axis=0)
            continue
        for v, o, rows, cols, r in plan:
            sl = slice(o, o + rows * cols)
            if r is None:
                outs[t, sl] = g[:, sl].mean(axis=0)
                continue
            acc = [(g[w, sl] + e[w, sl]).reshape(rows, cols) for w in range(WORLD)]
            qv = orthonormalize(q[v])
            p = orthonormalize(sum(a @ qv for a in acc))
            q[v] = sum(a.T @ p for a in acc) / WORLD
            approx = p @ q[v].T
            outs[t, sl] = approx.reshape(-1)
            for w in range(WORLD):
                e[w, sl] = (acc[w] - approx).reshape(-1)
    return outs, e


def torch_worker(rank, case, grads, folder):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ph
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(folder, "store"), rank=rank,
                            world_size=WORLD)

    class Probe(nn.Module):  # loss = sum_i <param_i, G_i>: the gradient of param_i is exactly G_i
        def __init__(self):
            super().__init__()
            self.ps = nn.ParameterList([nn.Parameter(torch.zeros(s)) for _, s in VIEWS])

        def forward(self, gs):
            return sum((p * g).sum() for p, g in zip(self.ps, gs))

    model = Probe()
    ddp = nn.parallel.DistributedDataParallel(model)
    state = ph.PowerSGDState(process_group=None, matrix_approximation_rank=CASES[case]["rank"],
                             min_compression_rate=CASES[case]["rate"], start_powerSGD_iter=WARMUP,
                             use_error_feedback=True, warm_start=True)
    index = {id(p): v for v, p in enumerate(model.ps)}

    def hook(state, bucket):
        # Preset the hook's first Q to ours (its warm-start path then orthonormalizes it, as ours does).
        if state.iter >= state.start_powerSGD_iter and bucket.index() not in state.p_memory_dict:
            qs, total_p = [], 0
            for p, g in zip(bucket.parameters(), bucket.gradients()):
                rows = g.shape[0]
                cols = g.numel() // rows
                r = min(rows, cols, state.matrix_approximation_rank)
                if (rows + cols) * r * state.min_compression_rate < rows * cols:
                    qs.append(torch.from_numpy(seeded_uniform(SEED, index[id(p)], cols * r)))
                    total_p += rows * r
            state.p_memory_dict[bucket.index()] = torch.zeros(total_p)
            state.q_memory_dict[bucket.index()] = torch.cat(qs)
        return ph.powerSGD_hook(state, bucket)

    ddp.register_comm_hook(state, hook)
    outs = []
    n = grads.shape[2]
    for t in range(STEPS):
        flat = torch.from_numpy(grads[rank, t])
        gs, o = [], 0
        for _, s in VIEWS:
            k = int(np.prod(s))
            gs.append(flat[o:o + k].view(s))
            o += k
        ddp.zero_grad()
        ddp(gs).backward()
        outs.append(torch.cat([p.grad.reshape(-1) for p in model.ps]).numpy().copy())
    assert sum(len(x) for x in outs) == STEPS * n
    np.save(os.path.join(folder, f"out{rank}.npy"), np.stack(outs))
    dist.destroy_process_group()


def check_against_torch(case, grads, outs):
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(torch_worker, args=(case, grads, folder), nprocs=WORLD, join=True)
        for w in range(WORLD):
            hook = np.load(os.path.join(folder, f"out{w}.npy")).astype(np.float64)
            err = np.abs(hook - outs).max() / np.abs(outs).max()
            print(f"{case}: PyTorch powerSGD_hook rank {w} vs the NumPy reference: max relative difference {err:.2e}")
            if not err < 1e-5:
                raise SystemExit(f"{case}: the reference disagrees with PyTorch's hook ({err:.2e})")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
    _, n = layout(2, 2.0)
    grads = gradients(n)
    store = {}
    meta = {"views": json.dumps(VIEWS), "world": str(WORLD), "warmup": str(WARMUP), "steps": str(STEPS),
            "seed": str(SEED), "writer": "scripts/make_powersgd_fixtures.py (NumPy reference checked against "
            "PyTorch's DDP powerSGD_hook)"}
    for case, c in CASES.items():
        outs, e = reference(grads, c["rank"], c["rate"])
        check_against_torch(case, grads, outs)
        for w in range(WORLD):
            store[f"grad.rank{w}"] = grads[w]
            store[f"{case}.residual.rank{w}"] = e[w]
        store[f"{case}.out"] = outs
        meta[f"{case}.rank"] = str(c["rank"])
        meta[f"{case}.rate"] = str(c["rate"])
    path = os.path.join(out_dir, "powersgd_reference.safetensors")
    write_safetensors(path, store, meta)
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
