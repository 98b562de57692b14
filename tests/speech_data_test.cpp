// The AN4 speech pipeline: vocabulary and transcripts, audio reading (SPHERE / WAV / raw give the
// same samples), features against the NumPy reference (tests/fixtures/features_tone.bin, made by
// scripts/make_feature_fixtures.py), loading a split with clear errors or skipping, the bucketing
// loader (sharding, padding, resume, thread count, augmentation), and the two data scripts.
#include <sndfile.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "data/an4.h"
#include "data/audio.h"
#include "data/features.h"
#include "data/speech_loader.h"

#include "process.h"
#include "skip.h"

namespace fs = std::filesystem;
using namespace trainer::data;
using Catch::Matchers::Contains;
using trainer::testing::TempDir;

namespace {

void write_text(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// The NumPy reference: int16 samples and, per case, options and the expected features.
struct Reference {
  std::vector<int16_t> samples;
  struct Case {
    FeatureOptions opts;
    int32_t frames = 0, dim = 0;
    std::vector<float> features;
  };
  std::vector<Case> cases;
};

Reference read_reference() {
  std::vector<uint8_t> b = read_bytes(std::string(TRAINER_FIXTURES) + "/features_tone.bin");
  REQUIRE(b.size() > 16);
  REQUIRE(std::string(b.begin(), b.begin() + 8) == "TRFEAT01");
  size_t at = 8;
  auto take = [&](void* dst, size_t n) {
    REQUIRE(at + n <= b.size());
    std::memcpy(dst, b.data() + at, n);
    at += n;
  };
  int32_t n = 0, cases = 0;
  take(&n, 4);
  take(&cases, 4);
  Reference ref;
  ref.samples.resize(n);
  take(ref.samples.data(), 2 * n);
  for (int c = 0; c < cases; ++c) {
    int32_t kind, n_fft, mel_bins;
    float window_ms, hop_ms;
    Reference::Case rc;
    take(&kind, 4), take(&n_fft, 4), take(&mel_bins, 4), take(&window_ms, 4), take(&hop_ms, 4);
    take(&rc.frames, 4), take(&rc.dim, 4);
    rc.opts.kind = kind == 0 ? "spectrogram" : "logmel";
    rc.opts.n_fft = n_fft;
    rc.opts.mel_bins = mel_bins;
    rc.opts.window_ms = window_ms;
    rc.opts.hop_ms = hop_ms;
    rc.features.resize(static_cast<size_t>(rc.frames) * rc.dim);
    take(rc.features.data(), 4 * rc.features.size());
    ref.cases.push_back(rc);
  }
  REQUIRE(at == b.size());
  return ref;
}

std::vector<float> to_float(const std::vector<int16_t>& s) {
  std::vector<float> f(s.size());
  for (size_t i = 0; i < s.size(); ++i) f[i] = s[i] / 32768.0f;
  return f;
}

// A tone of `n` samples whose frequency depends on `k`, as int16.
std::vector<int16_t> tone(int64_t n, int k) {
  std::vector<int16_t> s(n);
  for (int64_t i = 0; i < n; ++i) {
    double t = i / 16000.0;
    s[i] = static_cast<int16_t>(std::lround(9000 * std::sin(2 * M_PI * (300 + 97 * k) * t) +
                                            3000 * std::sin(2 * M_PI * 2500 * t * t)));
  }
  return s;
}

std::string audio_extension(AudioFormat f) {
  return f == AudioFormat::kSphere ? ".sph" : f == AudioFormat::kWav ? ".wav" : ".raw";
}

// A small corpus in AN4's layout: utterance i of each split is a tone of lengths[i] samples, in the
// formats given in turn. Returns the audio paths (train first).
struct CorpusEntry {
  std::string speaker, id, text;
  int64_t samples;
  AudioFormat format;
};
std::vector<std::string> write_corpus(const std::string& root, bool train, const std::vector<CorpusEntry>& entries) {
  const std::string split = train ? "train" : "test", folder = train ? "an4_clstk" : "an4test_clstk";
  std::string ids, texts;
  std::vector<std::string> paths;
  int k = 0;
  for (const CorpusEntry& e : entries) {
    std::string fileid = folder + "/" + e.speaker + "/" + e.id;
    ids += fileid + "\n";
    texts += "<s> " + e.text + " </s> (" + e.id + ")\n";
    std::string path = root + "/wav/" + fileid + audio_extension(e.format);
    fs::create_directories(fs::path(path).parent_path());
    write_audio(path, tone(e.samples, k++), 16000, e.format);
    paths.push_back(path);
  }
  write_text(root + "/etc/an4_" + split + ".fileids", ids);
  write_text(root + "/etc/an4_" + split + ".transcription", texts);
  return paths;
}

std::vector<CorpusEntry> small_train() {
  return {{"fash", "an251-fash-b", "R O B E R T", 5200, AudioFormat::kSphere},
          {"fash", "an252-fash-b", "FIVE SIX", 3900, AudioFormat::kWav},
          {"mblw", "an1-mblw-b", "RUBOUT J B X R Z NINE TWENTY", 8100, AudioFormat::kRaw},
          {"mblw", "an2-mblw-b", "YES", 2400, AudioFormat::kSphere},
          {"mcen", "an3-mcen-b", "IT'S GO", 6300, AudioFormat::kSphere},
          {"mcen", "an4-mcen-b", "ENTER", 4400, AudioFormat::kWav}};
}

std::vector<CorpusEntry> small_test() {
  return {{"fcaw", "an406-fcaw-b", "NO", 3000, AudioFormat::kSphere},
          {"fcaw", "an407-fcaw-b", "T W O", 4700, AudioFormat::kRaw}};
}

// An in-memory set: utterance i has 10 + p(i) frames for a permutation p (distinct lengths), random
// normalized features, and a short transcript.
SpeechSet make_set(int64_t n, int64_t dim = 4, uint32_t seed = 3) {
  std::mt19937 rng(seed);
  std::vector<int32_t> lengths(n);
  for (int64_t i = 0; i < n; ++i) lengths[i] = static_cast<int32_t>(10 + i);
  std::shuffle(lengths.begin(), lengths.end(), rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  SpeechSet set;
  set.feature_dim = dim;
  for (int64_t i = 0; i < n; ++i) {
    Utterance u;
    u.id = "u" + std::to_string(i);
    u.transcript = std::string(1, static_cast<char>('A' + i % 26)) + (i % 3 ? " B" : "");
    u.frames = lengths[i];
    u.features.resize(static_cast<size_t>(u.frames) * dim);
    for (float& v : u.features) v = normal(rng);
    normalize_features(u.features.data(), static_cast<int64_t>(u.features.size()));
    u.norm = FeatureNorm{1.5f, 0.8f};
    set.utterances.push_back(std::move(u));
  }
  return set;
}

std::vector<SpeechBatch> take(SpeechLoader& loader, int64_t count) {
  std::vector<SpeechBatch> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(loader.next());
  return out;
}

void require_same(const SpeechBatch& a, const SpeechBatch& b) {
  REQUIRE(a.epoch == b.epoch);
  REQUIRE(a.index == b.index);
  REQUIRE(a.indices == b.indices);
  REQUIRE(a.frames == b.frames);
  REQUIRE(a.labels == b.labels);
  REQUIRE(a.label_lengths == b.label_lengths);
  REQUIRE(a.features == b.features);  // bit-identical
}

int run_shell(const std::string& command) {
  int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Vocabulary and transcripts

TEST_CASE("CTC and LAS vocabularies map the AN4 characters", "[speech][an4]") {
  REQUIRE(kCtcClasses == 29);
  REQUIRE(ctc_id('\'') == 1);
  REQUIRE(ctc_id('A') == 2);
  REQUIRE(ctc_id('Z') == 27);
  REQUIRE(ctc_id(' ') == 28);
  REQUIRE(ctc_id('a') == -1);
  REQUIRE(ctc_id('1') == -1);
  REQUIRE(ctc_char(kCtcBlank) == '\0');
  for (int id = 1; id < kCtcClasses; ++id) REQUIRE(ctc_id(ctc_char(id)) == id);
  REQUIRE(las_id('\'') == 2);
  REQUIRE(las_id('A') == 3);
  REQUIRE(las_id(' ') == kLasClasses - 1);
  REQUIRE(las_char(kLasSos) == '\0');
  REQUIRE(las_char(kLasEos) == '\0');
  for (int id = 2; id < kLasClasses; ++id) REQUIRE(las_id(las_char(id)) == id);

  REQUIRE(ctc_labels("IT'S A") == std::vector<int32_t>{10, 21, 1, 20, 28, 2});
  REQUIRE(las_labels("IT'S A") == std::vector<int32_t>{11, 22, 2, 21, 29, 3});
  REQUIRE(ctc_text({0, 10, 0, 21, 1, 20, 28, 2, 0}) == "IT'S A");
  REQUIRE(las_text({kLasSos, 11, 22, 2, 21, 29, 3, kLasEos, 5}) == "IT'S A");
  REQUIRE_THROWS_WITH(ctc_labels("AB1"), Contains("'1'") && Contains("position 2"));
  REQUIRE_THROWS_WITH(las_labels("A-B"), Contains("'-'"));
}

TEST_CASE("transcription lines: <s> WORDS </s> (id)", "[speech][an4]") {
  std::string id, text;
  parse_transcription_line("<s> RUBOUT G M E F THREE NINE </s> (an251-fash-b)", &id, &text);
  REQUIRE(id == "an251-fash-b");
  REQUIRE(text == "RUBOUT G M E F THREE NINE");
  parse_transcription_line("  <s>  yes   it's  </s>(an2-mblw-b)\r", &id, &text);  // spacing, case, CR
  REQUIRE(id == "an2-mblw-b");
  REQUIRE(text == "YES IT'S");
  parse_transcription_line("NO (an406-fcaw-b)", &id, &text);  // markers are optional
  REQUIRE(text == "NO");
  REQUIRE_THROWS_WITH(parse_transcription_line("<s> YES </s>", &id, &text), Contains("(utterance-id)"));
  REQUIRE_THROWS_WITH(parse_transcription_line("<s> </s> (x)", &id, &text), Contains("empty transcript"));
  REQUIRE_THROWS_WITH(parse_transcription_line("<s> FIVE 5 </s> (x)", &id, &text), Contains("'5'"));
}

// ---------------------------------------------------------------------------------------------------
// Features

TEST_CASE("features match the NumPy reference (spectrogram, log-mel, padded window)", "[speech][features]") {
  Reference ref = read_reference();
  REQUIRE(ref.cases.size() == 3);
  std::vector<float> x = to_float(ref.samples);
  for (const Reference::Case& rc : ref.cases) {
    CAPTURE(rc.opts.kind, rc.opts.n_fft);
    FeatureExtractor fx(rc.opts);
    REQUIRE(fx.dim() == rc.dim);
    REQUIRE(fx.frames(static_cast<int64_t>(x.size())) == rc.frames);
    FeatureNorm norm;
    std::vector<float> f = fx.compute(x.data(), static_cast<int64_t>(x.size()), &norm);
    REQUIRE(f.size() == rc.features.size());
    float worst = 0;
    for (size_t i = 0; i < f.size(); ++i) worst = std::max(worst, std::abs(f[i] - rc.features[i]));
    CAPTURE(worst);
    REQUIRE(worst < 1e-4f);  // single-precision FFT against float64; features are unit scale
    REQUIRE(norm.std > 0);
  }
  REQUIRE(ref.cases[0].dim == 161);  // the paper's 161 bins
  REQUIRE(ref.cases[1].dim == 80);
}

TEST_CASE("feature options are validated and short audio is refused", "[speech][features]") {
  FeatureOptions o;
  FeatureExtractor spec(o);
  REQUIRE(spec.dim() == 161);
  REQUIRE(spec.window_samples() == 320);
  REQUIRE(spec.hop_samples() == 160);
  REQUIRE(spec.frames(16000) == 101);
  std::vector<float> tiny(160, 0.1f);
  REQUIRE_THROWS_WITH(spec.compute(tiny.data(), 160), Contains("too short"));
  REQUIRE(spec.compute(tiny.data(), 161).size() == 2 * 161u);  // the shortest that reflects

  auto bad = [](FeatureOptions v) { REQUIRE_THROWS_AS(FeatureExtractor(v), std::invalid_argument); };
  FeatureOptions v = o;
  v.kind = "mfcc";
  REQUIRE_THROWS_WITH(FeatureExtractor(v), Contains("mfcc"));
  v = o, v.n_fft = 256, bad(v);       // shorter than the 320-sample window
  v = o, v.hop_ms = 0, bad(v);
  v = o, v.sample_rate = 0, bad(v);
  v = o, v.kind = "logmel", v.mel_bins = 0, bad(v);
  v = o, v.kind = "logmel", v.mel_bins = 150;  // too many filters for 161 bins: some would be empty
  REQUIRE_THROWS_WITH(FeatureExtractor(v), Contains("covers no FFT bin"));
}

TEST_CASE("gain augmentation on features equals features of the scaled audio", "[speech][features]") {
  Reference ref = read_reference();
  std::vector<float> x = to_float(ref.samples), louder(x.size());
  const double db = -7.5, a = std::pow(10.0, db / 20);
  for (size_t i = 0; i < x.size(); ++i) louder[i] = static_cast<float>(x[i] * a);
  for (const char* kind : {"spectrogram", "logmel"}) {
    FeatureOptions o;
    o.kind = kind;
    FeatureExtractor fx(o);
    FeatureNorm norm;
    std::vector<float> f = fx.compute(x.data(), static_cast<int64_t>(x.size()), &norm);
    std::vector<float> expect = fx.compute(louder.data(), static_cast<int64_t>(louder.size()));
    apply_gain(kind, f.data(), static_cast<int64_t>(f.size()), norm, db);
    float worst = 0;
    for (size_t i = 0; i < f.size(); ++i) worst = std::max(worst, std::abs(f[i] - expect[i]));
    CAPTURE(kind, worst);
    REQUIRE(worst < 2e-4f);
  }
}

TEST_CASE("speed augmentation resamples frames along time", "[speech][features]") {
  std::vector<float> x = {0, 10, 1, 11, 2, 12, 3, 13, 4, 14};  // 5 frames x 2
  int64_t m = 0;
  REQUIRE(stretch_frames(x.data(), 5, 2, 1.0, &m) == x);
  REQUIRE(m == 5);
  std::vector<float> slow = stretch_frames(x.data(), 5, 2, 5.0 / 9.0, &m);  // 9 frames: halfway points
  REQUIRE(m == 9);
  REQUIRE(slow[2] == Approx(0.5f));
  REQUIRE(slow[3] == Approx(10.5f));
  REQUIRE(slow[16] == 4.0f);
  std::vector<float> fast = stretch_frames(x.data(), 5, 2, 2.0, &m);
  REQUIRE(m == 3);  // round(2.5)
  REQUIRE(fast == std::vector<float>{0, 10, 2, 12, 4, 14});
  REQUIRE_THROWS(stretch_frames(x.data(), 5, 2, 0.0, &m));
}

// ---------------------------------------------------------------------------------------------------
// Audio

TEST_CASE("SPHERE, WAV and raw files of the same samples read identically", "[speech][audio]") {
  TempDir dir;
  Reference ref = read_reference();
  std::vector<float> expect = to_float(ref.samples);
  for (AudioFormat f : {AudioFormat::kSphere, AudioFormat::kWav, AudioFormat::kRaw}) {
    std::string path = dir.file("x" + audio_extension(f));
    write_audio(path, ref.samples, 16000, f);
    Audio audio = read_audio(path);
    CAPTURE(path);
    REQUIRE(audio.sample_rate == 16000);
    REQUIRE(audio.samples == expect);  // exactly int16 / 32768
  }
  // A SPHERE file as in CMU's an4_sphere.tar.gz: big-endian samples ("10"), header padded to 1024.
  std::string header = "NIST_1A\n   1024\nsample_count -i " + std::to_string(ref.samples.size()) +
                       "\nsample_n_bytes -i 2\nchannel_count -i 1\nsample_byte_format -s2 10\n"
                       "sample_rate -i 16000\nsample_coding -s3 pcm\nend_head\n";
  header.resize(1024, ' ');
  std::string bytes = header;
  for (int16_t s : ref.samples) {
    bytes += static_cast<char>((static_cast<uint16_t>(s) >> 8) & 0xFF);
    bytes += static_cast<char>(static_cast<uint16_t>(s) & 0xFF);
  }
  write_text(dir.file("big.sph"), bytes);
  REQUIRE(read_audio(dir.file("big.sph"), 16000) == expect);

  // So the features agree too.
  FeatureExtractor fx{FeatureOptions{}};
  std::vector<float> a = read_audio(dir.file("x.sph"), 16000), b = read_audio(dir.file("x.raw"), 16000);
  REQUIRE(fx.compute(a.data(), static_cast<int64_t>(a.size())) == fx.compute(b.data(), static_cast<int64_t>(b.size())));
}

TEST_CASE("bad audio files give one error naming the file", "[speech][audio]") {
  TempDir dir;
  std::vector<int16_t> s = tone(4000, 1);
  SECTION("missing") {
    REQUIRE_THROWS_WITH(read_audio(dir.file("none.sph")), Contains(dir.file("none.sph")) && Contains("not found"));
  }
  SECTION("not audio") {
    write_text(dir.file("junk.sph"), "this is not a SPHERE file at all, just text of some length\n");
    REQUIRE_THROWS_WITH(read_audio(dir.file("junk.sph")), Contains("audio: " + dir.file("junk.sph") + ": cannot read"));
  }
  SECTION("wrong sample rate") {
    write_audio(dir.file("slow.wav"), s, 8000, AudioFormat::kWav);
    REQUIRE(read_audio(dir.file("slow.wav")).sample_rate == 8000);
    REQUIRE_THROWS_WITH(read_audio(dir.file("slow.wav"), 16000),
                        Contains(dir.file("slow.wav")) && Contains("sample rate 8000 Hz, expected 16000 Hz"));
  }
  SECTION("stereo") {
    SF_INFO info{};
    info.samplerate = 16000;
    info.channels = 2;
    info.format = SF_FORMAT_WAV | SF_FORMAT_PCM_16;
    SNDFILE* f = sf_open(dir.file("two.wav").c_str(), SFM_WRITE, &info);
    REQUIRE(f);
    sf_writef_short(f, s.data(), static_cast<sf_count_t>(s.size() / 2));
    sf_close(f);
    REQUIRE_THROWS_WITH(read_audio(dir.file("two.wav")), Contains(dir.file("two.wav")) && Contains("2 channels"));
  }
  SECTION("empty raw") {
    write_text(dir.file("empty.raw"), "");
    REQUIRE_THROWS_WITH(read_audio(dir.file("empty.raw")), Contains(dir.file("empty.raw")) && Contains("no samples"));
  }
  SECTION("a folder") {
    fs::create_directories(dir.file("d.wav"));
    REQUIRE_THROWS_WITH(read_audio(dir.file("d.wav")), Contains(dir.file("d.wav")));
  }
  SECTION("float samples that are not finite or far beyond full scale") {
    for (float bad : {std::nanf(""), INFINITY, 1e30f, -9.0f}) {
      SF_INFO info{};
      info.samplerate = 16000;
      info.channels = 1;
      info.format = SF_FORMAT_WAV | SF_FORMAT_FLOAT;
      SNDFILE* f = sf_open(dir.file("float.wav").c_str(), SFM_WRITE, &info);
      REQUIRE(f);
      std::vector<float> x(1000, 0.5f);
      x[700] = bad;
      sf_writef_float(f, x.data(), static_cast<sf_count_t>(x.size()));
      sf_close(f);
      REQUIRE_THROWS_WITH(read_audio(dir.file("float.wav")),
                          Contains(dir.file("float.wav")) && Contains("sample 700 is") && Contains("within +-8"));
    }
  }
  SECTION("a header claiming more samples than the cap") {
    // FLAC's STREAMINFO stores the sample count (36 bits): set it to 2^36 - 1.
    SF_INFO info{};
    info.samplerate = 16000;
    info.channels = 1;
    info.format = SF_FORMAT_FLAC | SF_FORMAT_PCM_16;
    SNDFILE* f = sf_open(dir.file("big.flac").c_str(), SFM_WRITE, &info);
    REQUIRE(f);
    sf_writef_short(f, s.data(), static_cast<sf_count_t>(s.size()));
    sf_close(f);
    std::fstream io(dir.file("big.flac"), std::ios::in | std::ios::out | std::ios::binary);
    char streaminfo[8];
    io.seekg(18);  // "fLaC", the block header, then 10 bytes before rate/channels/bits/count
    io.read(streaminfo, 8);
    streaminfo[3] |= 0x0f;
    for (int i = 4; i < 8; ++i) streaminfo[i] = static_cast<char>(0xff);
    io.seekp(18);
    io.write(streaminfo, 8);
    io.close();
    REQUIRE_THROWS_WITH(read_audio(dir.file("big.flac")),
                        Contains(dir.file("big.flac")) && Contains("header claims 68719476735 samples"));
  }
}

// ---------------------------------------------------------------------------------------------------
// Loading AN4

TEST_CASE("load_an4 reads the layout in fileids order, any format, any thread count", "[speech][an4]") {
  TempDir dir;
  const std::string root = dir.path.string();
  std::vector<CorpusEntry> train = small_train(), test = small_test();
  std::vector<std::string> paths = write_corpus(root, true, train);
  write_corpus(root, false, test);

  An4Options o;
  o.root = root;
  o.threads = 1;
  std::string warnings;
  SpeechSet one = load_an4(o, true, &warnings);
  REQUIRE(warnings.empty());
  REQUIRE(one.size() == 6);
  REQUIRE(one.feature_dim == 161);
  FeatureExtractor fx(o.features);
  for (size_t i = 0; i < train.size(); ++i) {
    const Utterance& u = one.utterances[i];
    REQUIRE(u.id == train[i].id);
    REQUIRE(u.transcript == train[i].text);
    REQUIRE(u.frames == fx.frames(train[i].samples));
    std::vector<float> x = read_audio(paths[i], 16000);
    REQUIRE(u.features == fx.compute(x.data(), static_cast<int64_t>(x.size())));
  }
  o.threads = 3;
  SpeechSet three = load_an4(o, true);
  for (int64_t i = 0; i < one.size(); ++i) REQUIRE(three.utterances[i].features == one.utterances[i].features);

  SpeechSet t = load_an4(o, false);
  REQUIRE(t.size() == 2);
  REQUIRE(t.utterances[1].transcript == "T W O");

  o.features.kind = "logmel";
  SpeechSet mel = load_an4(o, false);
  REQUIRE(mel.feature_dim == 80);
  REQUIRE(mel.utterances[0].features.size() == static_cast<size_t>(mel.utterances[0].frames) * 80);

  std::vector<An4Entry> index = read_an4_index(root, true);
  REQUIRE(index.size() == 6);
  REQUIRE(index[2].audio_path == root + "/wav/an4_clstk/mblw/an1-mblw-b.raw");
}

TEST_CASE("load_an4 names the bad file, or skips it with a counted warning", "[speech][an4]") {
  TempDir dir;
  const std::string root = dir.path.string();
  std::vector<std::string> paths = write_corpus(root, true, small_train());
  const std::string ids = root + "/etc/an4_train.fileids", texts = root + "/etc/an4_train.transcription";
  An4Options o;
  o.root = root;
  o.threads = 2;

  SECTION("missing list") {
    fs::remove(ids);
    REQUIRE_THROWS_WITH(load_an4(o, true), Contains(ids) && Contains("cannot open"));
    o.skip_bad = true;  // nothing to skip: still an error
    REQUIRE_THROWS_WITH(load_an4(o, true), Contains(ids));
  }
  SECTION("bad utterances") {
    fs::remove(paths[1]);                                                 // missing audio
    write_audio(paths[3], tone(3000, 0), 8000, AudioFormat::kSphere);    // wrong rate
    std::string t;
    for (const CorpusEntry& e : small_train()) {
      t += "<s> " + (e.id == "an3-mcen-b" ? std::string("IT'S 2 GO") : e.text) + " </s> (" + e.id + ")\n";
    }
    write_text(texts, t);  // a digit in one transcript
    REQUIRE_THROWS_WITH(load_an4(o, true), Contains(ids + ":2") && Contains("no audio for 'an252-fash-b'"));
    o.skip_bad = true;
    std::string warnings;
    SpeechSet set = load_an4(o, true, &warnings);
    REQUIRE(set.size() == 3);
    REQUIRE(set.utterances[0].id == "an251-fash-b");
    REQUIRE(set.utterances[1].id == "an1-mblw-b");
    REQUIRE(set.utterances[2].id == "an4-mcen-b");
    REQUIRE_THAT(warnings, Contains("an252-fash-b") && Contains(paths[3]) && Contains("sample rate 8000") &&
                               Contains(texts + ":5") && Contains("'2'") &&
                               Contains("skipped 3 of 6 train utterances"));
  }
  SECTION("each problem alone is an error naming the file") {
    SECTION("transcript character") {
      write_text(texts, "<s> R O B E R T </s> (an251-fash-b)\n<s> FIVE-SIX </s> (an252-fash-b)\n");
      REQUIRE_THROWS_WITH(load_an4(o, true), Contains(texts + ":2") && Contains("'-'"));
    }
    SECTION("no transcript") {
      write_text(texts, "<s> R O B E R T </s> (an251-fash-b)\n");
      REQUIRE_THROWS_WITH(load_an4(o, true), Contains("no transcript for 'an252-fash-b' in " + texts));
    }
    SECTION("unreadable audio") {
      write_text(paths[4], "garbage garbage garbage garbage garbage garbage garbage");
      REQUIRE_THROWS_WITH(load_an4(o, true), Contains(paths[4]) && Contains("cannot read"));
    }
    SECTION("too short") {
      write_audio(paths[4], tone(100, 0), 16000, AudioFormat::kSphere);
      REQUIRE_THROWS_WITH(load_an4(o, true), Contains(paths[4]) && Contains("too short"));
    }
    SECTION("bad options") {
      o.features.kind = "mfcc";
      REQUIRE_THROWS_AS(load_an4(o, true), std::invalid_argument);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Loader

TEST_CASE("bucketing: global batches are runs of similar length in a per-epoch order", "[speech][loader]") {
  SpeechSet set = make_set(50);
  SpeechLoaderOptions o;
  o.batch_size = 4;
  o.seed = 9;
  o.threads = 0;
  SpeechLoader loader(set, o);
  REQUIRE(loader.batches_per_epoch() == 12);  // 48 of 50 per epoch
  std::set<int64_t> seen;
  std::vector<std::vector<int64_t>> epoch_orders;
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<SpeechBatch> batches = take(loader, 12);
    std::set<int64_t> in_epoch;
    std::vector<int64_t> order;
    for (const SpeechBatch& b : batches) {
      REQUIRE(b.epoch == epoch);
      REQUIRE(b.size == 4);
      // Longest first, and lengths form a run of the sorted order: with lengths 10..59 and two left
      // out per epoch, a batch spans at most 4 + 2 consecutive lengths.
      REQUIRE(std::is_sorted(b.frames.rbegin(), b.frames.rend()));
      REQUIRE(b.frames.front() - b.frames.back() <= 5);
      REQUIRE(b.max_frames == b.frames.front());
      for (int64_t i : b.indices) {
        REQUIRE(in_epoch.insert(i).second);
        seen.insert(i);
      }
      order.push_back(b.indices[0]);
    }
    REQUIRE(in_epoch.size() == 48);
    epoch_orders.push_back(order);
  }
  REQUIRE(epoch_orders[0] != epoch_orders[1]);  // batch order shuffled per epoch
  REQUIRE(seen.size() == 50);                   // who sits out changes between epochs

  // Without shuffle: shortest first and the longest sit out.
  o.shuffle = false;
  SpeechLoader plain(set, o);
  SpeechBatch first = plain.next();
  REQUIRE(first.frames == std::vector<int32_t>{13, 12, 11, 10});
  plain.seek(0, 11);
  REQUIRE(plain.next().frames.front() == 57);
}

TEST_CASE("ranks take slices of the same global batches", "[speech][loader]") {
  SpeechSet set = make_set(37);
  SpeechLoaderOptions o;
  o.batch_size = 2;
  o.seed = 4;
  o.threads = 0;
  for (bool drop_last : {true, false}) {
    CAPTURE(drop_last);
    o.drop_last = drop_last;
    o.world = 1;
    o.batch_size = 6;
    SpeechLoader single(set, o);
    o.world = 3;
    o.batch_size = 2;
    std::vector<std::unique_ptr<SpeechLoader>> ranks;
    for (int r = 0; r < 3; ++r) {
      o.rank = r;
      ranks.push_back(std::make_unique<SpeechLoader>(set, o));
      REQUIRE(ranks.back()->batches_per_epoch() == single.batches_per_epoch());
    }
    o.rank = 0;
    REQUIRE(single.batches_per_epoch() == (drop_last ? 6 : 7));
    std::multiset<int64_t> all;
    for (int64_t b = 0; b < 2 * single.batches_per_epoch(); ++b) {
      SpeechBatch g = single.next();
      std::multiset<int64_t> expect(g.indices.begin(), g.indices.end()), got;
      int32_t previous_max = 0;
      for (auto& r : ranks) {
        SpeechBatch s = r->next();
        REQUIRE(s.index == g.index);
        got.insert(s.indices.begin(), s.indices.end());
        if (s.size > 0) {  // slices are contiguous in length: rank r's shortest >= rank r-1's longest
          REQUIRE(s.frames.back() >= previous_max);
          previous_max = s.frames.front();
        }
        if (b < single.batches_per_epoch()) all.insert(s.indices.begin(), s.indices.end());
      }
      REQUIRE(got == expect);
    }
    if (!drop_last) {  // evaluation: every utterance exactly once per epoch
      REQUIRE(all.size() == 37);
      REQUIRE(std::set<int64_t>(all.begin(), all.end()).size() == 37);
    }
  }
}

TEST_CASE("batches carry padded features, true lengths and concatenated labels", "[speech][loader]") {
  SpeechSet set = make_set(9, 3);
  SpeechLoaderOptions o;
  o.batch_size = 3;
  o.threads = 0;
  o.sort_by_length = false;
  o.shuffle = false;
  SpeechLoader loader(set, o);
  SpeechBatch b = loader.next();
  REQUIRE(b.feature_dim == 3);
  REQUIRE(static_cast<int64_t>(b.features.size()) == b.size * b.max_frames * 3);
  std::vector<int32_t> labels;
  for (int64_t j = 0; j < b.size; ++j) {
    const Utterance& u = set.utterances[b.indices[j]];
    REQUIRE(b.frames[j] == u.frames);
    REQUIRE(b.transcripts[j] == u.transcript);
    const float* row = b.features.data() + j * b.max_frames * 3;
    REQUIRE(std::equal(u.features.begin(), u.features.end(), row));
    REQUIRE(std::all_of(row + u.frames * 3, row + b.max_frames * 3, [](float v) { return v == 0.0f; }));
    std::vector<int32_t> ids = ctc_labels(u.transcript);
    REQUIRE(b.label_lengths[j] == static_cast<int32_t>(ids.size()));
    labels.insert(labels.end(), ids.begin(), ids.end());
  }
  REQUIRE(b.labels == labels);
  std::vector<int64_t> sorted_ids = b.indices;
  std::sort(sorted_ids.begin(), sorted_ids.end());
  REQUIRE(sorted_ids == std::vector<int64_t>{0, 1, 2});  // identity order, longest first in the batch
}

TEST_CASE("seek resumes exactly, output does not depend on threads, augmentation is seeded",
          "[speech][loader]") {
  SpeechSet set = make_set(40, 5);
  SpeechLoaderOptions o;
  o.batch_size = 3;
  o.world = 2;
  o.rank = 1;
  o.seed = 77;
  o.speed_perturb = 0.15;
  o.gain_perturb_db = 6;
  o.threads = 0;
  SpeechLoader sync(set, o);
  const int64_t per = sync.batches_per_epoch();
  std::vector<SpeechBatch> ref = take(sync, 2 * per + 3);
  for (int threads : {1, 3}) {
    o.threads = threads;
    SpeechLoader bg(set, o);
    std::vector<SpeechBatch> got = take(bg, 2 * per + 3);
    for (size_t i = 0; i < ref.size(); ++i) require_same(got[i], ref[i]);
    bg.seek(1, per - 1);  // resume mid-run, across an epoch boundary
    for (int64_t i = 2 * per - 1; i < 2 * per + 3; ++i) require_same(bg.next(), ref[i]);
    bg.seek(0, per);  // == (1, 0)
    require_same(bg.next(), ref[per]);
  }
  REQUIRE_THROWS_AS(sync.seek(0, per + 1), std::invalid_argument);

  // Augmentation: lengths move within the speed range, the same utterance differs between epochs,
  // and the features stay normalized.
  bool changed = false;
  for (const SpeechBatch& b : ref) {
    for (int64_t j = 0; j < b.size; ++j) {
      const Utterance& u = set.utterances[b.indices[j]];
      REQUIRE(b.frames[j] >= std::floor(u.frames / 1.15) - 1);
      REQUIRE(b.frames[j] <= std::ceil(u.frames / 0.85) + 1);
      changed = changed || b.frames[j] != u.frames;
      double sum = 0, sq = 0;
      const float* row = b.features.data() + j * b.max_frames * 5;
      for (int64_t k = 0; k < b.frames[j] * 5; ++k) sum += row[k], sq += row[k] * row[k];
      REQUIRE(std::abs(sum / (b.frames[j] * 5)) < 1e-4);
      REQUIRE(std::sqrt(sq / (b.frames[j] * 5)) == Approx(1.0).epsilon(1e-3));
    }
  }
  REQUIRE(changed);
  std::map<int64_t, std::vector<int32_t>> frames_by_epoch[2];
  for (const SpeechBatch& b : ref) {
    if (b.epoch > 1) continue;
    for (int64_t j = 0; j < b.size; ++j) frames_by_epoch[b.epoch][b.indices[j]].push_back(b.frames[j]);
  }
  int differ = 0;
  for (auto& [i, f] : frames_by_epoch[0]) differ += frames_by_epoch[1].count(i) && frames_by_epoch[1][i] != f;
  REQUIRE(differ > 0);
}

TEST_CASE("speech loader rejects bad options", "[speech][loader]") {
  SpeechSet set = make_set(10);
  SpeechLoaderOptions o;
  o.threads = 0;
  auto bad = [&](SpeechLoaderOptions v) { REQUIRE_THROWS_AS(SpeechLoader(set, v), std::invalid_argument); };
  SpeechLoaderOptions v = o;
  v.batch_size = 0, bad(v);
  v = o, v.batch_size = 11;  // more than the set with drop_last
  REQUIRE_THROWS_WITH(SpeechLoader(set, v), Contains("fewer than one global batch"));
  v = o, v.world = 2, v.rank = 2, bad(v);
  v = o, v.speed_perturb = 1.0, bad(v);
  v = o, v.gain_perturb_db = -1, bad(v);
  SpeechSet broken = make_set(4);
  broken.utterances[2].transcript = "A1";
  REQUIRE_THROWS_WITH(SpeechLoader(broken, SpeechLoaderOptions{1}), Contains("u2") && Contains("'1'"));
  REQUIRE_THROWS_AS(SpeechLoader(SpeechSet{}, o), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------------
// Scripts

TEST_CASE("prepare_an4 unpacks CMU's tarballs into the layout", "[speech][scripts]") {
  TempDir dir;
  const std::string script = std::string(TRAINER_SOURCE_DIR) + "/scripts/prepare_an4";
  for (AudioFormat format : {AudioFormat::kRaw, AudioFormat::kSphere}) {
    std::string name = format == AudioFormat::kRaw ? "an4_raw.bigendian" : "an4_sphere";
    std::string src = dir.file(name + "_src");
    std::vector<CorpusEntry> train = small_train(), test = small_test();
    for (CorpusEntry& e : train) e.format = format;
    for (CorpusEntry& e : test) e.format = format;
    write_corpus(src + "/an4", true, train);
    write_corpus(src + "/an4", false, test);
    write_text(src + "/an4/etc/an4.dic", "YES Y EH S\n");  // the distribution's other files come along
    const std::string tarball = dir.file(name + ".tar.gz"), out = dir.file(name + "_out");
    REQUIRE(run_shell("tar -czf '" + tarball + "' -C '" + src + "' an4") == 0);
    REQUIRE(run_shell("'" + script + "' '" + tarball + "' '" + out + "' > /dev/null") == 0);
    REQUIRE(fs::exists(out + "/etc/an4.dic"));
    An4Options o;
    o.root = out;
    REQUIRE(load_an4(o, true).size() == 6);
    REQUIRE(load_an4(o, false).utterances[0].id == "an406-fcaw-b");
    REQUIRE(run_shell("'" + script + "' '" + tarball + "' '" + out + "' 2> /dev/null") != 0);  // exists
    REQUIRE(run_shell("'" + script + "' --force '" + tarball + "' '" + out + "' > /dev/null") == 0);
  }
  // A tarball whose list names audio it does not hold is refused, naming the utterance.
  std::string src = dir.file("broken_src");
  write_corpus(src + "/an4", true, small_train());
  write_corpus(src + "/an4", false, small_test());
  fs::remove(src + "/an4/wav/an4test_clstk/fcaw/an407-fcaw-b.raw");
  REQUIRE(run_shell("tar -czf '" + dir.file("broken.tar.gz") + "' -C '" + src + "' an4") == 0);
  const std::string log = dir.file("broken.log");
  REQUIRE(run_shell("'" + script + "' '" + dir.file("broken.tar.gz") + "' '" + dir.file("broken_out") + "' 2> '" +
                    log + "'") != 0);
  std::vector<uint8_t> text = read_bytes(log);
  REQUIRE_THAT(std::string(text.begin(), text.end()), Contains("an407-fcaw-b"));
  REQUIRE(!fs::exists(dir.file("broken_out")));
}

TEST_CASE("make_speech_corpus writes a deterministic AN4-layout corpus", "[speech][scripts]") {
  if (run_shell("command -v espeak-ng > /dev/null && command -v sox > /dev/null && command -v python3 > /dev/null") != 0)
    trainer::testing::skip_test("espeak-ng, sox or python3 missing (scripts/install_deps.sh)");
  TempDir dir;
  const std::string script = std::string(TRAINER_SOURCE_DIR) + "/scripts/make_speech_corpus";
  const std::string args = " --train 6 --test 3 --train-speakers 3 --test-speakers 2 --seed 5 --jobs 2";
  REQUIRE(run_shell("'" + script + "' --out '" + dir.file("a") + "'" + args + " > /dev/null") == 0);
  REQUIRE(run_shell("'" + script + "' --out '" + dir.file("b") + "'" + args + " --jobs 1 > /dev/null") == 0);
  REQUIRE(run_shell("'" + script + "' --out '" + dir.file("w") + "'" + args + " --format wav > /dev/null") == 0);
  REQUIRE(run_shell("diff -r '" + dir.file("a") + "' '" + dir.file("b") + "' > /dev/null") == 0);  // identical
  REQUIRE(run_shell("'" + script + "' --out '" + dir.file("a") + "'" + args + " 2> /dev/null") != 0);  // exists

  std::set<std::string> speakers[2];
  for (bool train : {true, false}) {
    std::vector<An4Entry> index = read_an4_index(dir.file("a"), train);
    REQUIRE(index.size() == (train ? 6u : 3u));
    for (const An4Entry& e : index) {
      REQUIRE(fs::path(e.audio_path).extension() == ".sph");
      speakers[train].insert(fs::path(e.audio_path).parent_path().filename().string());
    }
    An4Options o;
    o.root = dir.file("a");
    SpeechSet sph = load_an4(o, train);
    o.root = dir.file("w");
    SpeechSet wav = load_an4(o, train);
    REQUIRE(sph.size() == wav.size());
    for (int64_t i = 0; i < sph.size(); ++i) {  // same samples in either container
      REQUIRE(sph.utterances[i].transcript == wav.utterances[i].transcript);
      REQUIRE(sph.utterances[i].features == wav.utterances[i].features);
      REQUIRE(sph.utterances[i].frames > 30);  // espeak-ng said something
    }
  }
  for (const std::string& s : speakers[0]) REQUIRE(speakers[1].count(s) == 0);  // disjoint speakers
}

TEST_CASE("make_speech_corpus --hard is deterministic, loads, and is not the default corpus", "[speech][scripts]") {
  if (run_shell("command -v espeak-ng > /dev/null && command -v sox > /dev/null && command -v python3 > /dev/null") != 0)
    trainer::testing::skip_test("espeak-ng, sox or python3 missing (scripts/install_deps.sh)");
  TempDir dir;
  const std::string script = std::string(TRAINER_SOURCE_DIR) + "/scripts/make_speech_corpus";
  const std::string args = " --train 8 --test 3 --train-speakers 4 --test-speakers 2 --seed 5";
  REQUIRE(run_shell("'" + script + "' --hard --out '" + dir.file("a") + "'" + args + " --jobs 2 > /dev/null") == 0);
  REQUIRE(run_shell("'" + script + "' --hard --out '" + dir.file("b") + "'" + args + " --jobs 1 > /dev/null") == 0);
  REQUIRE(run_shell("'" + script + "' --out '" + dir.file("easy") + "'" + args + " > /dev/null") == 0);
  REQUIRE(run_shell("diff -r '" + dir.file("a") + "' '" + dir.file("b") + "' > /dev/null") == 0);  // identical
  REQUIRE(run_shell("grep -q '^variant: hard' '" + dir.file("a") + "/README.txt'") == 0);
  REQUIRE(run_shell("grep -q '^variant:' '" + dir.file("easy") + "/README.txt'") != 0);

  REQUIRE(run_shell("diff -r -q '" + dir.file("a") + "/wav' '" + dir.file("easy") + "/wav' > /dev/null") != 0);

  std::set<std::string> speakers[2];
  for (bool train : {true, false}) {
    for (const An4Entry& e : read_an4_index(dir.file("a"), train))
      speakers[train].insert(fs::path(e.audio_path).parent_path().filename().string());
    An4Options o;
    o.root = dir.file("a");
    SpeechSet hard = load_an4(o, train);
    REQUIRE(hard.size() == (train ? 8 : 3));
    for (int64_t i = 0; i < hard.size(); ++i) REQUIRE(hard.utterances[i].frames > 30);  // espeak-ng said something
  }
  REQUIRE(speakers[true].size() == 4);
  REQUIRE(speakers[false].size() == 2);
  for (const std::string& s : speakers[0]) REQUIRE(speakers[1].count(s) == 0);  // unseen test voices
}
