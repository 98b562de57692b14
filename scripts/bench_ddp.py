#!/usr/bin/python3
"""PyTorch DistributedDataParallel (gloo, CPU) baseline for the data-parallel training step.

On rank 0, after --warmup untimed steps, over --steps timed steps, each after a barrier so that the
ranks start together (median and min):
  step_ms     a full DDP step: zero_grad, forward, cross-entropy, backward (DDP allreduces each
              bucket as it becomes ready, overlapped with the rest of backward), SGD step
  compute_ms  the same step under ddp.no_sync() (no allreduce) plus the SGD step
  comm_ms     the communication alone: a flat fp32 tensor of the gradient's size cut into DDP's own
              bucket sizes (read back from DDP after its bucket rebuild), each bucket's allreduce
              launched with async_op=True back to back, then all waited for, as DDP does
  hidden_share = clamp((compute_ms + comm_ms - step_ms) / comm_ms, 0, 1), the share of
              communication hidden behind compute; one JSON line on stdout.
Ranks come from Open MPI (OMPI_COMM_WORLD_*; without it, one process). Models are those of
scripts/bench_torch.py (the C++ trainer's, parameter counts asserted); data is one random
CIFAR-shaped batch per rank, reused; SGD lr 0.1, momentum 0.9, weight decay 5e-4.

    sudo scripts/netem --ranks 2 --bandwidth 100mbit -- /usr/bin/python3 scripts/bench_ddp.py \
        --model resnet20 --batch 32 --threads 1 --bucket-mb 25 --first-bucket-mb 1 --steps 10 --warmup 3
    (the same with /work/torchvenv/bin/python, PyTorch 2.x, instead of Debian's 1.13)
    mpiexec --allow-run-as-root --oversubscribe --bind-to none -n 2 /usr/bin/python3 scripts/bench_ddp.py

Rendezvous: TCP store on rank 0, port --port ($BENCH_DDP_PORT or 29511). Under scripts/netem (this
process in a namespace of /run/netns) gloo uses the shaped eth0 and rank 0 is host .1 of this
rank's eth0 /24; otherwise lo and 127.0.0.1.

DDP: bucket_cap_mb=--bucket-mb; gradient_as_bucket_view=True (backward writes straight into the
buckets) with zero_grad(set_to_none=False) to keep those views; broadcast_buffers left at its
default, True (rank 0's BatchNorm buffers are broadcast before each synced forward: in step_ms,
not in comm_ms); find_unused_parameters=False. First bucket: PyTorch 1.13 takes it from
dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB), set here from --first-bucket-mb; PyTorch 2.x drops the
small first bucket whenever bucket_cap_mb is given, so it gets bucket_cap_mb_list=[first, bucket]
(the last cap repeats). --first-bucket-mb torch leaves PyTorch's choice. Buckets hold whole
tensors in backward order, so one may exceed its cap; the sizes used are in the output. MB = MiB.
"""

import argparse
import contextlib
import datetime
import fcntl
import inspect
import json
import os
import socket
import statistics
import struct
import sys
import time


# Errors every rank meets alike are printed by rank 0 only: one line per failure, not one per rank.
RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))


def fail(msg, code=2, every_rank=False):
    if RANK == 0 or every_rank:
        print(f"bench_ddp: {msg}", file=sys.stderr)
    sys.exit(code)


def parse_args():
    ap = argparse.ArgumentParser(description="Time a PyTorch DDP (gloo) CIFAR training step.")
    ap.add_argument("--model", default="resnet20", help="a model of scripts/bench_torch.py")
    ap.add_argument("--batch", type=int, default=32, help="samples per rank")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--first-bucket-mb", default="1", help="MiB, or 'torch' for PyTorch's own choice")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--network", default=None, help="label copied into the output, e.g. 1gbit")
    ap.add_argument("--port", type=int, default=int(os.environ.get("BENCH_DDP_PORT", "29511")))
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds for rendezvous and collectives")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.threads < 1 or a.batch < 1 or a.steps < 1 or a.warmup < 0 or a.bucket_mb <= 0:
        fail("--threads, --batch, --steps must be >= 1, --warmup >= 0, --bucket-mb > 0")
    if a.first_bucket_mb != "torch":
        try:
            a.first_bucket_mb = float(a.first_bucket_mb)
            assert a.first_bucket_mb > 0
        except (ValueError, AssertionError):
            fail(f"--first-bucket-mb must be MiB > 0 or 'torch', got '{a.first_bucket_mb}'")
    return a


