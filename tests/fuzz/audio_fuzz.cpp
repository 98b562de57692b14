// Fuzz target: speech audio as the AN4 loader reads it (read_audio through libsndfile: SPHERE, WAV
// or headerless raw), then feature extraction (spectrogram or log-mel) of what was accepted.
// The first input byte picks the file extension and the feature kind; the rest is the file.
// Errors must be one line naming the file; features of accepted audio must be finite.
#include <cmath>
#include <stdexcept>

#include "data/audio.h"
#include "data/features.h"
#include "tests/fuzz/fuzz_input.h"

using namespace trainer;

namespace {
const data::FeatureExtractor& extractor(bool logmel) {
  static const data::FeatureExtractor spectrogram{data::FeatureOptions{}};
  static const data::FeatureExtractor mel{[] {
    data::FeatureOptions o;
    o.kind = "logmel";
    return o;
  }()};
  return logmel ? mel : spectrogram;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const char* const extensions[] = {".sph", ".wav", ".raw"};
  const std::string path = (fuzz::scratch_dir() / (std::string("utterance") + extensions[data[0] % 3])).string();
  const bool logmel = (data[0] / 3) % 2 == 1;
  fuzz::write_file(path, std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  std::vector<float> samples;
  try {
    samples = data::read_audio(path, data::kRawSampleRate);
  } catch (const std::runtime_error& e) {
    fuzz::check_error_message(e.what(), "audio: " + path + ": ");
    return 0;
  }
  if (samples.empty()) std::abort();  // documented: no samples is an error
  for (float s : samples)
    if (!std::isfinite(s)) std::abort();
  const data::FeatureExtractor& fx = extractor(logmel);
  if (static_cast<int64_t>(samples.size()) < fx.min_samples()) return 0;  // load_an4 reports it
  std::vector<float> features = fx.compute(samples.data(), static_cast<int64_t>(samples.size()));
  if (static_cast<int64_t>(features.size()) != fx.frames(static_cast<int64_t>(samples.size())) * fx.dim())
    std::abort();
  for (float f : features)
    if (!std::isfinite(f)) std::abort();
  return 0;
}
