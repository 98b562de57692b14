"""The elastic soak's logic without a run (scripts/soak_elastic.py): its plans of events obey their
rules, and its figures and "nothing lost" checks on a canned elastic/attempts.jsonl (written as
scripts/elastic writes it, with a line cut by a kill) give the figures worked out by hand and catch
each way a run can lose something. The soak itself is not run here (BENCHMARKS.md has its figures).
    /usr/bin/python3 tests/soak_elastic_test.py
"""
import json
import os
import random
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import soak_elastic as se  # noqa: E402

CHECKPOINT_EVERY, RANKS, STEPS = 50, 8, 400


def attempt(k, ranks, start, end, status, resumed, last):
    return {"attempt": k, "ranks": ranks, "hosts": [f"localhost:{ranks}"], "start": start, "end": end,
            "exit_status": status, "reason": "canned", "resumed_from_step": resumed, "last_step": last,
            "command": ["mpiexec"]}


def canned_run():
    """Four attempts: SIGKILL of a rank at step 137 (checkpoint 100), a slot gone, so 7 ranks; SIGTERM at
    step 212 (its own checkpoint); SIGKILL of the job after step 300 while its checkpoint was being
    written (no manifest: 250 is the newest, checkpoint_every steps lost), the slot back; then the finish."""
    attempts = [attempt(1, 8, 1000.0, 1030.0, 137, None, 137), attempt(2, 7, 1030.2, 1050.0, 143, 100, 212),
                attempt(3, 7, 1050.1, 1075.0, -9, 212, 300), attempt(4, 8, 1075.1, 1100.0, 0, 250, 400)]
    failures = [
        {"kind": "SIGKILL rank", "rank": 3, "fired": 1029.5, "attempt": 1, "newest_checkpoint": 100, "slots": 7,
         "next_first_step": 1034.0},
        {"kind": "SIGTERM rank", "rank": 5, "fired": 1048.0, "attempt": 2, "newest_checkpoint": 212, "slots": 7,
         "next_first_step": 1053.5},
        {"kind": "SIGKILL job", "rank": None, "fired": 1074.9, "attempt": 3, "newest_checkpoint": 250, "slots": 8,
         "next_first_step": 1080.0}]
    return attempts, failures


