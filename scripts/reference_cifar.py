#!/usr/bin/env python3
"""Reference implementations beside this trainer's, on the same recipe and data (issue 50): ResNet-20 on
CIFAR-10 binary files (the real data or the synthetic ones, data/synthetic_cifar.cpp), P processes on
gloo, each with its own batch, trained by PyTorch with

  dense     DDP, its allreduce in fp32 or, with --wire bf16, through DDP's bf16_compress_hook
  powersgd  DDP with torch.distributed's powerSGD_hook (error feedback, warm start; its first
            --dense-warmup-steps steps are DDP's plain allreduce: start_powerSGD_iter)
  dgc       Deep Gradient Compression written here from the paper's equations (Lin et al., ICLR 2018),
            no DDP: per rank u = m u + g, v += u; the k = density x n largest |v| are sent (an
            allgather of indices and values, every rank its own k: this trainer's topka), the
            output is their sum over ranks / P; momentum factor masking clears u and v where
            sent; coupled weight decay has its own dense velocity (as the authors' DGCSGD); the
            dense warmup applies the momentum to the averaged gradient. --selection whole (one
            top-k over the whole gradient, as this trainer) or per-tensor with 1-D tensors dense
            (the authors' code).
  diloco    torchft's DiLoCo (torchft from PyPI; one replica group per process, a lighthouse in the
            parent): every --period inner steps the averaged pseudo-gradient steps the shared
            parameters through SGD with Nesterov momentum (--outer-lr, --outer-momentum); its first
            --dense-warmup-steps steps average the gradient (an allreduce on gloo) instead.

so that what a method costs can be checked against an independent implementation: the difference from
this trainer's row, over seeds, should be within the seeds' spread. The recipe is
configs/studies/hard_cifar_horizon_*.toml's: batch 32 per process, SGD momentum 0.9, weight decay
5e-4, cosine from --lr to 0 with a linear warmup of --lr-warmup-steps, random crop (pad 4) and flip,
per-channel normalization from the training set, --dense-warmup-steps dense first. The ResNet-20 is
calibrate_synthetic_cifar.py's (option-A shortcuts, He et al.), the same network as the trainer's,
its conv weights drawn as the trainer draws them unless --init torch.

    /tmp/torchvenv/bin/python scripts/reference_cifar.py --data datasets/synthetic_cifar10_hard \\
        --method dgc --density 0.01 --epochs 24 --dense-warmup-steps 156 --lr-warmup-steps 80 \\
        --seed 0 --out out/reference/dgc-1%-24-s0.jsonl

Prints one line per evaluation and writes them (JSON lines: step, test accuracy, loss) to --out; the
last line holds the final accuracy. Needs torch (a venv with today's PyTorch from PyPI, or Debian's
python3-torch); one thread per process (--threads).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from calibrate_synthetic_cifar import ResNet20, augment, predict, read_split  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="a folder of CIFAR-10 binary files")
    p.add_argument("--method", choices=["dense", "powersgd", "dgc", "diloco"], required=True)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--batch", type=int, default=32, help="per process")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--lr-warmup-steps", type=int, default=20)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--dense-warmup-steps", type=int, default=0)
    p.add_argument("--wire", choices=["fp32", "bf16"], default="fp32", help="dense: DDP's allreduce format")
    p.add_argument("--rank-r", type=int, default=2, help="powersgd: matrix_approximation_rank")
    p.add_argument("--density", type=float, default=0.01, help="dgc: share of entries sent")
    p.add_argument("--period", type=int, default=8, help="diloco: H, inner steps between syncs")
    p.add_argument("--outer-lr", type=float, default=0.7, help="diloco")
    p.add_argument("--outer-momentum", type=float, default=0.5, help="diloco: the trainer's over SGD momentum")
    p.add_argument("--selection", choices=["whole", "per-tensor"], default="whole")
    p.add_argument("--eval-every", type=int, default=0, help="steps; 0: at the end only")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (a smoke test); 0: none")
    p.add_argument("--init", choices=["trainer", "torch"], default="trainer",
                   help="conv weights: the trainer's (He et al.'s normal over fan-out, models/layers/conv2d.cpp) "
                        "or PyTorch's default (uniform, bound 1/sqrt(fan-in): 2.4x smaller)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--out", default="")
    return p.parse_args()


def learning_rate(a, step, total):
    """The trainer's cosine (optim/schedule.cpp): min_lr 0, linear warmup over the first steps."""
    lr = a.lr * 0.5 * (1 + math.cos(math.pi * min(step, total) / total))
    if step < a.lr_warmup_steps:
        lr *= (step + 1) / a.lr_warmup_steps
    return lr


