// A small model's named tensors (a convolution and a linear layer, 596 parameters in all) for the
// sync-method tests that need views but no model: fragments, buckets and per-tensor rules.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "models/parameters.h"

namespace trainer::testing {

inline std::vector<models::ParamView> tiny_views() {
  std::vector<models::ParamView> views;
  int64_t offset = 0;
  for (const auto& [name, shape] : std::vector<std::pair<std::string, models::Shape>>{
           {"conv.weight", {8, 3, 3, 3}}, {"conv.bias", {8}}, {"fc.weight", {12, 30}}, {"fc.bias", {12}}}) {
    views.push_back({name, offset, shape});
    offset += views.back().numel();
  }
  return views;
}

}  // namespace trainer::testing
