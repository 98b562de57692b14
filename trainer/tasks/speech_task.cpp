#include "trainer/tasks/speech_task.h"

#include <algorithm>
#include <cstdio>

#include "data/seeding.h"
#include "models/nets/deepspeech.h"
#include "models/nets/las.h"
#include "trainer/tasks/speech_metrics.h"

namespace trainer::app {
namespace {

// The batch with its features uploaded to the model's backend.
models::SpeechInput input_of(const data::SpeechBatch& b, DeviceCopy<float>& features, uint64_t seed = 0) {
  return {features.upload(b.features.data(), static_cast<int64_t>(b.features.size())),
          b.size,
          b.max_frames,
          b.feature_dim,
          b.frames.data(),
          b.labels.data(),
          b.label_lengths.data(),
          seed};
}

data::An4Options an4_options(const Config& c) {
  data::An4Options o;
  o.root = c.data.root;
  o.skip_bad = c.data.skip_bad_audio;
  o.features.kind = c.data.features;
  o.features.mel_bins = c.data.mel_bins;
  o.threads = static_cast<int>(std::max<int64_t>(1, c.data.loader_threads));
  return o;
}

}  // namespace

std::unique_ptr<models::SpeechModel> SpeechTask::build_model(const Config& c, models::Backend& backend) {
  const uint64_t seed = static_cast<uint64_t>(c.experiment.seed);
  const int64_t feature_dim = data::FeatureExtractor(an4_options(c).features).dim();
  if (c.model.arch == "las") {
    models::LasOptions o;
    o.feature_dim = feature_dim;
    o.listener_hidden = c.model.las_listener_hidden;
    o.pyramid_layers = c.model.las_pyramid_layers;
    o.attention_dim = c.model.las_attention_dim;
    o.embedding_dim = c.model.las_embedding_dim;
    o.speller_hidden = c.model.las_speller_hidden;
    o.speller_layers = c.model.las_speller_layers;
    o.teacher_forcing = c.model.teacher_forcing;
    o.label_smoothing = c.model.label_smoothing;
    o.beam_width = c.model.beam_width;
    o.max_decode_steps = c.model.max_decode_steps;
    return models::make_las(backend, o, seed);
  }
  if (c.model.arch == "deepspeech") {
    models::DeepSpeechOptions o;
    o.feature_dim = feature_dim;
    o.conv_channels = c.model.deepspeech_conv_channels;
    o.hidden = c.model.deepspeech_hidden;
    o.rnn_layers = c.model.deepspeech_rnn_layers;
    return models::make_deepspeech(backend, o, seed);
  }
  return models::make_speech_model(c.model.arch, backend, seed);  // names the known ones
}

SpeechTask::SpeechTask(const Config& config, comm::Communicator& comm,
                       const std::function<void(const std::string&)>& announce, models::Backend& backend)
    : config_(config), rank_(static_cast<uint64_t>(comm.rank())), features_(backend) {
  std::string warnings;
  train_set_ = data::load_an4(an4_options(config), true, &warnings);
  test_set_ = data::load_an4(an4_options(config), false, &warnings);
  if (!warnings.empty()) announce(warnings);
  announce("data: " + config.data.root + ": " + std::to_string(train_set_.size()) + " train and " +
           std::to_string(test_set_.size()) + " test utterances, " + config.data.features + " features of " +
           std::to_string(train_set_.feature_dim));
  model_ = build_model(config, backend);
  data::SpeechLoaderOptions lo;
  lo.batch_size = config.data.batch_size;
  lo.global_batch = config.data.global_batch;
  lo.shuffle = true;
  lo.drop_last = true;
  lo.seed = static_cast<uint64_t>(config.experiment.seed);
  lo.rank = comm.rank();
  lo.world = comm.size();
  lo.threads = static_cast<int>(config.data.loader_threads);
  lo.speed_perturb = config.data.speed_perturb;
  lo.gain_perturb_db = config.data.gain_perturb_db;
  loader_ = std::make_unique<data::SpeechLoader>(train_set_, lo);
}

StepResult SpeechTask::forward_backward() {
  StepResult r;
  r.samples = batch_.size;
  // The model's own random choices (LAS teacher forcing) are a function of the run's seed, the
  // rank and the batch's place in the data order, so a resumed run repeats them.
  constexpr uint64_t kModelDraws = 0x4d4f44454cull;  // "MODEL": a stream of its own
  const uint64_t seed = data::mix(data::mix(static_cast<uint64_t>(config_.experiment.seed), kModelDraws, rank_, 0),
                                  kModelDraws, static_cast<uint64_t>(batch_.epoch), static_cast<uint64_t>(batch_.index));
  r.loss = model_->forward(input_of(batch_, features_, seed), models::Mode::kTrain);
  model_->backward();
  return r;
}

nlohmann::json SpeechTask::evaluate(comm::Communicator& comm) {
  data::SpeechLoaderOptions opts;
  opts.batch_size = config_.data.eval_batch_size;
  opts.shuffle = false;
  opts.drop_last = false;
  opts.rank = comm.rank();
  opts.world = comm.size();
  opts.threads = static_cast<int>(config_.data.loader_threads);
  data::SpeechLoader loader(test_set_, opts);
  ErrorCounts counts;
  double loss_sum = 0;
  nlohmann::json examples = nlohmann::json::array();
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    const data::SpeechBatch batch = loader.next();
    if (batch.size == 0) continue;  // a rank's share of the last, partial batch can be empty
    const models::SpeechInput in = input_of(batch, features_);
    loss_sum += model_->forward(in, models::Mode::kEval) * batch.size;
    const auto hypotheses = model_->decode(in);
    for (int64_t i = 0; i < batch.size; ++i) {
      const std::string hypothesis = data::ctc_text(hypotheses[i]);
      counts.add(batch.transcripts[i], hypothesis);
      if (comm.rank() == 0 && static_cast<int64_t>(examples.size()) < config_.train.eval_examples)
        examples.push_back({{"reference", batch.transcripts[i]}, {"hypothesis", hypothesis}});
    }
  }
  // Corpus totals over ranks: {loss sum, char edits, chars, word edits, words}.
  double totals[5] = {loss_sum, double(counts.char_edits), double(counts.chars), double(counts.word_edits),
                      double(counts.words)};
  comm.allreduce(totals, 5, comm::DType::kF64, comm::ReduceOp::kSum, "ALLREDUCE_EVAL");
  const double n = static_cast<double>(test_set_.size());
  return {{"split", "test"},
          {"loss", totals[0] / n},
          {"cer", totals[2] > 0 ? totals[1] / totals[2] : 0.0},
          {"wer", totals[4] > 0 ? totals[3] / totals[4] : 0.0},
          {"samples", test_set_.size()},
          {"examples", examples}};
}

std::string SpeechTask::describe_eval(const nlohmann::json& r) const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "test loss %.4f, CER %.2f%%, WER %.2f%% (%lld utterances)", r["loss"].get<double>(),
                100 * r["cer"].get<double>(), 100 * r["wer"].get<double>(),
                static_cast<long long>(r["samples"].get<int64_t>()));
  std::string text = buf;
  for (const auto& e : r["examples"])
    text += "\n        ref: " + e["reference"].get<std::string>() + "\n        hyp: " + e["hypothesis"].get<std::string>();
  return text;
}

}  // namespace trainer::app
