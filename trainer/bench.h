// `trainer bench`: times a training step of an image model at a batch size and compares it, in the
// same run and with the same thread count, with the same model in PyTorch (scripts/bench_torch.py).
#pragma once

#include <string>

namespace trainer::app {

struct BenchOptions {
  std::string model = "resnet20";
  int64_t batch = 128;
  int warmup = 3;
  int steps = 10;
  int64_t threads = 0;
  std::string conv_algorithm = "auto";
  bool torch = true;  // also run the PyTorch reference (default and channels_last layouts)
  std::string torch_python = "/usr/bin/python3";
};

int run_bench(const BenchOptions& options);

}  // namespace trainer::app
