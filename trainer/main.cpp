// trainer: one binary, one TOML experiment file.
//
//   [mpiexec -n P] trainer --config FILE.toml [--set key.path=value]... [--resume DIR|latest] [--dry-run]
//   trainer make-cifar --out DIR [--train N] [--test N] [--seed S]
//   trainer bench [--model resnet20|...|deepspeech|las] [--batch N] [--threads N] [--no-torch]
//   mpiexec -n P trainer bench comm [--n N]     (Communicator + log overhead vs bare MPI_Allreduce)
//   mpiexec -n P trainer bench sync [--n N] [--device cuda]   (every sync method on synthetic gradients)
//   trainer bench loader [--threads 0 1 2] [--data DIR]   (the CIFAR loader alone, augmented images/s)
//   trainer report RUN_DIR [RUN_DIR2 ...] [--out DIR] [--latency L]   (RUN_DIR/report/report.md and figures)
//   trainer whatif RUN_DIR --bandwidth 1gbit --latency 0.1ms [--ranks P]   (step time on another network)
//   trainer whatif RUN_DIR --calibration FILE.json [--ranks P]              (... on a measured one)
//   mpiexec -n P trainer calibrate --out FILE.json   (measure this network's achieved latency and rates)
//   trainer --config-reference          (the documentation of every config key, as Markdown)
#include <CLI/CLI.hpp>
#include <malloc.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainer/tools/bench_comm.h"
#include "trainer/tools/bench_outer.h"
#include "comm/calibrate.h"
#include "comm/communicator.h"
#include "trainer/tools/bench_sync.h"
#include "data/synthetic_cifar.h"
#include "trainer/tools/bench.h"
#include "trainer/config/config.h"
#include "trainer/experiment.h"
#include "trainer/checkpoint/preemption.h"
#include "trainer/tools/report.h"
#include "trainer/run.h"
#include "trainer/tools/whatif.h"

