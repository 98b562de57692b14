"""The soak's training jobs (scripts/soak, both modes): the trainer's command line, the mpiexec that
runs it on one machine, and the trainer processes of a run, found by their output folder."""
import json
import os
import signal
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER = os.path.join(ROOT, "build", "trainer")


def mpiexec_options():
    """What mpiexec needs to run more ranks than cores, each free to use any core."""
    opts = ["--oversubscribe", "--bind-to", "none", "-x", "OMP_WAIT_POLICY=passive"]
    if os.getuid() == 0:
        opts.append("--allow-run-as-root")
    return opts


def mpiexec(ranks):
    return ["mpiexec", "-n", str(ranks)] + mpiexec_options()


def trainer_args(a, data, out, overrides=None):
    """The trainer's command: the quickstart ResNet-20 with the soak's settings; `overrides`, a dict of
    config keys to values, changes or adds --set keys."""
    sets = {
        "data.root": data, "data.synthesize_if_missing": "false", "data.batch_size": a.batch,
        "data.eval_batch_size": 100, "data.augment": "false", "train.epochs": 100000,
        "train.max_steps": a.steps, "train.checkpoint_every": a.checkpoint_every, "train.keep_checkpoints": 2,
        "train.eval_every_steps": 1000000, "train.log_every_steps": 50, "runtime.threads": 1,
        "data.loader_threads": 1, "sync.method": a.sync, "sync.dense_warmup_steps": 10, "sync.density": 0.01,
        "comm.log": "false", "experiment.output_dir": out,
    }
    sets.update(overrides or {})
    args = [TRAINER, "--config", os.path.join(ROOT, "configs", "quickstart_cifar.toml")]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    return args


def trainer_rank_pids(trainer, out):
    """pid by rank of the processes of the binary `trainer` (the path they were started with) writing
    to `out`, from /proc: the command line names both, the environment holds mpiexec's rank. The exact
    path, not its basename: mpiexec hands argv[0] on as it was given, and the same name in another
    build (another worktree's build/trainer) is another program."""
    pids = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if not cmd or cmd[0] != os.fsencode(trainer) or f"experiment.output_dir={out}".encode() not in cmd:
            continue
        for e in env:
            if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                pids[int(e.split(b"=")[1])] = int(name)
    return pids


def rank_pids(out):
    """pid by rank of this checkout's trainer processes writing to `out`."""
    return trainer_rank_pids(TRAINER, out)


def kill_leftovers(out):
    """Every trainer process of this output folder gone (a killed mpiexec may leave ranks behind)."""
    for _ in range(500):
        pids = rank_pids(out)
        if not pids:
            return
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    sys.exit(f"soak: trainer processes for {out} do not go away")


def complete_checkpoints(out):
    """Steps of the complete checkpoints in a run folder (a checkpoint exists once its manifest does)."""
    folder = os.path.join(out, "checkpoints")
    if not os.path.isdir(folder):
        return []
    return sorted(int(d[5:]) for d in os.listdir(folder)
                  if d.startswith("step_") and os.path.exists(os.path.join(folder, d, "manifest.json")))


def final_accuracy(out):
    """The test accuracy of a finished run's last evaluation (summary.json)."""
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)["final_eval"]["accuracy"]
