#!/usr/bin/python3
"""PyTorch reference fixtures for the speech layers (tests/fixtures/lstm_*.safetensors, ctc_*.safetensors).

Run with Debian's Python, which has python3-torch and python3-numpy:

    /usr/bin/python3 scripts/make_speech_fixtures.py          # writes into tests/fixtures/

The fixtures are committed; the tests never need torch. Output is deterministic (fixed seeds, one
thread). The safetensors writer and the naming conventions are those of make_torch_fixtures.py
("param.<name>", "grad.param.<name>", "grad.input", "f64.<name>" for the float64 result), except
that sequences are time-major as torch.nn.LSTM's default: {T, N, features}.
"""

import copy
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_torch_fixtures import np_of, write_safetensors  # noqa: E402
from torch_speech_models import DeepSpeech, deepspeech_loss  # noqa: E402

META = {
    "generator": "scripts/make_speech_fixtures.py",
    "torch_version": torch.__version__,
    "layouts": "sequences time-major {T, N, C}; LSTM weights as torch.nn.LSTM ({4H, in}, gates i, f, g, o)",
}


# ---------------------------------------------------------------------------------------------------
# torch.nn.LSTM, 2 layers, bidirectional, on a packed batch of unsorted lengths

def lstm_bidir():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(3)
    T, N, I, H = 7, 3, 5, 4
    lengths = torch.tensor([5, 7, 2])
    net = nn.LSTM(I, H, num_layers=2, bidirectional=True)
    x = torch.randn(T, N, I, generator=gen)
    # Padding frames hold junk: the engine must not read them (PyTorch's packed sequence cannot).
    weight = torch.randn(T, N, 2 * H, generator=gen)  # objective: sum(weight * output)

    store = {"input": np_of(x), "lengths": lengths.numpy().astype("int32"), "objective_weight": np_of(weight)}
    for n, p in net.named_parameters():
        store["param." + n] = np_of(p)
    for prefix, dtype in (("", torch.float32), ("f64.", torch.float64)):
        m = copy.deepcopy(net).to(dtype)
        xx = x.to(dtype).clone().requires_grad_(True)
        packed = pack_padded_sequence(xx, lengths, enforce_sorted=False)
        out, _ = m(packed)
        out, _ = pad_packed_sequence(out, total_length=T)
        loss = (out * weight.to(dtype)).sum()
        loss.backward()
        store[prefix + "output"] = np_of(out)
        store[prefix + "grad.input"] = np_of(xx.grad)
        for n, p in m.named_parameters():
            store[f"{prefix}grad.param.{n}"] = np_of(p.grad)
    meta = dict(META)
    meta.update({
        "architecture": "torch.nn.LSTM(5, 4, num_layers=2, bidirectional=True), default init (seed 0)",
        "inputs": ("input {T=7, N=3, 5} (padding frames random), lengths [5, 7, 2] (I32) via "
                   "pack_padded_sequence(enforce_sorted=False); output = pad_packed_sequence(total_length=7)"),
        "objective": "loss = sum(objective_weight * output); grad.* are its gradients",
    })
    return {"lstm_bidir.safetensors": (store, meta)}


# ---------------------------------------------------------------------------------------------------
# F.ctc_loss

def ctc():
    gen = torch.Generator().manual_seed(4)
    T, N, C = 12, 4, 6
    frames = torch.tensor([12, 9, 7, 5])
    # Repeats (3, 3) need a blank between them; the third utterance has no labels at all; the
    # last one is as long as its frames allow (4 labels + 1 repeat = 5 frames).
    targets = [[1, 3, 3, 2], [5, 4, 1], [], [2, 2, 4, 1]]
    label_lengths = torch.tensor([len(t) for t in targets])
    labels = torch.tensor([c for t in targets for c in t])
    logits = torch.randn(T, N, C, generator=gen) * 2

    store = {"logits": np_of(logits), "frames": frames.numpy().astype("int32"),
             "labels": labels.numpy().astype("int32"), "label_lengths": label_lengths.numpy().astype("int32")}
    for prefix, dtype in (("", torch.float32), ("f64.", torch.float64)):
        z = logits.to(dtype).clone().requires_grad_(True)
        lp = z.log_softmax(2)
        losses = F.ctc_loss(lp, labels, frames, label_lengths, blank=0, reduction="none")
        loss = F.ctc_loss(lp, labels, frames, label_lengths, blank=0, reduction="sum") / N
        loss.backward()
        store[prefix + "losses"] = np_of(losses)
        store[prefix + "loss"] = np_of(loss)
        store[prefix + "grad.logits"] = np_of(z.grad)
    meta = dict(META)
    meta.update({
        "inputs": ("logits {T=12, N=4, C=6} unnormalized; frames [12, 9, 7, 5]; labels concatenated "
                   "(I32), label_lengths [4, 3, 0, 4]; blank 0"),
        "outputs": ("losses = F.ctc_loss(logits.log_softmax(2), ..., reduction='none'); "
                    "loss = F.ctc_loss(..., reduction='sum') / N; grad.logits = d loss / d logits"),
    })
    return {"ctc_loss.safetensors": (store, meta)}


