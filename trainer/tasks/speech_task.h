// Speech recognition on AN4-layout corpora (DeepSpeech LSTM-CTC; Listen-Attend-Spell).
#pragma once

#include "data/an4.h"
#include "data/speech_loader.h"
#include "models/speech_model.h"
#include "trainer/step/device_batch.h"
#include "trainer/tasks/task.h"

namespace trainer::app {

class SpeechTask final : public Task {
 public:
  SpeechTask(const Config& config, comm::Communicator& comm, const std::function<void(const std::string&)>& announce,
             models::Backend& backend);
  models::ParameterStore& parameters() override { return model_->parameters(); }
  models::ParameterStore& buffers() override { return model_->buffers(); }
  int64_t train_examples() const override { return train_set_.size(); }
  int64_t steps_per_epoch() const override { return loader_->batches_per_epoch(); }
  void seek(int64_t epoch, int64_t batch_in_epoch) override { loader_->seek(epoch, batch_in_epoch); }
  void load_batch() override { batch_ = loader_->next(); }
  StepResult forward_backward() override;
  void set_gradient_ready(std::function<void(int64_t)> ready) override {
    model_->set_gradient_ready(std::move(ready));
  }
  nlohmann::json evaluate(comm::Communicator& comm) override;
  std::string describe_eval(const nlohmann::json& record) const override;
  bool classifies() const override { return false; }

  static std::unique_ptr<models::SpeechModel> build_model(const Config& config, models::Backend& backend);

 private:
  Config config_;
  uint64_t rank_;
  data::SpeechSet train_set_, test_set_;
  std::unique_ptr<models::SpeechModel> model_;
  std::unique_ptr<data::SpeechLoader> loader_;
  data::SpeechBatch batch_;
  DeviceCopy<float> features_;  // a batch's features where the model reads them (the host array on the CPU)
};

}  // namespace trainer::app
