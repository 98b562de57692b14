// AN4 (CMU's alphanumeric speech corpus) in its distribution layout, its transcripts, the character
// vocabularies of the speech models, and loading a split into memory as features.
//
// Layout under root (the real corpus after scripts/prepare_an4, or scripts/make_speech_corpus):
//   etc/an4_train.fileids         one audio path per line, relative to wav/, without extension:
//   etc/an4_test.fileids            an4_clstk/fash/an251-fash-b, an4test_clstk/fcaw/an406-fcaw-b
//   etc/an4_train.transcription   one line per utterance: <s> RUBOUT G M E F THREE NINE </s> (an251-fash-b)
//   etc/an4_test.transcription
//   wav/<fileid>.sph | .wav | .raw  NIST SPHERE, WAV or raw big-endian 16-bit, 16 kHz mono (audio.h)
// The fileids list defines the split and its order; a transcript is matched by the id in parentheses,
// which is the fileid's last path component. Transcripts are upper-cased, the <s> and </s> markers
// dropped and whitespace collapsed to single spaces.
//
// Bad data is one clear error naming the file: a missing list, a fileid without audio or without a
// transcript, an unreadable or wrongly sampled audio file, a transcript with a character outside the
// vocabulary. With skip_bad, a bad utterance (not a missing list) is skipped instead, with one warning
// line naming it and a final count, returned through `warnings` for the log.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/features.h"

namespace trainer::data {

// CTC: 0 = blank, 1 = apostrophe, 2..27 = A..Z, 28 = space (docs/architecture.md section 5).
constexpr int kCtcBlank = 0;
constexpr int kCtcClasses = 29;
// LAS: 0 = <sos>, 1 = <eos>, then the same 28 characters in the same order: apostrophe = 2,
// A..Z = 3..28, space = 29 (las id = ctc id + 1).
constexpr int kLasSos = 0;
constexpr int kLasEos = 1;
constexpr int kLasClasses = 30;

int ctc_id(char c);         // -1 for a character outside the vocabulary (lower case included)
char ctc_char(int id);      // '\0' for the blank and ids out of range
int las_id(char c);         // -1 outside the vocabulary
char las_char(int id);      // '\0' for <sos>, <eos> and ids out of range

// The ids of every character. Throws std::invalid_argument naming the character and its position.
std::vector<int32_t> ctc_labels(const std::string& transcript);
std::vector<int32_t> las_labels(const std::string& transcript);  // characters only: no <sos>/<eos>
// The characters of ids (blanks skipped; no CTC collapsing: decoding is the model's business), and of
// LAS ids up to the first <eos> (<sos> skipped).
std::string ctc_text(const std::vector<int32_t>& ids);
std::string las_text(const std::vector<int32_t>& ids);

// One line of a .transcription file -> (id, transcript). Throws std::invalid_argument with the reason
// when the line has no "(id)" at its end or the text has a character outside the vocabulary.
void parse_transcription_line(const std::string& line, std::string* id, std::string* transcript);

struct An4Entry {
  std::string id;          // an251-fash-b
  std::string audio_path;  // root/wav/an4_clstk/fash/an251-fash-b.sph
  std::string transcript;  // RUBOUT G M E F THREE NINE
};

// The split's entries in fileids order, with their audio found on disk (.sph, then .wav, then .raw).
// Errors and skipping as described above; audio is not opened here.
std::vector<An4Entry> read_an4_index(const std::string& root, bool train, bool skip_bad = false,
                                     std::string* warnings = nullptr);

struct Utterance {
  std::string id;
  std::string transcript;       // upper-case words separated by single spaces
  std::vector<float> features;  // frames x feature_dim, row-major, normalized
  int32_t frames = 0;
  FeatureNorm norm;             // the normalization applied (gain augmentation undoes it)
};

struct SpeechSet {
  std::vector<Utterance> utterances;
  int64_t feature_dim = 0;
  FeatureOptions features;  // how the features were computed
  int64_t size() const { return static_cast<int64_t>(utterances.size()); }
};

struct An4Options {
  std::string root;
  bool skip_bad = false;  // skip bad utterances with a warning instead of an error
  FeatureOptions features;
  int threads = 2;        // feature workers; the result does not depend on it
};

// Reads the split's audio and computes its features once, on `threads` threads. Throws
// std::runtime_error naming the file (the first bad utterance in fileids order, so the message does
// not depend on timing), or std::invalid_argument for bad options. An empty result is an error.
SpeechSet load_an4(const An4Options& opts, bool train, std::string* warnings = nullptr);

}  // namespace trainer::data
