"""scripts/study end to end: a two-method study at 2 ranks on the unshaped network writes its report
(each number the table gives for bytes recomputed here from the comm logs), does not rerun complete
runs, resumes an interrupted one from its checkpoint, and refuses bad study files with one line.
scripts/seed_table over the same runs: means, spreads and bytes after the warmup recomputed here.
Run by ctest with TRAINER_BINARY set:
    TRAINER_BINARY=build/trainer /usr/bin/python3 tests/study_test.py
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDY = os.path.join(SOURCE, "scripts", "study")
SEED_TABLE = os.path.join(SOURCE, "scripts", "seed_table")
TRAINER = os.environ.get("TRAINER_BINARY", os.path.join(SOURCE, "build", "trainer"))

TINY = """
config = "configs/quickstart_cifar.toml"
ranks = 2
bandwidths = ["none"]
set = ["train.max_steps=8", "train.eval_every_steps=4", "data.batch_size=16", "data.eval_batch_size=100",
       "runtime.threads=1", "data.loader_threads=1", "train.checkpoint_every=4"]
target = 0.01

[[method]]
name = "dense"
set = ["sync.method=dense"]

[[method]]
name = "diloco-int8"
set = ["sync.method=diloco", "sync.period=4", "sync.outer_dtype=int8"]
"""


def study(path, out, *extra):
    return subprocess.run([sys.executable, STUDY, path, "--out", out, "--trainer", TRAINER, *extra],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# The step's verdict, evaluation, checkpoint, barrier and summary calls: bookkeeping, not gradient sync.
BOOKKEEPING = ("ALLREDUCE_CHECK", "ALLREDUCE_EVAL", "CHECKPOINT_", "BARRIER_", "SUMMARY_")


def is_sync_message(rec):
    return rec.get("kind") != "compute" and not rec["op"].startswith(BOOKKEEPING)


def sent_per_rank(run):
    """Bytes the comm logs record leaving each rank for gradient sync, mean over ranks."""
    files = glob.glob(os.path.join(run, "comm", "rank*.jsonl"))
    total = 0
    for name in files:
        with open(name) as f:
            for line in f:
                rec = json.loads(line)
                if is_sync_message(rec):
                    total += rec["bytes"]
    return total / len(files)


def sent_after_warmup_per_step(run):
    """Bytes each rank sent for gradient sync per step of the compressed phase (all steps when the
    run has none), from the comm logs."""
    files = glob.glob(os.path.join(run, "comm", "rank*.jsonl"))
    records = []
    for name in files:
        with open(name) as f:
            records += [json.loads(line) for line in f]
    phase = "compressed" if any(r["phase"] == "compressed" for r in records) else "dense"
    steps = {r["step"] for r in records if r.get("kind") == "compute" and r["phase"] == phase}
    sent = sum(r["bytes"] for r in records if r["phase"] == phase and is_sync_message(r))
    return sent / len(files) / len(steps)


def final_accuracy(run):
    with open(os.path.join(run, "summary.json")) as f:
        return json.load(f)["final_accuracy"]


def table_rows(markdown):
    lines = [l for l in markdown.splitlines() if l.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in l.strip("|").split("|")))) for l in lines[1:]]


def human_bytes(text):
    value, unit = text.split()
    return float(value) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]


class StudyTest(unittest.TestCase):
    def test_runs_reports_skips_and_resumes(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tiny.toml")
            with open(path, "w") as f:
                f.write(TINY)
            out = os.path.join(tmp, "out")
            first = study(path, out)
            self.assertEqual(first.returncode, 0, first.stdout)
            with open(os.path.join(out, "study.md")) as f:
                report = f.read()
            self.assertTrue(os.path.isfile(os.path.join(out, "curves_none.png")))
            rows = {r["method"]: r for r in table_rows(report)}
            self.assertEqual(set(rows), {"dense", "diloco-int8"})
            for name, row in rows.items():
                want = sent_per_rank(os.path.join(out, "none", name))
                self.assertAlmostEqual(human_bytes(row["sent in all per rank"]) / want, 1.0, delta=0.01, msg=name)
                self.assertEqual(row["steps"], "8")
            # DiLoCo int8 sends about a quarter of fp32 every 4 steps: far less than dense.
            self.assertLess(human_bytes(rows["diloco-int8"]["sent in all per rank"]),
                            0.2 * human_bytes(rows["dense"]["sent in all per rank"]))
            # The target (accuracy 0.01) is reached at the first evaluation by both.
            self.assertEqual(rows["dense"]["steps to target"], "4")
            self.assertIn("First to accuracy >= 0.01", report)

            self.check_seed_table(tmp, os.path.join(out, "none"))

            again = study(path, out)
            self.assertEqual(again.returncode, 0, again.stdout)
            self.assertEqual(again.stdout.count("complete, not run again"), 2, again.stdout)

            os.remove(os.path.join(out, "none", "dense", "summary.json"))  # as if interrupted
            resumed = study(path, out)
            self.assertEqual(resumed.returncode, 0, resumed.stdout)
            line = next(l for l in resumed.stdout.splitlines() if " dense:" in l)
            self.assertIn("--resume latest", line)
            self.assertTrue(os.path.isfile(os.path.join(out, "none", "dense", "summary.json")))

    def check_seed_table(self, tmp, runs):
        """A second seed of dense (a copy of the first, so the spread is 0) in another folder, and a
        third that has not finished (no summary; its comm log cut inside a record)."""
        seeds = os.path.join(tmp, "seeds")
        shutil.copytree(os.path.join(runs, "dense"), os.path.join(seeds, "dense-s1"))
        shutil.copytree(os.path.join(runs, "dense"), os.path.join(seeds, "dense-s2"))
        os.remove(os.path.join(seeds, "dense-s2", "summary.json"))
        with open(os.path.join(seeds, "dense-s2", "comm", "rank0.jsonl"), "a") as f:
            f.write('{"step": 9, "pha')
        p = subprocess.run([sys.executable, SEED_TABLE, runs, seeds], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        self.assertEqual(p.returncode, 0, p.stdout)
        rows = {r["method"]: r for r in table_rows(p.stdout)}
        self.assertEqual(list(rows), ["dense", "diloco-int8"])  # the baseline first
        dense, diloco = final_accuracy(os.path.join(runs, "dense")), final_accuracy(os.path.join(runs, "diloco-int8"))
        self.assertEqual(rows["dense"]["seed 0"], rows["dense"]["seed 1"])
        self.assertEqual(rows["dense"]["seed 2"], "incomplete")  # and left out of the mean:
        self.assertEqual(rows["dense"]["mean accuracy"], f"{100 * dense:.2f}%")
        self.assertEqual(rows["dense"]["spread"], "0.0")
        self.assertEqual(rows["diloco-int8"]["seed 1"], "")
        # The difference of the fractions in points, rounded once, as seed_table writes it (the
        # difference of the two percents can round the other way near a half).
        self.assertEqual(rows["diloco-int8"]["against dense"], f"{100 * (diloco - dense):+.1f}")
        sent = {}
        for name in rows:
            sent[name] = sent_after_warmup_per_step(os.path.join(runs, name))
            self.assertAlmostEqual(human_bytes(rows[name]["sent per step after the warmup"]) / sent[name], 1.0,
                                   delta=0.01, msg=name)
        ratio = float(rows["diloco-int8"]["fewer than dense"].rstrip("x"))
        self.assertAlmostEqual(ratio / (sent["dense"] / sent["diloco-int8"]), 1.0, delta=0.06)
        bad = subprocess.run([sys.executable, SEED_TABLE, seeds, "--baseline", "nothing"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("no runs of the baseline 'nothing'", bad.stdout)

    def test_bad_study_files_are_one_line_naming_the_key(self):
        cases = {
            "ranks = 2\nbandwidths = [\"none\"]\n[[method]]\nname = \"a\"\n": "'config' is missing",
            TINY.replace("ranks = 2", "ranks = \"two\""): "'ranks' must be int",
            TINY.replace("target = 0.01", "targte = 0.01"): "unknown key 'targte'",
            TINY.replace('set = ["sync.method=dense"]', 'set = ["sync.method"]'): "'method[0].set'",
            TINY.replace('name = "diloco-int8"', 'name = "dense"'): "'method[1].name' must be unique",
            TINY.replace("quickstart_cifar", "nowhere"): "'config' = \"configs/nowhere.toml\"",
        }
        with tempfile.TemporaryDirectory() as tmp:
            for text, message in cases.items():
                path = os.path.join(tmp, "bad.toml")
                with open(path, "w") as f:
                    f.write(text)
                p = study(path, os.path.join(tmp, "out"), "--dry-run")
                self.assertEqual(p.returncode, 2, p.stdout)
                self.assertEqual(len(p.stdout.strip().splitlines()), 1, p.stdout)
                self.assertIn(message, p.stdout)
                self.assertIn(path, p.stdout)


    def test_only_runs_the_named_methods_and_refuses_an_unknown_name(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tiny.toml")
            with open(path, "w") as f:
                f.write(TINY)
            p = study(path, os.path.join(tmp, "out"), "--only", "diloco-int8", "--dry-run")
            self.assertEqual(p.returncode, 0, p.stdout)
            runs = [line for line in p.stdout.splitlines() if line.startswith("[")]
            self.assertEqual(len(runs), 1, p.stdout)
            self.assertTrue(runs[0].startswith("[1/1] none diloco-int8: "), p.stdout)
            p = study(path, os.path.join(tmp, "out"), "--only", "dense,dgc", "--dry-run")
            self.assertEqual(p.returncode, 2, p.stdout)
            self.assertEqual(len(p.stdout.strip().splitlines()), 1, p.stdout)
            self.assertIn("--only: no method 'dgc' in the study (it has: dense, diloco-int8)", p.stdout)

    def test_prepare_runs_before_the_runs_only_when_its_path_is_missing(self):
        with tempfile.TemporaryDirectory() as tmp:
            made = os.path.join(tmp, "made")
            path = os.path.join(tmp, "prep.toml")
            def write(command):
                with open(path, "w") as f:
                    f.write(TINY.replace("[[method]]", "[prepare]\ncreates = %s\ncommand = %s\n\n[[method]]" % (
                        json.dumps(made), json.dumps(command)), 1))
            write(["mkdir", made])
            p = study(path, os.path.join(tmp, "out"), "--dry-run")  # says what it would run, runs nothing
            self.assertEqual(p.returncode, 0, p.stdout)
            self.assertIn("prepare: %s is missing: mkdir %s" % (made, made), p.stdout)
            self.assertFalse(os.path.exists(made))
            write(["true"])  # succeeds without making the path: an error before any run
            p = study(path, os.path.join(tmp, "out"))
            self.assertEqual(p.returncode, 2, p.stdout)
            self.assertIn("'prepare' did not make " + made, p.stdout)
            self.assertFalse(os.path.exists(os.path.join(tmp, "out", "none")))
            os.mkdir(made)
            p = study(path, os.path.join(tmp, "out"), "--dry-run")  # present: not run again
            self.assertNotIn("prepare:", p.stdout)
            write("mkdir")
            p = study(path, os.path.join(tmp, "out"), "--dry-run")
            self.assertEqual(p.returncode, 2, p.stdout)
            self.assertIn("'prepare.command' must be list", p.stdout)


if __name__ == "__main__":
    unittest.main()
