#include "data/an4.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "data/audio.h"

namespace fs = std::filesystem;

namespace trainer::data {

namespace {

const char* const kAudioExtensions[] = {".sph", ".wav", ".raw"};

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::string split_name(bool train) { return train ? "train" : "test"; }

// Lines of a list file; a missing or unreadable list is always an error (nothing to skip).
std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw std::runtime_error("an4: " + path + ": cannot open (expected CMU's AN4 layout under the root: "
                             "etc/an4_{train,test}.{fileids,transcription} and wav/; see scripts/prepare_an4 "
                             "and scripts/make_speech_corpus)");
  }
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The split's entries; bad ones become an error, or with skip_bad a line in `skipped`.
std::vector<An4Entry> index_split(const std::string& root, bool train, bool skip_bad,
                                  std::vector<std::string>* skipped, int64_t* listed) {
  const std::string etc = (fs::path(root) / "etc").string();
  const std::string base = etc + "/an4_" + split_name(train);
  const std::string ids_path = base + ".fileids", text_path = base + ".transcription";
  std::vector<std::string> id_lines = read_lines(ids_path);
  std::vector<std::string> text_lines = read_lines(text_path);

  auto problem = [&](const std::string& message) {
    if (!skip_bad) throw std::runtime_error(message);
    skipped->push_back(message);
  };

  struct Text {
    std::string transcript, error;  // error: why this utterance's line is unusable
  };
  std::map<std::string, Text> texts;
  for (size_t i = 0; i < text_lines.size(); ++i) {
    if (trim(text_lines[i]).empty()) continue;
    const std::string where = "an4: " + text_path + ":" + std::to_string(i + 1) + ": ";
    std::string id, transcript;
    try {
      parse_transcription_line(text_lines[i], &id, &transcript);
    } catch (const std::invalid_argument& e) {
      // An id we can still read lets the error name the utterance when (and only when) it is listed.
      size_t open = text_lines[i].rfind('('), close = text_lines[i].rfind(')');
      if (open != std::string::npos && close != std::string::npos && close > open + 1) {
        texts[trim(text_lines[i].substr(open + 1, close - open - 1))].error = where + e.what();
        continue;
      }
      problem(where + e.what());
      continue;
    }
    if (texts.count(id)) {
      problem(where + "utterance '" + id + "' has a second transcript");
      continue;
    }
    texts[id].transcript = transcript;
  }

  std::vector<An4Entry> entries;
  *listed = 0;
  for (size_t i = 0; i < id_lines.size(); ++i) {
    std::string fileid = trim(id_lines[i]);
    if (fileid.empty()) continue;
    ++*listed;
    for (const char* ext : kAudioExtensions) {  // tolerate lists that name the files with extension
      if (fs::path(fileid).extension() == ext) fileid = fileid.substr(0, fileid.size() - std::string(ext).size());
    }
    const std::string where = "an4: " + ids_path + ":" + std::to_string(i + 1) + ": ";
    An4Entry entry;
    entry.id = fs::path(fileid).filename().string();
    auto text = texts.find(entry.id);
    if (text == texts.end()) {
      problem(where + "no transcript for '" + entry.id + "' in " + text_path);
      continue;
    }
    if (!text->second.error.empty()) {
      problem(text->second.error);
      continue;
    }
    entry.transcript = text->second.transcript;
    const std::string stem = (fs::path(root) / "wav" / fileid).string();
    for (const char* ext : kAudioExtensions) {
      std::error_code ec;
      if (fs::exists(stem + ext, ec)) {
        entry.audio_path = stem + ext;
        break;
      }
    }
    if (entry.audio_path.empty()) {
      problem(where + "no audio for '" + entry.id + "': none of " + stem + ".{sph,wav,raw} exists");
      continue;
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

void append_warnings(std::string* warnings, const std::vector<std::string>& skipped, int64_t listed,
                     bool train) {
  if (!warnings || skipped.empty()) return;
  for (const std::string& s : skipped) *warnings += "skipped: " + s + "\n";
  *warnings += "an4: skipped " + std::to_string(skipped.size()) + " of " + std::to_string(listed) + " " +
               split_name(train) + " utterances (skip_bad)\n";
}

}  // namespace

int ctc_id(char c) {
  if (c >= 'A' && c <= 'Z') return 2 + (c - 'A');
  if (c == '\'') return 1;
  if (c == ' ') return 28;
  return -1;
}

char ctc_char(int id) {
  if (id >= 2 && id <= 27) return static_cast<char>('A' + (id - 2));
  if (id == 1) return '\'';
  if (id == 28) return ' ';
  return '\0';
}

int las_id(char c) {
  int id = ctc_id(c);
  return id < 0 ? -1 : id + 1;
}

char las_char(int id) { return id >= 2 && id < kLasClasses ? ctc_char(id - 1) : '\0'; }

namespace {
template <int (*Map)(char)>
std::vector<int32_t> labels_of(const std::string& transcript) {
  std::vector<int32_t> ids(transcript.size());
  for (size_t i = 0; i < transcript.size(); ++i) {
    ids[i] = Map(transcript[i]);
    if (ids[i] < 0) {
      unsigned char c = static_cast<unsigned char>(transcript[i]);
      std::ostringstream what;
      what << "character ";
      if (std::isprint(c)) what << "'" << transcript[i] << "'";
      else what << "0x" << std::hex << static_cast<int>(c);
      what << " at position " << std::dec << i << " of \"" << transcript
           << "\" is outside the vocabulary (A-Z, apostrophe, space)";
      throw std::invalid_argument(what.str());
    }
  }
  return ids;
}
}  // namespace

std::vector<int32_t> ctc_labels(const std::string& transcript) { return labels_of<ctc_id>(transcript); }
std::vector<int32_t> las_labels(const std::string& transcript) { return labels_of<las_id>(transcript); }

std::string ctc_text(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (char c = ctc_char(id)) s += c;
  }
  return s;
}

std::string las_text(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (id == kLasEos) break;
    if (char c = las_char(id)) s += c;
  }
  return s;
}

void parse_transcription_line(const std::string& raw, std::string* id, std::string* transcript) {
  const std::string line = trim(raw);
  const size_t open = line.rfind('(');
  if (line.empty() || line.back() != ')' || open == std::string::npos || open + 2 > line.size() - 1) {
    throw std::invalid_argument("expected '<s> WORDS </s> (utterance-id)', got \"" + line + "\"");
  }
  *id = trim(line.substr(open + 1, line.size() - open - 2));
  if (id->empty() || id->find_first_of(" \t") != std::string::npos) {
    throw std::invalid_argument("bad utterance id \"(" + *id + ")\"");
  }
  std::istringstream words(line.substr(0, open));
  transcript->clear();
  for (std::string word; words >> word;) {
    if (word == "<s>" || word == "</s>") continue;
    for (char& c : word) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (!transcript->empty()) *transcript += ' ';
    *transcript += word;
  }
  if (transcript->empty()) throw std::invalid_argument("empty transcript for '" + *id + "'");
  ctc_labels(*transcript);  // throws for a character outside the vocabulary
}

std::vector<An4Entry> read_an4_index(const std::string& root, bool train, bool skip_bad, std::string* warnings) {
  std::vector<std::string> skipped;
  int64_t listed = 0;
  std::vector<An4Entry> entries = index_split(root, train, skip_bad, &skipped, &listed);
  append_warnings(warnings, skipped, listed, train);
  return entries;
}

SpeechSet load_an4(const An4Options& opts, bool train, std::string* warnings) {
  if (opts.threads < 1) throw std::invalid_argument("an4: threads must be >= 1, got " + std::to_string(opts.threads));
  FeatureExtractor extractor(opts.features);  // validates the options before any file is read
  std::vector<std::string> skipped;
  int64_t listed = 0;
  std::vector<An4Entry> entries = index_split(opts.root, train, opts.skip_bad, &skipped, &listed);

  // Workers claim entries in increasing order and store results by index, so the set (and the first
  // error reported) is the same for any thread count. Without skip_bad, claiming stops at the first
  // error: every entry before it has been claimed already and still finishes.
  const int64_t n = static_cast<int64_t>(entries.size());
  std::vector<Utterance> done(n);
  std::vector<std::string> errors(n);
  std::atomic<int64_t> cursor{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    for (;;) {
      if (failed.load() && !opts.skip_bad) return;
      const int64_t i = cursor.fetch_add(1);
      if (i >= n) return;
      const An4Entry& e = entries[i];
      try {
        std::vector<float> samples = read_audio(e.audio_path, opts.features.sample_rate);
        Utterance& u = done[i];
        try {
          u.features = extractor.compute(samples.data(), static_cast<int64_t>(samples.size()), &u.norm);
        } catch (const std::invalid_argument& err) {
          throw std::runtime_error("audio: " + e.audio_path + ": " + err.what());
        }
        u.frames = static_cast<int32_t>(u.features.size() / extractor.dim());
        u.id = e.id;
        u.transcript = e.transcript;
      } catch (const std::exception& err) {
        errors[i] = err.what();
        failed.store(true);
      }
    }
  };
  std::vector<std::thread> workers;
  for (int t = 1; t < std::min<int64_t>(opts.threads, n); ++t) workers.emplace_back(work);
  work();
  for (std::thread& t : workers) t.join();

  SpeechSet set;
  set.feature_dim = extractor.dim();
  set.features = opts.features;
  for (int64_t i = 0; i < n; ++i) {
    if (errors[i].empty() && done[i].frames > 0) {
      set.utterances.push_back(std::move(done[i]));
    } else if (!errors[i].empty()) {
      if (!opts.skip_bad) throw std::runtime_error(errors[i]);
      skipped.push_back(errors[i]);
    }
  }
  append_warnings(warnings, skipped, listed, train);
  if (set.utterances.empty()) {
    throw std::runtime_error("an4: " + opts.root + ": no usable " + split_name(train) + " utterances (" +
                             std::to_string(listed) + " listed)");
  }
  return set;
}

}  // namespace trainer::data
