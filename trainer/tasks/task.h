// What the training loop needs from a model and its data, whatever the modality: image
// classification (CIFAR) here, speech recognition (AN4) next. The loop (worker.cpp) sees flat
// parameter buffers, a batch to load, a forward/backward, and an evaluation that returns the
// records metrics.jsonl keeps.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "models/backend.h"
#include "models/parameters.h"
#include "trainer/config/config.h"

namespace trainer::app {

struct StepResult {
  double loss = 0;      // mean over the batch
  int64_t samples = 0;  // examples in the batch
  int64_t correct = 0;  // classification: right argmaxes (0 where it means nothing)
};

class Task {
 public:
  virtual ~Task() = default;
  virtual models::ParameterStore& parameters() = 0;
  virtual models::ParameterStore& buffers() = 0;
  virtual int64_t train_examples() const = 0;
  // Batches per epoch on each rank (all ranks take the same number of steps).
  virtual int64_t steps_per_epoch() const = 0;
  // The next training batch comes from this position (checkpoint resume).
  virtual void seek(int64_t epoch, int64_t batch_in_epoch) = 0;
  // Takes the next training batch (waiting for the loader's background threads if needed).
  virtual void load_batch() = 0;
  // Forward and backward on the loaded batch; the gradient lands in parameters().grads().
  virtual StepResult forward_backward() = 0;
  // runtime.cuda_graph (trainer/step/step_graph.h): whether every training step has the same shapes, so
  // that one recorded step can be replayed; a task that says yes uploads its batches from pinned
  // memory from then on (a recorded upload must read such memory).
  virtual bool static_shapes() { return false; }
  // A replayed step's host half: the loaded batch into the pinned memory its recorded upload reads.
  virtual void stage_batch() {}
  // Called during backward with the offset from which the flat gradient is final (sync.overlap);
  // every model reports its layers as backward finishes them.
  virtual void set_gradient_ready(std::function<void(int64_t)> ready) = 0;
  // The whole held-out split, shared among the ranks; every rank returns the same record
  // ({"loss", "accuracy"} for images, {"loss", "cer", "wer"} for speech) ...
  virtual nlohmann::json evaluate(comm::Communicator& comm) = 0;
  // ... and its one-line human form.
  virtual std::string describe_eval(const nlohmann::json& record) const = 0;
  // True when StepResult::correct means something (metrics then report train_accuracy).
  virtual bool classifies() const = 0;
};

// The task the config asks for (by model.arch / data.dataset). Generates the synthetic dataset
// first when the config says so (rank 0 writes, the others wait). `announce` gets progress lines.
// The model lives on `backend`.
std::unique_ptr<Task> make_task(const Config& config, comm::Communicator& comm,
                                const std::function<void(const std::string&)>& announce, models::Backend& backend);

// The model alone, without data: what a parameter server holds (sync.method = "async_ps"). The
// stores belong to `model`, live on `backend` and are initialized exactly as a Task's (the same seed).
struct ModelStores {
  std::shared_ptr<void> model;
  models::ParameterStore* params = nullptr;
  models::ParameterStore* buffers = nullptr;
};
ModelStores build_model_stores(const Config& config, models::Backend& backend);

// The model's parameter store layout alone (no data), for --dry-run: count and named tensors.
int64_t model_parameter_count(const Config& config, std::vector<models::ParamView>* views = nullptr);

}  // namespace trainer::app
