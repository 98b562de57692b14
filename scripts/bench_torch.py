#!/usr/bin/python3
"""PyTorch side of the training-step benchmark (docs/architecture.md section 8).

Times one training step (forward, cross-entropy, backward, SGD momentum step) of a CIFAR model at a
given batch size on random 3x32x32 input, and prints one JSON line on stdout:

    /usr/bin/python3 scripts/bench_torch.py --model resnet20 --threads 2 --channels-last
    {"model": "resnet20", "params": 269722, ..., "median_ms": ..., "mean_ms": ..., "samples_per_s": ...}

Run it with Debian's Python (/usr/bin/python3 has python3-torch). The models are the ones the C++
trainer implements (docs/architecture.md section 5), and their parameter counts are asserted:
  resnet20 / resnet56  He et al. 2016 CIFAR ResNets, option-A shortcuts (akamaster/pytorch_resnet_cifar10)
  resnet18             CIFAR variant: 3x3 stem 64, no max-pool, 1x1 conv + BN projection shortcuts
  vgg16                CIFAR VGG-16 with BN, conv bias, Linear(512, 10)
samples_per_s is batch / median step time. cpu_per_wall (CPU seconds of this process per wall second
while timing) should be close to --threads; a much lower value means other processes were using the
cores and the times are inflated.

On a GPU (--device cuda) it runs what a practitioner would: channels_last (the default there),
cudnn.benchmark, fp32 with TF32 off unless --tf32, SGD fused (or foreach) rather than a loop over
parameters, step times from CUDA events between steps the host queues back to back. median_ms is
then the eager step, and graph_median_ms (and graph_mean/min/max_ms, graph_samples_per_s) the same
step captured once in one CUDA graph and replayed (static input and target, as the trainer's bench
uses a fixed batch); --no-graph skips it. `trainer bench --device cuda` runs this twice: TF32 off,
and --tf32 for PyTorch's best.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

PARAM_COUNTS = {"resnet20": 269_722, "resnet56": 853_018, "resnet18": 11_173_962, "vgg16": 14_728_266}


def parse_args():
    ap = argparse.ArgumentParser(description="Time a PyTorch CIFAR training step.")
    ap.add_argument("--model", choices=sorted(PARAM_COUNTS), default="resnet20")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--channels-last", dest="channels_last", action="store_true",
                    help="model and input in channels-last (NHWC) memory format")
    ap.add_argument("--no-channels-last", dest="channels_last", action="store_false")
    ap.set_defaults(channels_last=None)  # on for cuda, off for cpu (the CPU numbers' default)
    ap.add_argument("--autocast-bf16", dest="autocast_bf16", action="store_true",
                    help="forward and loss under torch.autocast(dtype=torch.bfloat16): mixed precision, "
                         "parameters and optimizer state fp32")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--tf32", action="store_true",
                    help="cuda: let cuDNN and cuBLAS use TF32 for fp32 (off by default, as the trainer's fp32)")
    ap.add_argument("--no-graph", dest="graph", action="store_false",
                    help="cuda: skip timing the step captured in one CUDA graph")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    if args.channels_last is None:
        args.channels_last = cuda
    if not cuda and args.tf32:
        ap.error("--tf32 is for --device cuda")
    if args.threads < 1 or args.batch < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("--threads, --batch and --steps must be >= 1, --warmup >= 0")
    return args


ARGS = parse_args()
# The OpenMP/MKL pools are sized when torch loads, so the thread count goes in before the import.
for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


# --- ResNet-20/32/56 (CIFAR, option A) ---------------------------------------------------------------

class CifarBasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.pad = planes // 4 if (stride != 1 or in_planes != planes) else None

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.pad is None:
            short = x
        else:  # option A: subsample and zero-pad channels, no parameters
            short = F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad), "constant", 0)
        return F.relu(out + short)


class CifarResNet(nn.Module):
    def __init__(self, n, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        layers, in_planes = [], 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                layers.append(CifarBasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.linear = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layers(out)
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


# --- ResNet-18 (CIFAR variant, projection shortcuts) --------------------------------------------------

class ProjBasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, in_planes = [], 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            for i in range(2):
                layers.append(ProjBasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layers(out)
        out = F.avg_pool2d(out, 4).flatten(1)
        return self.linear(out)


# --- VGG-16 with BN (CIFAR) ---------------------------------------------------------------------------

VGG16_CFG = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]


class VGG16(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        layers, in_ch = [], 3
        for v in VGG16_CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(in_ch, v, 3, padding=1, bias=True), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
                in_ch = v
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(512, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


def build(name):
    if name == "resnet20":
        return CifarResNet(3)
    if name == "resnet56":
        return CifarResNet(9)
    if name == "resnet18":
        return ResNet18()
    if name == "vgg16":
        return VGG16()
    raise ValueError(name)


def make_optimizer(model, device):
    """SGD with momentum and weight decay. On a GPU the strongest form PyTorch has: fused (one
    multi-tensor kernel a step) where this release has it, else foreach; the CPU keeps the default
    per-parameter loop that BENCHMARKS.md's CPU numbers were taken with."""
    kwargs = dict(lr=0.01, momentum=0.9, weight_decay=5e-4)
    if device.type != "cuda":
        return torch.optim.SGD(model.parameters(), **kwargs), "sgd"
    try:
        return torch.optim.SGD(model.parameters(), fused=True, **kwargs), "sgd fused"
    except (TypeError, RuntimeError):  # a release without fused SGD
        return torch.optim.SGD(model.parameters(), foreach=True, **kwargs), "sgd foreach"


