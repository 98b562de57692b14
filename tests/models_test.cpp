// Model construction: exact parameter counts of the papers' architectures, naming, determinism.
#include <catch2/catch.hpp>

#include <cstring>

#include "models/model.h"

using namespace trainer::models;

TEST_CASE("Parameter counts match the papers' models", "[models]") {
  const std::pair<const char*, int64_t> expected[] = {
      {"resnet20", 269722}, {"resnet32", 464154}, {"resnet56", 853018},
      {"resnet18", 11173962}, {"vgg16", 14728266}};
  for (const auto& [arch, count] : expected) {
    auto model = make_image_model({arch, 10, 0.f}, cpu_backend(), 0);
    INFO(arch);
    CHECK(model->parameters().size() == count);
  }
}

TEST_CASE("ResNet-20 uses PyTorch's state_dict names", "[models]") {
  auto model = make_image_model({"resnet20", 10, 0.f}, cpu_backend(), 0);
  const auto& p = model->parameters();
  CHECK(p.find("conv1.weight") == 0);
  CHECK(p.find("layer2.0.bn1.bias") >= 0);
  CHECK(p.find("linear.weight") >= 0);
  CHECK(model->buffers().find("layer3.2.bn2.running_var") >= 0);
}

TEST_CASE("Initialization is deterministic in the seed", "[models]") {
  auto a = make_image_model({"resnet20", 10, 0.f}, cpu_backend(), 7);
  auto b = make_image_model({"resnet20", 10, 0.f}, cpu_backend(), 7);
  auto c = make_image_model({"resnet20", 10, 0.f}, cpu_backend(), 8);
  const size_t bytes = sizeof(float) * a->parameters().size();
  CHECK(std::memcmp(a->parameters().values(), b->parameters().values(), bytes) == 0);
  CHECK(std::memcmp(a->parameters().values(), c->parameters().values(), bytes) != 0);
}

TEST_CASE("A forward/backward step runs at batch 8 and gives finite loss near log(10)", "[models]") {
  for (const char* arch : {"resnet20", "resnet18", "vgg16"}) {
    INFO(arch);
    auto model = make_image_model({arch, 10, 0.f}, cpu_backend(), 1);
    std::vector<float> x(8 * 32 * 32 * 3);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 1000) / 500.f - 1.f;
    std::vector<int32_t> labels{0, 1, 2, 3, 4, 5, 6, 7};
    const double loss = model->forward(Tensor{x.data(), {8, 3, 32, 32}}, labels.data(), Mode::kTrain);
    CHECK(std::isfinite(loss));
    CHECK(loss > 1.0);
    CHECK(loss < 6.0);
    model->backward();
    double norm = 0;
    for (int64_t i = 0; i < model->parameters().size(); ++i)
      norm += double(model->parameters().grads()[i]) * model->parameters().grads()[i];
    CHECK(norm > 0);
    CHECK(std::isfinite(norm));
  }
}
