// Image classification on CIFAR-10-format data (ResNets, VGG-16).
#pragma once

#include <fstream>
#include <memory>

#include "data/cifar.h"
#include "data/loader.h"
#include "models/model.h"
#include "trainer/step/device_batch.h"
#include "trainer/tasks/task.h"

namespace trainer::app {

class ImageTask final : public Task {
 public:
  ImageTask(const Config& config, comm::Communicator& comm, const std::function<void(const std::string&)>& announce,
            models::Backend& backend);
  models::ParameterStore& parameters() override { return model_->parameters(); }
  models::ParameterStore& buffers() override { return model_->buffers(); }
  int64_t train_examples() const override { return train_set_.size(); }
  int64_t steps_per_epoch() const override { return loader_->batches_per_epoch(); }
  void seek(int64_t epoch, int64_t batch_in_epoch) override { loader_->seek(epoch, batch_in_epoch); }
  void load_batch() override;
  StepResult forward_backward() override;
  // CIFAR batches are all data.batch_size images of 3 x 32 x 32 (drop_last).
  bool static_shapes() override;
  void stage_batch() override;
  void set_gradient_ready(std::function<void(int64_t)> ready) override {
    model_->set_gradient_ready(std::move(ready));
  }
  nlohmann::json evaluate(comm::Communicator& comm) override;
  std::string describe_eval(const nlohmann::json& record) const override;
  bool classifies() const override { return true; }

  static std::unique_ptr<models::ImageClassifier> build_model(const Config& config, models::Backend& backend);

 private:
  DataConfig data_;
  data::ImageSet train_set_, test_set_;
  data::Normalization norm_{};
  std::unique_ptr<models::ImageClassifier> model_;
  std::unique_ptr<data::ImageLoader> loader_;
  data::Batch batch_;
  DeviceBatch device_batch_;  // batch_ where the model reads it (the host arrays on the CPU)
  // Test hook: TRAINER_TEST_SAMPLE_LOG=FOLDER appends "epoch batch index..." per training batch to
  // FOLDER/rank<R>.samples (the elastic-resume tests check which samples an epoch used).
  std::unique_ptr<std::ofstream> sample_log_;
};

}  // namespace trainer::app
