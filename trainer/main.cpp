// trainer: one binary, one TOML experiment file.
//
//   trainer --config FILE.toml [--set key.path=value]... [--dry-run]
//   trainer make-cifar --out DIR [--train N] [--test N] [--seed S]
//   trainer bench [--model resnet20] [--batch 128] [--threads N] [--no-torch]
//   trainer --config-reference          (the documentation of every config key, as Markdown)
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "data/synthetic_cifar.h"
#include "trainer/bench.h"
#include "trainer/config.h"
#include "trainer/run.h"

int main(int argc, char** argv) {
  CLI::App app{"trainer: deep-learning training with compressed data parallelism"};
  std::string config_path;
  std::vector<std::string> overrides;
  bool dry_run = false, reference = false;
  app.add_option("--config", config_path, "TOML experiment file");
  app.add_option("--set", overrides, "Override a key: --set optim.lr=0.05 (repeatable)");
  app.add_flag("--dry-run", dry_run, "Validate, print the resolved config, model and plan, and exit");
  app.add_flag("--config-reference", reference, "Print the reference of every config key (Markdown)");

  auto* make_cifar = app.add_subcommand("make-cifar", "Write a synthetic dataset in CIFAR-10 binary format");
  std::string cifar_out;
  int64_t n_train = 20000, n_test = 2000;
  uint64_t cifar_seed = 1234;
  make_cifar->add_option("--out", cifar_out, "Output folder")->required();
  make_cifar->add_option("--train", n_train, "Training images")->check(CLI::PositiveNumber);
  make_cifar->add_option("--test", n_test, "Test images")->check(CLI::PositiveNumber);
  make_cifar->add_option("--seed", cifar_seed, "Generator seed");

  auto* bench = app.add_subcommand("bench", "Time a training step against PyTorch on this machine");
  trainer::app::BenchOptions bo;
  bool no_torch = false;
  bench->add_option("--model", bo.model, "resnet20, resnet32, resnet56, resnet18 or vgg16");
  bench->add_option("--batch", bo.batch, "Batch size")->check(CLI::PositiveNumber);
  bench->add_option("--steps", bo.steps, "Timed steps")->check(CLI::PositiveNumber);
  bench->add_option("--warmup", bo.warmup, "Untimed steps first");
  bench->add_option("--threads", bo.threads, "Threads (0: all cores)");
  bench->add_option("--conv-algorithm", bo.conv_algorithm, "auto (Winograd from 32 channels), direct or winograd");
  bench->add_flag("--no-torch", no_torch, "Skip the PyTorch reference");

  CLI11_PARSE(app, argc, argv);
  try {
    if (reference) {
      std::fputs(trainer::config_reference_markdown().c_str(), stdout);
      return 0;
    }
    if (make_cifar->parsed()) {
      trainer::data::write_synthetic_cifar10(cifar_out, n_train, n_test, cifar_seed);
      std::printf("wrote %lld train and %lld test images to %s\n", static_cast<long long>(n_train),
                  static_cast<long long>(n_test), cifar_out.c_str());
      return 0;
    }
    if (bench->parsed()) {
      bo.torch = !no_torch;
      return trainer::app::run_bench(bo);
    }
    if (config_path.empty()) {
      std::fprintf(stderr, "error: --config FILE.toml is required (see --help)\n");
      return 2;
    }
    const trainer::Config config = trainer::load_config(config_path, overrides);
    if (dry_run) {
      trainer::app::print_dry_run(config);
      return 0;
    }
    trainer::app::run_training(config);
    return 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "\nerror: %s\n", e.what());
    return 1;
  }
}
