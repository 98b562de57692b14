// `trainer bench`: times a training step (forward, backward, SGD momentum update) of a model and
// compares it, in the same run and with the same thread count, with the same model in PyTorch:
// image models on random 3x32x32 images against scripts/bench_torch.py (default and channels_last
// layouts), speech models (deepspeech, las) on a batch of equal-length utterances with ~40-character
// transcripts against scripts/bench_torch_speech.py (LSTMs on the plain batch and on packed
// sequences).
#pragma once

#include <cstdint>
#include <string>

namespace trainer::app {

struct BenchOptions {
  std::string model = "resnet20";
  int64_t batch = 0;  // 0: the model's default (128 images, 8 utterances)
  int warmup = 3;
  int steps = 10;
  int64_t threads = 0;
  std::string conv_algorithm = "auto";
  // As runtime.precision; with bf16 the PyTorch side runs under torch.autocast(dtype=bfloat16).
  std::string precision = "fp32";
  std::string device = "cpu";  // as runtime.device
  // Speech models: frames per utterance (161 spectrogram bins for deepspeech, 80 log-mel bins for
  // las) and characters per transcript (utterance n has label_length - 1 + n % 3).
  int64_t frames = 300;
  int64_t label_length = 40;
  bool torch = true;  // also run the PyTorch reference
  std::string torch_python = "/usr/bin/python3";
};

int run_bench(const BenchOptions& options);

// The path of a benchmark's PyTorch side in this source tree's scripts/ folder.
std::string bench_script(const std::string& name);

}  // namespace trainer::app
