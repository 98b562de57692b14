#include "trainer/task.h"

#include "trainer/image_task.h"

namespace trainer::app {

// The one place that maps a config to a task.
std::unique_ptr<Task> make_task(const Config& config, comm::Communicator& comm,
                                const std::function<void(const std::string&)>& announce) {
  return std::make_unique<ImageTask>(config, comm, announce);
}

int64_t model_parameter_count(const Config& config, size_t* tensors) {
  auto model = ImageTask::build_model(config);
  if (tensors) *tensors = model->parameters().views().size();
  return model->parameters().size();
}

}  // namespace trainer::app
