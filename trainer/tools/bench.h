// `trainer bench`: times a training step (forward, backward, SGD momentum update) of a model and
// compares it, in the same run and with the same thread count, with the same model in PyTorch:
// image models on random 3x32x32 images against scripts/bench_torch.py (on the CPU the default and
// channels_last layouts; on a GPU channels_last eager, the step in one CUDA graph, and PyTorch's best
// with TF32 and the graph, printed side by side with ours at the end), speech models (deepspeech, las) on a batch of equal-length utterances with ~40-character
// transcripts against scripts/bench_torch_speech.py (LSTMs on the plain batch and on packed
// sequences).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

// `trainer bench loader`: the CIFAR input pipeline alone (data/loader.h), augmented training batches
// handed out as fast as the workers prepare them, for each worker count. A GPU step of ResNet-20 at
// batch 128 in 4 ms needs 32,000 images/s from it.
struct LoaderBenchOptions {
  std::vector<int> threads = {0, 1, 2};  // loader workers per run; 0 = next() prepares the batch itself
  int64_t batch = 128;
  int64_t batches = 300;  // timed batches per run
  int64_t warmup = 10;    // batches first
  // A CIFAR-10 binary folder (data.root); empty: 50,000 random images in memory, the real training
  // split's size (the loader's work does not depend on the pixel values).
  std::string data;
  bool augment = true;
};

int run_loader_bench(const LoaderBenchOptions& options);

// The path of a benchmark's PyTorch side in this source tree's scripts/ folder.
std::string bench_script(const std::string& name);

}  // namespace trainer::app
