#!/usr/bin/python3
"""Writes RUN_DIR/report/report.md and its PNG figures from one or more run folders' logs.

    /usr/bin/python3 scripts/report.py RUN_DIR [RUN_DIR2 ...] [--out DIR] [--seed-check] [--trainer BINARY]
                                       [--latency 50us] [--calibration FILE.json]

`trainer report` runs this (with Debian's python3, numpy and matplotlib). The numbers come from
scripts/report_analysis.py; this file lays them out and plots them (matplotlib's Agg backend, no
display needed). The first run is the one reported in full; further runs are compared with it.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report_analysis as ra  # noqa: E402
import report_seed_check as seed  # noqa: E402


def mb(b):
    return f"{b / 1e6:.3f}"


def human(b):
    if b is None:
        return "-"
    if b < 1e3:
        return f"{b:.0f} B"
    if b < 1e6:
        return f"{b / 1e3:.1f} kB"
    if b < 1e9:
        return f"{b / 1e6:.2f} MB"
    return f"{b / 1e9:.2f} GB"


def ranks(p):
    return f"{p} rank" if p == 1 else f"{p} ranks"


def num(x, fmt="{:.3f}"):
    return "-" if x is None else fmt.format(x)


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


class Figures:
    """Saves figures into the report folder and remembers their Markdown links."""

    def __init__(self, folder):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        self.plt = plt
        self.folder = folder

    def save(self, fig, name):
        fig.tight_layout()
        fig.savefig(os.path.join(self.folder, name), dpi=90)
        self.plt.close(fig)
        return f"![{name}]({name})\n"


def section_overall(run):
    o = ra.overall(run)
    split = ra.time_split(run)
    md = ["## Overall\n\n"]
    cfg = f"{run.cfg('model', 'arch', '?')}, {ranks(run.world)}, sync {run.method}"
    if run.info:
        cfg += f", n = {run.info['n']:,} gradient elements"
        if run.method != "dense":
            cfg += f", density {run.info['density']:g} (k = {run.info['k']:,}), {run.info['dense_warmup_steps']} dense warmup steps"
    md.append(f"{cfg}.\n\n")
    md.append(table(["steps", "wall time s", "samples/s (all ranks)"],
                    [[o["steps"], num(o["wall_s"], "{:.1f}"), num(o["samples_per_s"], "{:.1f}")]]))
    rows = []
    for ph in ra.PHASES:
        s = split[ph]
        busy = s["data"] + s["compute"] + s["sync"] + s["optim"]
        if not s["steps"]:
            continue
        rows.append([ph, s["steps"]] + [f"{s[k] / 1e3:.2f} ({100 * s[k] / busy:.1f}%)" if busy else "-"
                                        for k in ("data", "compute", "sync", "optim")]
                    + [f"{busy / s['steps']:.1f}"])
    md.append("\nTime split of rank 0 by phase (seconds and share of the step; from metrics.jsonl, whose records "
              "hold means over the steps since the previous record, filed under the phase of their last step):\n\n")
    md.append(table(["phase", "steps", "data", "compute", "sync", "optimizer", "ms per step"], rows))
    hidden = ra.hidden_share(run)
    if hidden:
        rows = [[ph, h["steps"], f"{h['comm_us'] / h['steps'] / 1e3:.2f}", f"{h['hidden_us'] / h['steps'] / 1e3:.2f}",
                 f"{100 * h['hidden_us'] / h['comm_us']:.1f}%" if h["comm_us"] else "-"]
                for ph, h in hidden.items() if h["steps"]]
        md.append("\nCommunication hidden behind compute (rank 0, from comm/rank0.jsonl): per step, the gradient "
                  "sync's time on the wire (the union of its calls) and the part of it during the step's forward "
                  "and backward pass (sync.overlap sends dense buckets while backward runs; the other methods "
                  "start after it):\n\n")
        md.append(table(["phase", "logged steps", "communication ms", "during backward ms", "hidden"], rows))
    return "".join(md)


def section_diverged(run):
    """The divergence guard stopped the run: said first, so no table below reads as a finished run."""
    d = run.diverged
    if not d:
        return ""
    ref = d.get("reference_loss")
    window = d.get("window_loss")
    rows = [[d["step"], d.get("switch_step", "-"), num(ref, "{:.4g}") if ref is not None else "-",
             num(window, "{:.4g}") if window is not None else "not finite",
             f"{window / ref:.2f}" if window is not None and ref else "-", d.get("checkpoint") or "none"]]
    return ("## Diverged\n\n**This run diverged and was stopped** (train.divergence_guard; exit status 4) at step "
            f"{d['step']}:\n\n> {d['message']}\n\n"
            + table(["stopped at step", "switch after step", "loss before the switch", "loss when stopped",
                     "ratio", "checkpoint written"], rows))


def section_ops(run):
    ops, total = ra.op_table(run)
    md = ["## Communication per op\n\n",
          f"From the {len(run.records):,} records of comm/rank*.jsonl; calls, bytes and time **summed over all "
          f"{ranks(run.world)}**, calls per rank in their own column (min-max when ranks differ). Sizes are the data "
          "size S of one call (nccl-tests: allreduce the buffer, allgather(v) the whole output, alltoall the whole "
          "send buffer, a message its bytes), median the lower middle value; algbw = sum S / sum time, busbw = algbw "
          "x bus factor (allreduce 2(P-1)/P, allgather(v) and alltoall (P-1)/P, others 1). "
          f"Op kinds from {run.kinds_from}.\n\n"]
    rows = []
    for r in ops:
        per = r["calls_by_rank"]
        per_rank = str(per[0]) if min(per) == max(per) else f"{min(per)}-{max(per)}"
        rows.append([r["op"], r["kind"], r["calls"], per_rank, mb(r["bytes"]), mb(r["bytes_recv"]), human(r["size_min"]),
                     human(r["size_median"]), human(r["size_max"]), f"{r['time_us'] / 1e3:.3f}",
                     f"{r['mean_us'] / 1e3:.3f}", f"{r['share']:.1f}", num(r["algbw"]), num(r["busbw"])])
    rows.append(["**total**", "", total["calls"], "", mb(total["bytes"]), mb(total["bytes_recv"]), "", "", "",
                 f"{total['time_us'] / 1e3:.3f}", "", f"{total['share']:.1f}", "", ""])
    md.append(table(["op", "kind", "calls (all ranks)", "calls per rank", "sent MB", "recv MB", "size min", "size med",
                     "size max", "time ms", "mean ms", "time %", "algbw GB/s", "busbw GB/s"], rows))
    mism = ra.summary_mismatches(run, ops)
    if mism is None:
        md.append("\n(comm/summary.json absent: no check against the end-of-run summary.)\n")
    elif not mism:
        md.append("\nEvery row equals the end-of-run summary (comm/summary.txt): calls, bytes and time.\n")
    else:
        md.append(f"\nThe records differ from the end-of-run summary in {len(mism)} value(s) (the summary counts every "
                  "call while the log was on, records only the comm.log_* step window), e.g. "
                  + "; ".join(f"{op} {key} {got} vs {want}" for op, key, got, want in mism[:4]) + ".\n")
    return "".join(md), ops


def section_phases(run):
    rows = ra.phase_table(run)
    md = ["## Per phase: gradient synchronization against theory\n\n",
          "Gradient-sync calls only (start-up checks, evaluation and checkpoint calls left out). Per step per rank = "
          "total / (steps x ranks). Wire volume is what a ring algorithm sends per rank (S x bus factor for "
          "collectives, the bytes of each send), the quantity of the methods' formulas (words of 4 bytes, or 2 "
          "where sync.wire_dtype is bf16 or fp16: the dense phase and PowerSGD; dense "
          "2n(P-1)/P, Ok-Top-k at most 6k(P-1)/P, TopkA 2k(P-1), PowerSGD sum (n+m)r).\n\n"]
    out = []
    for r in rows:
        if not r["steps"]:
            continue
        out.append([r["phase"], r["steps"], r["calls"], num(r["calls_per_step_per_rank"], "{:.2f}"),
                    human(r["bytes_per_step_per_rank"]), human(r["wire_per_step_per_rank"]), human(r["theory_bytes"]),
                    r["formula"], num(r["measured_over_theory"], "{:.3f}"), num(r["reduction"], "{:.1f}x")])
    if not out:
        return "".join(md) + "No gradient-sync calls on record (one process has nothing to synchronize).\n"
    md.append(table(["phase", "steps", "calls (all ranks)", "calls per step per rank", "payload sent per step per rank",
                     "wire per step per rank", "theory per step per rank", "formula", "wire / theory",
                     "reduction vs dense"], out))
    if run.method == "oktopk":
        md.append("\nOk-Top-k's bound counts k selected (index, value) pairs; the wire column also holds the "
                  "counts, thresholds and region bounds exchanged and the balance step's moves, and a reused "
                  "threshold selects between 3k/4 and 5k/4 entries, so it can pass the bound by a little.\n")
    return "".join(md)


def section_schedule(run, ops):
    """Counts Ok-Top-k's schedule fixes, against the records."""
    if run.method != "oktopk" or not run.info:
        return ""
    phases = {r["phase"]: r["steps"] for r in ra.phase_table(run)}
    calls = {r["op"]: r["calls"] for r in ops}
    expect = seed.schedule_counts(run.world, phases["dense"], phases["compressed"], run.info["dense_buckets"],
                                  run.method_cfg("region_every", 64))
    rows = []
    for op, want in expect.items():
        got = calls.get(op, 0)
        if op == "ISEND_INDEX":
            rows.append([op, f"{want} + balance moves", got, "yes" if got >= want else "NO"])
        else:
            rows.append([op, want, got, "yes" if got == want else "NO"])
    return ("\n### Counts the schedule fixes\n\n"
            f"P = {run.world}, {phases['dense']} dense steps of {run.info['dense_buckets']} bucket(s), "
            f"{phases['compressed']} compressed steps, regions every {run.method_cfg('region_every', 64)} steps; calls "
            "summed over ranks:\n\n" + table(["op", "expected", "recorded", "match"], rows))


