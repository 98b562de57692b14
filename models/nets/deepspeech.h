#pragma once

#include <memory>
#include <vector>

#include "models/layers/batch_norm.h"
#include "models/layers/conv2d.h"
#include "models/layers/ctc_loss.h"
#include "models/layers/hardtanh.h"
#include "models/layers/linear.h"
#include "models/layers/lookahead.h"
#include "models/layers/lstm.h"
#include "models/layers/sequence_batch_norm.h"
#include "models/speech_model.h"

namespace trainer::models {

// The defaults are the model of docs/architecture.md section 5 (27,569,568 parameters); smaller values make
// fast test models of the same structure.
struct DeepSpeechOptions {
  int64_t feature_dim = 161;  // spectrogram bins
  int64_t conv_channels = 32;
  int64_t hidden = 800;  // LSTM width
  int64_t rnn_layers = 5;
  int64_t context = 20;  // lookahead steps
  int64_t classes = kSpeechClasses;
};

// DeepSpeech 2 (Amodei et al. 2016) as deepspeech.pytorch builds it for the Ok-Top-k paper's AN4
// experiment (its state_dict names, parameter order and default initialization):
//   spectrogram {N, 1, F, T} -> Conv2d(1->32, 41x11 (freq x time), stride 2x2, pad 20x5) + BN +
//   Hardtanh(0, 20) -> Conv2d(32->32, 21x11, stride 2x1, pad 10x5) + BN + Hardtanh(0, 20), with
//   frames past each utterance's length zeroed after every conv stage (MaskConv) -> {T', N, 32*F'}
//   -> LSTM(800) x 5, layers 2-5 preceded by sequence-wise BN -> lookahead (context 20) +
//   Hardtanh(0, 20) -> sequence-wise BN + Linear(800 -> 29, no bias) -> CTC.
// Deliberate differences from deepspeech.pytorch: the sequence-wise batch norms use valid frames
// only (it normalizes over padding too), and the loss is the mean of per-utterance CTC losses.
class DeepSpeech final : public SpeechModel {
 public:
  DeepSpeech(Backend& backend, const DeepSpeechOptions& options, uint64_t seed);

  ParameterStore& parameters() override { return params_; }
  ParameterStore& buffers() override { return buffers_; }
  double forward(const SpeechInput& input, Mode mode) override;
  void backward() override;
  std::vector<std::vector<int32_t>> decode(const SpeechInput& input) override;
  double forward_flops() const override;
  std::vector<StreamedWeights> streamed_weights() const override;  // the five LSTMs' recurrences

  // Frames after the convolutions for `frames` input frames: floor((T + 2*5 - 11) / 2) + 1.
  static int64_t output_frames(int64_t frames) { return (frames + 2 * 5 - 11) / 2 + 1; }
  // The logits {T', N, classes} of the last forward and the output frames of each utterance.
  const Tensor& logits() const { return logits_; }
  const std::vector<int32_t>& frames() const { return frames_; }

 private:
  // Runs the network up to the logits (no loss).
  void run(const SpeechInput& input, Mode mode);
  void init(uint64_t seed);

  Backend& backend_;
  DeepSpeechOptions opt_;
  ParameterStore params_{true};
  ParameterStore buffers_{false};
  std::unique_ptr<Conv2d> conv1_, conv2_;
  std::unique_ptr<BatchNorm2d> bn1_, bn2_;
  std::unique_ptr<Hardtanh> clip1_, clip2_, clip3_;
  std::vector<std::unique_ptr<SequenceBatchNorm>> rnn_bn_;  // [0] is null: the first LSTM has none
  std::vector<std::unique_ptr<Lstm>> rnn_;
  std::unique_ptr<Lookahead> lookahead_;
  std::unique_ptr<SequenceBatchNorm> fc_bn_;
  std::unique_ptr<Linear> fc_;
  CtcLoss ctc_;
  std::vector<int32_t> frames_;
  OwnedTensor spectrogram_{backend_}, sequence_{backend_}, image_grad_{backend_};
  Shape image_shape_;  // the conv stack's output {N, C, F', T'}
  Layout image_layout_ = Layout::kChannelsLast;
  Tensor logits_;
  std::vector<float> host_logits_;  // decode()'s copy of logits_ when they live on a device
};

std::unique_ptr<SpeechModel> make_deepspeech(Backend& backend, const DeepSpeechOptions& options, uint64_t seed);

}  // namespace trainer::models