namespace {

// A subcommand: its options are declared on the parser, and run() does its work once it was given.
struct Tool {
  CLI::App* command;
  std::function<int()> run;
};

Tool add_make_cifar(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-cifar", "Write a synthetic dataset in CIFAR-10 binary format");
  struct Options {
    std::string out;
    int64_t train = 20000, test = 2000;
    uint64_t seed = 1234;
    std::string variant = "easy";
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--out", o->out, "Output folder")->required();
  cmd->add_option("--train", o->train, "Training images")->check(CLI::PositiveNumber);
  cmd->add_option("--test", o->test, "Test images")->check(CLI::PositiveNumber);
  cmd->add_option("--seed", o->seed, "Generator seed");
  cmd->add_option("--variant", o->variant, "easy (default) or hard (calibrated near real CIFAR-10's accuracy)")
      ->check(CLI::IsMember({"easy", "hard"}));
  return {cmd, [o] {
            trainer::data::write_synthetic_cifar10(o->out, o->train, o->test, o->seed,
                                                   *trainer::data::parse_synthetic_variant(o->variant));
            std::printf("wrote %lld train and %lld test images to %s\n", static_cast<long long>(o->train),
                        static_cast<long long>(o->test), o->out.c_str());
            return 0;
          }};
}

// `bench` and its `comm`, `outer`, `sync` and `loader` subcommands: the nested ones first (they are also `bench`).
std::vector<Tool> add_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Time a training step against PyTorch on this machine");
  auto bo = std::make_shared<trainer::app::BenchOptions>();
  auto no_torch = std::make_shared<bool>(false);
  bench->add_option("--model", bo->model, "resnet20, resnet32, resnet56, resnet18, vgg16, deepspeech or las");
  bench->add_option("--batch", bo->batch, "Batch size (default: 128 images, 8 utterances)")->check(CLI::PositiveNumber);
  bench->add_option("--frames", bo->frames, "Speech models: frames per utterance")->check(CLI::PositiveNumber);
  bench->add_option("--label-length", bo->label_length, "Speech models: characters per transcript (about)")
      ->check(CLI::PositiveNumber);
  bench->add_option("--steps", bo->steps, "Timed steps")->check(CLI::PositiveNumber);
  bench->add_option("--warmup", bo->warmup, "Untimed steps first");
  bench->add_option("--threads", bo->threads, "Threads (0: all cores)");
  bench->add_option("--conv-algorithm", bo->conv_algorithm, "auto (Winograd from 32 channels), direct or winograd");
  bench->add_option("--device", bo->device, "cpu or cuda (as runtime.device)");
  bench->add_option("--precision", bo->precision,
                    "fp32 or bf16 (as runtime.precision; PyTorch then runs under bf16 autocast)");
  bench->add_flag("--no-torch", *no_torch, "Skip the PyTorch reference");
  bench->add_option("--torch-python", bo->torch_python,
                    "The Python whose torch is the reference (default /usr/bin/python3: Debian's; a venv's "
                    "python for today's release)");

  auto* comm = bench->add_subcommand("comm", "Dense sync vs bare MPI_Allreduce (run under mpiexec)");
  struct CommOptions {
    int64_t n = trainer::comm::kBenchCommDefaultN;
    int steps = 20;
    double bucket_mb = 25.0;
  };
  auto co = std::make_shared<CommOptions>();
  comm->add_option("--n", co->n, "Gradient elements (default: the paper's LSTM, 27,569,568)");
  comm->add_option("--steps", co->steps, "Timed steps");
  comm->add_option("--bucket-mb", co->bucket_mb, "Bucket size of the bucketed case");

  auto* outer = bench->add_subcommand("outer", "The outer-gradient allreduce in fp32, bf16, fp8, int8 (under mpiexec)");
  struct OuterOptions {
    int64_t n = trainer::comm::kBenchCommDefaultN;
    int steps = 10;
  };
  auto oo = std::make_shared<OuterOptions>();
  outer->add_option("--n", oo->n, "Elements (default: the paper's LSTM, 27,569,568)");
  outer->add_option("--steps", oo->steps, "Timed steps");

  auto* sync = bench->add_subcommand("sync", "Every sync method on synthetic gradients (under mpiexec)");
  auto so = std::make_shared<trainer::comm::SyncBenchOptions>();
  auto sync_no_torch = std::make_shared<bool>(false);
  sync->add_option("--n", so->n, "Gradient elements (default: the paper's LSTM, 27,569,568)");
  sync->add_option("--density", so->density, "Density of the sparse methods");
  sync->add_option("--steps", so->steps, "Timed steps per method");
  sync->add_option("--warmup", so->warmup, "Compressed steps before timing");
  sync->add_option("--methods", so->methods, "Methods to time");
  sync->add_option("--powersgd-ranks", so->powersgd_ranks, "Factor ranks powersgd runs with");
  sync->add_flag("--no-torch", *sync_no_torch,
                 "Skip PyTorch beside ours (DDP's powerSGD_hook on the CPU; the sparse compression on a device)");
  sync->add_option("--device", so->device, "Where the gradients live: cpu, or cuda (a -DTRAINER_CUDA=ON build)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sync->add_option("--torch-python", so->torch_python, "The Python whose torch runs the PyTorch side");
  sync->add_option("--communicator", so->communicator, "On a device, as runtime.communicator: auto, nccl or mpi")
      ->check(CLI::IsMember({"auto", "nccl", "mpi"}));

  auto* loader = bench->add_subcommand("loader", "The CIFAR loader alone: augmented images/s per worker count");
  auto lo = std::make_shared<trainer::app::LoaderBenchOptions>();
  auto no_augment = std::make_shared<bool>(false);
  loader->add_option("--threads", lo->threads, "Loader worker counts, one run each (0: next() prepares)");
  loader->add_option("--batch", lo->batch, "Images per batch")->check(CLI::PositiveNumber);
  loader->add_option("--batches", lo->batches, "Timed batches per run")->check(CLI::PositiveNumber);
  loader->add_option("--warmup", lo->warmup, "Batches first");
  loader->add_option("--data", lo->data, "CIFAR-10 binary folder (default: 50,000 random images in memory)");
  loader->add_flag("--no-augment", *no_augment, "Without the random crop and flip");

  return {{comm,
           [co] {
             trainer::comm::world();
             return trainer::comm::run_comm_bench(co->n, co->steps, co->bucket_mb);
           }},
          {outer,
           [oo] {
             trainer::comm::world();
             return trainer::comm::run_outer_bench(oo->n, oo->steps);
           }},
          {sync,
           [so, sync_no_torch] {
             if (!*sync_no_torch) so->torch_script = trainer::app::bench_script("bench_torch_powersgd.py");
             if (so->device != "cpu") {
               trainer::Config runtime;
               runtime.runtime.device = so->device;
               so->backend = &trainer::app::device_backend(runtime, trainer::comm::world().local_rank());
               if (!*sync_no_torch) so->torch_sparse_script = trainer::app::bench_script("bench_torch_sparse.py");
             }
             return trainer::comm::run_sync_bench(*so);
           }},
          {loader,
           [lo, no_augment] {
             lo->augment = !*no_augment;
             return trainer::app::run_loader_bench(*lo);
           }},
          {bench, [bo, no_torch] {
             bo->torch = !*no_torch;
             return trainer::app::run_bench(*bo);
           }}};
}

Tool add_report(CLI::App& app, const char* program) {
  auto* cmd = app.add_subcommand("report", "Write RUN_DIR/report/report.md and figures from a run's logs");
  auto o = std::make_shared<trainer::app::ReportOptions>();
  cmd->add_option("runs", o->runs, "Run folders: the first is reported in full, the others compared with it")
      ->required();
  cmd->add_option("--out", o->out, "Report folder (default: RUN_DIR/report)");
  cmd->add_flag("--seed-check", o->seed_check, "Check the published AN4 Ok-Top-k analyses' counts");
  cmd->add_option("--latency", o->latency,
                  "Per-message latency of the scalability view (E(P) against bandwidth, trainer whatif; default 50us)");
  cmd->add_option("--calibration", o->calibration,
                  "A trainer calibrate file: the scalability view adds the step predicted at its measured rates");
  return {cmd, [o, program] { return trainer::app::run_report(*o, program); }};
}

Tool add_whatif(CLI::App& app) {
  auto* cmd = app.add_subcommand("whatif", "Predict a finished run's step time on another network and rank count");
  struct Options {
    std::string dir, bandwidth, latency, calibration;
    int ranks = 0;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("RUN_DIR", o->dir, "Output folder of a run with comm.log = true")->required();
  cmd->add_option("--bandwidth", o->bandwidth,
                  "Nominal link bandwidth per rank: 100mbit, 1gbit, 10gbit, 1.25GB/s (or --calibration)");
  cmd->add_option("--latency", o->latency, "Nominal latency per message: 0.1ms, 50us (default 0)");
  cmd->add_option("--calibration", o->calibration,
                  "Rates measured by trainer calibrate (FILE.json) instead of --bandwidth/--latency");
  cmd->add_option("--ranks", o->ranks, "Ranks (default: the run's)")->check(CLI::PositiveNumber);
  cmd->add_flag("--json", o->json, "One JSON object instead of the table");
  return {cmd, [o] {
            const trainer::app::RunMeasurement run = trainer::app::measure_run(o->dir);
            const int ranks = o->ranks > 0 ? o->ranks : run.ranks;
            const trainer::app::WhatifNetwork network =
                trainer::app::whatif_network(o->bandwidth, o->latency, o->calibration, ranks);
            const auto predictions = trainer::app::predict(run, network.rates, ranks);
            std::fputs((o->json ? trainer::app::whatif_json(run, predictions, network, ranks)
                                : trainer::app::whatif_report(run, predictions, network, ranks))
                           .c_str(),
                       stdout);
            return 0;
          }};
}

Tool add_calibrate(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "calibrate", "Measure this job's achieved network latency and rates for trainer whatif (run under mpiexec)");
  auto o = std::make_shared<trainer::comm::CalibrateOptions>();
  cmd->add_option("--out", o->out, "The calibration file to write (JSON)")->required();
  cmd->add_option("--min-bytes", o->min_bytes, "Smallest message (default 256)");
  cmd->add_option("--max-bytes", o->max_bytes, "Largest message (default 64 MiB)");
  cmd->add_option("--size-factor", o->size_factor, "Ratio of one size to the next (default 4)");
  cmd->add_option("--repeats", o->repeats, "Timed samples per size; the median is fitted (default 5)");
  cmd->add_option("--max-call-seconds", o->max_call_seconds,
                  "Stop growing sizes after the first whose call takes longer (default 0.25)");
  cmd->add_option("--nominal", o->nominal,
                  "The link's nominal rate (100mbit, 1gbit), recorded to compare with what is achieved");
  return {cmd, [o] { return trainer::comm::run_calibrate(*o); }};
}

// The main job: every rank of the job. An error on any rank prints one line and ends the whole job
// (MPI_Abort), so no rank is left waiting in a collective.
int train(const std::string& config_path, const std::vector<std::string>& overrides, bool dry_run,
          trainer::app::RunOptions run_options, const std::string& inject_failure) {
  // The config first: it decides MPI's thread level, which MPI_Init (in world()) fixes.
  trainer::Config config;
  std::string config_error;
  try {
    config = trainer::load_config(config_path, overrides);
  } catch (const std::exception& e) {
    config_error = e.what();
  }
  if (config_error.empty() && trainer::app::needs_concurrent_calls(config)) trainer::comm::request_concurrent_calls();
  trainer::comm::Communicator& comm = trainer::comm::world();
  if (!config_error.empty()) {  // every rank reads the same file: one message is enough
    if (comm.rank() == 0) std::fprintf(stderr, "error: %s\n", config_error.c_str());
    return 1;
  }
  try {
    if (dry_run) {
      trainer::app::print_dry_run(config, comm);
      return 0;
    }
    if (!inject_failure.empty()) {
      const auto colon = inject_failure.find(':');
      run_options.fail_rank = std::stoi(inject_failure.substr(0, colon));
      run_options.fail_step = std::stoll(inject_failure.substr(colon + 1));
    }
    const trainer::app::RunSummary summary = trainer::app::run_training(config, run_options, comm);
    return summary.stop_signal ? trainer::app::stop_exit_status(summary.stop_signal) : 0;
  } catch (const trainer::app::AgreedError& e) {  // every rank has the same one: no abort needed
    std::fflush(stdout);
    if (comm.rank() == 0) std::fprintf(stderr, "\nerror: %s\n", e.what());
    return e.exit_status;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    if (comm.size() > 1) {
      std::fprintf(stderr, "\nerror (rank %d of %d): %s\n", comm.rank(), comm.size(), e.what());
      std::fflush(stderr);
      comm.abort(1);
    }
    std::fprintf(stderr, "\nerror: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Large buffers from the heap, never from fresh mmap'ed pages that are returned on free: Open MPI
  // allocates a message-sized temporary per large allreduce, and glibc's default (mmap above 32 MB)
  // made every dense step of the 110 MB LSTM gradient page-fault 110 MB anew (comm bench).
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  CLI::App app{"trainer: deep-learning training with compressed data parallelism"};
  std::string config_path, resume, inject_failure;
  std::vector<std::string> overrides;
  bool dry_run = false, reference = false;
  app.add_option("--config", config_path, "TOML experiment file");
  app.add_option("--set", overrides, "Override a key: --set optim.lr=0.05 (repeatable)");
  app.add_option("--resume", resume, "Continue from a checkpoint folder, or 'latest' in the output folder");
  app.add_flag("--dry-run", dry_run, "Validate, print the resolved config, model and plan, and exit");
  // Hidden testing hooks (no group: not shown in --help).
  trainer::app::RunOptions run_options;
  app.add_option("--stop-after", run_options.stop_after)->group("");
  app.add_option("--inject-failure", inject_failure, "RANK:STEP")->group("");
  app.add_flag("--config-reference", reference, "Print the reference of every config key (Markdown)");

  std::vector<Tool> tools{add_make_cifar(app)};
  for (Tool& t : add_bench(app)) tools.push_back(std::move(t));
  tools.push_back(add_calibrate(app));
  tools.push_back(add_report(app, argv[0]));
  tools.push_back(add_whatif(app));

  CLI11_PARSE(app, argc, argv);
  try {
    if (reference) {
      std::fputs(trainer::config_reference_markdown().c_str(), stdout);
      return 0;
    }
    for (const Tool& t : tools)
      if (t.command->parsed()) return t.run();
    if (config_path.empty()) {
      std::fprintf(stderr, "error: --config FILE.toml is required (see --help)\n");
      return 2;
    }
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "\nerror: %s\n", e.what());
    return 1;
  }
  run_options.resume = resume;
  return train(config_path, overrides, dry_run, run_options, inject_failure);
}
