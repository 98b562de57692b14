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
    ap.set_defaults(channels_last=False)
    ap.add_argument("--autocast-bf16", dest="autocast_bf16", action="store_true",
                    help="forward and loss under torch.autocast(dtype=torch.bfloat16): mixed precision, "
                         "parameters and optimizer state fp32")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
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


def main():
    args = ARGS
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build(args.model)
    params = sum(p.numel() for p in model.parameters())
    assert params == PARAM_COUNTS[args.model], f"{args.model}: {params} parameters, expected {PARAM_COUNTS[args.model]}"
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(device=device, memory_format=fmt).train()
    x = torch.randn(args.batch, 3, 32, 32, device=device).contiguous(memory_format=fmt)
    y = torch.randint(0, 10, (args.batch,), device=device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.autocast_bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

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
    # CPU seconds of all this process's threads per wall second: about --threads on an idle machine,
    # well below it when other processes take the cores (then the times are not comparable).
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
    }))


if __name__ == "__main__":
    main()
