"""The speech models of docs/architecture.md section 5 in torch.nn, for fixtures and benchmarks.

Imported by scripts/make_speech_fixtures.py, scripts/make_las_fixtures.py and
scripts/bench_torch_speech.py (run them with Debian's /usr/bin/python3, which has python3-torch).
Both models are written here from the architecture descriptions (models/nets/deepspeech.h,
models/nets/las.h) with the module names the C++ models use for their parameters, so state_dict
names and parameter order are the same on both sides.

  DeepSpeech  conv stack + LSTMs + lookahead + fc, CTC loss (deepspeech_loss)
  Las         Listen, Attend and Spell: listener BLSTM + pyramidal BLSTMs, MLP-projected
              dot-product attention, LSTMCell speller; label-smoothed cross-entropy (las_loss),
              greedy decoding (las_greedy_decode)

Batches come as the C++ SpeechInput holds them: features {N, T, F} (batch-major, padded; padding
frames are never read), frames {N} (int64 here), labels as one list of class ids per utterance.
The features (and the model) may be on a GPU; frames stay on the CPU, where pack_padded_sequence
wants its lengths.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

DEEPSPEECH_PARAMETERS = 27_569_568
LAS_PARAMETERS = 27_468_449
LAS_SOS, LAS_EOS, LAS_CLASSES = 29, 30, 33


# Benchmarks may set this to False to time packed sequences even where no utterance is padded.
SKIP_PACKING_WITHOUT_PADDING = True


def run_packed(lstm, x, lengths):
    """An nn.LSTM on the valid frames of a padded time-major batch x {T, N, C}; zeros in the padding.

    When no utterance is padded (every length is T) the LSTM runs on x directly: the same result,
    and PyTorch 1.13's backward through a PackedSequence on the CPU grows faster than linearly with
    T (a bidirectional LSTM(80, 384) at T 300, N 8: 6.2 s packed vs 0.5 s plain, 2 threads)."""
    if SKIP_PACKING_WITHOUT_PADDING and bool((lengths == x.shape[0]).all()):
        return lstm(x)[0]
    out, _ = lstm(pack_padded_sequence(x, lengths, enforce_sorted=False))
    out, _ = pad_packed_sequence(out, total_length=x.shape[0])
    return out


# ---------------------------------------------------------------------------------------------------
# DeepSpeech (models/nets/deepspeech.h) with deepspeech.pytorch's module names. The defaults are the
# paper's sizes (27,569,568 parameters); the fixtures use small ones.

def on_valid_frames(module, x, lengths):
    """module applied to the valid frames of a padded {T, N, C} batch only (rows in (t, n) order);
    zeros in the padding."""
    if SKIP_PACKING_WITHOUT_PADDING and bool((lengths == x.shape[0]).all()):  # nothing to leave out
        out = module(x.reshape((-1,) + x.shape[2:]))
        return out.reshape(x.shape[:2] + out.shape[1:])
    valid = torch.arange(x.shape[0], device=x.device)[:, None] < lengths.to(x.device)[None, :]  # {T, N}
    out = module(x[valid])
    y = out.new_zeros(x.shape[:2] + out.shape[1:])  # out's dtype: bf16 under autocast
    y[valid] = out
    return y


class SequenceBN(nn.Module):
    """BatchNorm1d over the valid frames of a padded {T, N, C} batch."""

    def __init__(self, channels):
        super().__init__()
        self.module = nn.BatchNorm1d(channels)

    def forward(self, x, lengths):
        return on_valid_frames(self.module, x, lengths)


class RnnBlock(nn.Module):
    def __init__(self, inputs, hidden, batch_norm):
        super().__init__()
        if batch_norm:
            self.batch_norm = SequenceBN(inputs)
        self.rnn = nn.LSTM(inputs, hidden)

    def forward(self, x, lengths):
        if hasattr(self, "batch_norm"):
            x = self.batch_norm(x, lengths)
        return run_packed(self.rnn, x, lengths)


class LookaheadConv(nn.Module):
    """y[t, n, c] = sum_k w[c, k] x[t + k, n, c], zero past the end."""

    def __init__(self, channels, context):
        super().__init__()
        # Wider than deepspeech.pytorch's init (uniform +-1/sqrt(context + 1)) so that the tiny
        # fixture exercises the weights; the initialization does not matter to the benchmark.
        self.weight = nn.Parameter(torch.empty(channels, context + 1).uniform_(-0.5, 0.5))

    def forward(self, x):
        taps = self.weight.shape[1]
        padded = torch.cat([x, x.new_zeros((taps - 1,) + x.shape[1:])], 0)
        return sum(self.weight[:, k] * padded[k:k + x.shape[0]] for k in range(taps))


class DeepSpeech(nn.Module):
    def __init__(self, features=161, channels=32, hidden=800, layers=5, context=20, classes=29):
        super().__init__()
        self.conv = nn.Module()
        self.conv.seq_module = nn.Sequential(
            nn.Conv2d(1, channels, (41, 11), (2, 2), (20, 5)), nn.BatchNorm2d(channels), nn.Hardtanh(0, 20),
            nn.Conv2d(channels, channels, (21, 11), (2, 1), (10, 5)), nn.BatchNorm2d(channels),
            nn.Hardtanh(0, 20))
        freq = ((features + 40 - 41) // 2 + 1 + 20 - 21) // 2 + 1
        self.rnns = nn.Sequential(*[RnnBlock(channels * freq if k == 0 else hidden, hidden, k > 0)
                                    for k in range(layers)])
        self.lookahead = nn.Sequential(LookaheadConv(hidden, context), nn.Hardtanh(0, 20))
        self.fc = nn.Sequential(nn.Module())
        self.fc[0].module = nn.Sequential(nn.BatchNorm1d(hidden), nn.Linear(hidden, classes, bias=False))

    def forward(self, x, lengths):
        """x {N, 1, F, T}; returns logits {T', N, classes} and the output lengths."""
        lengths = (lengths + 10 - 11) // 2 + 1
        for m in self.conv.seq_module:  # zero the frames past each length after every stage
            x = m(x)
            valid = torch.arange(x.shape[3], device=x.device)[None, :] < lengths.to(x.device)[:, None]
            x = x * valid.to(x.dtype)[:, None, None, :]
        n, c, f, t = x.shape
        x = x.reshape(n, c * f, t).permute(2, 0, 1)
        for block in self.rnns:
            x = block(x, lengths)
        x = self.lookahead(x)
        return on_valid_frames(self.fc[0].module, x, lengths), lengths


def deepspeech_loss(model, features, frames, labels_list):
    """The C++ DeepSpeech's loss: the mean over utterances of the CTC loss (blank 0).
    features {N, T, F}; returns (loss, logits {T', N, classes}, output lengths)."""
    x = features.transpose(1, 2).unsqueeze(1)  # {N, 1, F, T}
    logits, out_lengths = model(x, frames)
    labels = torch.tensor([c for t in labels_list for c in t], dtype=torch.long, device=logits.device)
    label_lengths = torch.tensor([len(t) for t in labels_list], dtype=torch.long)
    loss = F.ctc_loss(logits.log_softmax(2), labels, out_lengths, label_lengths, blank=0,
                      reduction="sum") / features.shape[0]
    return loss, logits, out_lengths


# ---------------------------------------------------------------------------------------------------
# Listen, Attend and Spell (models/nets/las.h). The defaults are the an4 configuration of docs/architecture.md
# section 5: 27,468,449 parameters.

class Listener(nn.Module):
    def __init__(self, feature_dim, hidden, pyramid_layers):
        super().__init__()
        self.blstm = nn.LSTM(feature_dim, hidden, bidirectional=True)
        self.pblstm = nn.ModuleList([nn.LSTM(4 * hidden, hidden, bidirectional=True)
                                     for _ in range(pyramid_layers)])

    def forward(self, x, lengths):
        """x {T, N, F}, lengths {N}; returns h {T >> layers, N, 2 hidden} (zero past each length) and
        the lengths l >> layers."""
        h = run_packed(self.blstm, x, lengths)
        for layer in self.pblstm:
            t2, n, c = h.shape[0] // 2, h.shape[1], h.shape[2]
            # Frames (2t, 2t+1) side by side: [h_2t ; h_2t+1]; an odd last frame is dropped.
            h = h[:2 * t2].reshape(t2, 2, n, c).transpose(1, 2).reshape(t2, n, 2 * c)
            lengths = lengths // 2
            h = run_packed(layer, h, lengths)
        return h, lengths


class Attention(nn.Module):
    def __init__(self, state_dim, value_dim, attention_dim):
        super().__init__()
        self.query = nn.Linear(state_dim, attention_dim)
        self.key = nn.Linear(value_dim, attention_dim)


class Speller(nn.Module):
    def __init__(self, classes, embedding_dim, context_dim, hidden, layers):
        super().__init__()
        self.embedding = nn.Embedding(classes, embedding_dim)
        self.cells = nn.ModuleList([nn.LSTMCell(embedding_dim + context_dim if j == 0 else hidden, hidden)
                                    for j in range(layers)])
        self.output = nn.Linear(hidden + context_dim, classes)


class Las(nn.Module):
    def __init__(self, feature_dim=80, listener_hidden=384, pyramid_layers=3, attention_dim=512,
                 embedding_dim=256, speller_hidden=640, speller_layers=2, classes=LAS_CLASSES):
        super().__init__()
        self.listener = Listener(feature_dim, listener_hidden, pyramid_layers)
        self.attention = Attention(speller_hidden, 2 * listener_hidden, attention_dim)
        self.speller = Speller(classes, embedding_dim, 2 * listener_hidden, speller_hidden, speller_layers)

    def listen(self, features, frames):
        """features {N, T, F}, frames {N}; returns the values h {T', N, 2 Hl}, the keys
        ReLU(key(h)) {T', N, A} and the valid-frame mask {T', N}."""
        h, lengths = self.listener(features.transpose(0, 1), frames)
        keys = F.relu(self.attention.key(h))
        mask = torch.arange(h.shape[0], device=h.device)[:, None] < lengths.to(h.device)[None, :]
        return h, keys, mask

    def initial_state(self, batch, dtype, device=None):
        hidden = self.speller.cells[0].hidden_size
        zeros = torch.zeros(batch, hidden, dtype=dtype, device=device)
        context = torch.zeros(batch, self.speller.output.in_features - hidden, dtype=dtype, device=device)
        return context, [(zeros, zeros) for _ in self.speller.cells]

    def step(self, tokens, context, states, h, keys, mask):
        """One speller step: tokens {N} (the input y_in(t)), the previous context {N, 2 Hl} and cell
        states; returns logits {N, classes}, the new context and the new states."""
        x = torch.cat([self.speller.embedding(tokens), context], 1)
        new_states = []
        for cell, state in zip(self.speller.cells, states):
            hx, cx = cell(x, state)
            new_states.append((hx, cx))
            x = hx
        query = F.relu(self.attention.query(x))  # {N, A}
        energies = (keys * query[None]).sum(2).masked_fill(~mask, float("-inf"))  # {T', N}
        alpha = energies.softmax(0)
        context = (alpha[:, :, None] * h).sum(0)
        return self.speller.output(torch.cat([x, context], 1)), context, new_states


def las_targets(labels_list):
    """Per utterance its class ids then <eos>; returns targets {U, N} (padded with <eos>) and the
    valid mask {U, N}, U = longest transcript + 1."""
    steps = max(len(t) for t in labels_list) + 1
    targets = torch.full((steps, len(labels_list)), LAS_EOS, dtype=torch.long)
    for n, t in enumerate(labels_list):
        targets[:len(t), n] = torch.tensor(t, dtype=torch.long)
    lengths = torch.tensor([len(t) + 1 for t in labels_list])
    return targets, torch.arange(steps)[:, None] < lengths[None, :]


def las_loss(model, features, frames, labels_list, smoothing, teacher_forcing=1.0, generator=None):
    """The training loss of las.h: label-smoothed cross-entropy, mean over all target tokens of the
    batch (each transcript's ids and <eos>). At step t > 0 the input token is the true previous one
    with probability teacher_forcing (drawn per utterance and step from `generator`), otherwise the
    previous step's argmax. Returns (loss, logits {U, N, classes})."""
    device = features.device
    targets, valid = (t.to(device) for t in las_targets(labels_list))
    h, keys, mask = model.listen(features, frames)
    n = features.shape[0]
    context, states = model.initial_state(n, features.dtype, device)
    tokens = torch.full((n,), LAS_SOS, dtype=torch.long, device=device)
    logits = []
    for t in range(targets.shape[0]):
        if t > 0:
            tokens = targets[t - 1]
            if teacher_forcing < 1.0:
                own = logits[-1].detach().argmax(1)
                truth = (torch.rand(n, generator=generator) < teacher_forcing).to(device)
                tokens = torch.where(truth, tokens, own)
        out, context, states = model.step(tokens, context, states, h, keys, mask)
        logits.append(out)
    logits = torch.stack(logits)  # {U, N, classes}
    loss = F.cross_entropy(logits[valid], targets[valid], label_smoothing=smoothing)
    return loss, logits


@torch.no_grad()
def las_greedy_decode(model, features, frames, max_steps=150):
    """Greedy decoding: from <sos>, feed back each step's argmax until <eos> (not part of the
    result) or max_steps tokens. Returns one list of class ids per utterance."""
    h, keys, mask = model.listen(features, frames)
    n = features.shape[0]
    context, states = model.initial_state(n, features.dtype, features.device)
    tokens = torch.full((n,), LAS_SOS, dtype=torch.long, device=features.device)
    result, done = [[] for _ in range(n)], [False] * n
    for _ in range(max_steps):
        out, context, states = model.step(tokens, context, states, h, keys, mask)
        tokens = out.argmax(1)
        for i in range(n):
            if not done[i]:
                if tokens[i].item() == LAS_EOS:
                    done[i] = True
                else:
                    result[i].append(tokens[i].item())
        if all(done):
            break
    return result