def write_attempts(folder, rows):
    os.makedirs(os.path.join(folder, "elastic"))
    with open(os.path.join(folder, "elastic", "attempts.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        f.write('{"attempt": 5, "ranks"')  # what a kill of the launcher mid-write would leave


class PlanTest(unittest.TestCase):
    def test_plans_follow_their_rules(self):
        for seed in range(200):
            plan = se.plan_events(random.Random(seed), 10, RANKS, 4)
            kinds = [e["kind"] for e in plan]
            self.assertEqual(len(plan), 10)
            self.assertEqual(set(kinds), set(se.KINDS), plan)
            self.assertIn(kinds[-1], se.FAILURES, plan)
            slots = RANKS
            for event, after in zip(plan, plan[1:]):
                if event["kind"] == se.REMOVE:
                    self.assertIn(slots - event["slots"], (1, 2), plan)
                    self.assertGreaterEqual(event["slots"], 4, plan)
                if event["kind"] == se.GIVE_BACK:
                    self.assertLess(slots, RANKS, plan)
                    self.assertEqual(event["slots"], RANKS, plan)
                if event["kind"] not in se.FAILURES:
                    self.assertIn(after["kind"], se.FAILURES, plan)
                    slots = event["slots"]
        self.assertEqual(se.plan_events(random.Random(3), 10, RANKS, 4), se.plan_events(random.Random(3), 10, RANKS, 4))

    def test_invalid_plans_are_refused(self):
        fail = {"kind": "SIGKILL rank"}
        base = [{"kind": "SIGKILL job"}, {"kind": "SIGTERM rank"}, {"kind": se.REMOVE, "slots": 6}, fail,
                {"kind": se.GIVE_BACK, "slots": 8}, fail]
        self.assertTrue(se.valid_plan(base, RANKS, 4))
        self.assertFalse(se.valid_plan(base[:-1], RANKS, 4))  # ends on a slot change
        self.assertFalse(se.valid_plan(base[:3] + base[4:], RANKS, 4))  # two slot changes in a row
        self.assertFalse(se.valid_plan(base, RANKS, 7))  # 6 slots, fewer than --min-ranks
        self.assertFalse(se.valid_plan([base[4], fail] + base[:4], RANKS, 4))  # given back while all are there
        self.assertFalse(se.valid_plan([e for e in base if e["kind"] != "SIGKILL job"], RANKS, 4))  # a kind missing
        with self.assertRaises(ValueError):
            se.plan_events(random.Random(1), 4, RANKS, 4)


class FiguresTest(unittest.TestCase):
    def figures(self, attempts, failures):
        with tempfile.TemporaryDirectory() as run:
            write_attempts(run, attempts)
            return se.figures(se.attempts(run), failures, CHECKPOINT_EVERY, RANKS, STEPS)

    def test_canned_run(self):
        attempts, failures = canned_run()
        fig = self.figures(attempts, failures)
        self.assertEqual(fig["problems"], [])
        self.assertEqual(fig["attempts"], 4)
        self.assertEqual(fig["world_sizes"], [8, 7, 7, 8])
        self.assertEqual([r["steps_lost"] for r in fig["failures"]], [37, 0, 50])
        self.assertEqual(fig["steps_lost_max"], 50)
        self.assertEqual([round(r["restart_s"], 3) for r in fig["failures"]], [4.5, 5.5, 5.1])
        self.assertEqual([round(r["down_s"], 3) for r in fig["failures"]], [0.5, 2.0, 0.1])
        self.assertAlmostEqual(fig["restart_s_median"], 5.1)
        self.assertIn("| 3 | SIGKILL job | 7 | 8 | 300 | 250 | 250 | 50 | 0.1 | 5.1 |", se.table(fig))

    def test_each_loss_is_caught(self):
        def problems(edit):
            attempts, failures = canned_run()
            edit(attempts, failures)
            return " / ".join(self.figures(attempts, failures)["problems"])

        # Resumed from the checkpoint before the newest (a fallback that should not have happened).
        self.assertIn("newest complete checkpoint when attempt 1 ended was 100",
                      problems(lambda a, f: a[1].update(resumed_from_step=50)))
        # A fresh start although a checkpoint existed.
        self.assertIn("attempt 2 resumed from step None", problems(lambda a, f: a[1].update(resumed_from_step=None)))
        # More than checkpoint_every steps lost (the soak saw checkpoint 100, the failed attempt got to 160).
        self.assertIn("lost 60 steps", problems(lambda a, f: a[0].update(last_step=160)))
        # The world size is not the hostfile's.
        self.assertIn("attempt 2 ran on 7 ranks; the hostfile offered 8", problems(lambda a, f: f[0].update(slots=8)))
        # The run did not finish, or an attempt came without an event, or logged no step.
        self.assertIn("did not finish", problems(lambda a, f: a[3].update(last_step=390)))
        self.assertIn("4 attempt(s) for 2 failure(s)", problems(lambda a, f: f.pop()))
        self.assertIn("attempt 4 logged no step", problems(lambda a, f: f[2].update(next_first_step=None)))

    def test_accuracy_verdict(self):
        v = se.accuracy_verdict(0.905, [0.91, 0.90])
        self.assertAlmostEqual(v["spread"], 0.01)
        self.assertAlmostEqual(v["difference"], -0.005)
        self.assertTrue(v["within_spread"])
        self.assertFalse(se.accuracy_verdict(0.89, [0.91, 0.90])["within_spread"])
        v = se.accuracy_verdict(0.93, [0.92, 0.87, 0.90, 0.91])  # the first is the same seed's
        self.assertAlmostEqual(v["spread"], 0.05)
        self.assertAlmostEqual(v["uninterrupted_mean"], 0.90)
        self.assertAlmostEqual(v["uninterrupted_std"], (0.0014 / 3) ** 0.5)  # deviations .02 -.03 0 .01
        self.assertTrue(v["within_spread"])

if __name__ == "__main__":
    unittest.main()
