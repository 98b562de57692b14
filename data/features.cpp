#include "data/features.h"

#include <fftw3.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <stdexcept>

namespace trainer::data {

namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kLogMelFloor = 1e-6;  // keeps log finite on digital silence

// FFTW's planner keeps global state; only execution is thread-safe.
std::mutex planner_mutex;

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("features: " + what); }

int64_t samples_of(double ms, int rate) { return std::llround(ms * rate / 1000.0); }

// Slaney's mel scale (librosa's default, htk=False): linear 200/3 Hz per mel below 1 kHz, logarithmic
// above (27 mels per factor 6.4).
constexpr double kMelLinearHz = 200.0 / 3.0, kMelBreakHz = 1000.0, kMelBreak = kMelBreakHz / kMelLinearHz;
const double kMelLogStep = std::log(6.4) / 27.0;

double hz_to_mel(double hz) {
  return hz >= kMelBreakHz ? kMelBreak + std::log(hz / kMelBreakHz) / kMelLogStep : hz / kMelLinearHz;
}
double mel_to_hz(double mel) {
  return mel >= kMelBreak ? kMelBreakHz * std::exp(kMelLogStep * (mel - kMelBreak)) : kMelLinearHz * mel;
}

struct FftwFree {
  void operator()(void* p) const { fftwf_free(p); }
};

}  // namespace

struct FeatureExtractor::Fft {
  fftwf_plan plan = nullptr;
};

void check_feature_options(const FeatureOptions& o) {
  if (o.kind != "spectrogram" && o.kind != "logmel") {
    bad("kind must be \"spectrogram\" or \"logmel\", got \"" + o.kind + "\"");
  }
  if (o.sample_rate <= 0) bad("sample_rate must be > 0, got " + std::to_string(o.sample_rate));
  if (!(o.window_ms > 0) || !(o.hop_ms > 0)) bad("window_ms and hop_ms must be > 0");
  const int64_t window = samples_of(o.window_ms, o.sample_rate), hop = samples_of(o.hop_ms, o.sample_rate);
  if (window < 2) bad("window_ms " + std::to_string(o.window_ms) + " is less than 2 samples");
  if (hop < 1) bad("hop_ms " + std::to_string(o.hop_ms) + " is less than 1 sample");
  if (o.n_fft < window) {
    bad("n_fft " + std::to_string(o.n_fft) + " is shorter than the window (" + std::to_string(window) +
        " samples)");
  }
  if (o.kind == "logmel" && (o.mel_bins < 1 || o.mel_bins > o.n_fft / 2 + 1)) {
    bad("mel_bins must be in [1, n_fft / 2 + 1 = " + std::to_string(o.n_fft / 2 + 1) + "], got " +
        std::to_string(o.mel_bins));
  }
}

FeatureExtractor::FeatureExtractor(const FeatureOptions& opts) : opts_(opts), fft_(std::make_unique<Fft>()) {
  check_feature_options(opts_);
  logmel_ = opts_.kind == "logmel";
  window_ = samples_of(opts_.window_ms, opts_.sample_rate);
  hop_ = samples_of(opts_.hop_ms, opts_.sample_rate);
  bins_ = opts_.n_fft / 2 + 1;
  dim_ = logmel_ ? opts_.mel_bins : bins_;

  window_fn_.assign(opts_.n_fft, 0.0f);
  const int64_t offset = (opts_.n_fft - window_) / 2;
  for (int64_t i = 0; i < window_; ++i) {
    window_fn_[offset + i] = static_cast<float>(0.54 - 0.46 * std::cos(2 * kPi * i / (window_ - 1)));
  }

  if (logmel_) {
    // librosa.filters.mel: triangles between mel-spaced edge frequencies, evaluated at the bin
    // frequencies, scaled by 2 / (upper edge - lower edge) (Slaney's equal-area normalization).
    const int64_t m = opts_.mel_bins;
    const double top = hz_to_mel(opts_.sample_rate / 2.0);
    std::vector<double> edge(m + 2);
    for (int64_t i = 0; i < m + 2; ++i) edge[i] = mel_to_hz(top * i / (m + 1));
    mel_first_.resize(m);
    mel_weights_.resize(m);
    for (int64_t f = 0; f < m; ++f) {
      const double area = 2.0 / (edge[f + 2] - edge[f]);
      for (int64_t b = 0; b < bins_; ++b) {
        const double hz = b * (opts_.sample_rate / 2.0) / (bins_ - 1);
        const double rise = (hz - edge[f]) / (edge[f + 1] - edge[f]);
        const double fall = (edge[f + 2] - hz) / (edge[f + 2] - edge[f + 1]);
        const double w = std::max(0.0, std::min(rise, fall));
        if (w <= 0) continue;
        if (mel_weights_[f].empty()) mel_first_[f] = b;
        // Bins between the first and this one are inside the triangle, so the run is contiguous.
        mel_weights_[f].resize(b - mel_first_[f] + 1, 0.0f);
        mel_weights_[f].back() = static_cast<float>(w * area);
      }
      if (mel_weights_[f].empty()) {
        bad("mel filter " + std::to_string(f) + " of " + std::to_string(m) + " covers no FFT bin: use fewer " +
            "mel_bins or a larger n_fft than " + std::to_string(opts_.n_fft));
      }
    }
  }

  // Plan on scratch arrays from fftwf_malloc: compute() executes the plan on its own arrays from the
  // same allocator, which have the alignment the plan assumes.
  std::unique_ptr<float, FftwFree> in(static_cast<float*>(fftwf_malloc(sizeof(float) * opts_.n_fft)));
  std::unique_ptr<fftwf_complex, FftwFree> out(
      static_cast<fftwf_complex*>(fftwf_malloc(sizeof(fftwf_complex) * bins_)));
  if (!in || !out) throw std::bad_alloc();
  std::lock_guard<std::mutex> lock(planner_mutex);
  fft_->plan = fftwf_plan_dft_r2c_1d(opts_.n_fft, in.get(), out.get(), FFTW_ESTIMATE);
  if (!fft_->plan) bad("FFTW could not plan a real FFT of size " + std::to_string(opts_.n_fft));
}

