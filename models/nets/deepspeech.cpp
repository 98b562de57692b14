#include "models/nets/deepspeech.h"

#include <cmath>
#include <stdexcept>

namespace trainer::models {
namespace {

// Frequency bins after a convolution along frequency (the same formula as along time).
int64_t conv_out(int64_t in, int64_t kernel, int64_t stride, int64_t pad) {
  return (in + 2 * pad - kernel) / stride + 1;
}

}  // namespace

DeepSpeech::DeepSpeech(Backend& backend, const DeepSpeechOptions& options, uint64_t seed)
    : backend_(backend), opt_(options), ctc_(backend) {
  LayerContext ctx{backend_, params_, buffers_};
  const int64_t C = opt_.conv_channels, H = opt_.hidden;
  // Declared in deepspeech.pytorch's module order, so the flat buffers follow its parameters().
  Conv2dOptions first{1, C, 41, 11, 2, 2, 20, 5, true};
  first.input_gradient = false;  // the spectrogram's gradient is not needed
  conv1_ = std::make_unique<Conv2d>(ctx, "conv.seq_module.0", first);
  bn1_ = std::make_unique<BatchNorm2d>(ctx, "conv.seq_module.1", BatchNormOptions{C});
  clip1_ = std::make_unique<Hardtanh>(ctx, 0.f, 20.f);
  conv2_ = std::make_unique<Conv2d>(ctx, "conv.seq_module.3", Conv2dOptions{C, C, 21, 11, 2, 1, 10, 5, true});
  bn2_ = std::make_unique<BatchNorm2d>(ctx, "conv.seq_module.4", BatchNormOptions{C});
  clip2_ = std::make_unique<Hardtanh>(ctx, 0.f, 20.f);
  const int64_t freq = conv_out(conv_out(opt_.feature_dim, 41, 2, 20), 21, 2, 10);
  if (freq < 1)
    throw std::invalid_argument("deepspeech: feature_dim " + std::to_string(opt_.feature_dim) + " is too small");
  rnn_bn_.resize(opt_.rnn_layers);
  for (int64_t k = 0; k < opt_.rnn_layers; ++k) {
    const std::string name = "rnns." + std::to_string(k);
    if (k > 0) rnn_bn_[k] = std::make_unique<SequenceBatchNorm>(ctx, name + ".batch_norm.module", BatchNormOptions{H});
    rnn_.push_back(std::make_unique<Lstm>(ctx, name + ".rnn", LstmOptions{k == 0 ? C * freq : H, H, 1, false}));
  }
  lookahead_ = std::make_unique<Lookahead>(ctx, "lookahead.0", H, opt_.context);
  clip3_ = std::make_unique<Hardtanh>(ctx, 0.f, 20.f);
  fc_bn_ = std::make_unique<SequenceBatchNorm>(ctx, "fc.0.module.0", BatchNormOptions{H});
  fc_ = std::make_unique<Linear>(ctx, "fc.0.module.1", H, opt_.classes, /*bias=*/false);
  params_.allocate(backend_);
  buffers_.allocate(backend_);
  init(seed);
  params_.upload_initial_values();
  buffers_.upload_initial_values();
}

void DeepSpeech::init(uint64_t seed) {
  // PyTorch's defaults, in module order from one generator: convolutions (weights and biases)
  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the other layers' own init() follows PyTorch already.
  Rng rng(seed);
  auto pytorch_conv_init = [&](const std::string& name) {
    Tensor w = params_.initial_value(params_.find(name + ".weight"));
    Tensor b = params_.initial_value(params_.find(name + ".bias"));
    const float bound = 1.f / std::sqrt(static_cast<float>(w.dim(1) * w.dim(2) * w.dim(3)));
    std::uniform_real_distribution<float> uniform(-bound, bound);
    for (int64_t i = 0; i < w.numel(); ++i) w.data[i] = uniform(rng);
    for (int64_t i = 0; i < b.numel(); ++i) b.data[i] = uniform(rng);
  };
  pytorch_conv_init("conv.seq_module.0");
  bn1_->init(rng);
  pytorch_conv_init("conv.seq_module.3");
  bn2_->init(rng);
  for (int64_t k = 0; k < opt_.rnn_layers; ++k) {
    if (rnn_bn_[k]) rnn_bn_[k]->init(rng);
    rnn_[k]->init(rng);
  }
  lookahead_->init(rng);
  fc_bn_->init(rng);
  fc_->init(rng);
}

void DeepSpeech::run(const SpeechInput& in, Mode mode) {
  if (in.batch < 1 || in.max_frames < 1 || in.feature_dim != opt_.feature_dim)
    throw std::invalid_argument("deepspeech: expected a batch of {N, T, " + std::to_string(opt_.feature_dim) +
                                "} features, got {" + std::to_string(in.batch) + ", " + std::to_string(in.max_frames) +
                                ", " + std::to_string(in.feature_dim) + "}");
  const int64_t N = in.batch, T = in.max_frames, F = in.feature_dim;
  frames_.resize(N);
  for (int64_t n = 0; n < N; ++n) {
    if (in.frames[n] < 1 || in.frames[n] > T)
      throw std::invalid_argument("deepspeech: utterance " + std::to_string(n) + " has " +
                                  std::to_string(in.frames[n]) + " frames, outside [1, " + std::to_string(T) + "]");
    frames_[n] = static_cast<int32_t>(output_frames(in.frames[n]));
  }
  // {N, T, F} features -> the spectrogram image {N, 1, F, T} (one channel: channels-last is NCHW).
  Tensor& spectrogram = spectrogram_.resize({N, 1, F, T});
  backend_.transpose(N, T, F, in.features, spectrogram.data);

  // MaskConv: frames past each utterance's length are zeroed after every stage, so padding never
  // leaks into valid frames through the next convolution. Masking the layers' own outputs in place
  // is safe: neither a convolution's nor a batch norm's backward reads its output.
  const Tensor* h = &conv1_->forward(spectrogram, mode);
  backend_.mask_width(*h, frames_.data());
  h = &clip1_->forward(bn1_->forward(*h, mode), mode);
  backend_.mask_width(*h, frames_.data());
  h = &conv2_->forward(*h, mode);
  backend_.mask_width(*h, frames_.data());
  h = &clip2_->forward(bn2_->forward(*h, mode), mode);
  backend_.mask_width(*h, frames_.data());

  image_shape_ = h->shape;
  image_layout_ = h->layout;
  const int64_t steps = h->dim(3), features = h->dim(1) * h->dim(2);
  Tensor& sequence = sequence_.resize({steps, N, features});
  backend_.image_to_sequence(*h, sequence.data);
  const Tensor* s = &sequence;
  for (int64_t k = 0; k < opt_.rnn_layers; ++k) {
    if (rnn_bn_[k]) {
      rnn_bn_[k]->set_lengths(frames_);
      s = &rnn_bn_[k]->forward(*s, mode);
    }
    rnn_[k]->set_lengths(frames_);
    s = &rnn_[k]->forward(*s, mode);
  }
  s = &clip3_->forward(lookahead_->forward(*s, mode), mode);
  fc_bn_->set_lengths(frames_);
  s = &fc_bn_->forward(*s, mode);
  const Tensor& logits = fc_->forward(Tensor{s->data, {steps * N, opt_.hidden}}, mode);
  logits_ = Tensor{logits.data, {steps, N, opt_.classes}};
}

double DeepSpeech::forward(const SpeechInput& input, Mode mode) {
  run(input, mode);
  return ctc_.forward(logits_, frames_.data(), input.labels, input.label_lengths, mode == Mode::kTrain);
}

void DeepSpeech::backward() {
  const int64_t steps = logits_.dim(0), N = logits_.dim(1);
  // Each layer's gradients are final when its backward returns (reported for overlap, in reverse
  // declaration order).
  const Tensor& dlogits = ctc_.backward();
  const Tensor& dfc = fc_->backward(Tensor{dlogits.data, {steps * N, opt_.classes}});
  gradients_final_from("fc.0.module.1");
  const Tensor* d = &fc_bn_->backward(Tensor{dfc.data, {steps, N, opt_.hidden}});
  gradients_final_from("fc.0.module.0");
  d = &lookahead_->backward(clip3_->backward(*d));
  gradients_final_from("lookahead.0");
  for (int64_t k = opt_.rnn_layers - 1; k >= 0; --k) {
    const std::string name = "rnns." + std::to_string(k);
    d = &rnn_[k]->backward(*d);
    gradients_final_from(name + ".rnn");
    if (rnn_bn_[k]) {
      d = &rnn_bn_[k]->backward(*d);
      gradients_final_from(name + ".batch_norm.module");
    }
  }
  // Back into the conv stack's output image; each mask of the forward masks the gradient too.
  Tensor& image_grad = image_grad_.resize(image_shape_, image_layout_);
  backend_.sequence_to_image(d->data, image_grad);
  backend_.mask_width(image_grad, frames_.data());
  const Tensor* g = &bn2_->backward(clip2_->backward(image_grad));
  backend_.mask_width(*g, frames_.data());
  gradients_final_from("conv.seq_module.4");
  g = &conv2_->backward(*g);
  gradients_final_from("conv.seq_module.3");
  backend_.mask_width(*g, frames_.data());
  g = &bn1_->backward(clip1_->backward(*g));
  gradients_final_from("conv.seq_module.1");
  backend_.mask_width(*g, frames_.data());
  conv1_->backward(*g);  // weights only: conv1_ computes no spectrogram gradient
  gradients_final_from("conv.seq_module.0");
}

std::vector<std::vector<int32_t>> DeepSpeech::decode(const SpeechInput& input) {
  run(input, Mode::kEval);
  if (backend_.is_host()) return ctc_greedy_decode(logits_, frames_.data());
  // Best-path decoding is a walk over each utterance's frames on the host: copy the logits back
  // (T' x N x 29 floats, a few hundred kB) rather than launch a kernel per utterance.
  host_logits_.resize(static_cast<size_t>(logits_.numel()));
  copy_to_host(backend_, logits_.data, logits_.numel(), host_logits_.data());
  return ctc_greedy_decode(Tensor{host_logits_.data(), logits_.shape}, frames_.data());
}

std::vector<StreamedWeights> DeepSpeech::streamed_weights() const {
  std::vector<StreamedWeights> all;
  for (const auto& rnn : rnn_)
    for (const StreamedWeights& w : rnn->streamed_weights()) all.push_back(w);
  return all;
}

double DeepSpeech::forward_flops() const {
  double flops = conv1_->forward_flops() + conv2_->forward_flops() + lookahead_->forward_flops() + fc_->forward_flops();
  for (const auto& rnn : rnn_) flops += rnn->forward_flops();
  return flops;
}

std::unique_ptr<SpeechModel> make_deepspeech(Backend& backend, const DeepSpeechOptions& options, uint64_t seed) {
  return std::make_unique<DeepSpeech>(backend, options, seed);
}

}  // namespace trainer::models
