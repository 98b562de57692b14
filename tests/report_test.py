"""`trainer report` on a committed recorded run (tests/fixtures/report_run) and on a fresh 2-rank run.

Every table total is checked against sums over the raw records, computed here independently of
scripts/report_analysis.py, and against the C++ end-of-run summary (comm/summary.json). Run by ctest:
    /usr/bin/python3 tests/report_test.py            (the fixture cases)
    TRAINER_BINARY=build/trainer TRAINER_MPIEXEC="mpiexec ..." /usr/bin/python3 tests/report_test.py
"""
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest
from collections import defaultdict

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(SOURCE, "tests", "fixtures", "report_run")
sys.path.insert(0, os.path.join(SOURCE, "scripts"))
import report  # noqa: E402
import report_analysis as ra  # noqa: E402


def records(folder, kind=None):
    """Every message record of the run's comm logs (kind="compute": the steps' FORWARD_BACKWARD
    intervals instead), with its rank."""
    out = []
    comm = os.path.join(folder, "comm")
    for name in sorted(os.listdir(comm)):
        if name.startswith("rank") and name.endswith(".jsonl"):
            with open(os.path.join(comm, name)) as f:
                out += [dict(json.loads(line), rank=int(name[4:-6])) for line in f if line.strip()]
    return [r for r in out if r.get("kind") == kind]


