#!/usr/bin/python3
"""PyTorch side of `trainer bench sync`'s powersgd rows: DDP with powerSGD_hook, gloo on CPU.

    /usr/bin/python3 scripts/bench_torch_powersgd.py --world 4 --ranks 1,2,4 --threads 1 --steps 16

Starts --world processes (gloo over a file store) holding the DeepSpeech model's parameters (the
27,569,568 of scripts/torch_speech_models.py, asserted), each gradient 0.5 x a window of a normal
pool shared by all ranks + a window of this rank's own pool (windows move every step, as in the C++
bench). The backward of loss = sum_i <param_i, grad_i> makes DDP hand exactly those gradients to
its comm hook. Per factor rank r: PowerSGDState(matrix_approximation_rank=r, start_powerSGD_iter=2,
min_compression_rate=2, error feedback and warm start on, the defaults otherwise; each bucket's hook
waited for before the next, see serial()); two dense
steps and --warmup compressed steps untimed, then --steps timed backwards (slowest rank each step,
after a barrier). The same backwards with a no-op hook (the bucket returned untouched) measure what
is not the hook (the gradient pass and DDP's bucket copies); hook_ms is the difference of medians.
Prints one JSON line per factor rank on rank 0's stdout.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    ap = argparse.ArgumentParser(description="Time PyTorch DDP's powerSGD_hook on the DeepSpeech shapes.")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--ranks", default="1,2,4", help="factor ranks, comma-separated")
    ap.add_argument("--threads", type=int, default=1, help="threads per process")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=2)
    return ap.parse_args()


def worker(rank, args, folder):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ph
    from torch_speech_models import DEEPSPEECH_PARAMETERS, DeepSpeech

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(folder, "store"), rank=rank,
                            world_size=args.world)
    shapes = [p.shape for p in DeepSpeech().parameters()]
    n = sum(s.numel() for s in shapes)
    assert n == DEEPSPEECH_PARAMETERS, n
    pad = 1 << 16
    shared = torch.randn(n + pad, generator=torch.Generator().manual_seed(12345))
    own = torch.randn(n + pad, generator=torch.Generator().manual_seed(1000 + rank))
    flat = torch.empty(n)

    class Probe(nn.Module):  # the gradient of param_i is exactly grad_i
        def __init__(self):
            super().__init__()
            self.ps = nn.ParameterList([nn.Parameter(torch.zeros(s)) for s in shapes])

        def forward(self, gs):
            return sum((p * g).sum() for p, g in zip(self.ps, gs))

    def grads(step):
        a, b = (step * 7919) % pad, (step * 104729 + 13) % pad
        torch.add(own[b:b + n], shared[a:a + n], alpha=0.5, out=flat)
        out, o = [], 0
        for s in shapes:
            out.append(flat[o:o + s.numel()].view(s))
            o += s.numel()
        return out

    def noop(state, bucket):
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    def serial(state, bucket):
        # One bucket's hook finishes before the next bucket's starts. Without this the hook's
        # collectives of different buckets, issued from future callbacks, reach gloo in different
        # orders on different ranks and gloo aborts (sizes do not match).
        fut = ph.powerSGD_hook(state, bucket)
        fut.wait()
        return fut

    def timed(hook, state):
        model = Probe()
        ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
        ddp.register_comm_hook(state, hook)
        times = []
        for step in range(2 + args.warmup + args.steps):
            gs = grads(step)
            ddp.zero_grad(set_to_none=False)
            loss = ddp(gs)
            dist.barrier()
            t0 = time.perf_counter()
            loss.backward()
            ms = torch.tensor([(time.perf_counter() - t0) * 1e3])
            dist.all_reduce(ms, op=dist.ReduceOp.MAX)
            if step >= 2 + args.warmup:
                times.append(ms.item())
        del ddp, model
        return statistics.median(times)

    noop_ms = timed(noop, None)
    for r in [int(x) for x in args.ranks.split(",")]:
        state = ph.PowerSGDState(process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=2,
                                 min_compression_rate=2, use_error_feedback=True, warm_start=True)
        step_ms = timed(serial, state)
        if rank == 0:
            print(json.dumps({"rank": r, "world": args.world, "threads": args.threads, "n": n,
                              "ddp_step_ms": step_ms, "noop_step_ms": noop_ms, "hook_ms": step_ms - noop_ms,
                              "torch": torch.__version__}), flush=True)
    dist.destroy_process_group()


def main():
    args = parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(worker, args=(args, folder), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
