#!/usr/bin/python3
"""Reference fixture for the DeMo sync method (tests/fixtures/demo_reference.{json,bin}).

    /usr/bin/python3 scripts/make_demo_fixtures.py          # writes into tests/fixtures/

DeMo's step (Peng, Quesnelle and Kingma 2024, arXiv 2411.19870; comm/sync/methods/demo/demo.h) written out in
NumPy over P = 2 simulated ranks, on make_sparseloco_fixtures.py's tensors and codec (vectors in runs
of 64 here, DeMo's), with the orthonormal DCT-II of each chunk (comm/sync/methods/demo/chunk_dct.h: float64
products rounded once to float32). Per step t and rank r, with gradient
    g[t][r][i] = float32((i * 7919 + t * 104729 + r * 1299709) % 2001 - 1000) * float32(1e-3):
    m_r <- float32(beta) * m_r + g                 (each op rounded to float32)
    c_r  = TopK(DCT(m_r)); m_r <- m_r - IDCT(D(c_r))
    out  = sign(IDCT(sum over r in rank order of D(c_r)))
Fixture: per case (density, bits, beta, steps, the views, n, `at`) the .bin holds float32 values:
out for each step (steps x n), then every rank's momentum after the last (P x n).
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_sparseloco_fixtures import VIEWS, chunks_of, encode_decode  # noqa: E402

F32 = np.float32
P, STEPS, RUN = 2, 3, 64


def dct_matrix(m):
    u = np.arange(m)[:, None]
    i = np.arange(m)[None, :]
    return np.sqrt(np.where(u == 0, 1.0, 2.0) / m) * np.cos(np.pi * (2 * i + 1) * u / (2 * m))


def tiles(views):
    """(flat index array of shape rows x cols) per chunk, as chunk_codec.h cuts them (runs of 64)."""
    out = []
    for v in views:
        shape, offset = v["shape"], v["offset"]
        numel = int(np.prod(shape))
        rows = shape[0] if len(shape) >= 2 else 1
        cols = numel // rows
        if rows <= 1 or cols <= 1:
            for at in range(0, numel, RUN):
                out.append(offset + np.arange(at, min(at + RUN, numel))[None, :])
            continue
        for r in range(0, rows, 64):
            for c in range(0, cols, 64):
                h, w = min(64, rows - r), min(64, cols - c)
                out.append(offset + (r + np.arange(h))[:, None] * cols + c + np.arange(w)[None, :])
    return out


def dct(x, chunk_tiles, inverse):
    y = x.copy()
    for idx in chunk_tiles:
        t = x[idx].astype(np.float64)
        cr, cc = dct_matrix(idx.shape[0]), dct_matrix(idx.shape[1])
        y[idx] = (cr.T @ (t @ cc)) if inverse else (cr @ (t @ cc.T))
    return y.astype(F32)


def run(density, bits, beta):
    views, offset = [], 0
    for name, shape in VIEWS:
        views.append({"name": name, "offset": offset, "shape": shape})
        offset += int(np.prod(shape))
    n = offset
    chunks = []
    for v in views:  # chunks_of with runs of 64
        numel = int(np.prod(v["shape"]))
        rows = v["shape"][0] if len(v["shape"]) >= 2 else 1
        if rows <= 1 or numel // rows <= 1:
            for at in range(0, numel, RUN):
                idx = v["offset"] + np.arange(at, min(at + RUN, numel))
                chunks.append((idx, min(len(idx), max(1, int(np.ceil(density * len(idx)))))))
        else:
            chunks.extend(chunks_of(v["offset"], v["shape"], density))
    chunk_tiles = tiles(views)
    i = np.arange(n, dtype=np.int64)
    m = np.zeros((P, n), dtype=F32)
    values = []
    for t in range(STEPS):
        total = np.zeros(n, dtype=F32)
        for r in range(P):
            g = ((i * 7919 + t * 104729 + r * 1299709) % 2001 - 1000).astype(F32) * F32(1e-3)
            m[r] = (F32(beta) * m[r]).astype(F32) + g
            comp = dct(m[r], chunk_tiles, False)
            sent = np.zeros(n, dtype=F32)
            for idx, val in encode_decode(comp, chunks, bits):
                sent[idx] = val
                total[idx] = total[idx] + val
            m[r] = m[r] - dct(sent, chunk_tiles, True)
        values.append(np.sign(dct(total, chunk_tiles, True)).astype(F32))
    values.append(m.reshape(-1))
    case = {"P": P, "density": density, "bits": bits, "beta": beta, "steps": STEPS, "views": views, "n": n}
    return case, np.concatenate(values).astype("<f4")


def main():
    fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
    cases, blobs, at = [], [], 0
    for density, bits, beta in [(0.02, 32, 0.999), (0.05, 4, 0.9)]:
        case, blob = run(density, bits, beta)
        case["at"] = at
        at += blob.size
        cases.append(case)
        blobs.append(blob)
    with open(os.path.join(fixtures, "demo_reference.json"), "w") as f:
        json.dump({"cases": cases}, f, indent=1)
    np.concatenate(blobs).tofile(os.path.join(fixtures, "demo_reference.bin"))
    print("wrote", os.path.normpath(os.path.join(fixtures, "demo_reference.{json,bin}")), file=sys.stderr)


if __name__ == "__main__":
    main()
