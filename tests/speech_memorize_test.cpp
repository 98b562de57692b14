// Both speech models memorize a tiny real corpus: 8 utterances that scripts/make_speech_corpus
// synthesizes (espeak-ng speech, AN4 layout, SPHERE audio) are read, featurized and trained on as
// one batch until greedy decoding transcribes them with a character error rate below 5%.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>

#include "data/an4.h"
#include "models/nets/deepspeech.h"
#include "models/nets/las.h"
#include "process.h"
#include "speech_testing.h"
#include "trainer/tasks/speech_metrics.h"

using namespace trainer;
using models::Mode;

namespace {

// The 8 training utterances, synthesized once per test process.
const std::string& corpus() {
  static trainer::testing::TempDir dir("memorize_corpus");
  static const std::string root = [] {
    const std::string script = std::string(TRAINER_SOURCE_DIR) + "/scripts/make_speech_corpus";
    const auto made = trainer::testing::run_command("'" + script + "' --out '" + dir.file("an4") +
                                                    "' --train 8 --test 2 --seed 3");
    INFO(made.output);
    REQUIRE(made.exit_code == 0);
    return dir.file("an4");
  }();
  return root;
}

// The whole split as one zero-padded batch.
struct CorpusBatch {
  std::vector<float> features;
  std::vector<int32_t> frames, labels, label_lengths;
  std::vector<std::string> transcripts;
  int64_t max_frames = 0, dim = 0;

  explicit CorpusBatch(const data::SpeechSet& set) : dim(set.feature_dim) {
    for (const auto& u : set.utterances) max_frames = std::max<int64_t>(max_frames, u.frames);
    features.assign(set.size() * max_frames * dim, 0.f);
    for (int64_t n = 0; n < set.size(); ++n) {
      const auto& u = set.utterances[n];
      std::copy(u.features.begin(), u.features.end(), features.begin() + n * max_frames * dim);
      frames.push_back(u.frames);
      const auto ids = data::ctc_labels(u.transcript);
      labels.insert(labels.end(), ids.begin(), ids.end());
      label_lengths.push_back(static_cast<int32_t>(ids.size()));
      transcripts.push_back(u.transcript);
    }
  }
  models::SpeechInput input() const {
    return {features.data(), static_cast<int64_t>(frames.size()), max_frames, dim, frames.data(),
            labels.data(), label_lengths.data()};
  }
  double cer(const std::vector<std::vector<int32_t>>& hypotheses) const {
    app::ErrorCounts counts;
    for (size_t n = 0; n < transcripts.size(); ++n) counts.add(transcripts[n], data::ctc_text(hypotheses[n]));
    return counts.cer();
  }
};

data::SpeechSet load(const std::string& kind, int64_t mel_bins) {
  data::An4Options o;
  o.root = corpus();
  o.features.kind = kind;
  o.features.mel_bins = mel_bins;
  data::SpeechSet set = data::load_an4(o, true);
  REQUIRE(set.size() == 8);
  return set;
}

}  // namespace

TEST_CASE("deepspeech memorizes 8 synthesized utterances to a CER below 5%", "[speech][memorize]") {
  const CorpusBatch batch(load("spectrogram", 80));
  models::DeepSpeechOptions o;  // 161 spectrogram bins; small widths
  o.conv_channels = 4;
  o.hidden = 64;
  o.rnn_layers = 2;
  o.context = 4;
  models::DeepSpeech model(models::cpu_backend(), o, 1);
  // Adam at 5e-3 for up to 800 steps. At 1e-2 the run's path depended on which GEMM kernels
  // OpenBLAS picks for the CPU: with its Sapphire Rapids kernels the loss was still 0.88 after 400
  // steps, with its Haswell kernels (OPENBLAS_CORETYPE=Haswell) it memorized; at 5e-3 both do (the
  // Sapphire Rapids one reaches 0.051 at step 400).
  trainer::testing::train_until(model, batch.input(), 5e-3, 0.05, 800);
  for (int i = 0; i < 30; ++i) model.forward(batch.input(), Mode::kTrain);  // running statistics catch up
  const double cer = batch.cer(model.decode(batch.input()));
  INFO("CER " << cer);
  CHECK(cer < 0.05);
}

TEST_CASE("las memorizes 8 synthesized utterances to a CER below 5%", "[speech][memorize]") {
  const CorpusBatch batch(load("logmel", 40));
  models::LasOptions o;
  o.feature_dim = 40;
  o.listener_hidden = 64;
  o.pyramid_layers = 2;
  o.attention_dim = 64;
  o.embedding_dim = 32;
  o.speller_hidden = 96;
  o.speller_layers = 1;
  models::Las model(models::cpu_backend(), o, 1);
  trainer::testing::train_until(model, batch.input(), 3e-3, 0.02, 400);
  const double greedy = batch.cer(model.decode_greedy(batch.input()));
  const double beam = batch.cer(model.decode_beam(batch.input(), 4));
  INFO("CER greedy " << greedy << ", beam " << beam);
  CHECK(greedy < 0.05);
  CHECK(beam < 0.05);
}
