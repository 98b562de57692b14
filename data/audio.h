// Reading speech audio: NIST SPHERE, WAV (anything libsndfile recognizes by its header) and headerless
// raw 16-bit big-endian PCM, all through libsndfile.
//
// AN4 ships as SPHERE (an4_sphere.tar.gz: `.sph`) or as raw big-endian 16-bit 16 kHz mono
// (an4_raw.bigendian.tar.gz: `.raw`); the synthetic corpus writes `.sph` or `.wav`. The format is
// chosen by the extension: `.raw` is opened as SF_FORMAT_RAW | SF_FORMAT_PCM_16 | SF_ENDIAN_BIG,
// mono, at kRawSampleRate (a raw file carries no rate; AN4's is 16 kHz by definition); every other
// extension is opened by libsndfile from its header, so a `.sph` holding WAV data still reads.
//
// Samples come back as float in [-1, 1): the int16 value / 32768, exactly (libsndfile's float
// normalization), so the same PCM samples give bit-identical floats whatever the container.
// Only mono audio is accepted: silently mixing or picking channels would hide a wrong file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer::data {

constexpr int kRawSampleRate = 16000;
// Float files may exceed full scale (1) a little; beyond this, or not finite, is a broken file.
constexpr float kMaxSampleMagnitude = 8;
// A header may not make the reader allocate more than this (2^25 samples, 128 MiB of float: 34
// minutes at 16 kHz; AN4 utterances are seconds).
constexpr int64_t kMaxAudioSamples = int64_t{1} << 25;

struct Audio {
  std::vector<float> samples;  // mono, in [-1, 1)
  int sample_rate = 0;
};

// Reads a whole file. Throws std::runtime_error with one line "audio: <path>: <reason>" when the file
// is missing, unreadable, not a recognized format, empty, has more than one channel, has more samples
// than kMaxAudioSamples, or holds a sample that is not finite or beyond +-kMaxSampleMagnitude.
Audio read_audio(const std::string& path);

// read_audio, and additionally an error naming the file when its rate is not sample_rate.
std::vector<float> read_audio(const std::string& path, int sample_rate);

enum class AudioFormat { kSphere, kWav, kRaw };

// Writes 16-bit mono PCM: SPHERE (little-endian, as sox writes it), WAV, or raw big-endian (rate not
// stored). For tests and tools; throws std::runtime_error naming the path on failure.
void write_audio(const std::string& path, const std::vector<int16_t>& samples, int sample_rate,
                 AudioFormat format);

}  // namespace trainer::data