# ---------------------------------------------------------------------------------------------------
# A tiny DeepSpeech: the structure of models/nets/deepspeech.h at small sizes (the torch.nn model in
# torch_speech_models.py, with deepspeech.pytorch's module names, so state_dict names match).

def deepspeech_tiny():
    torch.manual_seed(5)
    gen = torch.Generator().manual_seed(6)
    F_, T_ = 8, 14
    net = DeepSpeech(F_, channels=2, hidden=4, layers=2, context=2, classes=5)
    for m in net.modules():  # batch-norm affine parameters away from 1/0
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            with torch.no_grad():
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
    frames = torch.tensor([14, 10])
    features = torch.randn(2, T_, F_, generator=gen)  # {N, T, F} as the loader gives
    features[1, 10:] = 0
    targets = [[1, 2, 2], [3, 4]]
    labels = torch.tensor([c for t in targets for c in t])
    label_lengths = torch.tensor([len(t) for t in targets])

    store = {"features": np_of(features), "frames": frames.numpy().astype("int32"),
             "labels": labels.numpy().astype("int32"), "label_lengths": label_lengths.numpy().astype("int32")}
    for n, p in net.named_parameters():
        store["param." + n] = np_of(p)
    for prefix, dtype in (("", torch.float32), ("f64.", torch.float64)):
        m = copy.deepcopy(net).to(dtype)
        m.train()
        loss, logits, _ = deepspeech_loss(m, features.to(dtype), frames, targets)
        loss.backward()
        store[prefix + "logits"] = np_of(logits)
        store[prefix + "loss"] = np_of(loss)
        for n, p in m.named_parameters():
            store[f"{prefix}grad.param.{n}"] = np_of(p.grad)
        for n, b in m.named_buffers():
            if not n.endswith("num_batches_tracked"):
                store[f"{prefix}buffer.{n}"] = np_of(b)
        m.eval()
        with torch.no_grad():
            x = features.to(dtype).transpose(1, 2).unsqueeze(1)  # {N, 1, F, T}
            store[prefix + "logits_eval"] = np_of(m(x, frames)[0])
    meta = dict(META)
    meta.update({
        "architecture": ("DeepSpeech structure at small sizes: features 8, conv channels 2, LSTM hidden 4, "
                         "2 LSTM layers, lookahead context 2, 5 classes; sequence-wise batch norms over valid "
                         "frames; masks after every conv stage"),
        "inputs": ("features {N=2, T=14, F=8} (the loader's layout; utterance 1 zero past frame 10), "
                   "frames [14, 10], labels [1 2 2 | 3 4]"),
        "outputs": ("logits {T'=7, N, 5} of one train-mode forward, loss = ctc_loss(sum) / N, grad.param.*, "
                    "buffer.* after it, logits_eval = eval-mode forward with those buffers"),
    })
    return {"ctc_deepspeech_tiny.safetensors": (store, meta)}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "fixtures")
    torch.set_num_threads(1)
    for make in (lstm_bidir, ctc, deepspeech_tiny):
        for fname, (store, meta) in make().items():
            path = os.path.join(out, fname)
            size = write_safetensors(path, store, meta)
            print(f"{os.path.relpath(path)}: {len(store)} tensors, {size} bytes")


if __name__ == "__main__":
    main()
