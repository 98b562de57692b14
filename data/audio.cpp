#include "data/audio.h"

#include <sndfile.h>

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
  Audio audio;
  audio.sample_rate = info.samplerate;
  audio.samples.resize(static_cast<size_t>(info.frames));
  // Normalization on: float = int16 / 32768 for 16-bit PCM.
  sf_command(file.get(), SFC_SET_NORM_FLOAT, nullptr, SF_TRUE);
  sf_count_t got = sf_readf_float(file.get(), audio.samples.data(), info.frames);
  if (got != info.frames) {
    fail(path, "truncated: header promises " + std::to_string(info.frames) + " samples, read " +
                   std::to_string(got));
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
