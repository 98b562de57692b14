#!/usr/bin/python3
"""Deep Gradient Compression's steps from the paper's equations, in NumPy, for tests/dgc_test.cpp.

    /usr/bin/python3 scripts/make_dgc_fixtures.py   # writes tests/fixtures/dgc_reference.json

Lin et al., "Deep Gradient Compression", ICLR 2018 (arXiv 1712.01887), Algorithm 1 and section 3,
with P simulated ranks, written from the equations (not from the trainer's code):
  local clipping       g_r *= min(1, (C / sqrt(P)) / (||g_r|| + 1e-6))          (PyTorch's clip rule)
  momentum correction  u_r = m u_r + g_r;  v_r += u_r                             (plain)
                       u_r = m (u_r + g_r);  v_r += u_r + g_r                     (Nesterov)
  selection            topka: the k = ceil(d n) largest |v_r| (ties: lower index);
                       gaussiank: |v_r| >= t, t fitted to a normal (mean + std z(d)) and nudged
                       by 1.012 until the count is within [3k/4, 5k/4] (the GaussianK paper's loop)
  output               the sum over ranks of the selected entries (in rank order) / P
  masking              v_r = 0 and u_r = 0 where rank r's entry was selected
  sparsity warm-up     the density of step s < S: start (d / start)^(floor(s stages / S) / stages)
and the dense warmup's steps: the average is clipped at C, then u = m u + g_avg, output u (Nesterov
u + g_avg), the same on every rank. Coupled weight decay lambda as DGC's reference optimizer (DGCSGD)
applies it: a dense momentum of its own, w = m w + lambda p (Nesterov w = m (w + lambda p), adding
lambda p + w), added to the output; the parameters p are fixed here (the trainer's optimizer moves
them between steps, which this model leaves out).
Values are float32 as the trainer keeps them; fma(m, u, g) is computed in float64 and rounded once.
"""

import json
import math
from pathlib import Path

import numpy as np

F32 = np.float32
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "dgc_reference.json"


def short(values):
    """float32 values as the shortest decimals that read back as the same float32."""
    return [float(np.format_float_scientific(F32(x), unique=True)) for x in values]


def fma32(a, b, c):
    return (np.float64(a) * b.astype(np.float64) + c.astype(np.float64)).astype(F32)


def clip(g, max_norm):
    if max_norm <= 0:
        return g
    norm = math.sqrt(float(np.sum(g.astype(np.float64) ** 2)))
    coef = max_norm / (norm + 1e-6)
    return (g * F32(coef)).astype(F32) if coef < 1 else g


def momentum(u, g, m, nesterov):
    """The new velocity and what the accumulator (or, in the dense warmup, the optimizer) gets."""
    if nesterov:
        t = (u + g).astype(F32)
        return (F32(m) * t).astype(F32), fma32(m, t, g)
    u = fma32(m, u, g)
    return u, u.copy()


def warmup_density(step, w, target):
    if w["steps"] == 0 or step >= w["steps"]:
        return target
    stage = step * w["stages"] // w["steps"]
    return w["start"] * (target / w["start"]) ** (stage / w["stages"])


def top_k_count(d, n):
    return min(max(int(math.ceil(d * n)), 1), n)


def two_sided_quantile(tail):
    z = 2.0
    for _ in range(50):
        e = math.erfc(z / math.sqrt(2.0))
        step = (math.log(e) - math.log(tail)) / (-math.sqrt(2.0 / math.pi) * math.exp(-z * z / 2) / e)
        z = max(0.0, z - step)
        if abs(step) < 1e-12:
            break
    return z


def select(method, acc, d):
    n = acc.size
    k = top_k_count(d, n)
    mag = np.abs(acc)
    if method == "topka":
        return np.sort(np.argsort(-mag, kind="stable")[:k])
    # gaussiank
    a = acc.astype(np.float64)
    mean = a.sum() / n
    std = math.sqrt(max(0.0, (float(np.sum(a * a)) - a.sum() * mean) / (n - 1)))
    denorm = np.finfo(F32).smallest_subnormal
    t = max(F32(mean + std * two_sided_quantile(min(d, 1 - 1e-12))), denorm)
    scale = F32(1.012)
    count = int(np.sum(mag >= t))
    loops = 0
    if 4 * count < 3 * k:
        while 4 * count < 3 * k and loops < 50 and t > denorm:
            t = F32(t / scale)
            loops += 1
            count = int(np.sum(mag >= t))
    else:
        while 4 * count > 5 * k and loops < 50:
            t = F32(t * scale)
            loops += 1
            count = int(np.sum(mag >= t))
    return np.nonzero(mag >= max(t, denorm))[0]


def run(method, p, n, steps, m, nesterov, c, dense, warmup, density, seed, wd=0.0):
    rng = np.random.default_rng(seed)
    params = rng.uniform(-2, 2, n).astype(F32)
    w = np.zeros(n, F32)
    u = [np.zeros(n, F32) for _ in range(p)]
    v = [np.zeros(n, F32) for _ in range(p)]
    record = []
    for s in range(steps):
        # Gradients of a few scales, so that local clipping binds at some steps and not at others.
        grads = [(rng.standard_normal(n) * (0.3 + 0.6 * ((s + r) % 3))).astype(F32) for r in range(p)]
        step = {"grads": [short(g) for g in grads]}
        if s < dense:
            total = grads[0].copy()
            for g in grads[1:]:
                total = (total + g).astype(F32)
            avg = clip((total / F32(p)).astype(F32), c)
            for r in range(p):
                u[r], out = momentum(u[r], avg, m, nesterov)
            step["density_target"] = -1
        else:
            d = warmup_density(s, warmup, density)
            total = np.zeros(n, F32)
            for r in range(p):
                g = clip(grads[r], c / math.sqrt(p) if c > 0 else 0)
                u[r], inc = momentum(u[r], g, m, nesterov)
                acc = (inc + v[r]).astype(F32)
                sel = select(method, acc, d)
                total[sel] = (total[sel] + acc[sel]).astype(F32)
                v[r] = acc
                v[r][sel] = 0
                u[r][sel] = 0
            out = (total / F32(p)).astype(F32)
            step["density_target"] = d if warmup["steps"] > 0 else -1
        if wd > 0:
            w, decay = momentum(w, (params * F32(wd)).astype(F32), m, nesterov)
            out = (out + decay).astype(F32)
        step["output"] = short(out)
        step["residual"] = [short(x) for x in v]
        step["velocity"] = [short(x) for x in u]
        record.append(step)
    return {"method": method, "ranks": p, "n": n, "momentum": m, "nesterov": nesterov, "clip": c,
            "dense_warmup_steps": dense, "density": density, "warmup": warmup, "weight_decay": wd,
            "params": short(params), "steps": record}


def main():
    cases = []
    warm = {"steps": 6, "stages": 3, "start": 0.5}
    off = {"steps": 0, "stages": 4, "start": 0.25}
    for p in (2, 4):
        cases.append(run("topka", p, 48, 9, 0.9, False, 2.0, 2, warm, 0.1, 100 + p, wd=0.01))
        cases.append(run("topka", p, 48, 6, 0.9, True, 0.0, 0, off, 0.1, 200 + p))
        cases.append(run("gaussiank", p, 64, 9, 0.9, False, 2.0, 2, warm, 0.1, 300 + p))
        cases.append(run("gaussiank", p, 64, 6, 0.8, True, 2.5, 0, off, 0.15, 400 + p, wd=0.05))
    OUT.write_text(json.dumps({"source": "scripts/make_dgc_fixtures.py", "cases": cases}, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
