#include "data/audio.h"

#include <sndfile.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace trainer::data {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& reason) {
  throw std::runtime_error("audio: " + path + ": " + reason);
}

bool has_extension(const std::string& path, const char* ext) {
  return std::filesystem::path(path).extension() == ext;
}

// libsndfile reports open failures through a process-wide error slot (sf_strerror(nullptr)); the
// lock keeps one thread's message from being read by another that loads files in parallel.
std::mutex open_mutex;

struct Closer {
  void operator()(SNDFILE* f) const { sf_close(f); }
};

}  // namespace

Audio read_audio(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(path, "file not found");
  if (std::filesystem::is_directory(path, ec)) fail(path, "is a directory, not an audio file");
  SF_INFO info{};
  if (has_extension(path, ".raw")) {
    info.samplerate = kRawSampleRate;
    info.channels = 1;
    info.format = SF_FORMAT_RAW | SF_FORMAT_PCM_16 | SF_ENDIAN_BIG;
  }
  std::unique_ptr<SNDFILE, Closer> file;
  {
    std::lock_guard<std::mutex> lock(open_mutex);
    file.reset(sf_open(path.c_str(), SFM_READ, &info));
    if (!file) fail(path, std::string("cannot read: ") + sf_strerror(nullptr));
  }
  if (info.channels != 1) fail(path, std::to_string(info.channels) + " channels; only mono audio is supported");
  if (info.frames <= 0) fail(path, "no samples");
  if (info.frames > kMaxAudioSamples) {
    fail(path, "header claims " + std::to_string(info.frames) + " samples, more than the limit of " +
                   std::to_string(kMaxAudioSamples) + " (" + std::to_string(kMaxAudioSamples / kRawSampleRate / 60) +
                   " minutes at 16 kHz)");
  }
  Audio audio;
  audio.sample_rate = info.samplerate;
  // Normalization on: float = int16 / 32768 for 16-bit PCM.
  sf_command(file.get(), SFC_SET_NORM_FLOAT, nullptr, SF_TRUE);
  // In blocks, so the memory follows what the file holds, not what its header claims.
  constexpr sf_count_t kBlock = 1 << 16;
  for (sf_count_t got = 0; got < info.frames;) {
    const sf_count_t want = std::min(kBlock, info.frames - got);
    audio.samples.resize(static_cast<size_t>(got + want));
    const sf_count_t n = sf_readf_float(file.get(), audio.samples.data() + got, want);
    got += std::max<sf_count_t>(n, 0);
    if (n != want) {
      fail(path, "truncated: header promises " + std::to_string(info.frames) + " samples, read " +
                     std::to_string(got));
    }
  }
  // Integer PCM is within [-1, 1) by construction; float files are not, and a NaN, an infinity or a
  // huge value would turn every feature of the utterance into NaN (|FFT|^2 overflows float).
  for (size_t i = 0; i < audio.samples.size(); ++i) {
    if (!(std::fabs(audio.samples[i]) <= kMaxSampleMagnitude)) {
      fail(path, "sample " + std::to_string(i) + " is " + std::to_string(audio.samples[i]) +
                     ": float audio must be finite and within +-" + std::to_string(int(kMaxSampleMagnitude)) +
                     " (full scale is 1)");
    }
  }
  return audio;
}

std::vector<float> read_audio(const std::string& path, int sample_rate) {
  Audio audio = read_audio(path);
  if (audio.sample_rate != sample_rate) {
    fail(path, "sample rate " + std::to_string(audio.sample_rate) + " Hz, expected " + std::to_string(sample_rate) +
                   " Hz");
  }
  return std::move(audio.samples);
}

void write_audio(const std::string& path, const std::vector<int16_t>& samples, int sample_rate,
                 AudioFormat format) {
  SF_INFO info{};
  info.samplerate = sample_rate;
  info.channels = 1;
  switch (format) {
    case AudioFormat::kSphere: info.format = SF_FORMAT_NIST | SF_FORMAT_PCM_16; break;
    case AudioFormat::kWav: info.format = SF_FORMAT_WAV | SF_FORMAT_PCM_16; break;
    case AudioFormat::kRaw: info.format = SF_FORMAT_RAW | SF_FORMAT_PCM_16 | SF_ENDIAN_BIG; break;
  }
  std::unique_ptr<SNDFILE, Closer> file;
  {
    std::lock_guard<std::mutex> lock(open_mutex);
    file.reset(sf_open(path.c_str(), SFM_WRITE, &info));
    if (!file) fail(path, std::string("cannot write: ") + sf_strerror(nullptr));
  }
  sf_count_t n = static_cast<sf_count_t>(samples.size());
  if (sf_writef_short(file.get(), samples.data(), n) != n) fail(path, "short write");
  if (sf_close(file.release()) != 0) fail(path, "cannot close after writing");
}

}  // namespace trainer::data
