#!/usr/bin/python3
"""Writes tests/fixtures/features_tone.bin: NumPy reference features for data/features.cpp.

Run with Debian's Python (it has NumPy): /usr/bin/python3 scripts/make_feature_fixtures.py
The tests read the committed file and need no Python.

The signal is a tone plus a chirp under a slow amplitude envelope with a little deterministic noise,
quantized to int16 (so the C++ side starts from exactly the same samples), 0.4 s at 16 kHz, with a
length that is not a multiple of the hop so the last frames reach into the reflected padding.

This is an independent float64 implementation of the definition in data/features.h:
  samples / 32768; centred frames (reflect padding of n_fft // 2 on both sides); symmetric Hamming
  window of window_ms, zero-padded to n_fft in the centre; |rfft|;
  spectrogram = log1p(|X|); logmel = log(mel @ |X|^2 + 1e-6) with librosa's default (Slaney) mel
  filters; then per-utterance normalization by the scalar mean and population std.

File format (little-endian):
  char[8] "TRFEAT01"; int32 n_samples; int32 n_cases; int16 samples[n_samples];
  per case: int32 kind (0 spectrogram, 1 logmel); int32 n_fft; int32 mel_bins; float32 window_ms;
            float32 hop_ms; int32 frames; int32 dim; float32 features[frames * dim] (row-major).
"""
import os
import struct
import sys

import numpy as np

RATE = 16000
CASES = [  # (kind, n_fft, mel_bins, window_ms, hop_ms)
    (0, 320, 0, 20.0, 10.0),   # the paper's spectrogram: 161 bins
    (1, 320, 80, 20.0, 10.0),  # log-mel for LAS
    (0, 400, 0, 20.0, 10.0),   # window shorter than n_fft: zero-padded window, 201 bins
]


def signal():
    n = 6437
    t = np.arange(n) / RATE
    duration = n / RATE
    f0, f1 = 200.0, 6000.0  # linear chirp
    chirp = np.sin(2 * np.pi * (f0 * t + (f1 - f0) * t * t / (2 * duration)))
    tone = np.sin(2 * np.pi * 440.0 * t)
    envelope = 0.2 + 0.8 * np.sin(np.pi * t / duration) ** 2
    # A fixed LCG instead of NumPy's generators, whose streams may change between versions.
    state, noise = 12345, np.empty(n)
    for i in range(n):
        state = (1103515245 * state + 12345) % 2**31
        noise[i] = state / 2**31 - 0.5
    x = envelope * (0.45 * tone + 0.35 * chirp) + 0.02 * noise
    return np.round(x * 32767 * 0.9).astype(np.int16)


def hz_to_mel(f):  # librosa, htk=False (Slaney)
    f = np.asarray(f, dtype=np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp)


def mel_to_hz(m):
    m = np.asarray(m, dtype=np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


def mel_filters(n_fft, n_mels):  # librosa.filters.mel(sr, n_fft, n_mels), norm="slaney"
    fft_freqs = np.linspace(0, RATE / 2, n_fft // 2 + 1)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(RATE / 2), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    w = np.zeros((n_mels, n_fft // 2 + 1))
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        w[i] = np.maximum(0, np.minimum(lower, upper))
    w *= (2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels]))[:, None]
    assert (w.sum(axis=1) > 0).all(), "empty mel filter"
    return w


def features(samples, kind, n_fft, mel_bins, window_ms, hop_ms):
    x = samples.astype(np.float64) / 32768.0
    win = int(round(window_ms * RATE / 1000))
    hop = int(round(hop_ms * RATE / 1000))
    window = np.zeros(n_fft)
    lpad = (n_fft - win) // 2
    window[lpad:lpad + win] = 0.54 - 0.46 * np.cos(2 * np.pi * np.arange(win) / (win - 1))
    padded = np.pad(x, n_fft // 2, mode="reflect")
    frames = 1 + (len(padded) - n_fft) // hop
    spec = np.stack([np.fft.rfft(padded[t * hop:t * hop + n_fft] * window) for t in range(frames)])
    mag = np.abs(spec)
    if kind == 0:
        f = np.log1p(mag)
    else:
        f = np.log((mag ** 2) @ mel_filters(n_fft, mel_bins).T + 1e-6)
    return ((f - f.mean()) / f.std()).astype(np.float32)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "features_tone.bin")
    samples = signal()
    blob = bytearray(b"TRFEAT01")
    blob += struct.pack("<ii", len(samples), len(CASES))
    blob += samples.astype("<i2").tobytes()
    for kind, n_fft, mel_bins, window_ms, hop_ms in CASES:
        f = features(samples, kind, n_fft, mel_bins, window_ms, hop_ms)
        blob += struct.pack("<iiiffii", kind, n_fft, mel_bins, window_ms, hop_ms, f.shape[0], f.shape[1])
        blob += f.astype("<f4").tobytes()
        print(f"case kind={kind} n_fft={n_fft} mel_bins={mel_bins}: {f.shape[0]} x {f.shape[1]}")
    with open(out, "wb") as fh:
        fh.write(blob)
    print(f"wrote {out} ({len(blob)} bytes)")


if __name__ == "__main__":
    main()
