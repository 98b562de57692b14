#include "trainer/tasks/image_task.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "data/synthetic_cifar.h"
#include "trainer/agreed_error.h"

namespace trainer::app {
namespace fs = std::filesystem;

namespace {

bool dataset_present(const std::string& root) {
  for (bool train : {true, false})
    for (const auto& f : data::cifar10_files(root, train))
      if (!fs::exists(f)) return false;
  return true;
}

}  // namespace

std::unique_ptr<models::ImageClassifier> ImageTask::build_model(const Config& c, models::Backend& backend) {
  return models::make_image_model({c.model.arch, c.model.num_classes, static_cast<float>(c.model.label_smoothing),
                                   c.model.freeze_batchnorm},
                                  backend, static_cast<uint64_t>(c.experiment.seed));
}

ImageTask::ImageTask(const Config& config, comm::Communicator& comm,
                     const std::function<void(const std::string&)>& announce, models::Backend& backend)
    : data_(config.data), device_batch_(backend) {
  const DataConfig& d = config.data;
  if (d.synthesize_if_missing) {
    const data::SyntheticVariant variant = *data::parse_synthetic_variant(d.synthetic_variant);  // validated
    if (!dataset_present(d.root)) {
      if (comm.rank() == 0) {
        announce("data: generating the " + d.synthetic_variant + " synthetic CIFAR-10-format dataset in " +
                 d.root + " (" + std::to_string(d.synthetic_train_size) + " train, " +
                 std::to_string(d.synthetic_test_size) + " test images)");
        data::write_synthetic_cifar10(d.root, d.synthetic_train_size, d.synthetic_test_size,
                                      static_cast<uint64_t>(d.synthetic_seed), variant);
      }
      comm.barrier("BARRIER_SETUP");
    }
    // An easy corpus must never stand in for a hard one, nor the other way round. Every rank reads
    // the same README, so all stop alike.
    std::optional<data::SyntheticVariant> found = data::synthetic_variant_in(d.root);
    if (found && *found != variant) {
      throw AgreedError("data.root = " + d.root + " holds the " + data::synthetic_variant_name(*found) +
                            " synthetic dataset, but data.synthetic_variant = " + d.synthetic_variant +
                            ": point data.root at another folder (or delete this one)",
                        1);
    }
  }
  train_set_ = data::read_cifar10(d.root, true);
  test_set_ = data::read_cifar10(d.root, false);
  norm_ = data::channel_stats(train_set_);
  model_ = build_model(config, backend);
  data::LoaderOptions lo;
  lo.batch_size = d.batch_size;
  lo.global_batch = d.global_batch;
  lo.shuffle = true;
  lo.augment = d.augment;
  lo.drop_last = true;
  lo.seed = static_cast<uint64_t>(config.experiment.seed);
  lo.rank = comm.rank();
  lo.world = comm.size();
  lo.threads = static_cast<int>(d.loader_threads);
  loader_ = std::make_unique<data::ImageLoader>(train_set_, norm_, lo);
  if (const char* folder = std::getenv("TRAINER_TEST_SAMPLE_LOG"))
    sample_log_ = std::make_unique<std::ofstream>(std::string(folder) + "/rank" + std::to_string(comm.rank()) + ".samples",
                                                  std::ios::app);
}

void ImageTask::load_batch() {
  batch_ = loader_->next();
  if (!sample_log_) return;
  *sample_log_ << batch_.epoch << ' ' << batch_.index;
  for (int64_t i : batch_.indices) *sample_log_ << ' ' << i;
  *sample_log_ << std::endl;
}

StepResult ImageTask::forward_backward() {
  StepResult r;
  r.samples = batch_.size;
  device_batch_.upload(batch_.images.data(), static_cast<int64_t>(batch_.images.size()), batch_.labels.data(),
                       batch_.size);
  r.loss = model_->forward(models::Tensor{const_cast<float*>(device_batch_.images()), {batch_.size, 3, 32, 32}},
                           device_batch_.labels(), models::Mode::kTrain, &r.correct);
  model_->backward();
  return r;
}

bool ImageTask::static_shapes() {
  device_batch_.pin();
  return true;
}

void ImageTask::stage_batch() {
  device_batch_.stage(batch_.images.data(), static_cast<int64_t>(batch_.images.size()), batch_.labels.data(),
                      batch_.size);
}

nlohmann::json ImageTask::evaluate(comm::Communicator& comm) {
  data::LoaderOptions opts;
  opts.batch_size = data_.eval_batch_size;
  opts.shuffle = false;
  opts.augment = false;
  opts.drop_last = false;
  opts.rank = comm.rank();
  opts.world = comm.size();
  opts.threads = static_cast<int>(data_.loader_threads);
  data::ImageLoader loader(test_set_, norm_, opts);
  // {loss sum, correct, samples}, summed over ranks in one small allreduce.
  double totals[3] = {0, 0, 0};
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    data::Batch batch = loader.next();
    if (batch.size == 0) continue;  // a rank's share of the last, partial batch can be empty
    int64_t hits = 0;
    device_batch_.upload(batch.images.data(), static_cast<int64_t>(batch.images.size()), batch.labels.data(),
                         batch.size);
    const double loss =
        model_->forward(models::Tensor{const_cast<float*>(device_batch_.images()), {batch.size, 3, 32, 32}},
                        device_batch_.labels(), models::Mode::kEval, &hits);
    totals[0] += loss * batch.size;
    totals[1] += static_cast<double>(hits);
    totals[2] += static_cast<double>(batch.size);
  }
  comm.allreduce(totals, 3, comm::DType::kF64, comm::ReduceOp::kSum, "ALLREDUCE_EVAL");
  const double n = totals[2];
  return {{"split", "test"}, {"loss", n ? totals[0] / n : 0.0}, {"accuracy", n ? totals[1] / n : 0.0},
          {"samples", static_cast<int64_t>(n)}};
}

std::string ImageTask::describe_eval(const nlohmann::json& r) const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "test loss %.4f, accuracy %.2f%% (%lld images)", r["loss"].get<double>(),
                100 * r["accuracy"].get<double>(), static_cast<long long>(r["samples"].get<int64_t>()));
  return buf;
}

}  // namespace trainer::app
