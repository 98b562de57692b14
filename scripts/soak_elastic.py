"""The elastic soak (`scripts/soak --elastic`, issue 20 part 3): one training job run by scripts/elastic
on a hostfile of slots on this machine, hit by random events while it trains, against two
uninterrupted runs of the same job (or more: --uninterrupted).

Events, drawn up front from --seed: SIGKILL of one rank (mpiexec ends the others), SIGKILL of the
whole job (mpiexec and every rank; the launcher lives on, as it would on another node), SIGTERM to
one rank (the job checkpoints and exits 143), one or two slots taken out of the hostfile, and the
slots given back. A slot change is followed by a failure (the restart after it is what it changes),
so the plan ends on a failure; every kind occurs at least once. Each failure comes a random number of
steps after the current attempt logged its first (soak_run says how many); a slot change at a random
step before it. The launcher restarts the job after every failure with --resume latest, on
min(--ranks, the hostfile's slots) ranks, re-sharding the checkpoint when that number changed.

Checked ("nothing lost"): every attempt after a failure resumed from the newest complete checkpoint
there was when the failed attempt ended (seen by the soak between the two attempts), lost at most
train.checkpoint_every steps (last step the failed attempt logged minus the step resumed from), ran
on as many ranks as the hostfile offered, and the last attempt finished every step.
Measured: attempts, their world sizes, steps lost, time to restart (from the event to the first step
the next attempt logged, seen by polling metrics.jsonl), and the final test accuracy against the
uninterrupted runs at the same global batch. "Run-to-run spread": the same configuration with
experiment.seed s, s + 1, ... (--uninterrupted runs, default 2: another initialization and data
order; a run with the same seed repeats bit for bit, so that is the only spread there is), the
largest accuracy minus the smallest; the elastic run uses seed s, and its accuracy is called within
the spread when it differs from seed s's by no more than that.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

from soak_jobs import (ROOT, TRAINER, complete_checkpoints, final_accuracy, mpiexec, mpiexec_options, rank_pids,
                       trainer_args)

ELASTIC = os.path.join(ROOT, "scripts", "elastic")
FAILURES = ("SIGKILL rank", "SIGKILL job", "SIGTERM rank")
REMOVE, GIVE_BACK = "remove slots", "give back slots"
KINDS = FAILURES + (REMOVE, GIVE_BACK)
TRAIN_IMAGES, TEST_IMAGES = 10000, 2000  # enough that test accuracy after the run is not saturated


# ---- the plan of events ----

def valid_plan(events, ranks, min_ranks):
    """Every kind at least once; each slot change followed by a failure; slots never below min_ranks;
    slots given back only when some are missing."""
    kinds = [e["kind"] for e in events]
    if set(kinds) != set(KINDS) or kinds[-1] not in FAILURES:
        return False
    slots = ranks
    for event, after in zip(events, events[1:]):
        if event["kind"] in FAILURES:
            continue
        if after["kind"] not in FAILURES:
            return False
        if (event["kind"] == GIVE_BACK and slots == ranks) or event["slots"] < min_ranks:
            return False
        slots = event["slots"]
    return True


def plan_events(rng, count, ranks, min_ranks):
    """`count` events drawn uniformly over the five kinds until the sequence is a valid plan. Each is
    {"kind"}, and a slot change also {"slots": the hostfile's slots after it}."""
    if count < len(KINDS) or min_ranks > ranks - 1:
        raise ValueError(f"--events {count} with --ranks {ranks} and --min-ranks {min_ranks}: need at least "
                         f"{len(KINDS)} events and --min-ranks below --ranks")
    for _ in range(1000000):
        events, slots = [], ranks
        for _ in range(count):
            event = {"kind": rng.choice(KINDS)}
            if event["kind"] in (REMOVE, GIVE_BACK):
                slots = slots - rng.choice((1, 2)) if event["kind"] == REMOVE else ranks
                event["slots"] = slots
            events.append(event)
        if valid_plan(events, ranks, min_ranks):
            return events
    raise ValueError("no valid plan of events drawn")


# ---- what the soak sees of the run ----

def read_jsonl(path):
    """The whole JSON lines of a file ([] without it; a line cut by a kill is skipped)."""
    rows = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    except FileNotFoundError:
        pass
    return rows


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def training_records(run):
    """(step, time_s) of every training record in metrics.jsonl: time_s restarts with each attempt's
    processes, so a pair identifies the record of one attempt."""
    return {(r["step"], r.get("time_s")) for r in read_jsonl(os.path.join(run, "metrics.jsonl"))
            if "split" not in r and "step" in r}


def attempts(run):
    return read_jsonl(os.path.join(run, "elastic", "attempts.jsonl"))


def mpiexec_pid(launcher_pid):
    """The launcher's mpiexec child (None between attempts)."""
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0]
        except (OSError, ValueError, IndexError):
            continue
        if ppid == launcher_pid and os.path.basename(argv0) == b"mpiexec":
            return int(name)
    return None


