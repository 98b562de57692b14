"""The published Ok-Top-k communication analyses' counts (DeepSpeech LSTM on AN4, 8 ranks, density 2%,
128 dense warmup steps), checked against the counts the same schedule implies and against a run's.

The numbers below are what those analyses state (tables of calls per op tag, summed over ranks); the
checks are arithmetic on them and on the schedule, so every "cannot all be true" line can be redone
by hand. Used by `trainer report --seed-check` (scripts/reproduce_seed).
"""

PUBLISHED = {
    "ranks": 8,
    "dense_steps": 128,
    "calls": {"ALLREDUCE_DENSE": 1024, "ALLGATHERV_FINAL": 88, "ISEND_INDEX": 672, "IRECV_INDEX": 672,
              "ISEND_VALUE": 672, "IRECV_VALUE": 672, "ALLREDUCE_REGION": 8},
    "total_calls": 3808,
    "dense_message_mb": 110.28,
    "dense_total_gb": 110.28,          # stated total of the ALLREDUCE_DENSE rows
    "allgatherv_min_mb": 0.35,         # stated smallest ALLGATHERV_FINAL message
    "allgatherv_most_common_mb": 0.28,  # stated most common one (25 of 88)
    "allgatherv_listed_mb": 0.15,      # a size in the same op's top-10 list
    "allgatherv_unique_sizes": 88,
    "allgatherv_most_common_count": 25,
    "time_shares": [98.1, 0.11, 0.27, 0.27, 0.27, 0.27],  # plus "<0.1" for ALLREDUCE_REGION
    "ops_per_iteration": 8.0,          # stated for both phases
    "compressed_steps_stated": 11,
}


def schedule_counts(ranks, dense_steps, compressed_steps, buckets, region_every):
    """Calls summed over ranks that Ok-Top-k's schedule fixes (ISEND/IRECV: the split-and-reduce
    messages to P-1 peers; the balance step adds a data-dependent number on top)."""
    regions = -(-compressed_steps // region_every) if compressed_steps else 0
    return {"ALLREDUCE_DENSE": ranks * dense_steps * buckets, "ALLGATHERV_FINAL": ranks * compressed_steps,
            "ALLTOALL_COUNTS": ranks * compressed_steps, "ALLREDUCE_REGION": ranks * regions,
            "ISEND_INDEX": ranks * (ranks - 1) * compressed_steps}


def contradictions():
    """Lines saying where the published numbers cannot all be true."""
    p = PUBLISHED
    c = p["calls"]
    out = []
    implied = c["ALLGATHERV_FINAL"] / p["ranks"]
    out.append(f"ALLREDUCE_DENSE = ranks x dense steps x buckets: {p['ranks']} x {p['dense_steps']} x 1 = "
               f"{p['ranks'] * p['dense_steps']}, as stated ({c['ALLREDUCE_DENSE']}): consistent, one bucket per step.")
    out.append(f"ALLGATHERV_FINAL is one call per rank per compressed step: {c['ALLGATHERV_FINAL']} / {p['ranks']} = "
               f"{implied:g} compressed steps, the analyses' own estimate; so {c['ALLGATHERV_FINAL']} is a count "
               "summed over ranks, not a count per rank or per iteration.")
    split = p["ranks"] * (p["ranks"] - 1) * implied
    steps_p2p = c["ISEND_INDEX"] / (p["ranks"] * (p["ranks"] - 1))
    out.append(f"ISEND_INDEX: the split-and-reduce sends to P-1 peers per step, so the stated {c['ISEND_INDEX']} is "
               f"exactly {p['ranks']} x {p['ranks'] - 1} x {steps_p2p:g}: {steps_p2p:g} compressed steps, one more than "
               f"ALLGATHERV_FINAL's {implied:g}. Both hold only if the {c['ISEND_INDEX'] - split:g} extra messages "
               f"of {implied:g} steps came from the balance step, exactly one per ordered rank pair over the run; "
               "without balance moves, the two counts come from different steps.")
    total = sum(c.values())
    out.append(f"Total calls: the rows add up to {total} (stated {p['total_calls']}): consistent.")
    gb = c["ALLREDUCE_DENSE"] * p["dense_message_mb"] / 1e3
    out.append(f"Dense volume: {c['ALLREDUCE_DENSE']} x {p['dense_message_mb']} MB = {gb:.2f} GB, not the stated "
               f"{p['dense_total_gb']} GB (that is one call's size in GB).")
    out.append(f"ALLGATHERV_FINAL sizes: the stated smallest ({p['allgatherv_min_mb']} MB) is larger than the stated "
               f"most common ({p['allgatherv_most_common_mb']} MB) and than a size in the same top-10 list "
               f"({p['allgatherv_listed_mb']} MB): at most one of these can be true.")
    out.append(f"ALLGATHERV_FINAL: {p['allgatherv_unique_sizes']} distinct sizes among {c['ALLGATHERV_FINAL']} calls "
               f"cannot include one size seen {p['allgatherv_most_common_count']} times.")
    shares = sum(p["time_shares"][:2]) + 4 * p["time_shares"][2]
    out.append(f"Time shares: {p['time_shares'][0]} + {p['time_shares'][1]} + 4 x {p['time_shares'][2]} = {shares:.2f}% "
               "plus under 0.1% for ALLREDUCE_REGION: short of 100% by more than the rounding.")
    compressed_calls = c["ALLGATHERV_FINAL"] + 4 * c["ISEND_INDEX"] + c["ALLREDUCE_REGION"]
    out.append(f"Calls per iteration: dense {c['ALLREDUCE_DENSE'] / p['dense_steps']:g} (summed over ranks; 1 per rank), "
               f"compressed {compressed_calls / implied:.1f} summed over ranks ({compressed_calls / implied / p['ranks']:.1f} "
               f"per rank), not the stated {p['ops_per_iteration']} for both phases.")
    return out


def check_table(ranks, dense_steps, compressed_steps, buckets, region_every, observed):
    """Rows (op, published, schedule with the published compressed steps, schedule with this run's,
    this run observed); observed: op -> calls summed over ranks."""
    p = PUBLISHED
    theirs = schedule_counts(p["ranks"], p["dense_steps"], p["compressed_steps_stated"], 1, 64)
    ours = schedule_counts(ranks, dense_steps, compressed_steps, buckets, region_every)
    rows = []
    for op in ("ALLREDUCE_DENSE", "ALLGATHERV_FINAL", "ALLTOALL_COUNTS", "ALLREDUCE_REGION", "ISEND_INDEX",
               "IRECV_INDEX", "ISEND_VALUE", "IRECV_VALUE"):
        base = "ISEND_INDEX" if op in ("IRECV_INDEX", "ISEND_VALUE", "IRECV_VALUE") else op
        rows.append((op, p["calls"].get(op), theirs[base], ours[base], observed.get(op, 0), base == "ISEND_INDEX"))
    return rows