class Dgc:
    """DGC's step on one process. Every rank holds the same parameters (the outputs are averages)."""

    def __init__(self, params, a, world):
        self.params, self.a, self.world = params, a, world
        self.u = [torch.zeros_like(p) for p in params]       # the velocity (momentum correction)
        self.v = [torch.zeros_like(p) for p in params]       # the accumulated velocity (error feedback)
        self.w = [torch.zeros_like(p) for p in params]       # weight decay's own dense velocity
        self.dense_u = [torch.zeros_like(p) for p in params]  # 1-D tensors under --selection per-tensor

    def step(self, step, lr):
        a, m = self.a, self.a.momentum
        grads = [p.grad for p in self.params]
        if step < a.dense_warmup_steps:
            # Dense: the momentum on the averaged gradient, u = m u + g_avg.
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            flat /= self.world
            outputs, at = [], 0
            for g, u in zip(grads, self.u):
                u.mul_(m).add_(flat[at:at + g.numel()].view_as(g))
                outputs.append(u.clone())
                at += g.numel()
        elif a.selection == "whole":
            for g, u, v in zip(grads, self.u, self.v):
                u.mul_(m).add_(g)
                v.add_(u)
            outputs = self.sparse_sum(self.v, self.u)
        else:
            outputs = [None] * len(grads)
            compressed = [i for i, g in enumerate(grads) if g.dim() > 1]
            for i in compressed:
                self.u[i].mul_(m).add_(grads[i])
                self.v[i].add_(self.u[i])
            for i, out in zip(compressed, self.sparse_sum([self.v[i] for i in compressed],
                                                           [self.u[i] for i in compressed], per_tensor=True)):
                outputs[i] = out
            for i, g in enumerate(grads):  # 1-D tensors: dense SGD momentum on the average
                if g.dim() <= 1:
                    avg = g.clone()
                    dist.all_reduce(avg)
                    avg /= self.world
                    self.dense_u[i].mul_(m).add_(avg)
                    outputs[i] = self.dense_u[i].clone()
        with torch.no_grad():
            for p, out, w in zip(self.params, outputs, self.w):
                w.mul_(m).add_(p, alpha=a.weight_decay)  # identical on every rank: no message
                p.add_(out + w, alpha=-lr)

    def sparse_sum(self, vs, us, per_tensor=False):
        """Each rank sends its k largest |v| (over all of vs, or per tensor); returns sum / P per tensor
        and clears v and u where this rank sent (momentum factor masking)."""
        groups = [[i] for i in range(len(vs))] if per_tensor else [list(range(len(vs)))]
        outputs = [None] * len(vs)
        for group in groups:
            flat = torch.cat([vs[i].reshape(-1) for i in group])
            n = flat.numel()
            k = max(1, int(round(self.a.density * n)))
            idx = torch.topk(flat.abs(), k, sorted=False).indices
            vals = flat[idx]
            all_idx = [torch.empty_like(idx) for _ in range(self.world)]
            all_vals = [torch.empty_like(vals) for _ in range(self.world)]
            dist.all_gather(all_idx, idx)
            dist.all_gather(all_vals, vals)
            total = torch.zeros(n)
            for i_, v_ in zip(all_idx, all_vals):
                total.index_add_(0, i_, v_)
            total /= self.world
            sent = torch.zeros(n, dtype=torch.bool)
            sent[idx] = True
            at = 0
            for i in group:
                size = vs[i].numel()
                mask = sent[at:at + size].view_as(vs[i])
                vs[i].masked_fill_(mask, 0)
                us[i].masked_fill_(mask, 0)
                outputs[i] = total[at:at + size].view_as(vs[i]).clone()
                at += size
        return outputs


