#!/usr/bin/python3
"""PyTorch reference fixture for Listen, Attend and Spell (tests/fixtures/las_tiny.safetensors).

Run with Debian's Python, which has python3-torch and python3-numpy:

    /usr/bin/python3 scripts/make_las_fixtures.py          # writes into tests/fixtures/

The model is torch_speech_models.Las (the structure of models/nets/las.h) at tiny sizes. The
fixture is committed; the tests never need torch. Output is deterministic (fixed seeds, one thread).
Conventions as make_speech_fixtures.py: "param.<name>" (float32 initial weights), "grad.param.<name>",
"f64.<name>" for the float64 result of the same computation; features in the loader's layout
{N, T, F}; logits {U, N, classes} (U = longest transcript + 1; rows u > L_n of utterance n are
computed but not part of the loss).
"""

import copy
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_torch_fixtures import np_of, write_safetensors  # noqa: E402
from torch_speech_models import (LAS_EOS, LAS_PARAMETERS, LAS_SOS, Las, las_greedy_decode, las_loss,  # noqa: E402
                                 las_targets)

TINY = dict(feature_dim=6, listener_hidden=4, pyramid_layers=2, attention_dim=5, embedding_dim=3,
            speller_hidden=7, speller_layers=2, classes=33)
SMOOTHING = 0.1
DECODE_STEPS = 8
EOS_DECODE_STEPS = 12


def las_tiny():
    # The an4 configuration of docs/architecture.md section 5 (the defaults) has exactly this many parameters.
    default_count = sum(p.numel() for p in Las().parameters())
    assert default_count == LAS_PARAMETERS, f"default Las has {default_count} parameters, expected {LAS_PARAMETERS}"

    torch.manual_seed(7)
    gen = torch.Generator().manual_seed(8)
    net = Las(**TINY)
    # Away from the default init: at its tiny sizes the default model's listener outputs are small
    # and its attention nearly uniform, so the attention gradients were 1e-4 of the others and
    # dominated by rounding (float32 PyTorch itself was 2.5e-4 off float64). Larger listener and
    # attention weights make the attention peaked and its gradients of the others' size.
    with torch.no_grad():
        for p in net.listener.parameters():
            p.mul_(3)
        for p in net.attention.parameters():
            p.mul_(4)
    N, T = 3, 17
    frames = torch.tensor([17, 12, 9])  # unsorted after the first; listener lengths 4, 3, 2
    # Padding frames hold junk: the model must not read them (PyTorch's packed sequences cannot).
    features = torch.randn(N, T, TINY["feature_dim"], generator=gen)
    targets = [[8, 5, 12, 12, 15], [28, 1], [20, 9, 14, 25]]  # different lengths, repeats, space, apostrophe
    labels = torch.tensor([c for t in targets for c in t])
    label_lengths = torch.tensor([len(t) for t in targets])

    store = {"features": np_of(features), "frames": frames.numpy().astype("int32"),
             "labels": labels.numpy().astype("int32"), "label_lengths": label_lengths.numpy().astype("int32"),
             "listener_lengths": (frames >> TINY["pyramid_layers"]).numpy().astype("int32"),
             "targets": las_targets(targets)[0].numpy().astype("int32")}
    for n, p in net.named_parameters():
        store["param." + n] = np_of(p)
    losses = {}
    for prefix, dtype in (("", torch.float32), ("f64.", torch.float64)):
        m = copy.deepcopy(net).to(dtype)
        loss, logits = las_loss(m, features.to(dtype), frames, targets, SMOOTHING, teacher_forcing=1.0)
        loss.backward()
        losses[dtype] = loss.item()
        store[prefix + "loss"] = np_of(loss)
        store[prefix + "logits"] = np_of(logits)
        for n, p in m.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, f"{n}: no gradient"
            store[f"{prefix}grad.param.{n}"] = np_of(p.grad)
    # Every gradient is well above rounding: float32 PyTorch agrees with float64 to 1e-5 relative.
    for n, _ in net.named_parameters():
        ref, f32 = store[f"f64.grad.param.{n}"], store[f"grad.param.{n}"]
        assert abs(f32 - ref).max() <= 1e-5 * abs(ref).max(), f"{n}: float32 and float64 gradients disagree"

    # The padding frames do not matter: other junk there gives the same loss (float64).
    m = copy.deepcopy(net).to(torch.float64)
    junk = features.clone().to(torch.float64)
    for n in range(N):
        junk[n, frames[n]:] = torch.randn(T - frames[n], TINY["feature_dim"], generator=gen, dtype=torch.float64)
    assert abs(las_loss(m, junk, frames, targets, SMOOTHING)[0].item() - losses[torch.float64]) < 1e-12

    # Greedy decoding (float64) of the untrained model: the argmax of every step is kept (also
    # ids no transcript uses), up to <eos> or DECODE_STEPS tokens.
    margin = store_greedy(store, "greedy_", net, features, frames, DECODE_STEPS)
    # A second model whose greedy decoding of utterance 2 ends with <eos> after some tokens (the
    # first one's never emits it): the fixture's weights with larger embeddings and speller input
    # weights and a raised <eos> bias, from another seed.
    torch.manual_seed(2)
    eos_net = Las(**TINY)
    with torch.no_grad():
        for p in eos_net.listener.parameters():
            p.mul_(3)
        for p in eos_net.attention.parameters():
            p.mul_(4)
        eos_net.speller.embedding.weight.mul_(8)
        for cell in eos_net.speller.cells:
            cell.weight_ih.mul_(3)
        eos_net.speller.output.bias[LAS_EOS] += 0.4
    for n, p in eos_net.named_parameters():
        store["greedy_eos.param." + n] = np_of(p)
    eos_margin = store_greedy(store, "greedy_eos_", eos_net, features, frames, EOS_DECODE_STEPS)
    assert 1 < store["greedy_eos_lengths"][2] < EOS_DECODE_STEPS, store["greedy_eos_lengths"]

    meta = {
        "generator": "scripts/make_las_fixtures.py (model: scripts/torch_speech_models.py Las)",
        "torch_version": torch.__version__,
        "architecture": ("Las(" + ", ".join(f"{k}={v}" for k, v in TINY.items()) +
                         "), PyTorch default init (seed 7), then listener weights x 3 and attention "
                         "weights x 4; <sos> 29, <eos> 30"),
        "parameter_order": ",".join(n for n, _ in net.named_parameters()),
        "default_parameters": str(default_count),
        "inputs": ("features {N=3, T=17, F=6} (padding frames random junk), frames [17, 12, 9] (I32), labels "
                   "[8 5 12 12 15 | 28 1 | 20 9 14 25] concatenated with label_lengths [5, 2, 4]; listener_lengths "
                   "= frames >> 2; targets {U=6, N} = labels then <eos> (30), padded with 30"),
        "outputs": ("loss = las_loss(label_smoothing=0.1, teacher_forcing=1.0): CrossEntropyLoss(label_smoothing) "
                    "mean over the 14 target tokens; logits {U=6, N=3, 33} (rows u > L_n not in the loss); "
                    "grad.param.* = d loss / d param"),
        "greedy": (f"greedy_tokens / greedy_lengths: float64 greedy decoding (from <sos>, feed back each step's "
                   f"argmax, stop at the first argmax <eos>, which is not included) of the model, up to "
                   f"{DECODE_STEPS} tokens, raw argmax ids; top-2 logit margin >= {margin:.4f}"),
        "greedy_eos": (f"greedy_eos_tokens / greedy_eos_lengths: the same for the weights greedy_eos.param.* "
                       f"(seed 2; listener x 3, attention x 4, embedding x 8, speller weight_ih x 3, output "
                       f"bias[<eos>] + 0.4), up to {EOS_DECODE_STEPS} tokens: utterance 2 ends with <eos> after "
                       f"{store['greedy_eos_lengths'][2]} tokens; top-2 logit margin >= {eos_margin:.4f}"),
    }
    return {"las_tiny.safetensors": (store, meta)}


