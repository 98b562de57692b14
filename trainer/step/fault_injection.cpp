#include "trainer/step/fault_injection.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

namespace trainer::app {
namespace {

std::set<std::pair<int, int64_t>> nan_injections() {
  std::set<std::pair<int, int64_t>> at;
  const char* env = std::getenv("TRAINER_TEST_INJECT_NAN");
  if (!env) return at;
  std::istringstream in(env);
  std::string item;
  while (std::getline(in, item, ',')) {
    int rank = -1;
    long long step = -1;
    char extra = 0;
    if (std::sscanf(item.c_str(), "%d:%lld%c", &rank, &step, &extra) != 2 || rank < 0 || step < 0)
      throw std::runtime_error("TRAINER_TEST_INJECT_NAN: expected RANK:STEP[,RANK:STEP]..., got '" +
                               std::string(env) + "'");
    at.insert({rank, step});
  }
  return at;
}

}  // namespace

FaultInjection::FaultInjection(int rank, int fail_rank, int64_t fail_step)
    : rank_(rank), fail_rank_(fail_rank), fail_step_(fail_step), nans_(nan_injections()) {}

void FaultInjection::step_starts(int64_t step) const {
  if (rank_ == fail_rank_ && step == fail_step_)
    throw std::runtime_error("injected failure at step " + std::to_string(step) + " (--inject-failure)");
}

void FaultInjection::gradient_final(int64_t final_from, models::ParameterStore& params, models::Backend& backend) {
  if (!armed_ || final_from > params.views().back().offset) return;
  backend.fill(1, std::nanf(""), params.grads() + params.views().back().offset);
  armed_ = false;
}

}  // namespace trainer::app