def setup_cuda(args, device):
    if not torch.cuda.is_available():
        sys.exit(f"bench_torch: --device {args.device} needs a GPU, and torch {torch.__version__} "
                 f"(CUDA {torch.version.cuda}) sees none")
    if device.index is not None:  # plain "cuda" is the current device (set_device wants an index)
        torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True
    # Both switches: cuBLAS (the Linear layer) and cuDNN (the convolutions) decide TF32 separately.
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32


def time_cuda(run, warmup, steps):
    """Milliseconds of each of `steps` calls of run() after `warmup`, from CUDA events recorded
    between them on the current stream. The host queues the steps back to back with no
    synchronization, as a training loop does, so a step costs whichever is slower: the GPU's work or
    the host's launches (an eager step of a small network is launch-bound)."""
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    events[0].record()
    for i in range(steps):
        run()
        events[i + 1].record()
    torch.cuda.synchronize()
    return [events[i].elapsed_time(events[i + 1]) for i in range(steps)]


def capture_step(forward_backward, opt):
    """The whole step (forward, loss, backward, optimizer) captured in one CUDA graph, by the recipe
    of PyTorch's CUDA-graph documentation: a few steps on a side stream first (cudnn.benchmark's
    search, the momentum buffers and the allocator's pools all settle outside the capture), then the
    capture with the gradients set to None, so backward allocates them in the graph's pool. Returns
    the graph and its static loss tensor."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            forward_backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss = forward_backward()
        opt.step()
    return graph, loss


def summary(prefix, times_ms, batch):
    median = statistics.median(times_ms)
    return {
        prefix + "median_ms": round(median, 3),
        prefix + "mean_ms": round(statistics.fmean(times_ms), 3),
        prefix + "min_ms": round(min(times_ms), 3),
        prefix + "max_ms": round(max(times_ms), 3),
        prefix + "samples_per_s": round(batch / (median / 1e3), 2),
    }


def main():
    args = ARGS
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "cuda":
        setup_cuda(args, device)
    model = build(args.model)
    params = sum(p.numel() for p in model.parameters())
    assert params == PARAM_COUNTS[args.model], f"{args.model}: {params} parameters, expected {PARAM_COUNTS[args.model]}"
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(device=device, memory_format=fmt).train()
    x = torch.randn(args.batch, 3, 32, 32, device=device).contiguous(memory_format=fmt)
    y = torch.randint(0, 10, (args.batch,), device=device)
    opt, optimizer_name = make_optimizer(model, device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def forward_backward(cache=True):
        # Autocast's weight cache must be off inside a graph capture (the cached casts would be
        # freed tensors on replay).
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.autocast_bf16,
                            cache_enabled=None if cache else False):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    def step():
        opt.zero_grad(set_to_none=True)
        loss = forward_backward()
        opt.step()
        return loss

    extra = {}
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if device.type == "cuda":
        loss = None

        def eager():
            nonlocal loss
            loss = step()

        times_ms = time_cuda(eager, args.warmup, args.steps)
        cpu_per_wall = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
        extra = {"timing": "cuda events", "optimizer": optimizer_name, "tf32": args.tf32,
                 "gpu": torch.cuda.get_device_name(device), "cudnn_version": torch.backends.cudnn.version() or 0}
        if args.graph:
            graph, loss = capture_step(lambda: forward_backward(cache=False), opt)
            extra.update(summary("graph_", time_cuda(graph.replay, args.warmup, args.steps), args.batch))
    else:
        for _ in range(args.warmup):
            step()
        sync()
        times_ms = []
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(args.steps):
            t0 = time.perf_counter()
            loss = step()
            sync()
            times_ms.append((time.perf_counter() - t0) * 1e3)
        # CPU seconds of all this process's threads per wall second: about --threads on an idle
        # machine, well below it when other processes take the cores (then the times are not
        # comparable).
        cpu_per_wall = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    if not torch.isfinite(loss).item():
        sys.exit("bench_torch: loss is not finite")

    median = statistics.median(times_ms)
    print(json.dumps({
        "framework": "pytorch",
        "torch_version": torch.__version__,
        # The kernels ATen dispatched to (ATEN_CPU_CAPABILITY caps it); torch 1.13 cannot say.
        "cpu_capability": getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: "?")(),
        "model": args.model,
        "params": params,
        "batch": args.batch,
        "threads": torch.get_num_threads(),
        "channels_last": args.channels_last,
        "autocast_bf16": args.autocast_bf16,
        "device": str(device),
        "warmup": args.warmup,
        "steps": args.steps,
        "median_ms": round(median, 3),
        "mean_ms": round(statistics.fmean(times_ms), 3),
        "min_ms": round(min(times_ms), 3),
        "max_ms": round(max(times_ms), 3),
        "samples_per_s": round(args.batch / (median / 1e3), 2),
        "cpu_per_wall": round(cpu_per_wall, 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpu": platform.processor() or platform.machine(),
        **extra,
    }))


if __name__ == "__main__":
    main()
