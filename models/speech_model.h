// The interface the trainer drives speech models through (DeepSpeech, Listen-Attend-Spell): a batch of
// padded feature sequences with their lengths and label sequences in, a mean loss out, gradients
// into the flat gradient buffer, greedy transcripts for evaluation.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/layers/layer.h"
#include "models/streamed_weights.h"

namespace trainer::models {

// Class ids of the character models: 0 is the CTC blank, then apostrophe, A-Z, space (29 classes,
// deepspeech.pytorch's labels.json order).
constexpr const char* kSpeechLabels = "_'ABCDEFGHIJKLMNOPQRSTUVWXYZ ";
constexpr int64_t kSpeechClasses = 29;

// One batch: what data/speech_loader.h produces, with the features where the model computes (the
// model's backend: host memory on the CPU, a device copy on a GPU; trainer/step/device_batch.h) and the
// per-utterance arrays on the host (lengths and labels steer the model's host code and ride into
// kernels as arguments).
struct SpeechInput {
  const float* features = nullptr;  // batch x max_frames x feature_dim, row-major, zero padded
  int64_t batch = 0, max_frames = 0, feature_dim = 0;
  const int32_t* frames = nullptr;         // true number of frames of each utterance
  const int32_t* labels = nullptr;         // every utterance's class ids (1..28), back to back
  const int32_t* label_lengths = nullptr;  // labels per utterance
  uint64_t seed = 0;  // the batch's random choices inside the model (LAS teacher forcing)
};

class SpeechModel {
 public:
  virtual ~SpeechModel() = default;
  virtual ParameterStore& parameters() = 0;
  virtual ParameterStore& buffers() = 0;
  // The mean loss over the batch (Mode::kTrain keeps what backward() needs).
  virtual double forward(const SpeechInput& input, Mode mode) = 0;
  // Writes the gradient of the last training forward's loss into parameters().grads().
  virtual void backward() = 0;
  // Transcripts as character class ids (kSpeechLabels; other ids are not characters) decoded in
  // evaluation mode: greedy CTC for deepspeech, greedy or beam search for las. Labels are not read.
  virtual std::vector<std::vector<int32_t>> decode(const SpeechInput& input) = 0;
  // Multiply-add FLOPs of the last forward (2 per multiply-add).
  virtual double forward_flops() const { return 0; }
  // The weights the last training step's time-step-at-a-time products read (streamed_weights.h):
  // what bounds the recurrent part of the step at small batches.
  virtual std::vector<StreamedWeights> streamed_weights() const { return {}; }
  // For overlap with backward (sync.overlap): during backward(), `ready(from)` is called whenever
  // the gradient entries [from, n) are final, as ImageClassifier does (models/model.h).
  void set_gradient_ready(std::function<void(int64_t)> ready) { gradient_ready_ = std::move(ready); }

 protected:
  // Backward has finished every tensor from the first one named `prefix` (or `prefix`.*) to the
  // end of the flat gradient. The models call it in reverse declaration order, right after the
  // last write into those gradients.
  void gradients_final_from(const std::string& prefix);

 private:
  std::function<void(int64_t)> gradient_ready_;
};

// The speech models by name at their default (an4) sizes: "deepspeech" and "las" (docs/architecture.md
// section 5). Parameters are initialized from
// `seed`; the same seed gives the same weights on every rank.
std::unique_ptr<SpeechModel> make_speech_model(const std::string& arch, Backend& backend, uint64_t seed);
const std::vector<std::string>& speech_model_names();

}  // namespace trainer::models