FeatureExtractor::~FeatureExtractor() {
  if (fft_ && fft_->plan) {
    std::lock_guard<std::mutex> lock(planner_mutex);
    fftwf_destroy_plan(fft_->plan);
  }
}

int64_t FeatureExtractor::frames(int64_t n) const {
  if (n < min_samples()) return 0;
  const int64_t half = opts_.n_fft / 2;
  return 1 + (n + 2 * half - opts_.n_fft) / hop_;
}

std::vector<float> FeatureExtractor::compute(const float* samples, int64_t n, FeatureNorm* norm) const {
  if (n < min_samples()) {
    bad(std::to_string(n) + " samples are too short: at least n_fft / 2 + 1 = " + std::to_string(min_samples()) +
        " are needed");
  }
  const int64_t n_fft = opts_.n_fft, half = n_fft / 2, count = frames(n);
  std::vector<float> features(static_cast<size_t>(count * dim_));
  std::unique_ptr<float, FftwFree> in(static_cast<float*>(fftwf_malloc(sizeof(float) * n_fft)));
  std::unique_ptr<fftwf_complex, FftwFree> out(static_cast<fftwf_complex*>(fftwf_malloc(sizeof(fftwf_complex) * bins_)));
  if (!in || !out) throw std::bad_alloc();
  std::vector<float> power(bins_);

  for (int64_t t = 0; t < count; ++t) {
    for (int64_t k = 0; k < n_fft; ++k) {
      int64_t src = t * hop_ + k - half;  // index into the unpadded signal, then reflected
      if (src < 0) src = -src;
      if (src >= n) src = 2 * (n - 1) - src;
      in.get()[k] = samples[src] * window_fn_[k];
    }
    fftwf_execute_dft_r2c(fft_->plan, in.get(), out.get());
    float* row = features.data() + t * dim_;
    for (int64_t b = 0; b < bins_; ++b) {
      const float re = out.get()[b][0], im = out.get()[b][1];
      power[b] = re * re + im * im;
    }
    if (!logmel_) {
      for (int64_t b = 0; b < bins_; ++b) row[b] = std::log1p(std::sqrt(power[b]));
    } else {
      for (int64_t f = 0; f < dim_; ++f) {
        const std::vector<float>& w = mel_weights_[f];
        const float* p = power.data() + mel_first_[f];
        double acc = 0;
        for (size_t j = 0; j < w.size(); ++j) acc += static_cast<double>(w[j]) * p[j];
        row[f] = static_cast<float>(std::log(acc + kLogMelFloor));
      }
    }
  }
  FeatureNorm applied = normalize_features(features.data(), static_cast<int64_t>(features.size()));
  if (norm) *norm = applied;
  return features;
}

FeatureNorm normalize_features(float* x, int64_t n) {
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const double mean = n > 0 ? sum / n : 0.0;
  // Two passes: the one-pass formula loses digits when the mean is large against the spread.
  for (int64_t i = 0; i < n; ++i) sum_sq += (x[i] - mean) * (x[i] - mean);
  double std = n > 0 ? std::sqrt(sum_sq / n) : 0.0;
  if (!(std > 0)) std = 1.0;
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((x[i] - mean) / std);
  return FeatureNorm{static_cast<float>(mean), static_cast<float>(std)};
}

FeatureNorm apply_gain(const std::string& kind, float* x, int64_t n, FeatureNorm norm, double gain_db) {
  const bool logmel = kind == "logmel";
  if (!logmel && kind != "spectrogram") bad("unknown feature kind \"" + kind + "\"");
  // Amplitude factor a = 10^(dB / 20); power scales by a^2.
  const double a = std::pow(10.0, gain_db / 20.0);
  for (int64_t i = 0; i < n; ++i) {
    const double raw = static_cast<double>(x[i]) * norm.std + norm.mean;
    if (logmel) {
      const double power = std::max(0.0, std::exp(raw) - kLogMelFloor);
      x[i] = static_cast<float>(std::log(a * a * power + kLogMelFloor));
    } else {
      const double magnitude = std::max(0.0, std::expm1(raw));
      x[i] = static_cast<float>(std::log1p(a * magnitude));
    }
  }
  return normalize_features(x, n);
}

std::vector<float> stretch_frames(const float* x, int64_t frames, int64_t dim, double speed,
                                  int64_t* out_frames) {
  if (!(speed > 0)) bad("speed factor must be > 0, got " + std::to_string(speed));
  if (frames < 1) bad("cannot stretch an utterance without frames");
  const int64_t m = std::max<int64_t>(1, std::llround(frames / speed));
  std::vector<float> out(static_cast<size_t>(m * dim));
  for (int64_t j = 0; j < m; ++j) {
    const double pos = m > 1 ? static_cast<double>(j) * (frames - 1) / (m - 1) : 0.0;
    const int64_t lo = std::min<int64_t>(static_cast<int64_t>(pos), frames - 1);
    const int64_t hi = std::min<int64_t>(lo + 1, frames - 1);
    const float w = static_cast<float>(pos - lo);
    const float* a = x + lo * dim;
    const float* b = x + hi * dim;
    float* o = out.data() + j * dim;
    for (int64_t d = 0; d < dim; ++d) o[d] = a[d] + w * (b[d] - a[d]);
  }
  if (out_frames) *out_frames = m;
  return out;
}

}  // namespace trainer::data
