#!/usr/bin/python3
"""scripts/horizon_table over a records file and a run folder together: each horizon's gap, seeds
and spread, the "within 1 point from" horizon, bytes ratios and T/tau recomputed here from the
records; a run in a folder outranks its record (and a final the rerun does not reproduce is said);
--save-records writes what the next session reads back to the same table; a bad record is one line
naming the file and line, and a non-zero exit."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(SOURCE, "scripts", "horizon_table")
# A complete recorded run: Ok-Top-k at density 0.02, 6 steps, 2 ranks, final accuracy 0.1.
FIXTURE = os.path.join(SOURCE, "tests", "fixtures", "report_run")


def record(steps, method, seed, final, bytes_per_step, sync="dense", density=None, wire="fp32"):
    return {"steps": steps, "method": method, "seed": seed, "final": final, "key": "accuracy",
            "bytes": bytes_per_step, "sync": sync, "density": density, "wire": wire, "source": "test"}


def rows_of(table):
    """{method: [cells]} of the Markdown table."""
    rows = {}
    for line in table.splitlines():
        if line.startswith("| ") and not line.startswith("| method") and "---" not in line:
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


class HorizonTable(unittest.TestCase):
    def run_table(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)

    def write_records(self, path, records):
        with open(path, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")

    def test_records_and_a_folder_make_one_table(self):
        with tempfile.TemporaryDirectory() as tmp:
            # Horizon 6 steps: the fixture run as "topk-2%" (final 0.1) in a folder, and dense in
            # the records; a stale record of topk-2% at 0.15 that the folder's run replaces.
            folder = os.path.join(tmp, "h6")
            shutil.copytree(FIXTURE, os.path.join(folder, "topk-2%"))
            dense_bf16 = 1000.0
            records = [
                record(6, "dense-bf16", 0, 0.20, dense_bf16, wire="bf16"),
                record(6, "topk-2%", 0, 0.15, 50.0, sync="oktopk", density=0.02),
                # Horizon 600 steps: two seeds of each; topk-2% ends within a point on average.
                record(600, "dense-bf16", 0, 0.900, dense_bf16, wire="bf16"),
                record(600, "dense-bf16", 1, 0.880, dense_bf16, wire="bf16"),
                record(600, "topk-2%", 0, 0.890, 40.0, sync="oktopk", density=0.02),
                record(600, "topk-2%", 1, 0.880, 60.0, sync="oktopk", density=0.02),
            ]
            recorded = os.path.join(tmp, "kept.jsonl")
            self.write_records(recorded, records)
            saved = os.path.join(tmp, "saved.jsonl")
            done = self.run_table(folder, "--records", recorded, "--save-records", saved)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn("topk-2% seed 0 at 6 steps", done.stderr)  # the stale record, said
            rows = rows_of(done.stdout)

            # At 6 steps: the folder's 0.1 against dense's 0.2; at 600: the means over both seeds.
            self.assertEqual(rows["topk-2%"][0], f"{100 * (0.1 - 0.20):+.1f}")
            gap600 = 100 * ((0.890 + 0.880) / 2 - (0.900 + 0.880) / 2)
            spread600 = 100 * (0.890 - 0.880)
            self.assertEqual(rows["topk-2%"][1], f"{gap600:+.1f} (2 seeds, spread {spread600:.1f})")
            # Bytes from the longest horizon (the mean over its seeds), the ratios to fp32 dense
            # (twice the bf16 baseline) and to the baseline, T/tau = 600 x 0.02, within from 600.
            sent = (40.0 + 60.0) / 2
            self.assertEqual(rows["topk-2%"][2], f"{sent:.0f} B")
            self.assertEqual(rows["topk-2%"][3], f"{2 * dense_bf16 / sent:.1f}x")
            self.assertEqual(rows["topk-2%"][4], f"{dense_bf16 / sent:.1f}x")
            self.assertEqual(rows["topk-2%"][5], f"{600 * 0.02:.0f}")
            self.assertEqual(rows["topk-2%"][6], "600 steps")
            self.assertEqual(rows["dense-bf16"][:2], ["baseline", "baseline"])

            # The saved records alone make the same table, the folder's run among them.
            kept = [json.loads(line) for line in open(saved)]
            self.assertEqual(len(kept), 6)
            folder_run = next(r for r in kept if r["steps"] == 6 and r["method"] == "topk-2%")
            self.assertEqual((folder_run["final"], folder_run["sync"], folder_run["density"]), (0.1, "oktopk", 0.02))
            again = self.run_table("--records", saved)
            self.assertEqual(again.returncode, 0, again.stderr)
            self.assertEqual(again.stdout, done.stdout)

    def test_bad_records_are_one_line_naming_the_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            bad = os.path.join(tmp, "bad.jsonl")
            good = record(6, "dense-bf16", 0, 0.2, 1.0)
            del good["bytes"]
            with open(bad, "w") as f:
                f.write(json.dumps(record(6, "dense-bf16", 1, 0.2, 1.0)) + "\n" + json.dumps(good) + "\n")
            done = self.run_table("--records", bad)
            self.assertNotEqual(done.returncode, 0)
            self.assertEqual(done.stderr.strip().count("\n"), 0, done.stderr)
            self.assertIn(f"{bad}:2: no 'bytes'", done.stderr)
            with open(bad, "w") as f:
                f.write("{not json\n")
            done = self.run_table("--records", bad)
            self.assertNotEqual(done.returncode, 0)
            self.assertIn(f"{bad}:1: not JSON", done.stderr)
            done = self.run_table("--records", os.path.join(tmp, "missing.jsonl"))
            self.assertNotEqual(done.returncode, 0)
            self.assertIn("missing.jsonl: no such records file", done.stderr)


if __name__ == "__main__":
    unittest.main()