def ipv4_of(ifname):
    """The interface's IPv4 address (SIOCGIFADDR), or None when it has none or does not exist."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            req = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(req[20:24])


def in_named_netns():
    """True when this process is in a namespace of /run/netns (what `ip netns identify` checks).
    The root namespace is never there, and a container's own eth0 must not be taken for netem's."""
    me = os.stat("/proc/self/ns/net")
    with contextlib.suppress(OSError):
        for n in os.listdir("/run/netns"):
            st = os.stat(os.path.join("/run/netns", n))
            if (st.st_dev, st.st_ino) == (me.st_dev, me.st_ino):
                return True
    return False


def rendezvous_address():
    addr = ipv4_of("eth0") if in_named_netns() else None
    if addr is None:
        return "lo", "127.0.0.1"
    # scripts/netem gives rank R the address 10.77.X.(R+1)/24, so rank 0 is .1 of the same /24.
    return "eth0", ".".join(addr.split(".")[:3] + ["1"])


def main():
    args = parse_args()
    rank, world = RANK, int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    iface, master = rendezvous_address()
    # gloo picks its interface when the process group is made; without this it resolves the
    # hostname, which under netem is an address of the root namespace, unreachable from a rank.
    os.environ["GLOO_SOCKET_IFNAME"] = iface

    # bench_torch parses its own argv when imported and sizes the OpenMP/MKL pools from --threads
    # before importing torch, so it gets an argv with our thread count.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    saved_argv, sys.argv = sys.argv, ["bench_torch.py", "--threads", str(args.threads)]
    try:
        import bench_torch
    except ImportError as e:
        fail(f"cannot import torch or scripts/bench_torch.py with {sys.executable}: {e}", 3)
    finally:
        sys.argv = saved_argv
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    if args.model not in bench_torch.PARAM_COUNTS:
        fail(f"unknown model '{args.model}' (choose from {', '.join(sorted(bench_torch.PARAM_COUNTS))})")
    if not (dist.is_available() and dist.is_gloo_available()):
        fail(f"torch {torch.__version__} at {sys.executable} has no torch.distributed with gloo", 3)
    torch.set_num_threads(args.threads)
    with contextlib.suppress(RuntimeError):  # only settable before the first inter-op task
        torch.set_num_interop_threads(1)

    try:
        dist.init_process_group("gloo", init_method=f"tcp://{master}:{args.port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=args.timeout))
    except Exception as e:  # noqa: BLE001 - any rendezvous failure is one line
        fail(f"rank {rank}: rendezvous at {master}:{args.port} via {iface} failed: "
             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}", 4, every_rank=True)

    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = bench_torch.build(args.model)
    params = sum(p.numel() for p in model.parameters())
    if params != bench_torch.PARAM_COUNTS[args.model]:
        fail(f"{args.model}: {params} parameters, expected {bench_torch.PARAM_COUNTS[args.model]}")
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt).train()

    mib = 1024 * 1024
    cap_bytes = int(args.bucket_mb * mib)
    # broadcast_buffers stays at its default (2.x warns when it is passed at all).
    kw = dict(bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=True)
    has_list = "bucket_cap_mb_list" in inspect.signature(DDP.__init__).parameters
    if args.first_bucket_mb == "torch":
        first_how = "pytorch default"
        first_bytes = (dist._DEFAULT_FIRST_BUCKET_BYTES if not has_list else None)  # 2.x: read below
    elif has_list:
        first_bytes = int(args.first_bucket_mb * mib)
        if first_bytes < cap_bytes:
            kw["bucket_cap_mb_list"] = [args.first_bucket_mb, args.bucket_mb]
        first_how = f"bucket_cap_mb_list={kw.get('bucket_cap_mb_list', [args.bucket_mb])}"
    else:  # 1.13's reducer reads this module constant when DDP is constructed
        first_bytes = dist._DEFAULT_FIRST_BUCKET_BYTES = int(args.first_bucket_mb * mib)
        first_how = "dist._DEFAULT_FIRST_BUCKET_BYTES"
    ddp = DDP(model, **kw)
    if first_bytes is None:
        first_bytes = getattr(getattr(ddp, "_bucket_config", None), "first_bucket_bytes_cap", cap_bytes)
    first_bytes = min(first_bytes, cap_bytes)  # a first cap above the cap is just the cap

    # Each rank its own random batch (as data parallelism would give it), the same every step.
    g = torch.Generator().manual_seed(args.seed + 1 + rank)
    x = torch.randn(args.batch, 3, 32, 32, generator=g).contiguous(memory_format=fmt)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)

    def train_step(sync):
        opt.zero_grad(set_to_none=False)  # keeps the gradients as views into DDP's buckets
        with (contextlib.nullcontext() if sync else ddp.no_sync()):
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
        opt.step()
        return loss

    def timed(fn):
        """--warmup untimed then --steps timed calls, each after a barrier; times in ms."""
        times = []
        for i in range(args.warmup + args.steps):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            if i >= args.warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        return times

    # 1. Full DDP step. DDP rebuilds its buckets in gradient-ready order after the first step, so
    # warmup steps also take that rebuild out of the timed ones.
    losses = []
    step_t = timed(lambda: losses.append(train_step(True)))
    if not torch.isfinite(losses[-1]).item():
        fail("loss is not finite")
    # 2. Compute only. The first no_sync forward after a synced one still broadcasts the buffers
    # (once), which the warmup absorbs. The ranks' weights drift apart from here on: no matter.
    compute_t = timed(lambda: train_step(False))

    # 3. Communication only, in DDP's own bucket sizes (bytes, in launch order) once rebuilt.
    info = ddp._get_ddp_logging_data() if hasattr(ddp, "_get_ddp_logging_data") else {}
    sizes_str = info.get("rebuilt_bucket_sizes") or info.get("bucket_sizes")
    sizes_src = "ddp rebuilt" if info.get("rebuilt_bucket_sizes") else "ddp initial"
    numel = sum(p.numel() for p in ddp.parameters())
    if sizes_str:
        sizes = [int(s) // 4 for s in str(sizes_str).split(",")]
    else:  # no logging data: whole tensors from the last parameter back, first cap then cap
        sizes, cur, src_caps, sizes_src = [], 0, [first_bytes, cap_bytes], "reconstructed"
        for p in reversed(list(ddp.parameters())):
            cur += p.numel()
            if cur * 4 >= src_caps[min(len(sizes), 1)]:
                sizes.append(cur)
                cur = 0
        sizes += [cur] if cur else []
    if sum(sizes) != numel:
        fail(f"bucket sizes ({sum(sizes)} floats) do not add up to the gradient ({numel})")
    flat = torch.randn(numel)
    chunks = list(torch.split(flat, sizes))

    def allreduce_buckets():
        works = [dist.all_reduce(c, async_op=True) for c in chunks]
        for w in works:
            w.wait()

    comm_t = timed(allreduce_buckets)

    if rank == 0:
        step_ms, compute_ms, comm_ms = (statistics.median(t) for t in (step_t, compute_t, comm_t))
        hidden = max(0.0, min(1.0, (compute_ms + comm_ms - step_ms) / comm_ms)) if comm_ms > 0 else None
        r = lambda v: round(v, 3)  # noqa: E731
        print(json.dumps({
            "framework": "pytorch-ddp-gloo", "torch_version": torch.__version__, "model": args.model,
            "params": params, "world_size": world, "batch_per_rank": args.batch,
            "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
            "channels_last": args.channels_last, "bucket_mb": args.bucket_mb,
            "first_bucket_mb": round(first_bytes / mib, 6), "first_bucket_set_by": first_how,
            "bucket_sizes_bytes": [s * 4 for s in sizes], "bucket_sizes_source": sizes_src,
            "gradient_as_bucket_view": True, "broadcast_buffers": bool(ddp.broadcast_buffers),
            "buffer_bytes": sum(b.numel() * b.element_size() for b in ddp.module.buffers()),
            "warmup": args.warmup, "steps": args.steps,
            "step_ms": r(step_ms), "step_ms_min": r(min(step_t)),
            "compute_ms": r(compute_ms), "compute_ms_min": r(min(compute_t)),
            "comm_ms": r(comm_ms), "comm_ms_min": r(min(comm_t)),
            "hidden_share": None if hidden is None else r(hidden),
            "samples_per_s": round(world * args.batch / (step_ms / 1e3), 2),
            "network": args.network, "gloo_iface": iface, "load_avg_1m": round(os.getloadavg()[0], 2),
        }), flush=True)
    dist.barrier()  # nobody leaves while rank 0 (the store) may still be needed
    # No teardown: torch 1.13 can deadlock at exit (seen under netem, resnet18) when the Reducer's
    # ProcessGroupGloo destructor, run with the GIL held, joins a gloo worker thread that is
    # freeing a tensor and waits for the GIL. Everything is done and printed; leave at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
