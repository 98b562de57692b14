"""The numbers of `trainer report`, computed from a run folder's logs (no plotting, no formatting).

A run folder (docs/architecture.md section 3) holds config.toml, metrics.jsonl (rank 0), comm/rank<R>.jsonl
(one record per message or collective per rank), and, from runs of this version on, run.json (n, P,
k, dense buckets, parameter shapes: what the theoretical volumes need) and comm/summary.json (the
end-of-run summary's statistics: the kind of every op tag, and totals to check against).

Definitions shared with the C++ summary (comm/comm_summary.h), so that both agree:
  data size S of one call: allreduce and broadcast the buffer, allgather(v) the whole output,
  alltoall the whole send buffer, a send or receive the message (record: bytes + bytes_recv for
  allgather(v) and broadcast, bytes for allreduce, bytes * P/(P-1) for alltoall, max(bytes,
  bytes_recv) otherwise); median = the lower middle value; algbw = sum S / sum time; busbw = algbw x
  bus factor: allreduce 2(P-1)/P, allgather(v) and alltoall (P-1)/P, barrier 0, others 1.
Wire volume (ring model) of one call on one rank: S x bus factor for collectives, the bytes sent for
a point-to-point send. It is what a ring algorithm sends per rank, the quantity the methods'
theoretical volumes count (dense: 2n(P-1)/P words).

Counts are "summed over ranks" (every rank's calls, as the published analyses count: 128 dense steps
on 8 ranks are 1,024 ALLREDUCE_DENSE calls) unless a name says per rank.
"""
import json
import math
import os
import tomllib
from collections import defaultdict

PHASES = ("dense", "compressed")

# Calls that are not gradient synchronization: start-up checks, evaluation, checkpoints, the log's
# own summary. The per-op table lists them; the per-phase volumes leave them out.
BOOKKEEPING_PREFIXES = ("ALLREDUCE_CHECK", "ALLREDUCE_EVAL", "CHECKPOINT_", "BARRIER_", "SUMMARY_")

# Fields another version of the comm log may carry: time a rank waited for the last rank to enter a
# collective (straggler wait).
WAIT_FIELDS = ("wait_us", "t_last_enter_us")


class RunError(Exception):
    """A run folder that cannot be reported on; the message is one line naming the file."""


def is_bookkeeping(op):
    return op.startswith(BOOKKEEPING_PREFIXES)


def infer_kind(op, peer):
    """The kind of an op tag when comm/summary.json is absent: from the tag's name (docs/architecture.md's tags
    start with the collective's name) or, for messages, the peer."""
    if peer >= 0:
        return "p2p"
    for prefix, kind in (("ALLREDUCE", "allreduce"), ("ALLGATHERV", "allgatherv"), ("ALLGATHER", "allgather"),
                         ("ALLTOALL", "alltoall"), ("BROADCAST", "broadcast"), ("BARRIER", "barrier"),
                         ("CHECKPOINT_AGREE", "allreduce"), ("CHECKPOINT_STEP", "allreduce"),
                         ("CHECKPOINT_FILES", "allgather"), ("CHECKPOINT_LIST", "allgather")):
        if op.startswith(prefix):
            return kind
    return "other"


def bus_factor(kind, p):
    if kind == "allreduce":
        return 2.0 * (p - 1) / p
    if kind in ("allgather", "allgatherv", "alltoall"):
        return (p - 1) / p
    if kind == "barrier":
        return 0.0
    return 1.0


def data_size(rec, kind, p):
    b, r = rec["bytes"], rec["bytes_recv"]
    if kind == "allreduce":
        return b
    if kind in ("allgather", "allgatherv", "broadcast"):
        return b + r
    if kind == "alltoall":
        return b * p // (p - 1) if p > 1 else b
    if kind == "barrier":
        return 0
    return max(b, r)