def store_greedy(store, prefix, net, features, frames, max_steps):
    """Greedy decoding of `net` in float64 into store[prefix + "tokens"] (concatenated) and
    store[prefix + "lengths"]; returns the smallest top-2 logit margin of the steps that decided
    it, checked to be large enough for float32 arithmetic to pick the same tokens."""
    m = copy.deepcopy(net).to(torch.float64)
    x = features.to(torch.float64)
    decoded = las_greedy_decode(m, x, frames, max_steps=max_steps)
    with torch.no_grad():  # replay the decode, collecting each utterance's margins until it ended
        h, keys, mask = m.listen(x, frames)
        n = x.shape[0]
        context, states = m.initial_state(n, x.dtype)
        tokens = torch.full((n,), LAS_SOS, dtype=torch.long)
        margins = []
        for t in range(max(len(d) for d in decoded) + 1):
            out, context, states = m.step(tokens, context, states, h, keys, mask)
            top = out.topk(2, 1).values
            margins += [(top[i, 0] - top[i, 1]).item() for i in range(n)
                        if t < len(decoded[i]) or t == len(decoded[i]) < max_steps]
            tokens = out.argmax(1)
    assert min(margins) > 1e-3, f"{prefix}: greedy decoding has a near tie (margin {min(margins)})"
    store[prefix + "tokens"] = torch.tensor([c for d in decoded for c in d]).numpy().astype("int32")
    store[prefix + "lengths"] = torch.tensor([len(d) for d in decoded]).numpy().astype("int32")
    return min(margins)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "fixtures")
    torch.set_num_threads(1)
    for fname, (store, meta) in las_tiny().items():
        path = os.path.join(out, fname)
        size = write_safetensors(path, store, meta)
        print(f"{os.path.relpath(path)}: {len(store)} tensors, {size} bytes")


if __name__ == "__main__":
    main()
