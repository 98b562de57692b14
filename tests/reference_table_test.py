#!/usr/bin/python3
"""scripts/reference_table on run folders and reference files written here: each seed's gap, the
means, the spread and the verdict recomputed from the accuracies; a seed missing on one side is left
out; a missing folder is one line and a non-zero exit."""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "reference_table")


def write_ours(root, name, accuracy):
    os.makedirs(os.path.join(root, name))
    with open(os.path.join(root, name, "summary.json"), "w") as f:
        json.dump({"final_accuracy": accuracy, "steps": 468}, f)


def write_reference(root, name, accuracies):
    with open(os.path.join(root, name + ".jsonl"), "w") as f:
        for step, accuracy in enumerate(accuracies):
            f.write(json.dumps({"step": 39 * (step + 1), "test_accuracy": accuracy}) + "\n")


class ReferenceTable(unittest.TestCase):
    def run_table(self, ours, ref, *methods):
        args = [sys.executable, SCRIPT, ours, ref, "--dense", "dense=ddp"]
        for m in methods:
            args += ["--method", m]
        return subprocess.run(args, capture_output=True, text=True)

    def test_gaps_means_and_verdict(self):
        with tempfile.TemporaryDirectory() as tmp:
            ours, ref = os.path.join(tmp, "ours"), os.path.join(tmp, "ref")
            os.makedirs(ref)
            dense, psgd = [0.715, 0.7125, 0.754], [0.637, 0.6425, 0.693]
            ddp, hook = [0.7405, 0.6835, 0.7285], [0.60, 0.58, 0.62]
            for s in range(3):
                write_ours(ours, f"dense-s{s}", dense[s])
                write_ours(ours, f"psgd-s{s}", psgd[s])
                write_reference(ref, f"ddp-s{s}", [0.2, ddp[s]])  # the last line is the final accuracy
                write_reference(ref, f"hook-s{s}", [0.1, hook[s]])
            write_ours(ours, "psgd-s3", 0.6)  # no seed 3 on the other side: left out
            out = self.run_table(ours, ref, "psgd=hook")
            self.assertEqual(out.returncode, 0, out.stderr)
            ours_gaps = [100 * (p - d) for p, d in zip(psgd, dense)]
            ref_gaps = [100 * (h - d) for h, d in zip(hook, ddp)]
            for s in range(3):
                self.assertIn(f"| | {s} | {100 * psgd[s]:.2f}% | {ours_gaps[s]:+.2f} | {100 * hook[s]:.2f}% | "
                              f"{ref_gaps[s]:+.2f} | {ours_gaps[s] - ref_gaps[s]:+.2f} |", out.stdout)
            self.assertNotIn("| | 3 |", out.stdout)
            difference = statistics.mean(ours_gaps) - statistics.mean(ref_gaps)
            spread = max(statistics.stdev(ours_gaps), statistics.stdev(ref_gaps))
            self.assertGreater(abs(difference), spread)  # the data above: ours costs 4.8 points less
            self.assertIn(f"**{statistics.mean(ours_gaps):+.2f}** (sd {statistics.stdev(ours_gaps):.2f})", out.stdout)
            self.assertIn(f"{difference:+.2f}: outside the seeds' spread", out.stdout)

    def test_a_method_without_runs_and_a_missing_folder(self):
        with tempfile.TemporaryDirectory() as tmp:
            os.makedirs(os.path.join(tmp, "ref"))
            write_ours(os.path.join(tmp, "ours"), "dense-s0", 0.7)
            out = self.run_table(os.path.join(tmp, "ours"), os.path.join(tmp, "ref"), "psgd=hook")
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("psgd: no seed with all four runs", out.stdout)
            out = self.run_table(os.path.join(tmp, "none"), os.path.join(tmp, "ref"), "psgd=hook")
            self.assertNotEqual(out.returncode, 0)
            self.assertEqual(out.stderr.strip(), f"reference_table: {os.path.join(tmp, 'none')}: no such folder")


if __name__ == "__main__":
    unittest.main()
