// Speech features: the paper's linear spectrogram and log-mel filterbanks, through FFTW.
//
// Definition (tests/fixtures/features_tone.bin holds an independent NumPy computation of it, made by
// scripts/make_feature_fixtures.py):
//   window  W = round(window_ms * sample_rate / 1000) samples (20 ms -> 320), hop H likewise (10 ms ->
//           160); symmetric Hamming 0.54 - 0.46 cos(2 pi i / (W - 1)) (scipy.signal.hamming, as
//           deepspeech.pytorch uses), zero-padded to n_fft in the centre when W < n_fft.
//   frames  centred, as librosa / torch.stft with center=True: the signal is padded by n_fft / 2 on
//           each side by reflection (x[-1] = x[1]), and frame t covers padded[t H, t H + n_fft):
//           frames = 1 + (n + 2 (n_fft / 2) - n_fft) / H. The signal must be longer than n_fft / 2
//           samples, since reflection cannot reach further.
//   spectrogram  log1p(|rfft|): n_fft / 2 + 1 bins (161 for n_fft 320), the Ok-Top-k paper's
//           DeepSpeech input.
//   logmel  log(mel . |rfft|^2 + 1e-6) with librosa's default mel filters (Slaney mel scale, linear
//           below 1 kHz, and Slaney area normalization, 0 Hz to sample_rate / 2). Slaney's scale
//           keeps every one of 80 filters non-empty on 161 bins; HTK's would leave the lowest empty.
//   normalization  per utterance, by the scalar mean and population standard deviation over all
//           frames x bins (deepspeech.pytorch's `spect.add_(-mean).div_(std)`); std 0 counts as 1.
// Samples are floats in [-1, 1) (data/audio.h). FFTs are single precision, accumulations double.
//
// The FFTW plan is made once per extractor (FFTW_ESTIMATE: the same algorithm every run, so features
// are bit-identical across runs and machines with the same FFTW); compute() is const and may be
// called from many threads at once (FFTW's new-array execute is thread-safe; the planner is not, so
// plan creation and destruction hold a global lock).
//
// Augmentation on features. The pipeline keeps features, not audio, so gain and speed perturbation
// act on them: gain undoes the normalization and the log, scales the magnitude (x a) or power
// (x a^2), and redoes both, which is exact since the STFT is linear; speed is a time-axis resampling
// of the frames (linear interpolation), which changes duration without shifting pitch (a tempo
// change, not sox's speed effect).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trainer::data {

struct FeatureOptions {
  std::string kind = "spectrogram";  // or "logmel"
  int64_t mel_bins = 80;             // logmel only
  int sample_rate = 16000;
  double window_ms = 20, hop_ms = 10;
  int n_fft = 320;
};

// Throws std::invalid_argument naming the field when the options make no sense (unknown kind,
// non-positive sizes, window longer than n_fft, more mel bins than the FFT can fill).
void check_feature_options(const FeatureOptions& opts);

struct FeatureNorm {
  float mean = 0, std = 1;  // what was subtracted and divided by
};

class FeatureExtractor {
 public:
  explicit FeatureExtractor(const FeatureOptions& opts);  // validates; plans the FFT
  ~FeatureExtractor();
  FeatureExtractor(const FeatureExtractor&) = delete;
  FeatureExtractor& operator=(const FeatureExtractor&) = delete;

  const FeatureOptions& options() const { return opts_; }
  int64_t dim() const { return dim_; }                 // bins per frame
  int64_t window_samples() const { return window_; }
  int64_t hop_samples() const { return hop_; }
  int64_t min_samples() const { return opts_.n_fft / 2 + 1; }
  int64_t frames(int64_t n_samples) const;             // 0 when n_samples < min_samples()

  // Normalized features, frames(n) x dim(), row-major. Throws std::invalid_argument when n <
  // min_samples(). `norm`, when given, receives the normalization that was applied.
  std::vector<float> compute(const float* samples, int64_t n, FeatureNorm* norm = nullptr) const;

 private:
  struct Fft;  // FFTW plan and its buffers' shape, kept out of this header
  FeatureOptions opts_;
  bool logmel_ = false;
  int64_t dim_ = 0, window_ = 0, hop_ = 0, bins_ = 0;
  std::vector<float> window_fn_;  // n_fft values, zero outside the centred window
  // Mel filters, sparse: filter m has weights mel_weights_[m] on bins [mel_first_[m], + size).
  std::vector<int64_t> mel_first_;
  std::vector<std::vector<float>> mel_weights_;
  std::unique_ptr<Fft> fft_;
};

// Subtracts the mean and divides by the population std (std 0 -> 1), in place; returns them.
FeatureNorm normalize_features(float* x, int64_t n);

// Gain perturbation by gain_db decibels of normalized features of the given kind that were
// normalized with `norm`: undo, scale, redo the log, normalize again. Returns the new normalization.
FeatureNorm apply_gain(const std::string& kind, float* x, int64_t n, FeatureNorm norm, double gain_db);

// Speed perturbation: `frames` x dim features resampled along time to max(1, round(frames / speed))
// frames by linear interpolation, first and last frames aligned (speed > 1 is faster: fewer frames).
std::vector<float> stretch_frames(const float* x, int64_t frames, int64_t dim, double speed,
                                  int64_t* out_frames);

}  // namespace trainer::data