def run(rank, a):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(a.port)
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)  # the same initial weights on every rank
    gen = torch.Generator().manual_seed(a.seed * 1000 + rank)  # this rank's augmentation
    order = torch.Generator().manual_seed(a.seed)  # the epoch's order, the same on every rank

    xtr, ytr = read_split(a.data, True)
    xte, yte = read_split(a.data, False)
    scaled = xtr.astype(np.float64) / 255
    mean, std = scaled.mean((0, 2, 3)), scaled.std((0, 2, 3))
    pad_value = torch.tensor(-mean / std, dtype=torch.float32)

    def normalize(v):
        return torch.from_numpy(((v / 255.0 - mean[None, :, None, None]) / std[None, :, None, None]).astype(np.float32))

    xtr, xte = normalize(xtr), normalize(xte)
    ytr, yte = torch.from_numpy(ytr), torch.from_numpy(yte)

    model = ResNet20()
    if a.init == "trainer":
        # Behind batch norm a conv's scale does not change what it computes, but it sets how far a
        # step moves it (the step divided by the weights' norm): PyTorch's smaller default makes
        # the same lr a larger step: DDP dense ended 7.9 points higher with it at 468 steps on the
        # hard CIFAR (78.13% against 70.22%, 3 seeds; BENCHMARKS.md, "The reference gap was the init").
        for m in model.modules():
            if isinstance(m, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    steps_per_epoch = len(xtr) // (a.batch * a.ranks)
    total = steps_per_epoch * a.epochs
    last = min(total, a.max_steps) if a.max_steps > 0 else total  # the schedule keeps the whole run's shape
    if a.method in ("dgc", "diloco"):
        trained, dgc, opt = model, None, None
        if a.method == "dgc":
            dgc = Dgc(list(model.parameters()), a, a.ranks)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay)
        for p in model.parameters():  # the same start on every rank
            dist.broadcast(p.data, 0)
    else:
        # One bucket (the model is 1 MB): with two, powerSGD_hook on gloo (torch 2.15) ended in a
        # collective size mismatch at its first compressed step; the accuracy does not depend on buckets.
        trained = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True, bucket_cap_mb=64)
        if a.method == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
            state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=a.rank_r,
                                       start_powerSGD_iter=max(2, a.dense_warmup_steps), use_error_feedback=True,
                                       warm_start=True, random_seed=a.seed)
            trained.register_comm_hook(state, psgd.powerSGD_hook)
        elif a.wire == "bf16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            trained.register_comm_hook(None, default_hooks.bf16_compress_hook)
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay)
        dgc = None
    diloco = None

    rows, step, t0 = [], 0, time.time()

    def evaluate(loss):
        acc = (predict(model, xte) == yte).float().mean().item()
        row = {"step": step, "test_accuracy": acc, "loss": loss, "seconds": round(time.time() - t0, 1)}
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)

    while step < last:
        perm = torch.randperm(len(xtr), generator=order)
        for b in range(steps_per_epoch):
            if step == last:
                break
            at = (b * a.ranks + rank) * a.batch
            idx = perm[at:at + a.batch]
            loss = F.cross_entropy(trained(augment(xtr[idx], pad_value, gen)), ytr[idx])
            model.zero_grad(set_to_none=False)
            loss.backward()
            lr = learning_rate(a, step, total)
            if dgc:
                dgc.step(step, lr)
            else:
                if a.method == "diloco":
                    if step < a.dense_warmup_steps:
                        average_gradients(model, a.ranks)
                    elif diloco is None:
                        diloco = start_diloco(a, rank, model, opt)
                for group in opt.param_groups:
                    group["lr"] = lr
                opt.step()
            step += 1
            if (a.eval_every and step % a.eval_every == 0) or step == last:
                evaluate(loss.item())
    if diloco is not None:
        diloco.__exit__(None, None, None)
        diloco.manager.shutdown(wait=False)
    if rank == 0 and a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            for row in rows:
                f.write(json.dumps(dict(row, method=a.method, ranks=a.ranks, seed=a.seed)) + "\n")
    dist.destroy_process_group()


def average_gradients(model, world):
    """Dense steps without DDP: the gradient averaged over the processes, one allreduce."""
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    dist.all_reduce(flat)
    flat /= world
    at = 0
    for p in model.parameters():
        p.grad.copy_(flat[at:at + p.numel()].view_as(p))
        at += p.numel()


def start_diloco(a, rank, model, inner):
    """torchft's DiLoCo from this step on: this process is one replica group of one, its Manager
    meets the others' through the parent's lighthouse; the shared parameters start as the current ones."""
    from datetime import timedelta
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo
    store_port = a.port + 1 + rank
    store = dist.TCPStore("localhost", store_port, 1, True, wait_for_workers=False)
    long = timedelta(minutes=30)  # a sync waits for the slowest replica's H steps
    manager = Manager(pg=ProcessGroupGloo(timeout=long), load_state_dict=None, state_dict=None,
                      min_replica_size=a.ranks, use_async_quorum=False, timeout=long, quorum_timeout=long,
                      rank=0, world_size=1, store_addr="localhost", store_port=store_port,
                      lighthouse_addr=a.lighthouse, replica_id=f"rank{rank}", port=a.port + 1 + a.ranks + rank,
                      init_sync=False)  # every rank starts from the same parameters: nothing to heal
    outer = torch.optim.SGD(model.parameters(), lr=a.outer_lr, momentum=a.outer_momentum, nesterov=True)
    diloco = DiLoCo(manager, [model], inner, outer, sync_every=a.period, backup_device=torch.device("cpu"),
                    pin_memory=False)
    diloco.__enter__()
    diloco.manager, diloco.store = manager, store  # the replica group's store lives as long as its DiLoCo
    return diloco


def main():
    a = parse_args()
    if not os.path.isdir(a.data):
        sys.exit(f"reference_cifar: --data {a.data}: no such folder (the trainer writes it on a run's first use)")
    a.lighthouse = None
    if a.method == "diloco":
        os.environ.setdefault("RUST_LOG", "warn")  # torchft logs every quorum and commit at info
        from torchft._torchft import LighthouseServer
        lighthouse = LighthouseServer(bind="[::]:0", min_replicas=a.ranks)
        a.lighthouse = lighthouse.address()
    mp.spawn(run, args=(a,), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    main()