def lower_median(values):
    s = sorted(values)
    return s[(len(s) - 1) // 2] if s else 0


def _read_jsonl(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise RunError(f"{path}:{number}: not a JSON record ({e.msg})") from None
    return out


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise RunError(f"{path}: not JSON ({e.msg})") from None


class Run:
    """One run folder, loaded."""

    def __init__(self, folder):
        self.folder = os.path.abspath(folder)
        self.name = os.path.basename(self.folder.rstrip("/"))
        if not os.path.isdir(folder):
            raise RunError(f"{folder}: no such run folder")
        config_path = os.path.join(folder, "config.toml")
        metrics_path = os.path.join(folder, "metrics.jsonl")
        for path in (config_path, metrics_path):
            if not os.path.isfile(path):
                raise RunError(f"{path}: missing (not a trainer run folder?)")
        try:
            with open(config_path, "rb") as f:
                self.config = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise RunError(f"{config_path}: not TOML ({e})") from None
        self.metrics = _read_jsonl(metrics_path)
        self.train = [m for m in self.metrics if "loss" in m and "split" not in m]
        self.evals = [m for m in self.metrics if "split" in m]
        # The divergence guard's record (trainer/step/divergence_guard.h): the run stopped, diverged.
        self.diverged = next((m for m in self.metrics if m.get("diverged")), None)
        info_path = os.path.join(folder, "run.json")
        self.info = _read_json(info_path) if os.path.isfile(info_path) else None
        summary_path = os.path.join(folder, "summary.json")
        self.summary = _read_json(summary_path) if os.path.isfile(summary_path) else None
        comm_summary_path = os.path.join(folder, "comm", "summary.json")
        self.comm_summary = _read_json(comm_summary_path) if os.path.isfile(comm_summary_path) else None

        comm_dir = os.path.join(folder, "comm")
        ranks = sorted(int(f[4:-6]) for f in os.listdir(comm_dir) if f.startswith("rank") and f.endswith(".jsonl")
                       and f[4:-6].isdigit()) if os.path.isdir(comm_dir) else []
        if self.info:
            self.world = int(self.info["world_size"])
        elif self.summary and "world_size" in self.summary:
            self.world = int(self.summary["world_size"])
        else:
            self.world = len(ranks)
        if not ranks:
            raise RunError(f"{os.path.join(comm_dir, 'rank0.jsonl')}: missing (was comm.log off?)")
        missing = [r for r in range(self.world) if r not in ranks]
        if missing:
            raise RunError(f"{os.path.join(comm_dir, f'rank{missing[0]}.jsonl')}: missing "
                           f"(the run had {self.world} ranks)")
        self.records = []  # every message record, with its rank added as "rank"
        self.compute_records = []  # the steps' FORWARD_BACKWARD intervals (overlap: comm during them is hidden)
        for r in range(self.world):
            path = os.path.join(comm_dir, f"rank{r}.jsonl")
            for rec in _read_jsonl(path):
                for key in ("step", "phase", "op", "bytes", "bytes_recv", "peer", "t_start_us", "t_end_us"):
                    if key not in rec:
                        raise RunError(f"{path}: a record without '{key}'")
                rec["rank"] = r
                if rec.get("kind") == "compute":  # a compute phase of the step, not a message
                    self.compute_records.append(rec)
                else:
                    self.records.append(rec)
        kinds = {o["op"]: o["kind"] for o in self.comm_summary["ops"]} if self.comm_summary else {}
        for rec in self.records:
            rec["kind"] = kinds.get(rec["op"]) or infer_kind(rec["op"], rec["peer"])
            rec["size"] = data_size(rec, rec["kind"], self.world)
            rec["time_us"] = rec["t_end_us"] - rec["t_start_us"]
        self.kinds_from = "comm/summary.json" if kinds else "the op tags' names"

    # -- the config -------------------------------------------------------------------------------
    def cfg(self, section, key, default=None):
        return self.config.get(section, {}).get(key, default)

    def method_cfg(self, key, default=None):
        """A key of sync.method's own table ([sync.<method>] in config.toml; older runs wrote it flat
        under [sync])."""
        sync = self.config.get("sync", {})
        own = sync.get(self.method, {})
        return own.get(key, sync.get(key, default)) if isinstance(own, dict) else sync.get(key, default)

    @property
    def method(self):
        return self.info["method"] if self.info else self.cfg("sync", "method", "dense")


# -- per op -----------------------------------------------------------------------------------------
def op_table(run):
    """One row per op tag in order of first appearance, then a total row; every count summed over
    ranks, with the per-rank spread of calls."""
    rows, order = {}, []
    total_time = sum(r["time_us"] for r in run.records)
    for rec in run.records:
        op = rec["op"]
        if op not in rows:
            rows[op] = {"op": op, "kind": rec["kind"], "calls": 0, "bytes": 0, "bytes_recv": 0, "time_us": 0,
                        "sizes": [], "calls_by_rank": [0] * run.world}
            order.append(op)
        row = rows[op]
        row["calls"] += 1
        row["bytes"] += rec["bytes"]
        row["bytes_recv"] += rec["bytes_recv"]
        row["time_us"] += rec["time_us"]
        row["sizes"].append(rec["size"])
        row["calls_by_rank"][rec["rank"]] += 1
    out = []
    for op in order:
        row = rows[op]
        sizes = row["sizes"]
        total_size = sum(sizes)
        factor = bus_factor(row["kind"], run.world)
        row.update(size_min=min(sizes), size_median=lower_median(sizes), size_max=max(sizes), size_total=total_size,
                   mean_us=row["time_us"] / row["calls"],
                   share=100.0 * row["time_us"] / total_time if total_time else 0.0,
                   algbw=total_size / row["time_us"] / 1e3 if row["time_us"] > 0 and total_size > 0 else None)
        row["busbw"] = row["algbw"] * factor if row["algbw"] is not None and factor > 0 else None
        out.append(row)
    total = {"op": "total", "calls": sum(r["calls"] for r in out), "bytes": sum(r["bytes"] for r in out),
             "bytes_recv": sum(r["bytes_recv"] for r in out), "time_us": sum(r["time_us"] for r in out),
             "share": 100.0 if total_time else 0.0}
    return out, total


# -- per phase --------------------------------------------------------------------------------------
def theoretical_words(run, phase):
    """Words (elements: word_bytes each) one rank sends per step by the method's formula, with the
    formula; None when the run does not say n (no run.json)."""
    if not run.info:
        return None, "needs run.json"
    n, p, k = run.info["n"], run.world, run.info["k"]
    method = run.info["method"]
    if p < 2:
        return 0, "one rank: nothing to send"
    if phase == "dense" or method in ("dense", "local_sgd"):
        return 2 * n * (p - 1) / p, "2n(P-1)/P"
    if method == "diloco":  # one fragment of about n/F every H/F steps: n/H per step on average
        h = run.method_cfg("period", 1)
        return 2 * n * (p - 1) / p / h, "2n(P-1)/P / H (pseudo-gradients, on average per step)"
    if method == "oktopk":
        return 6 * k * (p - 1) / p, "<= 6k(P-1)/P"
    if method == "topka":
        return 2 * k * (p - 1), "2k(P-1)"
    if method == "powersgd":
        total = 0
        for v in run.info["parameters"]:
            shape = v["shape"]
            rows_ = shape[0]
            cols = math.prod(shape[1:]) if len(shape) > 1 else 1
            r = run.method_cfg("rank", 1)
            total += (rows_ + cols) * r if len(shape) > 1 else rows_
        return 2 * total * (p - 1) / p, "sum (n+m)r, ring allreduce 2(P-1)/P"
    if method == "gaussiank":
        return 2 * k * (p - 1), "about 2k(P-1) (allgatherv of about k pairs per rank)"
    return None, f"no formula for {method}"


def word_bytes(run, phase):
    """Bytes per element on the wire in a phase: 2 where sync.wire_dtype's 16-bit formats apply (the
    dense phase's gradient allreduce and PowerSGD's factors), 4 elsewhere (local SGD's parameters,
    the sparse methods' values, the parameter server)."""
    if run.cfg("sync", "wire_dtype", "fp32") == "fp32" or run.method == "async_ps":
        return 4
    return 2 if phase == "dense" or run.method == "powersgd" else 4


def wire_bytes(rec, world):
    if rec["kind"] == "p2p":
        return rec["bytes"]
    return rec["size"] * bus_factor(rec["kind"], world)


def phase_table(run):
    """Per phase, gradient-sync calls only: steps seen, messages and bytes per step per rank, the
    ring-model wire volume against the method's formula, and the reduction against dense."""
    stats = {ph: {"steps": set(), "calls": 0, "bytes": 0, "bytes_recv": 0, "wire": 0.0, "time_us": 0} for ph in PHASES}
    for rec in run.records:
        if is_bookkeeping(rec["op"]) or rec["phase"] not in stats:
            continue
        s = stats[rec["phase"]]
        s["steps"].add(rec["step"])
        s["calls"] += 1
        s["bytes"] += rec["bytes"]
        s["bytes_recv"] += rec["bytes_recv"]
        s["wire"] += wire_bytes(rec, run.world)
        s["time_us"] += rec["time_us"]
    rows = []
    for ph in PHASES:
        s = stats[ph]
        steps = len(s["steps"])
        words, formula = theoretical_words(run, ph)
        per = steps * run.world
        row = {"phase": ph, "steps": steps, "calls": s["calls"], "bytes": s["bytes"], "bytes_recv": s["bytes_recv"],
               "time_us": s["time_us"], "wire": s["wire"],
               "calls_per_step_per_rank": s["calls"] / per if per else None,
               "bytes_per_step_per_rank": s["bytes"] / per if per else None,
               "wire_per_step_per_rank": s["wire"] / per if per else None,
               "theory_bytes": word_bytes(run, ph) * words if words is not None else None, "formula": formula}
        row["measured_over_theory"] = (row["wire_per_step_per_rank"] / row["theory_bytes"]
                                       if per and row["theory_bytes"] else None)
        rows.append(row)
    dense = rows[0]["wire_per_step_per_rank"]
    for row in rows:
        row["reduction"] = dense / row["wire_per_step_per_rank"] if dense and row["wire_per_step_per_rank"] else None
    return rows


# -- over the run -------------------------------------------------------------------------------------
def time_split(run):
    """Per phase: steps and total milliseconds of data, compute, sync and optimizer from metrics.jsonl
    (each record holds the means over the steps since the previous record; the record's phase is that
    of its last step)."""
    out = {ph: {"steps": 0, "data": 0.0, "compute": 0.0, "sync": 0.0, "optim": 0.0} for ph in PHASES}
    previous = 0  # a resumed run's metrics.jsonl continues the same file from step 0
    for m in run.train:
        steps = m["step"] - previous
        previous = m["step"]
        o = out.get(m.get("phase", "dense"))
        if o is None or steps <= 0:
            continue
        o["steps"] += steps
        for key in ("data", "compute", "sync", "optim"):
            o[key] += m.get(f"t_{key}_ms", 0.0) * steps
    return out


def bytes_per_step(run):
    """step -> bytes sent by gradient sync, mean over ranks."""
    per = defaultdict(int)
    for rec in run.records:
        if not is_bookkeeping(rec["op"]):
            per[rec["step"]] += rec["bytes"]
    return {s: b / run.world for s, b in sorted(per.items())}


def region_balance(run):
    """Per rank: bytes received by gradient-sync calls in the compressed phase (Ok-Top-k's regions
    decide who receives what), and by point-to-point receives alone."""
    total = [0] * run.world
    p2p = [0] * run.world
    for rec in run.records:
        if rec["phase"] == "compressed" and not is_bookkeeping(rec["op"]):
            total[rec["rank"]] += rec["bytes_recv"]
            if rec["kind"] == "p2p":
                p2p[rec["rank"]] += rec["bytes_recv"]
    return total, p2p


def wait_split(run):
    """(field, per rank [time_us, wait_us], per op {op: [time_us, wait_us]}) over the records that carry
    a wait (the collectives), else None. Transfer = time - wait: the part of a call after the last rank
    entered it."""
    field = next((f for f in WAIT_FIELDS if any(f in r for r in run.records)), None)
    if field is None:
        return None
    per_rank = [[0.0, 0.0] for _ in range(run.world)]
    per_op = defaultdict(lambda: [0.0, 0.0])
    for rec in run.records:
        if field not in rec:
            continue
        wait = rec[field] - rec["t_start_us"] if field == "t_last_enter_us" else rec[field]
        wait = max(wait, 0)
        time = rec["t_end_us"] - rec["t_start_us"]
        for cell in (per_rank[rec["rank"]], per_op[rec["op"]]):
            cell[0] += time
            cell[1] += wait
    return field, per_rank, dict(per_op)


def _union(intervals):
    """Total length of the union of (start, end) intervals."""
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def hidden_share(run):
    """Per phase, over rank 0's steps that have a FORWARD_BACKWARD record: gradient-sync communication
    time per step (the union of its calls' intervals: calls may run concurrently) and the part of it
    that ran during the step's forward and backward pass, hidden behind compute (sync.overlap). None
    without compute records (a run from before they were logged)."""
    compute = {(r["step"], r["phase"]): (r["t_start_us"], r["t_end_us"])
               for r in run.compute_records if r["rank"] == 0}
    if not compute:
        return None
    calls = defaultdict(list)
    for rec in run.records:
        if rec["rank"] == 0 and not is_bookkeeping(rec["op"]) and (rec["step"], rec["phase"]) in compute:
            calls[(rec["step"], rec["phase"])].append((rec["t_start_us"], rec["t_end_us"]))
    out = {ph: {"steps": 0, "comm_us": 0.0, "hidden_us": 0.0} for ph in PHASES}
    for (step, phase), (c0, c1) in compute.items():
        o = out.get(phase)
        if o is None:
            continue
        intervals = calls.get((step, phase), [])
        o["steps"] += 1
        o["comm_us"] += _union(intervals)
        o["hidden_us"] += _union([(max(a, c0), min(b, c1)) for a, b in intervals if min(b, c1) > max(a, c0)])
    return out


def elastic_attempts(run):
    """scripts/elastic's attempts (elastic/attempts.jsonl; [] without it), each with "records": its
    training records, their "wall_s" on one clock from the first attempt's start. Each resume cuts
    metrics.jsonl back to its checkpoint's step, so the record of step s is from the last attempt that
    started below s (a fresh start at 0); time_s restarts with every attempt's processes."""
    path = os.path.join(run.folder, "elastic", "attempts.jsonl")
    if not os.path.isfile(path):
        return []
    attempts = _read_jsonl(path)
    origin = attempts[0]["start"] if attempts else 0.0
    for a in attempts:
        a["from_step"] = a.get("resumed_from_step") or 0
        a["records"] = []
    for m in run.train:
        owner = None
        for a in attempts:
            if a["from_step"] < m["step"]:
                owner = a
        if owner is not None:
            owner["records"].append(dict(m, wall_s=owner["start"] - origin + m.get("time_s", 0.0)))
    for a, after in zip(attempts, attempts[1:] + [None]):
        a["start_s"], a["end_s"] = a["start"] - origin, a["end"] - origin
        failed = a["exit_status"] != 0 and after is not None
        a["steps_lost"] = (a["last_step"] or 0) - after["from_step"] if failed and a["last_step"] is not None else None
        a["restart_s"] = (after["records"][0]["wall_s"] - a["end_s"]) if failed and after["records"] else None
    return attempts


def overall(run):
    steps = run.train[-1]["step"] if run.train else 0
    wall = run.summary.get("seconds") if run.summary else (run.metrics[-1]["time_s"] if run.metrics else None)
    rate = run.summary.get("samples_per_s") if run.summary else None
    return {"steps": steps, "wall_s": wall, "samples_per_s": rate}


def summary_mismatches(run, ops):
    """Per-op differences between the records' totals and comm/summary.json (the C++ summary). The
    summary counts every call while the log was on; records exist only in the comm.log_* window, so
    a windowed run differs by design."""
    if not run.comm_summary:
        return None
    by_op = {r["op"]: r for r in ops}
    out = []
    for o in run.comm_summary["ops"]:
        mine = by_op.get(o["op"])
        for key in ("calls", "bytes", "bytes_recv", "time_us"):
            got = mine[key] if mine else 0
            if got != o[key]:
                out.append((o["op"], key, got, o[key]))
    return out


# Link bandwidths of the scalability view (`trainer whatif` units), 100 Mbit/s to 100 Gbit/s.
SCALING_BANDWIDTHS = ("100mbit", "250mbit", "500mbit", "1gbit", "2.5gbit", "5gbit", "10gbit", "25gbit", "40gbit",
                      "100gbit")


def whatif_json(run, trainer, network_args):
    """`trainer whatif RUN <network_args> --json`, parsed; RunError with whatif's own message when it fails."""
    import subprocess
    done = subprocess.run([trainer, "whatif", run.folder] + list(network_args) + ["--json"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise RunError(f"trainer whatif {run.folder}: " + (lines[-1] if lines else f"exit status {done.returncode}"))
    return json.loads(done.stdout)


def scaling_point(label, result):
    return {"bandwidth": label, "bits_per_s": 8 * result["bandwidth_bytes_per_s"],
            "latency_s": result["latency_s"], "ranks": result["ranks"], "network": result.get("network", {}),
            "phases": {p["phase"]: p for p in result["phases"]}}


def scaling(run, trainer, latency, bandwidths=SCALING_BANDWIDTHS):
    """The what-if model's prediction for this run at its own rank count on each nominal bandwidth: one dict
    per bandwidth, {"bandwidth": text, "bits_per_s": float, "network": whatif's network object, "phases":
    {phase: {step_ms, efficiency, comm_ms, wait_ms, compute_ms, comm_share}}}, from `trainer whatif RUN --json`
    (the model lives there, in C++: comm/network_model.h, trainer/tools/whatif.h). Raises RunError with whatif's own
    message when it fails."""
    return [scaling_point(bw, whatif_json(run, trainer, ["--bandwidth", bw, "--latency", latency])) for bw in bandwidths]


def calibrated_scaling(run, trainer, calibration):
    """The same prediction at the rates a `trainer calibrate` file measured: one dict as scaling() gives, with
    "bandwidth" = "calibrated" and bits_per_s the achieved allreduce bus rate."""
    return scaling_point("calibrated", whatif_json(run, trainer, ["--calibration", calibration]))
