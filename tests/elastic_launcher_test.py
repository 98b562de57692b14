"""scripts/elastic end to end: a job on 3 ranks loses one (killed) while its hostfile drops to 2 slots;
the launcher restarts it on 2 from the newest checkpoint; the slot comes back, another rank is killed,
and the third attempt runs on 3 again and finishes. Also: a job that fails the same way every time
stops after --max-restarts, and a configuration that does not load is one error line, no attempt.
Run by ctest with TRAINER_BINARY set:
    TRAINER_BINARY=build/trainer /usr/bin/python3 tests/elastic_launcher_test.py
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ELASTIC = os.path.join(SOURCE, "scripts", "elastic")
TRAINER = os.environ.get("TRAINER_BINARY", os.path.join(SOURCE, "build", "trainer"))

sys.path.insert(0, os.path.join(SOURCE, "scripts"))
from soak_jobs import trainer_rank_pids  # noqa: E402


def trainer_command(out, *extra):
    sets = ["data.batch_size=8", "train.max_steps=36", "train.checkpoint_every=4", "train.log_every_steps=1",
            "train.eval_every_steps=1000", "runtime.threads=1", "data.loader_threads=1",
            f"experiment.output_dir={out}", *extra]
    cmd = [TRAINER, "--config", os.path.join(SOURCE, "configs", "quickstart_cifar.toml")]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def launcher(hostfile, ranks, out, *extra, trainer_sets=()):
    return [sys.executable, ELASTIC, "--ranks", str(ranks), "--hostfile", hostfile, "--min-ranks", "2",
            "--mpiexec-arg=--oversubscribe", "--mpiexec-arg=--bind-to", "--mpiexec-arg=none", *extra, "--",
            *trainer_command(out, *trainer_sets)]


def last_step(out):
    try:
        with open(os.path.join(out, "metrics.jsonl")) as f:
            steps = [json.loads(line).get("step", 0) for line in f if line.strip().endswith("}")]
        return max(steps, default=0)
    except FileNotFoundError:
        return 0


def kill_one_rank_after(out, step, attempts_before, timeout=120):
    """Waits until attempt attempts_before + 1 has logged `step`, then SIGKILLs one of its ranks."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if attempts(out, quiet=True) == attempts_before and last_step(out) >= step and \
                (pids := trainer_rank_pids(TRAINER, out)):
            os.kill(pids[max(pids)], signal.SIGKILL)
            return
        time.sleep(0.2)
    raise AssertionError(f"step {step} was never reached")


def attempts(out, quiet=False):
    path = os.path.join(out, "elastic", "attempts.jsonl")
    if not os.path.isfile(path):
        return 0 if quiet else []
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return len(rows) if quiet else rows


class ElasticLauncherTest(unittest.TestCase):
    def test_restarts_on_fewer_ranks_and_grows_back(self):
        with tempfile.TemporaryDirectory() as tmp:
            hostfile, out = os.path.join(tmp, "hosts"), os.path.join(tmp, "run")
            with open(hostfile, "w") as f:
                f.write("localhost slots=3\n")
            job = subprocess.Popen(launcher(hostfile, 3, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True)
            try:
                kill_one_rank_after(out, 10, 0)
                with open(hostfile, "w") as f:  # a node is gone for the next attempt
                    f.write("localhost slots=2  # one slot taken away\n")
                kill_one_rank_after(out, 22, 1)
                with open(hostfile, "w") as f:  # and back
                    f.write("localhost slots=3\n")
                output, _ = job.communicate(timeout=300)
            finally:
                job.kill()
            self.assertEqual(job.returncode, 0, output)
            rows = attempts(out)
            self.assertEqual([r["ranks"] for r in rows], [3, 2, 3], output)
            self.assertEqual([r["exit_status"] == 0 for r in rows], [False, False, True])
            for r in rows[:2]:
                self.assertIn("signal 9", r["reason"])
            # Each restart resumed from a checkpoint no older than checkpoint_every steps before the kill.
            for failed, after in zip(rows, rows[1:]):
                self.assertIsNotNone(after["resumed_from_step"], output)
                self.assertLessEqual(failed["last_step"] - after["resumed_from_step"], 4 + 1)
            with open(os.path.join(out, "summary.json")) as f:
                self.assertEqual(json.load(f)["steps"], 36)
            for k in (1, 2, 3):
                self.assertTrue(os.path.isfile(os.path.join(out, "elastic", f"attempt-{k}.log")))
            report = subprocess.run([TRAINER, "report", out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
            self.assertEqual(report.returncode, 0, report.stdout)
            with open(os.path.join(out, "report", "report.md")) as f:
                self.assertIn("3 attempt(s), world sizes 3, 2, 3", f.read())

    def test_gives_up_after_max_restarts_and_refuses_a_bad_config(self):
        with tempfile.TemporaryDirectory() as tmp:
            hostfile, out = os.path.join(tmp, "hosts"), os.path.join(tmp, "run")
            with open(hostfile, "w") as f:
                f.write("localhost slots=2\n")
            # A failure at step 2, before any checkpoint: every attempt meets it again.
            cmd = launcher(hostfile, 2, out, "--max-restarts", "1")
            p = subprocess.run(cmd + ["--inject-failure", "1:2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=120)
            self.assertEqual(p.returncode, 2, p.stdout)
            self.assertIn("1 restart(s) used up", p.stdout)
            self.assertEqual(len(attempts(out)), 2)
            bad = launcher(hostfile, 2, os.path.join(tmp, "bad"), trainer_sets=["train.max_steps=-5"])
            p = subprocess.run(bad, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
            self.assertEqual(p.returncode, 2, p.stdout)
            self.assertIn("configuration does not load", p.stdout)
            self.assertNotIn("attempt 1", p.stdout)


if __name__ == "__main__":
    unittest.main()
