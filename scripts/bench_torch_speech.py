#!/usr/bin/python3
"""PyTorch side of the speech training-step benchmark (docs/architecture.md section 8; `trainer bench --model
deepspeech|las` runs it beside the C++ step).

Times one training step (forward, loss, backward, SGD momentum step) of a speech model of
scripts/torch_speech_models.py at its default (paper) sizes and prints one JSON line on stdout:

    /usr/bin/python3 scripts/bench_torch_speech.py --model las --threads 2
    {"model": "las", "params": 27468449, ..., "median_ms": ..., "samples_per_s": ...}

The batch is the one trainer/tools/bench.cpp builds: --batch utterances of --frames frames each (161
spectrogram bins for deepspeech, 80 log-mel bins for las; random values), utterance n has
--label-length - 1 + (n % 3) random characters (ids 1..28).
  deepspeech  CTC loss, mean over utterances
  las         teacher forcing 1.0, label smoothing 0.1 (models/nets/las.h)
Every utterance has all --frames frames, so the LSTMs run unpacked (the same result as packed
sequences, which PyTorch's CPU backward handles far more slowly; --packed times that). The SGD step
is lr 0.01, momentum 0.9, weight decay 5e-4, as in the image benchmark. --device cuda runs it on a
GPU (each timed part then ends with torch.cuda.synchronize). The medians of
the forward (with the loss), backward and optimizer parts are reported too. cpu_per_wall (CPU
seconds of this process per wall second while timing) should be close to --threads; a much lower
value means other processes were using the cores.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

FEATURES = {"deepspeech": 161, "las": 80}


def parse_args():
    ap = argparse.ArgumentParser(description="Time a PyTorch speech-model training step.")
    ap.add_argument("--model", choices=sorted(FEATURES), default="deepspeech")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--frames", type=int, default=300, help="input frames of every utterance")
    ap.add_argument("--label-length", dest="label_length", type=int, default=40,
                    help="characters per transcript (utterance n: this - 1 + n %% 3)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--packed", action="store_true",
                    help="run the LSTMs on packed sequences although no utterance is padded (PyTorch's "
                         "packed backward is much slower on the CPU; the default runs them unpacked)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--autocast-bf16", dest="autocast_bf16", action="store_true",
                    help="forward and loss under torch.autocast(dtype=torch.bfloat16), as runtime.precision = "
                         "bf16 (on the CPU autocast runs the LSTMs and Linears on bf16 copies)")
    args = ap.parse_args()
    if min(args.threads, args.batch, args.steps, args.frames, args.label_length) < 1 or args.warmup < 0:
        ap.error("--threads, --batch, --frames, --label-length and --steps must be >= 1, --warmup >= 0")
    return args


ARGS = parse_args()
# The OpenMP/MKL pools are sized when torch loads, so the thread count goes in before the import.
for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_speech_models as tsm  # noqa: E402


def main():
    args = ARGS
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tsm.SKIP_PACKING_WITHOUT_PADDING = not args.packed
    if args.model == "deepspeech":
        model, expected = tsm.DeepSpeech(), tsm.DEEPSPEECH_PARAMETERS
    else:
        model, expected = tsm.Las(), tsm.LAS_PARAMETERS
    params = sum(p.numel() for p in model.parameters())
    assert params == expected, f"{args.model}: {params} parameters, expected {expected}"
    device = torch.device(args.device)
    model.to(device).train()

    features = torch.randn(args.batch, args.frames, FEATURES[args.model]).to(device)
    frames = torch.full((args.batch,), args.frames, dtype=torch.long)
    labels = [torch.randint(1, 29, (args.label_length - 1 + n % 3,)).tolist() for n in range(args.batch)]
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    def loss_of():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.autocast_bf16):
            if args.model == "deepspeech":
                return tsm.deepspeech_loss(model, features, frames, labels)[0]
            return tsm.las_loss(model, features, frames, labels, smoothing=0.1, teacher_forcing=1.0)[0]

    def sync():  # a phase ends when the device has done its work
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def step():
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_of()
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        opt.step()
        sync()
        t3 = time.perf_counter()
        return loss, ((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3)

    for _ in range(args.warmup):
        step()
    times = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(args.steps):
        loss, parts = step()
        times.append(parts)
    cpu_per_wall = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    if not torch.isfinite(loss).item():
        sys.exit("bench_torch_speech: loss is not finite")

    totals = [sum(p) for p in times]
    median = statistics.median(totals)
    print(json.dumps({
        "framework": "pytorch",
        "torch_version": torch.__version__,
        # The kernels ATen dispatched to (ATEN_CPU_CAPABILITY caps it); torch 1.13 cannot say.
        "cpu_capability": getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: "?")(),
        "model": args.model,
        "device": str(device),
        "params": params,
        "batch": args.batch,
        "frames": args.frames,
        "label_length": args.label_length,
        "packed": args.packed,
        "autocast_bf16": args.autocast_bf16,
        "threads": torch.get_num_threads(),
        "warmup": args.warmup,
        "steps": args.steps,
        "median_ms": round(median, 3),
        "mean_ms": round(statistics.fmean(totals), 3),
        "min_ms": round(min(totals), 3),
        "max_ms": round(max(totals), 3),
        "forward_ms": round(statistics.median(t[0] for t in times), 3),
        "backward_ms": round(statistics.median(t[1] for t in times), 3),
        "optimizer_ms": round(statistics.median(t[2] for t in times), 3),
        "samples_per_s": round(args.batch / (median / 1e3), 3),
        "cpu_per_wall": round(cpu_per_wall, 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpu": platform.processor() or platform.machine(),
    }))


if __name__ == "__main__":
    main()