def markdown_table(text, heading):
    """The first table after `heading`, as (header, rows of cells)."""
    lines = text[text.index(heading):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append([c.strip() for c in line.strip("|").split("|")])
    return table[0], table[2:]


class ReportChecks:
    """Checks of one report against its run folder."""

    def check_report(self, folder, out):
        with open(os.path.join(out, "report.md")) as f:
            text = f.read()
        recs = records(folder)
        by_op = defaultdict(lambda: {"calls": 0, "bytes": 0, "bytes_recv": 0, "time_us": 0, "ranks": defaultdict(int)})
        for r in recs:
            o = by_op[r["op"]]
            o["calls"] += 1
            o["bytes"] += r["bytes"]
            o["bytes_recv"] += r["bytes_recv"]
            o["time_us"] += r["t_end_us"] - r["t_start_us"]
            o["ranks"][r["rank"]] += 1

        # Per op: every row and the total row equal the sums over the records; counts are labelled.
        header, rows = markdown_table(text, "## Communication per op")
        self.assertIn("calls (all ranks)", header)
        self.assertIn("calls per rank", header)
        self.assertIn("summed over all", text)
        col = {name: i for i, name in enumerate(header)}
        table_ops = {row[0]: row for row in rows}
        self.assertEqual(set(table_ops) - {"**total**"}, set(by_op))
        for op, o in by_op.items():
            row = table_ops[op]
            self.assertEqual(int(row[col["calls (all ranks)"]]), o["calls"], op)
            self.assertEqual(row[col["sent MB"]], f"{o['bytes'] / 1e6:.3f}", op)
            self.assertEqual(row[col["recv MB"]], f"{o['bytes_recv'] / 1e6:.3f}", op)
            self.assertEqual(row[col["time ms"]], f"{o['time_us'] / 1e3:.3f}", op)
            per_rank = list(o["ranks"].values())
            want = str(per_rank[0]) if min(per_rank) == max(per_rank) else f"{min(per_rank)}-{max(per_rank)}"
            self.assertEqual(row[col["calls per rank"]], want, op)
        total = table_ops["**total**"]
        self.assertEqual(int(total[col["calls (all ranks)"]]), len(recs))
        self.assertEqual(total[col["sent MB"]], f"{sum(r['bytes'] for r in recs) / 1e6:.3f}")
        self.assertEqual(total[col["recv MB"]], f"{sum(r['bytes_recv'] for r in recs) / 1e6:.3f}")
        self.assertEqual(total[col["time ms"]],
                         f"{sum(r['t_end_us'] - r['t_start_us'] for r in recs) / 1e3:.3f}")
        shares = sum(float(row[col["time %"]]) for op, row in table_ops.items() if op != "**total**")
        self.assertAlmostEqual(shares, 100.0, delta=0.05 * len(by_op) + 1e-9)

        # The analysis module's exact integers: the same sums, and the C++ summary's.
        run = ra.Run(folder)
        ops, tot = ra.op_table(run)
        self.assertEqual(tot["calls"], len(recs))
        self.assertEqual(tot["bytes"], sum(r["bytes"] for r in recs))
        for row in ops:
            self.assertEqual(row["calls"], by_op[row["op"]]["calls"])
            self.assertEqual(sum(row["calls_by_rank"]), row["calls"])
            self.assertEqual(len(row["sizes"]), row["calls"])
        with open(os.path.join(folder, "comm", "summary.json")) as f:
            summary = json.load(f)
        for o in summary["ops"]:
            mine = next(r for r in ops if r["op"] == o["op"])
            for key in ("calls", "bytes", "bytes_recv", "time_us"):
                self.assertEqual(mine[key], o[key], (o["op"], key))
            self.assertEqual(mine["kind"], o["kind"])
            sizes = sorted(s for s, c in o["sizes"] for _ in range(c))
            self.assertEqual(sorted(mine["sizes"]), sizes, o["op"])
        self.assertEqual(ra.summary_mismatches(run, ops), [])
        self.assertIn("Every row equals the end-of-run summary", text)

        # Per phase: calls are the gradient-sync records of the phase; per step per rank divides by
        # steps x ranks.
        header, rows = markdown_table(text, "## Per phase")
        col = {name: i for i, name in enumerate(header)}
        for row in rows:
            phase = row[col["phase"]]
            mine = [r for r in recs if r["phase"] == phase and not ra.is_bookkeeping(r["op"])]
            steps = len({r["step"] for r in mine})
            self.assertEqual(int(row[col["steps"]]), steps)
            self.assertEqual(int(row[col["calls (all ranks)"]]), len(mine))
            self.assertEqual(row[col["calls per step per rank"]], f"{len(mine) / (steps * run.world):.2f}")
        # Time split: the phases' steps add up to the run's, and each column to the metrics' sums.
        with open(os.path.join(folder, "metrics.jsonl")) as f:
            train = [m for m in map(json.loads, f) if "loss" in m and "split" not in m]
        header, rows = markdown_table(text, "Time split of rank 0")
        col = {name: i for i, name in enumerate(header)}
        self.assertEqual(sum(int(row[col["steps"]]) for row in rows), train[-1]["step"])
        steps = [m["step"] - p for m, p in zip(train, [0] + [m["step"] for m in train])]
        for key in ("data", "compute", "sync"):
            want = sum(m[f"t_{key}_ms"] * n for m, n in zip(train, steps)) / 1e3
            got = sum(float(row[col[key]].split()[0]) for row in rows)
            self.assertAlmostEqual(got, want, delta=0.006 * len(rows), msg=key)
        # Communication hidden behind compute: per phase, rank 0's gradient-sync time per step (union
        # of its calls) and the part inside the step's FORWARD_BACKWARD, recomputed by brute force
        # over microseconds.
        compute = {(r["step"], r["phase"]): (r["t_start_us"], r["t_end_us"])
                   for r in records(folder, "compute") if r["rank"] == 0}
        if compute:
            header, rows = markdown_table(text, "Communication hidden behind compute")
            col = {name: i for i, name in enumerate(header)}
            for row in rows:
                phase = row[col["phase"]]
                keys = [k for k in compute if k[1] == phase]
                comm_us = hidden_us = 0
                for key in keys:
                    busy = set()
                    for r in recs:
                        if r["rank"] == 0 and (r["step"], r["phase"]) == key and not ra.is_bookkeeping(r["op"]):
                            busy.update(range(r["t_start_us"], r["t_end_us"]))
                    comm_us += len(busy)
                    hidden_us += sum(1 for t in busy if compute[key][0] <= t < compute[key][1])
                self.assertEqual(int(row[col["logged steps"]]), len(keys))
                self.assertEqual(row[col["communication ms"]], f"{comm_us / len(keys) / 1e3:.2f}")
                self.assertEqual(row[col["during backward ms"]], f"{hidden_us / len(keys) / 1e3:.2f}")
        for png in ("message_sizes.png", "bytes_per_step.png", "density.png", "region_balance.png"):
            self.assertGreater(os.path.getsize(os.path.join(out, png)), 1000, png)
        return text, run


    def check_wait_split(self, folder, text):
        """The straggler tables: wait and transfer (time - wait) per rank and per op equal the sums over
        the records that carry wait_us."""
        recs = [r for r in records(folder) if "wait_us" in r]
        self.assertTrue(recs)
        header, rows = markdown_table(text, "### Straggler wait")
        by_row = {row[0]: row[1:] for row in rows}
        for rank in range(len(header) - 1):
            mine = [r for r in recs if r["rank"] == rank]
            wait = sum(r["wait_us"] for r in mine)
            time = sum(r["t_end_us"] - r["t_start_us"] for r in mine)
            self.assertEqual(by_row["wait ms"][rank], f"{wait / 1e3:.3f}")
            self.assertEqual(by_row["transfer ms"][rank], f"{(time - wait) / 1e3:.3f}")
        header, rows = markdown_table(text, "| op | time ms (all ranks)")
        self.assertEqual({row[0] for row in rows}, {r["op"] for r in recs})
        for row in rows:
            mine = [r for r in recs if r["op"] == row[0]]
            wait = sum(r["wait_us"] for r in mine)
            time = sum(r["t_end_us"] - r["t_start_us"] for r in mine)
            self.assertEqual(row[1:4], [f"{time / 1e3:.3f}", f"{wait / 1e3:.3f}", f"{(time - wait) / 1e3:.3f}"])

    def check_scaling(self, folder, out, binary, latency="50us"):
        """The scalability view: each cell is `trainer whatif --json` at that bandwidth; more bandwidth
        never predicts a slower step or a lower E(P); the figure is written."""
        with open(os.path.join(out, "report.md")) as f:
            text = f.read()
        header, rows = markdown_table(text, "## Scalability against bandwidth")
        self.assertEqual([row[0] for row in rows], list(ra.SCALING_BANDWIDTHS))
        phases = [h.rsplit(" ", 1)[1] for h in header[1:]]
        self.assertIn("dense", phases)
        for row in rows:
            done = subprocess.run([binary, "whatif", folder, "--bandwidth", row[0], "--latency", latency, "--json"],
                                  capture_output=True, text=True, check=True)
            want = {p["phase"]: p for p in json.loads(done.stdout)["phases"]}
            for phase, cell in zip(phases, row[1:]):
                self.assertEqual(cell, f"{want[phase]['step_ms']:.1f} / {want[phase]['efficiency']:.3f}", row[0])
        for i, phase in enumerate(phases):
            step = [float(row[1 + i].split(" / ")[0]) for row in rows]
            eff = [float(row[1 + i].split(" / ")[1]) for row in rows]
            self.assertEqual(step, sorted(step, reverse=True), phase)
            self.assertEqual(eff, sorted(eff), phase)
            self.assertLess(eff[0], eff[-1], phase)  # 100 Mbit/s costs this run something
        self.assertGreater(os.path.getsize(os.path.join(out, "scaling.png")), 1000)
        return text


class FixtureTest(unittest.TestCase, ReportChecks):
    def test_tables_equal_sums_over_records(self):
        with tempfile.TemporaryDirectory() as out:
            self.assertEqual(report.main([FIXTURE, "--out", out]), 0)
            text, run = self.check_report(FIXTURE, out)
        # The fixture's schedule: 2 dense steps of one bucket, 4 compressed, regions every 2 steps.
        self.assertIn("| ALLREDUCE_DENSE | 4 | 4 | yes |", text)
        self.assertIn("| ALLGATHERV_FINAL | 8 | 8 | yes |", text)
        self.assertIn("| ALLREDUCE_REGION | 4 | 4 | yes |", text)
        self.assertIn("Not recorded", text)  # no wait field in this log version
        self.assertIn("Not computed: the model is `trainer whatif`", text)  # no --trainer given

    def test_dense_volume_matches_formula(self):
        run = ra.Run(FIXTURE)
        dense = ra.phase_table(run)[0]
        # A dense step allreduces the whole gradient: the ring sends exactly 2n(P-1)/P words per rank.
        self.assertEqual(dense["theory_bytes"], 4 * 2 * run.info["n"] * (run.world - 1) / run.world)
        self.assertAlmostEqual(dense["measured_over_theory"], 1.0, places=12)

    def test_straggler_wait_when_recorded(self):
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(tmp, "run")
            shutil.copytree(FIXTURE, folder)
            for r in range(2):
                path = os.path.join(folder, "comm", f"rank{r}.jsonl")
                with open(path) as f:
                    recs = [json.loads(line) for line in f]
                with open(path, "w") as f:
                    for rec in recs:
                        rec["wait_us"] = 10 * (r + 1)
                        f.write(json.dumps(rec) + "\n")
            run = ra.Run(folder)
            field, per_rank, _ = ra.wait_split(run)
            self.assertEqual(field, "wait_us")
            self.assertEqual([wait for _, wait in per_rank], [10 * len(records(FIXTURE)) / 2, 20 * len(records(FIXTURE)) / 2])
            with tempfile.TemporaryDirectory() as out:
                self.assertEqual(report.main([folder, "--out", out]), 0)
                with open(os.path.join(out, "report.md")) as f:
                    text = f.read()
            self.check_wait_split(folder, text)

    def test_missing_rank_file_is_one_clear_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(tmp, "run")
            shutil.copytree(FIXTURE, folder)
            os.remove(os.path.join(folder, "comm", "rank1.jsonl"))
            with self.assertRaisesRegex(ra.RunError, r"comm/rank1\.jsonl: missing"):
                ra.Run(folder)

    def test_adaptive_switches_reported(self):
        # sync.adaptive: the metrics' low_compression share and the comm log's ADAPTIVE_SWITCH records
        # (after step 3 on every rank) become the report's section and marks on the density plot.
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(tmp, "run")
            shutil.copytree(FIXTURE, folder)
            path = os.path.join(folder, "metrics.jsonl")
            with open(path) as f:
                lines = [json.loads(line) for line in f if line.strip()]
            shares = iter([1.0, 0.25])
            with open(path, "w") as f:
                for m in lines:
                    if m.get("phase") == "compressed" and "loss" in m:
                        m["low_compression"] = next(shares, 0.25)
                    f.write(json.dumps(m) + "\n")
            for r in range(2):
                with open(os.path.join(folder, "comm", f"rank{r}.jsonl"), "a") as f:
                    f.write(json.dumps({"step": 3, "phase": "compressed", "op": "ADAPTIVE_SWITCH", "bytes": 0,
                                        "bytes_recv": 0, "peer": -1, "t_start_us": 5, "t_end_us": 5}) + "\n")
            self.assertEqual(report.adaptive_switches(ra.Run(folder)), [3])
            with tempfile.TemporaryDirectory() as out:
                self.assertEqual(report.main([folder, "--out", out]), 0)
                with open(os.path.join(out, "report.md")) as f:
                    text = f.read()
            self.assertIn("## Adaptive compression", text)
            self.assertIn("Switches (ADAPTIVE_SWITCH in the comm log): 1, after steps 3.", text)
            header, rows = markdown_table(text, "Low-compression share by metrics record")
            self.assertEqual([row[1] for row in rows], ["1.000", "0.250"])
        # A run without sync.adaptive has no such section.
        with tempfile.TemporaryDirectory() as out:
            self.assertEqual(report.main([FIXTURE, "--out", out]), 0)
            with open(os.path.join(out, "report.md")) as f:
                self.assertNotIn("## Adaptive compression", f.read())

    def test_two_runs_compared(self):
        with tempfile.TemporaryDirectory() as out:
            self.assertEqual(report.main([FIXTURE, FIXTURE, "--out", out, "--seed-check"]), 0)
            with open(os.path.join(out, "report.md")) as f:
                text = f.read()
            self.assertIn("## Runs compared", text)
            self.assertIn("## The published analyses' counts", text)
            self.assertTrue(os.path.isfile(os.path.join(out, "compare_loss.png")))

    def test_diverged_run_is_marked(self):
        # The divergence guard's record (as trainer/worker.cpp writes it) ends the run's metrics.
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(tmp, "run")
            shutil.copytree(FIXTURE, folder)
            message = ("diverged: sync.method = oktopk (sync.density = 0.02; sync.dense_warmup_steps = 2, optim.lr = "
                       "0.1) after its dense warmup (switched after step 2): the mean training loss over the 2 steps "
                       "to step 6 is 9.1, above 1.5 x the 2.3 of the 2 steps to step 2 (before the switch)")
            with open(os.path.join(folder, "metrics.jsonl"), "a") as f:
                f.write(json.dumps({"step": 6, "diverged": True, "switch_step": 2, "reference_loss": 2.3,
                                    "window_loss": 9.1, "factor": 1.5, "checkpoint": "ck/step_6",
                                    "message": message}) + "\n")
            run = ra.Run(folder)
            self.assertEqual(run.diverged["step"], 6)
            self.assertNotIn(run.diverged, run.train)  # not a loss record: the curves are unchanged
            with tempfile.TemporaryDirectory() as out:
                self.assertEqual(report.main([folder, FIXTURE, "--out", out]), 0)
                with open(os.path.join(out, "report.md")) as f:
                    text = f.read()
            # Said before everything else, with the line, the levels and their ratio.
            self.assertLess(text.index("## Diverged"), text.index("## Overall"))
            self.assertIn("**This run diverged and was stopped**", text)
            self.assertIn("> " + message, text)
            _, rows = markdown_table(text, "## Diverged")
            self.assertEqual(rows, [["6", "2", "2.3", "9.1", "3.96", "ck/step_6"]])
            # In the comparison only the diverged run is marked.
            _, compared = markdown_table(text, "## Runs compared")
            self.assertEqual(compared[0][0], "run (**diverged** at step 6)")
            self.assertEqual(compared[1][0], "report_run")
        # A run that finished has no such section.
        with tempfile.TemporaryDirectory() as out:
            self.assertEqual(report.main([FIXTURE, "--out", out]), 0)
            with open(os.path.join(out, "report.md")) as f:
                self.assertNotIn("Diverged", f.read())


@unittest.skipUnless(os.environ.get("TRAINER_BINARY"), "TRAINER_BINARY not set")
class ScriptsBesideTheBinaryTest(unittest.TestCase):
    def test_the_build_copies_the_report_scripts_beside_the_binary(self):
        """`trainer report` looks beside the binary first, so a build copied away from the source
        tree (a GPU machine's bundle) still reports: the build keeps current copies there."""
        beside = os.path.join(os.path.dirname(os.path.abspath(os.environ["TRAINER_BINARY"])), "scripts")
        for name in ("report.py", "report_analysis.py", "report_seed_check.py"):
            with open(os.path.join(beside, name), "rb") as copy, open(os.path.join(SOURCE, "scripts", name), "rb") as f:
                self.assertEqual(copy.read(), f.read(), name)


@unittest.skipUnless(os.environ.get("TRAINER_BINARY"), "TRAINER_BINARY not set")
class FixtureScalingTest(unittest.TestCase, ReportChecks):
    def test_scaling_view_is_the_whatif_model(self):
        binary = os.environ["TRAINER_BINARY"]
        with tempfile.TemporaryDirectory() as out:
            self.assertEqual(report.main([FIXTURE, "--out", out, "--trainer", binary, "--latency", "20us"]), 0)
            text = self.check_scaling(FIXTURE, out, binary, "20us")
        self.assertIn("report_run: dense", text)
        self.assertIn("report_run: compressed", text)
        self.assertIn("**nominal** link rates", text)

    def test_calibrated_row_is_whatif_at_the_calibration(self):
        """With --calibration the view gains a row at the file's rates, equal to `trainer whatif --calibration`,
        and says which rates those are; the nominal rows stay as they were."""
        binary = os.environ["TRAINER_BINARY"]
        fit = {"allreduce": {"latency_s": 142e-6, "bandwidth_bytes_per_s": 8.59e6, "max_relative_error": 0.05},
               "p2p": {"latency_s": 95e-6, "bandwidth_bytes_per_s": 10e6, "max_relative_error": 0.03}}
        calibration = {"format": "trainer network calibration", "version": 1, "ranks": 2, "hosts": ["a", "b"],
                       "cpu": "test", "isa": "avx2", "mpi": "Open MPI", "date": "2026-11-24T07:00:00Z",
                       "nominal_bandwidth_bytes_per_s": 12.5e6, "repeats": 5,
                       "measurements": {"allreduce": [], "p2p": []}, "fit": fit}
        with tempfile.TemporaryDirectory() as out:
            path = os.path.join(out, "net.json")
            with open(path, "w") as f:
                json.dump(calibration, f)
            self.assertEqual(report.main([FIXTURE, "--out", out, "--trainer", binary, "--latency", "20us",
                                          "--calibration", path]), 0)
            with open(os.path.join(out, "report.md")) as f:
                text = f.read()
            done = subprocess.run([binary, "whatif", FIXTURE, "--calibration", path, "--json"],
                                  capture_output=True, text=True, check=True)
        header, rows = markdown_table(text, "## Scalability against bandwidth")
        self.assertEqual([row[0] for row in rows], list(ra.SCALING_BANDWIDTHS) + ["calibrated"])
        self.assertIn("68.7 Mbit/s achieved allreduce bus rate, 142 us latency (69% of the nominal 100 Mbit/s)", text)
        self.assertIn("measured at P=2 on 2026-11-24T07:00:00Z", text)
        want = {p["phase"]: p for p in json.loads(done.stdout)["phases"]}
        phases = [h.rsplit(" ", 1)[1] for h in header[1:]]
        for phase, cell in zip(phases, rows[-1][1:]):
            self.assertEqual(cell, f"{want[phase]['step_ms']:.1f} / {want[phase]['efficiency']:.3f}")
        # A bad file is one error line from `trainer report`, before the script runs.
        bad = subprocess.run([binary, "report", FIXTURE, "--calibration", path + ".absent"], capture_output=True,
                             text=True)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn(path + ".absent: cannot open the calibration file", bad.stderr)


@unittest.skipUnless(os.environ.get("TRAINER_BINARY"), "TRAINER_BINARY not set")
class FreshRunTest(unittest.TestCase, ReportChecks):
    def test_fresh_two_rank_run(self):
        binary = os.environ["TRAINER_BINARY"]
        mpiexec = shlex.split(os.environ["TRAINER_MPIEXEC"])
        with tempfile.TemporaryDirectory() as tmp:
            data, run_dir = os.path.join(tmp, "data"), os.path.join(tmp, "run")
            subprocess.run([binary, "make-cifar", "--out", data, "--train", "64", "--test", "20"], check=True,
                           stdout=subprocess.DEVNULL)
            sets = ["data.root=" + data, "data.synthesize_if_missing=false", "data.batch_size=8",
                    "data.eval_batch_size=20", "train.max_steps=5", "train.log_every_steps=1", "runtime.threads=1",
                    "data.loader_threads=1", "sync.method=oktopk", "sync.density=0.05", "sync.dense_warmup_steps=2",
                    "experiment.output_dir=" + run_dir]
            cmd = mpiexec + ["-n", "2", "-x", "OMP_WAIT_POLICY=passive", binary, "--config",
                             os.path.join(SOURCE, "configs", "quickstart_cifar.toml")]
            for s in sets:
                cmd += ["--set", s]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            done = subprocess.run([binary, "report", run_dir], capture_output=True, text=True)
            self.assertEqual(done.returncode, 0, done.stderr)
            out = os.path.join(run_dir, "report")
            self.assertIn(os.path.join(out, "report.md"), done.stdout)
            self.check_report(run_dir, out)
            self.check_scaling(run_dir, out, binary)
            with open(os.path.join(out, "report.md")) as f:
                self.check_wait_split(run_dir, f.read())
            bad = subprocess.run([binary, "report", run_dir, "--latency", "5 parsecs"], capture_output=True, text=True)
            self.assertNotEqual(bad.returncode, 0)
            self.assertIn("latency '5 parsecs'", bad.stderr)
            # A folder that is not a run: one line naming the missing file, non-zero exit.
            os.remove(os.path.join(run_dir, "metrics.jsonl"))
            bad = subprocess.run([binary, "report", run_dir], capture_output=True, text=True)
            self.assertNotEqual(bad.returncode, 0)
            self.assertIn("metrics.jsonl: missing", bad.stderr)


if __name__ == "__main__":
    unittest.main()