def section_distributions(run, ops, figs):
    import numpy as np
    plt = figs.plt
    md = ["## Distributions over the run\n\n"]
    shown = [r for r in ops if not ra.is_bookkeeping(r["op"]) and r["kind"] != "barrier" and r["size_max"] > 0]
    if shown:
        cols = min(3, len(shown))
        rows_ = -(-len(shown) // cols)
        fig, axes = plt.subplots(rows_, cols, figsize=(4.2 * cols, 2.8 * rows_), squeeze=False)
        for ax, r in zip(axes.flat, shown):
            sizes = np.array(r["sizes"], dtype=float)
            if sizes.min() == sizes.max():  # one size: a single bar, labelled with it
                ax.bar([human(sizes[0])], [len(sizes)], width=0.4)
            else:
                lo, hi = max(sizes.min(), 1.0), sizes.max()
                log = hi / lo > 4
                ax.hist(sizes, bins=np.geomspace(lo, hi * 1.0001, 30) if log else 20)
                if log:
                    ax.set_xscale("log")
                else:
                    ax.ticklabel_format(axis="x", style="plain", useOffset=False)
            ax.set_title(f"{r['op']} ({r['calls']} calls)", fontsize=9)
            ax.set_xlabel("data size S, bytes", fontsize=8)
        for ax in list(axes.flat)[len(shown):]:
            ax.axis("off")
        md.append("Message sizes per op (all ranks' calls):\n\n" + figs.save(fig, "message_sizes.png") + "\n")
    per_step = ra.bytes_per_step(run)
    if per_step:
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.plot(list(per_step), [b / 1e6 for b in per_step.values()], marker=".", lw=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("MB sent per rank (mean)")
        md.append("Payload sent per step by gradient sync (mean over ranks):\n\n" + figs.save(fig, "bytes_per_step.png")
                  + "\n")
    dens = [(m["step"], m["density"]) for m in run.train if "density" in m]
    if dens:
        fig, ax = plt.subplots(figsize=(7, 2.6))
        ax.plot([s for s, _ in dens], [d for _, d in dens], marker=".", lw=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("density")
        for step in adaptive_switches(run):  # sync.adaptive: where the setting changed
            ax.axvline(step + 1, color="tab:red", lw=0.7, ls="--")
        md.append("Density of the synchronized gradient (metrics.jsonl, 1 = dense):\n\n"
                  + figs.save(fig, "density.png") + "\n")
    total, p2p = ra.region_balance(run)
    if any(total):
        fig, ax = plt.subplots(figsize=(6, 2.8))
        ranks = list(range(run.world))
        ax.bar(ranks, [b / 1e6 for b in total], label="all sync calls")
        ax.bar(ranks, [b / 1e6 for b in p2p], label="point to point", alpha=0.8)
        ax.set_xlabel("rank")
        ax.set_ylabel("MB received, compressed phase")
        ax.legend(fontsize=8)
        mean = sum(p2p) / len(p2p)
        md.append("Region balance: bytes each rank received in the compressed phase (point to point: what its region "
                  "drew from the others). " + (f"Max/mean of point-to-point: {max(p2p) / mean:.2f}. " if mean else "")
                  + "\n\n" + figs.save(fig, "region_balance.png") + "\n")
        md.append(table(["rank"] + [str(r) for r in ranks],
                        [["recv MB, all sync"] + [mb(b) for b in total], ["recv MB, p2p"] + [mb(b) for b in p2p]]))
    split = ra.wait_split(run)
    md.append("\n### Straggler wait\n\n")
    if split is None:
        md.append("Not recorded: this run's comm log has no per-collective wait field "
                  f"({' or '.join(ra.WAIT_FIELDS)}).\n")
    else:
        field, per_rank, per_op = split
        ms = lambda us: f"{us / 1e3:.3f}"  # noqa: E731
        md.append(f"Collectives' time split by the records' `{field}`: wait, until the last rank entered the call "
                  "(skew: another rank was still computing), and transfer, the rest of the call; summed over the "
                  "calls:\n\n")
        md.append(table(["rank"] + [str(r) for r in range(run.world)],
                        [["wait ms"] + [ms(w) for _, w in per_rank],
                         ["transfer ms"] + [ms(t - w) for t, w in per_rank]]))
        md.append("\n" + table(["op", "time ms (all ranks)", "wait ms", "transfer ms", "wait %"],
                               [[op, ms(t), ms(w), ms(t - w), f"{100 * w / t:.1f}" if t else "-"]
                                for op, (t, w) in sorted(per_op.items(), key=lambda x: -x[1][1])]))
    return "".join(md)


def adaptive_switches(run):
    """Steps after which sync.adaptive changed the compression setting: rank 0's ADAPTIVE_SWITCH records
    (every rank records the same ones)."""
    return sorted({r["step"] for r in run.records if r["op"] == "ADAPTIVE_SWITCH" and r["rank"] == 0})


def section_adaptive(run):
    """sync.adaptive (Accordion): the share sent at low compression and when it switched."""
    low = [(m["step"], m["low_compression"]) for m in run.train if "low_compression" in m]
    if not low and not adaptive_switches(run):
        return ""
    md = ["## Adaptive compression\n\n"]
    setting = ("rank", "adaptive_rank") if run.method == "powersgd" else ("density", "adaptive_density")
    md.append(f"sync.adaptive: {setting[0]} {run.method_cfg(setting[1])} in critical regimes, "
              f"{run.method_cfg(setting[0])} elsewhere; threshold {run.method_cfg('adaptive_threshold')}, "
              f"interval {run.method_cfg('adaptive_interval') or 'an epoch'}"
              + (" steps" if run.method_cfg('adaptive_interval') else "") + ".\n\n")
    if low:
        mean = sum(v for _, v in low) / len(low)
        md.append(f"Share of the compressed entries sent at low compression, mean over the {len(low)} metrics "
                  f"records of the compressed phase: {mean:.3f}.\n\n")
    switches = adaptive_switches(run)
    md.append(f"Switches (ADAPTIVE_SWITCH in the comm log): {len(switches)}"
              + (", after steps " + ", ".join(str(s) for s in switches) if switches else "") + ".\n\n")
    if low:
        rows, last = [], None
        for step, v in low:
            if last is None or v != last:
                rows.append([str(step), f"{v:.3f}"])
                last = v
        md.append("Low-compression share by metrics record, where it changed:\n\n"
                  + table(["step (record)", "low-compression share"], rows) + "\n")
    return "".join(md)


def eval_metric(run):
    for key in ("cer", "accuracy", "wer"):
        pts = [(m["step"], m["time_s"], m[key]) for m in run.evals if key in m]
        if pts:
            return key, pts
    return None, []


def section_compare(runs, figs):
    plt = figs.plt
    md = ["## Runs compared\n\n"]
    rows = []
    for run in runs:
        o = ra.overall(run)
        ph = {r["phase"]: r for r in ra.phase_table(run)}
        ops, total = ra.op_table(run)
        key, pts = eval_metric(run)
        name = run.name + (f" (**diverged** at step {run.diverged['step']})" if run.diverged else "")
        rows.append([name, run.method, run.world, o["steps"], num(o["wall_s"], "{:.1f}"),
                     num(o["samples_per_s"], "{:.1f}"), total["calls"], mb(total["bytes"]),
                     human(ph["dense"]["wire_per_step_per_rank"]), human(ph["compressed"]["wire_per_step_per_rank"]),
                     f"{run.train[-1]['loss']:.4f}" if run.train else "-",
                     f"{key} {pts[-1][2]:.4f}" if pts else "-"])
    md.append(table(["run", "method", "ranks", "steps", "wall s", "samples/s", "calls (all ranks)", "sent MB (all ranks)",
                     "wire per step per rank, dense", "... compressed", "last loss", "last eval"], rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for run in runs:
        axes[0].plot([m["step"] for m in run.train], [m["loss"] for m in run.train], label=run.name, lw=0.9)
        axes[1].plot([m["time_s"] for m in run.train], [m["loss"] for m in run.train], label=run.name, lw=0.9)
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("wall time, s")
    for ax in axes:
        ax.set_ylabel("training loss")
        ax.legend(fontsize=8)
    md.append("\n" + figs.save(fig, "compare_loss.png") + "\n")
    if any(eval_metric(r)[1] for r in runs):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
        for run in runs:
            key, pts = eval_metric(run)
            if pts:
                axes[0].plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=f"{run.name} ({key})")
                axes[1].plot([p[1] for p in pts], [p[2] for p in pts], marker="o", label=f"{run.name} ({key})")
        axes[0].set_xlabel("step")
        axes[1].set_xlabel("wall time, s")
        for ax in axes:
            ax.set_ylabel("evaluation")
            ax.legend(fontsize=8)
        md.append(figs.save(fig, "compare_eval.png") + "\n")
    return "".join(md)


def section_scaling(runs, trainer, latency, figs, calibration=None):
    """E(P) and the predicted step time against link bandwidth, per run and phase, from the what-if model;
    with a calibration file, one more row at the rates it measured. The text says which rates each row used."""
    md = ["## Scalability against bandwidth (what-if model)\n\n"]
    if not trainer:
        return "".join(md) + "Not computed: the model is `trainer whatif`; run the report through `trainer report`.\n"
    series, notes = [], []  # (label, phase, [points], calibrated point or None)
    for run in runs:
        if run.world < 2:
            notes.append(f"{run.name}: one rank, nothing to predict.")
            continue
        try:
            points = ra.scaling(run, trainer, latency)
            measured = ra.calibrated_scaling(run, trainer, calibration) if calibration else None
        except ra.RunError as e:
            notes.append(f"{run.name}: not computed ({e}).")
            continue
        for phase in ra.PHASES:
            if phase in points[0]["phases"]:
                series.append((f"{run.name}: {phase}", phase, points, measured))
    if not series:
        return "".join(md) + " ".join(notes) + "\n"
    md.append(f"`trainer whatif RUN --bandwidth B --latency {latency}` at each run's own rank count: the alpha-beta model "
              "(comm/network_model.h) costs the calls one logged step of each phase makes, adds the measured compute "
              "and straggler wait, and gives the step time and E(P) = T(1) / T(P) per sample = compute / step "
              "(docs/architecture.md, what-if model). Cells: predicted step ms / E(P). The bandwidth rows are "
              "**nominal** link rates, not measured: an MPI library over TCP may reach only part of a link "
              "(`trainer calibrate` measures what it reaches).\n\n")
    calibrated = series[0][3]
    if calibrated:
        md.append(f"Row \"calibrated\": `trainer whatif RUN --calibration {calibration}`, at "
                  f"{calibrated['network'].get('description', '').removeprefix('calibrated: ')}."
                  + (f" {calibrated['network']['extrapolation']}." if calibrated["network"].get("extrapolation") else "")
                  + "\n\n")
    rows = []
    for i, bw in enumerate(series[0][2]):
        rows.append([bw["bandwidth"]] + [f"{pts[i]['phases'][ph]['step_ms']:.1f} / {pts[i]['phases'][ph]['efficiency']:.3f}"
                                         for _, ph, pts, _ in series])
    if calibrated:
        rows.append(["calibrated"] + [f"{cal['phases'][ph]['step_ms']:.1f} / {cal['phases'][ph]['efficiency']:.3f}"
                                      for _, ph, _, cal in series])
    md.append(table(["bandwidth"] + [label for label, _, _, _ in series], rows))
    if notes:
        md.append("\n" + " ".join(notes) + "\n")
    plt = figs.plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for label, phase, pts, cal in series:
        x = [p["bits_per_s"] / 1e9 for p in pts]
        style = "--" if phase == "dense" else "-"
        line = axes[0].plot(x, [p["phases"][phase]["efficiency"] for p in pts], style, marker=".", label=label)[0]
        axes[1].plot(x, [p["phases"][phase]["step_ms"] for p in pts], style, marker=".", label=label)
        if cal:  # at the achieved allreduce bus rate
            axes[0].plot([cal["bits_per_s"] / 1e9], [cal["phases"][phase]["efficiency"]], "*", ms=10,
                         color=line.get_color(), label=f"{label}, calibrated")
            axes[1].plot([cal["bits_per_s"] / 1e9], [cal["phases"][phase]["step_ms"]], "*", ms=10,
                         color=line.get_color())
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("link bandwidth, Gbit/s (nominal; stars: calibrated)" if calibrated else
                      "link bandwidth, Gbit/s (nominal)")
        ax.legend(fontsize=8)
    axes[0].set_ylabel(f"E(P), P = {series[0][2][0]['ranks']}" if len({pts[0]["ranks"] for _, _, pts, _ in series}) == 1
                       else "E(P)")
    axes[0].set_ylim(0, 1.05)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("predicted step time, ms")
    md.append("\n" + figs.save(fig, "scaling.png") + "\n")
    return "".join(md)


def section_restarts(run, figs):
    """scripts/elastic's attempts, and the training loss on one wall clock across them."""
    attempts = ra.elastic_attempts(run)
    if not attempts:
        return ""
    md = ["## Restarts (scripts/elastic)\n\n",
          f"{len(attempts)} attempt(s), world sizes {', '.join(str(a['ranks']) for a in attempts)}. Times from the "
          "first attempt's start; steps lost: the failed attempt's last logged step minus the checkpoint step the "
          "next one resumed from; restart: from the failure to the next attempt's first logged step.\n\n"]
    rows = [[a["attempt"], a["ranks"], " ".join(a["hosts"]), num(a["start_s"], "{:.1f}"), num(a["end_s"], "{:.1f}"),
             a["exit_status"], a["reason"], "-" if a.get("resumed_from_step") is None else a["resumed_from_step"],
             "-" if a["last_step"] is None else a["last_step"], "-" if a["steps_lost"] is None else a["steps_lost"],
             num(a["restart_s"], "{:.1f}") if a["restart_s"] is not None else "-"] for a in attempts]
    md.append(table(["attempt", "ranks", "hosts", "start s", "end s", "exit", "why it ended", "resumed from step",
                     "last step logged", "steps lost", "restart s"], rows))
    plt = figs.plt
    fig, ax = plt.subplots(figsize=(10, 3.2))
    for a in attempts:
        if a["records"]:
            ax.plot([m["wall_s"] for m in a["records"]], [m["loss"] for m in a["records"]], lw=0.9, marker=".",
                    label=f"attempt {a['attempt']} ({a['ranks']} ranks)")
        if a["exit_status"] != 0:
            ax.axvline(a["end_s"], color="red", ls="--", lw=0.8)
    ax.set_xlabel("wall time since the first attempt, s (dashed: an attempt failed)")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=8)
    md.append("\n" + figs.save(fig, "restarts.png"))
    return "".join(md)


def section_seed(run, ops):
    md = ["## The published analyses' counts\n\n",
          "The Ok-Top-k communication analyses of DeepSpeech on AN4 (8 ranks, 2%, 128 dense warmup steps) state "
          "per-op call counts summed over ranks. Where their own numbers cannot all be true:\n\n"]
    md += [f"- {line}\n" for line in seed.contradictions()]
    if run.info and run.method == "oktopk":
        phases = {r["phase"]: r["steps"] for r in ra.phase_table(run)}
        calls = {r["op"]: r["calls"] for r in ops}
        rows = seed.check_table(run.world, phases["dense"], phases["compressed"], run.info["dense_buckets"],
                                run.method_cfg("region_every", 64), calls)
        md.append(f"\nThe same schedule, counted: published; expected with their {seed.PUBLISHED['compressed_steps_stated']} "
                  f"compressed steps; expected for this run (P = {run.world}, {phases['dense']} dense steps of "
                  f"{run.info['dense_buckets']} bucket(s), {phases['compressed']} compressed); recorded in this run. "
                  "Point-to-point rows: the split-and-reduce messages, plus the balance step's moves.\n\n")
        out = [[op, "-" if pub is None else pub, f"{a} +" if p2p else a, f"{b} +" if p2p else b, got]
               for op, pub, a, b, got, p2p in rows]
        md.append(table(["op", "published", "schedule (theirs)", "schedule (this run)", "this run"], out))
    return "".join(md)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run folders (the first is reported in full)")
    parser.add_argument("--out", help="report folder (default: FIRST_RUN/report)")
    parser.add_argument("--seed-check", action="store_true", help="check the published AN4 Ok-Top-k counts")
    parser.add_argument("--trainer", help="the trainer binary, for the what-if model's scalability view")
    parser.add_argument("--latency", default="50us", help="per-message latency of that view (default 50us)")
    parser.add_argument("--calibration", help="a `trainer calibrate` file: that view adds the step at its rates")
    args = parser.parse_args(argv)
    try:
        runs = [ra.Run(folder) for folder in args.runs]
    except (ra.RunError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    out = args.out or os.path.join(runs[0].folder, "report")
    os.makedirs(out, exist_ok=True)
    figs = Figures(out)
    run = runs[0]
    md = [f"# Report: {run.name}\n\n",
          f"Generated by `trainer report` from {run.folder}: config.toml, metrics.jsonl, comm/rank*.jsonl"
          + (", run.json" if run.info else "") + (", comm/summary.json" if run.comm_summary else "")
          + ". Every number below is computed from these files.\n\n"]
    diverged = section_diverged(run)
    if diverged:
        md.append(diverged + "\n")
    md.append(section_overall(run) + "\n")
    ops_md, ops = section_ops(run)
    md.append(ops_md + "\n")
    md.append(section_phases(run) + section_schedule(run, ops) + "\n")
    md.append(section_distributions(run, ops, figs) + "\n")
    md.append(section_adaptive(run))
    if len(runs) > 1:
        md.append(section_compare(runs, figs) + "\n")
    md.append(section_restarts(run, figs) + "\n")
    md.append(section_scaling(runs, args.trainer, args.latency, figs, args.calibration) + "\n")
    if args.seed_check:
        md.append(section_seed(run, ops) + "\n")
    path = os.path.join(out, "report.md")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write("".join(md))
    os.replace(path + ".tmp", path)
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
