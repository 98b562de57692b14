#include "trainer/tasks/task.h"

#include <algorithm>
#include <stdexcept>

#include "trainer/tasks/image_task.h"
#include "trainer/tasks/speech_task.h"

namespace trainer::app {
namespace {

bool is_speech(const Config& config) {
  const auto& names = models::speech_model_names();
  return std::find(names.begin(), names.end(), config.model.arch) != names.end();
}

// Image models read CIFAR-format data and speech models AN4: a mismatch is a config error.
void check_pairing(const Config& config) {
  const bool speech_data = config.data.dataset == "an4";
  if (is_speech(config) != speech_data)
    throw std::invalid_argument("model.arch = \"" + config.model.arch + "\" cannot train on data.dataset = \"" +
                                config.data.dataset + "\" (" + (is_speech(config) ? "use an4" : "use cifar10") +
                                ")");
}

}  // namespace

// The one place that maps a config to a task.
std::unique_ptr<Task> make_task(const Config& config, comm::Communicator& comm,
                                const std::function<void(const std::string&)>& announce, models::Backend& backend) {
  check_pairing(config);
  if (is_speech(config)) return std::make_unique<SpeechTask>(config, comm, announce, backend);
  return std::make_unique<ImageTask>(config, comm, announce, backend);
}

ModelStores build_model_stores(const Config& config, models::Backend& backend) {
  check_pairing(config);
  ModelStores m;
  if (is_speech(config)) {
    std::shared_ptr<models::SpeechModel> model = SpeechTask::build_model(config, backend);
    m.params = &model->parameters();
    m.buffers = &model->buffers();
    m.model = model;
  } else {
    std::shared_ptr<models::ImageClassifier> model = ImageTask::build_model(config, backend);
    m.params = &model->parameters();
    m.buffers = &model->buffers();
    m.model = model;
  }
  return m;
}

int64_t model_parameter_count(const Config& config, std::vector<models::ParamView>* views) {
  check_pairing(config);
  // The layout does not depend on the device: a host build counts, also where the device is absent.
  models::Backend& host = models::cpu_backend();
  if (is_speech(config)) {
    auto model = SpeechTask::build_model(config, host);
    if (views) *views = model->parameters().views();
    return model->parameters().size();
  }
  auto model = ImageTask::build_model(config, host);
  if (views) *views = model->parameters().views();
  return model->parameters().size();
}

}  // namespace trainer::app