def wait(launcher, seconds, until, poll=0.2):
    """Polls until `until()` is true (True), the launcher ends or `seconds` pass (False)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if until():
            return True
        if launcher.poll() is not None:
            return False
        time.sleep(poll)
    return False


def write_slots(hostfile, slots):
    with open(hostfile + ".tmp", "w") as f:
        f.write(f"localhost slots={slots}\n")
    os.replace(hostfile + ".tmp", hostfile)  # the launcher never reads half a file


def fire(kind, rng, run, launcher_pid):
    """Delivers one failure to the attempt running now; returns (the kind delivered, the rank it hit or
    None for the job). A rank's failure with no rank to be found (the attempt is ending) kills the job."""
    pids = rank_pids(run)
    if kind == "SIGKILL job" or not pids:
        for pid in [mpiexec_pid(launcher_pid)] + list(pids.values()):
            try:
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return "SIGKILL job", None
    rank = rng.choice(sorted(pids))
    os.kill(pids[rank], signal.SIGKILL if kind == "SIGKILL rank" else signal.SIGTERM)
    return kind, rank


# ---- the figures ----

def figures(attempt_rows, failures, checkpoint_every, ranks, steps):
    """Per failure: the world size before and after, the newest complete checkpoint when the attempt
    ended, the step the next one resumed from, steps lost and time to restart; and every way the run
    lost something (`problems`, empty when nothing was lost). `failures` are the soak's own records:
    kind, fired (time), attempt (the one it ended, from 1), newest_checkpoint (None: none), slots
    (the hostfile's when it ended), next_first_step (time; None: never seen)."""
    rows, problems = [], []
    if len(attempt_rows) != len(failures) + 1:
        problems.append(f"{len(attempt_rows)} attempt(s) for {len(failures)} failure(s): an attempt ended "
                        "without an event, or an event ended none")
    for f in failures:
        k = f["attempt"]
        if k >= len(attempt_rows):
            problems.append(f"attempt {k} ({f['kind']}) has no attempt after it")
            continue
        failed, after = attempt_rows[k - 1], attempt_rows[k]
        resumed = after.get("resumed_from_step")
        lost = None if failed.get("last_step") is None else failed["last_step"] - (resumed or 0)
        restart = None if f.get("next_first_step") is None else f["next_first_step"] - f["fired"]
        rows.append({"attempt": k, "event": f["kind"], "rank": f.get("rank"), "ranks": failed["ranks"],
                     "next_ranks": after["ranks"], "last_step": failed.get("last_step"),
                     "newest_checkpoint": f["newest_checkpoint"], "resumed_from": resumed, "steps_lost": lost,
                     "down_s": failed["end"] - f["fired"], "restart_s": restart})
        if failed["exit_status"] == 0:
            problems.append(f"attempt {k} finished before its {f['kind']}")
        if resumed != f["newest_checkpoint"]:
            problems.append(f"attempt {k + 1} resumed from step {resumed}, but the newest complete checkpoint "
                            f"when attempt {k} ended was {f['newest_checkpoint']}")
        if lost is None or lost > checkpoint_every:
            problems.append(f"attempt {k} ({f['kind']}) lost {lost} steps, more than train.checkpoint_every "
                            f"{checkpoint_every}")
        if after["ranks"] != min(ranks, f["slots"]):
            problems.append(f"attempt {k + 1} ran on {after['ranks']} ranks; the hostfile offered {f['slots']}")
        if restart is None:
            problems.append(f"attempt {k + 1} logged no step")
    last = attempt_rows[-1] if attempt_rows else None
    if last is None or last["exit_status"] != 0 or last.get("last_step") != steps:
        problems.append(f"the last attempt did not finish all {steps} steps")
    lost = [r["steps_lost"] for r in rows if r["steps_lost"] is not None]
    restarts = sorted(r["restart_s"] for r in rows if r["restart_s"] is not None)
    return {"attempts": len(attempt_rows), "world_sizes": [a["ranks"] for a in attempt_rows], "failures": rows,
            "steps_lost_max": max(lost, default=None), "steps_lost_total": sum(lost),
            "restart_s_median": restarts[len(restarts) // 2] if restarts else None,
            "restart_s_max": restarts[-1] if restarts else None, "problems": problems}


def accuracy_verdict(elastic, uninterrupted):
    """The elastic run's final test accuracy against the uninterrupted runs' (the first with the same
    experiment.seed); spread: the largest minus the smallest of the uninterrupted runs."""
    same_seed = uninterrupted[0]
    spread = max(uninterrupted) - min(uninterrupted)
    mean = sum(uninterrupted) / len(uninterrupted)
    std = (sum((x - mean) ** 2 for x in uninterrupted) / (len(uninterrupted) - 1)) ** 0.5
    return {"elastic": elastic, "uninterrupted": uninterrupted, "uninterrupted_mean": mean, "uninterrupted_std": std,
            "spread": spread, "difference": elastic - same_seed, "within_spread": abs(elastic - same_seed) <= spread}


def table(fig):
    """The per-failure table, as printed and as BENCHMARKS.md shows it."""
    lines = ["| attempt | event | ranks | next ranks | last step | newest checkpoint | resumed from | steps lost | "
             "job down s | restart s |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def show(value, fmt="{}"):
        return "-" if value is None else fmt.format(value)
    for r in fig["failures"]:
        event = r["event"] + ("" if r["rank"] is None else f" (rank {r['rank']})")
        lines.append(f"| {r['attempt']} | {event} | {r['ranks']} | {r['next_ranks']} | {show(r['last_step'])} | "
                     f"{show(r['newest_checkpoint'])} | {show(r['resumed_from'])} | {show(r['steps_lost'])} | "
                     f"{show(r['down_s'], '{:.1f}')} | {show(r['restart_s'], '{:.1f}')} |")
    return "\n".join(lines)


# ---- the runs ----

def settings(a, seed):
    """The --set keys of every run of the elastic soak beyond soak_jobs.trainer_args's."""
    return {"train.log_every_steps": 1, "sync.dense_warmup_steps": a.warmup, "experiment.seed": seed}


def uninterrupted(a, data, out, seed):
    """One run of the job without events under plain mpiexec: (seconds, final test accuracy)."""
    t0 = time.time()
    with open(out + ".log", "w") as log:
        rc = subprocess.run(mpiexec(a.ranks) + trainer_args(a, data, out, settings(a, seed)), stdout=log,
                            stderr=subprocess.STDOUT).returncode
    if rc != 0:
        sys.exit(f"soak: the uninterrupted run with seed {seed} failed (exit {rc}); see {out}.log")
    return time.time() - t0, final_accuracy(out)


def launcher_command(a, data, run, hostfile, events):
    options = [o for o in mpiexec_options() if o != "--allow-run-as-root"]  # the launcher adds that itself
    return ([ELASTIC, "--ranks", str(a.ranks), "--hostfile", hostfile, "--min-ranks", str(a.min_ranks),
             "--max-restarts", str(len(events) + 5)] + [f"--mpiexec-arg={o}" for o in options] + ["--"] +
            trainer_args(a, data, run, settings(a, a.train_seed)))


def new_steps(run, seen):
    """Steps the attempt running now has logged: the training records not in `seen`."""
    return [step for step, _ in training_records(run) - seen]


def soak_run(a, rng, plan, data, run, hostfile):
    """The job under the launcher with the plan's events; returns (failure records, slot records,
    launcher exit status). Event times are drawn in steps, so a loaded machine does not move them past
    the end of the run: each failure comes a random number of steps after its attempt's first (mean:
    0.7 of the run over the failures + 1, so the last attempt trains too; never after the second-last
    step), at a random moment within that step; a slot change at a random step before it."""
    failures, slot_changes = [], []
    slots = a.ranks
    write_slots(hostfile, slots)
    segments, pending = [], None  # (slot change or None, failure)
    for event in plan:
        if event["kind"] in FAILURES:
            segments.append((pending, event))
            pending = None
        else:
            pending = event
    mean_steps = 0.7 * a.steps / (len(segments) + 1)
    with open(os.path.join(a.out, "soak.log"), "w") as log:
        launcher = subprocess.Popen(launcher_command(a, data, run, hostfile, plan), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.time()
        try:
            seen = set()
            reached = lambda step: lambda: max(new_steps(run, seen), default=-1) >= step  # noqa: E731
            running = wait(launcher, 600, lambda: new_steps(run, seen))
            for slot_change, failure in segments:
                if not running:
                    break
                first = min(new_steps(run, seen))
                target = min(first + max(1, round(rng.uniform(0.25, 1.75) * mean_steps)), a.steps - 2)
                if slot_change:
                    if not wait(launcher, 1800, reached(first + round(rng.uniform(0.1, 0.9) * (target - first)))):
                        break
                    slots = slot_change["slots"]
                    write_slots(hostfile, slots)
                    slot_changes.append({"kind": slot_change["kind"], "slots": slots, "fired": time.time()})
                    print(f"soak: {time.time() - t0:6.1f} s  {slot_change['kind']}: the hostfile has {slots}",
                          flush=True)
                if not wait(launcher, 1800, reached(target)):
                    break
                time.sleep(rng.uniform(0.0, 0.3))
                ended = len(attempts(run))
                record = {"fired": time.time(), "attempt": ended + 1}
                record["kind"], record["rank"] = fire(failure["kind"], rng, run, launcher.pid)
                wait(launcher, 600, lambda: len(attempts(run)) > ended)
                rows = attempts(run)
                if len(rows) == ended or rows[-1]["exit_status"] == 0:
                    break  # the run finished before the event could end it: not a failure
                newest = complete_checkpoints(run)
                record.update(newest_checkpoint=newest[-1] if newest else None, slots=slots)
                seen = training_records(run)
                running = wait(launcher, 600, lambda: new_steps(run, seen))
                record["next_first_step"] = time.time() if running else None
                failures.append(record)
                print(f"soak: {record['fired'] - t0:6.1f} s  {record['kind']}"
                      f"{'' if record['rank'] is None else ' of rank ' + str(record['rank'])} in attempt "
                      f"{record['attempt']} (at step {rows[-1]['last_step']}); newest complete checkpoint "
                      f"{record['newest_checkpoint']}; a step logged again after "
                      f"{(record['next_first_step'] or time.time()) - record['fired']:.1f} s", flush=True)
            try:
                status = launcher.wait(timeout=3600)
            except subprocess.TimeoutExpired:
                status = "still running after an hour (killed)"
        finally:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait()
    return failures, slot_changes, status


def main(a):
    if not os.access(TRAINER, os.X_OK):
        sys.exit(f"soak: {TRAINER} not found: build first (scripts/build.sh)")
    rng = random.Random(a.seed)
    try:
        plan = plan_events(rng, a.events, a.ranks, a.min_ranks)
    except ValueError as e:
        sys.exit(f"soak: {e}")
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    data, run, hostfile = (os.path.join(a.out, d) for d in ("data", "soak", "hosts"))
    subprocess.run([TRAINER, "make-cifar", "--out", data, "--train", str(TRAIN_IMAGES), "--test", str(TEST_IMAGES),
                    "--seed", "7"], check=True, stdout=subprocess.DEVNULL)
    t_begin = time.time()
    print(f"soak --elastic: {a.ranks} ranks, {a.steps} steps of {a.batch} x {a.ranks} images, {a.sync} after "
          f"{a.warmup} dense steps, checkpoint every {a.checkpoint_every}; events: "
          f"{', '.join(e['kind'] + (' -> ' + str(e['slots']) if 'slots' in e else '') for e in plan)}", flush=True)
    refs = []
    for seed in range(a.train_seed, a.train_seed + a.uninterrupted):
        seconds, accuracy = uninterrupted(a, data, os.path.join(a.out, f"uninterrupted_seed{seed}"), seed)
        refs.append({"seed": seed, "seconds": round(seconds, 1), "accuracy": accuracy})
        print(f"soak: uninterrupted run, seed {seed}: {seconds:.0f} s, test accuracy {100 * accuracy:.2f}%", flush=True)

    t0 = time.time()
    failures, slot_changes, status = soak_run(a, rng, plan, data, run, hostfile)
    soak_seconds = time.time() - t0
    fig = figures(attempts(run), failures, a.checkpoint_every, a.ranks, a.steps)
    if status != 0:
        fig["problems"].append(f"the launcher exited with {status}; see {a.out}/soak.log")
    fired = len(failures) + len(slot_changes)
    if fired < len(plan):
        fig["problems"].append(f"{fired} of {len(plan)} events fired: the run finished first")
    accuracy = None
    if os.path.isfile(os.path.join(run, "summary.json")):
        accuracy = accuracy_verdict(final_accuracy(run), [r["accuracy"] for r in refs])
    resharded = sum(1 for k in range(2, fig["attempts"] + 1) if "re-sharded from" in read_text(
        os.path.join(run, "elastic", f"attempt-{k}.log")))
    result = {"mode": "elastic", "sync": a.sync, "ranks": a.ranks, "steps": a.steps, "batch_per_rank": a.batch,
              "global_batch": a.batch * a.ranks, "checkpoint_every": a.checkpoint_every, "dense_warmup": a.warmup,
              "seed": a.seed, "train_seed": a.train_seed, "plan": plan, "slot_changes": slot_changes,
              "resharded_attempts": resharded, **fig, "accuracy": accuracy, "uninterrupted": refs,
              "soak_seconds": round(soak_seconds), "total_seconds": round(time.time() - t_begin)}
    with open(os.path.join(run, "elastic", "soak.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(table(fig))
    print(f"attempts {fig['attempts']}, world sizes {', '.join(map(str, fig['world_sizes']))} ({resharded} "
          f"re-sharded); steps lost: at most {fig['steps_lost_max']}, {fig['steps_lost_total']} in all; time to "
          f"restart: median {fig['restart_s_median'] or 0:.1f} s, at most {fig['restart_s_max'] or 0:.1f} s; soak run "
          f"{soak_seconds:.0f} s")
    for r in refs:
        print(f"uninterrupted, seed {r['seed']}: test accuracy {100 * r['accuracy']:.2f}% ({r['seconds']:.0f} s)")
    if not a.keep:  # the logs and soak.json stay; the data and checkpoints go
        shutil.rmtree(data, ignore_errors=True)
        for folder in [run] + [os.path.join(a.out, f"uninterrupted_seed{r['seed']}") for r in refs]:
            shutil.rmtree(os.path.join(folder, "checkpoints"), ignore_errors=True)
    if fig["problems"]:
        print("soak: FAILED:\n  " + "\n  ".join(fig["problems"]))
        return 1
    verdict = "" if accuracy is None else (
        f"; test accuracy {100 * accuracy['elastic']:.2f}% against {100 * accuracy['uninterrupted'][0]:.2f}% "
        f"uninterrupted (spread over {len(refs)} seeds {100 * accuracy['spread']:.2f} points: "
        f"{'within' if accuracy['within_spread'] else 'OUTSIDE'} it)")
    print(f"soak: OK: {fig['attempts']} attempts on {', '.join(map(str, fig['world_sizes']))} ranks, each resumed "
          f"from the newest complete checkpoint, at most {fig['steps_lost_max']} steps lost{verdict}; "
          f"{run}/elastic/soak.json")
    return 0
