#!/usr/bin/python3
"""Reference fixture for the SparseLoCo sync method (tests/fixtures/sparseloco_reference.json).

    /usr/bin/python3 scripts/make_sparseloco_fixtures.py          # writes into tests/fixtures/

SparseLoCo's outer steps (Sarfi et al. 2025, arXiv 2508.15706; comm/sync/methods/outer/sparseloco.h) written out
from the paper's equations in float32 NumPy, over P = 2 and P = 3 simulated ranks. The inner steps
are given: in round t, rank r's local parameters are theta_outer - d[t][r] (rounded to float32), so
its pseudo-gradient is theta_outer - local. Per round and rank:
    e_r     <- beta e_r + delta_r                  (float32: the product rounded, then the sum)
    c_r      = chunk-wise top-k of e_r, quantized  (comm/sync/codecs/chunk_codec.h)
    e_r     <- e_r - D(c_r)
    sum      = sum over r in rank order of D(c_r)  (float32, starting from 0)
    theta   <- theta - float32(alpha / P) * sum
The codec as chunk_codec.h states it: tensors of 2+ dimensions as shape[0] x rest in tiles of up
to 64 x 64 (row-major tile order), vectors in runs of up to 4096; k = min(m, max(1, ceil(density m)))
entries of largest magnitude per chunk (ties: lower position first); scale s = max|x| / ((L-1)/2)
over the kept entries, q = clamp(floor(x / s + L/2), 0, L-1), value (q - (L-1)/2) s, L = 2^bits
(32 bits: the values themselves; make_demo_fixtures.py uses it).

The tensors are shaped to exercise the ragged tiles (65 x 66: 64 x 64, 64 x 2, 1 x 64, 1 x 2), a
conv weight (5 x 3 x 3 x 3 -> 5 x 27), a vector (300) and a 1 x 40 row (a run); runs longer than
4096 are chunk_codec's unit tests'. theta0 and d are integers scaled once in float32, which the C++
test computes the same way (no random numbers to share):
    theta0[i]  = float32((i * 6151) % 4001 - 2000) * float32(1e-3)
    d[t][r][i] = float32((i * 7919 + t * 104729 + r * 1299709) % 2001 - 1000) * float32(1e-5)
Fixture: sparseloco_reference.json (per case: P, density, bits, beta, alpha, rounds, the views and
`at`, its first float in the .bin) and sparseloco_reference.bin (float32, little-endian; per case
theta_outer after each round, rounds x n, then every rank's accumulator after the last, P x n).
"""

import json
import math
import os
import sys

import numpy as np

F32 = np.float32
VIEWS = [("w", [65, 66]), ("conv", [5, 3, 3, 3]), ("v", [300]), ("row", [1, 40])]
ROUNDS = 3


def chunks_of(offset, shape, density):
    """[(flat indices of the chunk, in chunk order), k] for one tensor."""
    numel = int(np.prod(shape))
    rows = shape[0] if len(shape) >= 2 else 1
    cols = numel // rows if rows > 0 else 0
    out = []

    def kept(m):
        return min(m, max(1, math.ceil(density * m)))

    if rows <= 1 or cols <= 1:
        for at in range(0, numel, 4096):
            idx = offset + np.arange(at, min(at + 4096, numel))
            out.append((idx, kept(len(idx))))
        return out
    for r in range(0, rows, 64):
        for c in range(0, cols, 64):
            h, w = min(64, rows - r), min(64, cols - c)
            idx = (offset + (r + np.arange(h))[:, None] * cols + c + np.arange(w)[None, :]).reshape(-1)
            out.append((idx, kept(h * w)))
    return out


def encode_decode(x, chunks, bits):
    """The values the payload of x stands for, as (flat index, value) per chunk in payload order."""
    levels = 1 << bits
    half = F32((levels - 1) / 2)
    sent = []
    for idx, k in chunks:
        v = x[idx]
        order = np.argsort(-np.abs(v), kind="stable")[:k]
        pos = np.sort(order)
        kept = v[pos]
        if bits == 32:  # the fp32 values themselves
            sent.append((idx[pos], kept.astype(F32)))
            continue
        scale = F32(np.max(np.abs(kept))) / half
        if scale > 0:
            q = np.floor(kept / scale + F32(levels / 2)).astype(F32)
            q = np.clip(q, F32(0), F32(levels - 1))
        else:
            q = np.zeros(k, dtype=F32)
        sent.append((idx[pos], ((q - half) * F32(scale)).astype(F32)))
    return sent


def run(P, density, bits, beta, alpha):
    views, offset = [], 0
    for name, shape in VIEWS:
        views.append({"name": name, "offset": offset, "shape": shape})
        offset += int(np.prod(shape))
    n = offset
    chunks = [c for v in views for c in chunks_of(v["offset"], v["shape"], density)]
    i = np.arange(n, dtype=np.int64)
    theta = ((i * 6151) % 4001 - 2000).astype(F32) * F32(1e-3)
    d = np.stack([np.stack([((i * 7919 + t * 104729 + r * 1299709) % 2001 - 1000).astype(F32) * F32(1e-5)
                            for r in range(P)]) for t in range(ROUNDS)])
    e = np.zeros((P, n), dtype=F32)
    case = {"P": P, "density": density, "bits": bits, "beta": beta, "alpha": alpha, "rounds": ROUNDS,
            "views": views, "n": n}
    values = []
    for t in range(ROUNDS):
        total = np.zeros(n, dtype=F32)
        for r in range(P):
            local = (theta - d[t, r]).astype(F32)
            delta = (theta - local).astype(F32)
            e[r] = (F32(beta) * e[r]).astype(F32) + delta
            for idx, val in encode_decode(e[r], chunks, bits):
                e[r][idx] = e[r][idx] - val
                total[idx] = total[idx] + val
        theta = (theta - total * F32(alpha / P)).astype(F32)
        values.append(theta.copy())
    values.append(e.reshape(-1))
    return case, np.concatenate(values).astype("<f4")


def main():
    fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
    cases, blobs, at = [], [], 0
    for P, density, bits, beta, alpha in [(2, 0.02, 2, 0.95, 1.0), (3, 0.03, 4, 0.9, 0.7), (2, 0.01, 8, 0.95, 1.0)]:
        case, blob = run(P, density, bits, beta, alpha)
        case["at"] = at
        at += blob.size
        cases.append(case)
        blobs.append(blob)
    with open(os.path.join(fixtures, "sparseloco_reference.json"), "w") as f:
        json.dump({"cases": cases}, f, indent=1)
    np.concatenate(blobs).tofile(os.path.join(fixtures, "sparseloco_reference.bin"))
    print("wrote", os.path.normpath(os.path.join(fixtures, "sparseloco_reference.{json,bin}")), file=sys.stderr)


if __name__ == "__main__":
    main()
