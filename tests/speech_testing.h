// Helpers shared by the speech model tests: a batch of random features that owns its arrays, Adam
// on a model's flat buffers (the tests stand alone, without optim/), and a finite-difference check
// of a whole model's loss against its backward.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "gradcheck.h"
#include "models/nets/las.h"
#include "models/speech_model.h"

namespace trainer::testing {

// Random features with the given frame counts (zero padded, as the loader pads) and labels.
struct SpeechTestBatch {
  std::vector<float> features;
  std::vector<int32_t> frames, labels, label_lengths;
  int64_t max_frames = 0, feature_dim = 0;

  SpeechTestBatch(int64_t dim, std::vector<int32_t> frame_counts, const std::vector<std::vector<int32_t>>& targets,
                  uint64_t seed)
      : frames(std::move(frame_counts)), feature_dim(dim) {
    max_frames = *std::max_element(frames.begin(), frames.end());
    features = random_vector(static_cast<int64_t>(frames.size()) * max_frames * dim, seed);
    for (size_t n = 0; n < frames.size(); ++n)
      for (int64_t t = frames[n]; t < max_frames; ++t)
        std::fill_n(features.begin() + (n * max_frames + t) * dim, dim, 0.f);
    for (const auto& t : targets) {
      labels.insert(labels.end(), t.begin(), t.end());
      label_lengths.push_back(static_cast<int32_t>(t.size()));
    }
  }
  models::SpeechInput input() const {
    return {features.data(), static_cast<int64_t>(frames.size()), max_frames, feature_dim, frames.data(),
            labels.data(), label_lengths.data()};
  }
};

// A tiny LAS: the sizes of scripts/make_las_fixtures.py (TINY), label smoothing 0.1.
inline models::LasOptions tiny_las_options() {
  models::LasOptions o;
  o.feature_dim = 6;
  o.listener_hidden = 4;
  o.pyramid_layers = 2;
  o.attention_dim = 5;
  o.embedding_dim = 3;
  o.speller_hidden = 7;
  o.speller_layers = 2;
  o.label_smoothing = 0.1;
  return o;
}

// Overlap's contract (SpeechModel::set_gradient_ready): a report of `from` says the gradient
// entries [from, n) are final, so they must hold then what they hold when backward returns. The
// model first takes a step on `before` (so every gradient holds something else), then on `in` with
// reports recorded. The reports must descend to 0, and there must be at least `min_reports` of
// them (one report at the end would overlap nothing).
inline void check_gradient_reports(models::SpeechModel& model, const models::SpeechInput& before,
                                   const models::SpeechInput& in, size_t min_reports) {
  models::ParameterStore& p = model.parameters();
  const int64_t n = p.size();
  model.forward(before, models::Mode::kTrain);
  model.backward();
  std::vector<std::pair<int64_t, std::vector<float>>> reports;
  model.set_gradient_ready([&](int64_t from) { reports.emplace_back(from, std::vector<float>(p.grads() + from, p.grads() + n)); });
  model.forward(in, models::Mode::kTrain);
  model.backward();
  model.set_gradient_ready(nullptr);
  REQUIRE(reports.size() >= min_reports);
  CHECK(reports.back().first == 0);
  for (size_t r = 0; r < reports.size(); ++r) {
    const auto& [from, seen] = reports[r];
    INFO("report " << r << ": from " << from);
    if (r > 0) CHECK(from < reports[r - 1].first);
    const bool final_then = std::equal(seen.begin(), seen.end(), p.grads() + from);
    CHECK(final_then);
  }
}

class Adam {
 public:
  explicit Adam(double lr) : lr_(lr) {}
  void step(models::ParameterStore& p) {
    if (m_.empty()) m_.assign(p.size(), 0.0), v_.assign(p.size(), 0.0);
    ++t_;
    const double b1 = 0.9, b2 = 0.999, c1 = 1 - std::pow(b1, t_), c2 = 1 - std::pow(b2, t_);
    for (int64_t i = 0; i < p.size(); ++i) {
      const double g = p.grads()[i];
      m_[i] = b1 * m_[i] + (1 - b1) * g;
      v_[i] = b2 * v_[i] + (1 - b2) * g * g;
      p.values()[i] -= static_cast<float>(lr_ * (m_[i] / c1) / (std::sqrt(v_[i] / c2) + 1e-8));
    }
  }

 private:
  double lr_;
  int t_ = 0;
  std::vector<double> m_, v_;
};

// Adam on the model's training loss until it is below `target` (checked before each update), at
// most `max_steps` forwards; the test fails if the target is not reached.
inline void train_until(models::SpeechModel& model, const models::SpeechInput& input, double lr, double target,
                        int max_steps) {
  Adam adam(lr);
  double loss = 0;
  int step = 0;
  for (step = 1; step <= max_steps; ++step) {
    loss = model.forward(input, models::Mode::kTrain);
    if (loss < target) break;
    model.backward();
    adam.step(model.parameters());
  }
  INFO("loss " << loss << " after " << step << " steps");
  CHECK(loss < target);
}

// Central differences of the model's training loss (float32 network, loss accumulated in double)
// against backward(), on up to `per_tensor` elements of every parameter tensor. A point where the
// one-sided slopes disagree has a kink (Hardtanh, ReLU) inside [-h, h] and is skipped; at most 10%
// may be.
inline void check_model_gradients(models::SpeechModel& model, const models::SpeechInput& input, double h = 1e-2,
                                  int per_tensor = 6, double atol = 2e-3, double rtol = 2e-2) {
  using models::Mode;
  model.forward(input, Mode::kTrain);
  model.backward();
  models::ParameterStore& p = model.parameters();
  std::vector<float> analytic(p.grads(), p.grads() + p.size());
  int64_t checked = 0, kinks = 0;
  for (const auto& v : p.views()) {
    const int64_t step = std::max<int64_t>(1, v.numel() / per_tensor);
    for (int64_t i = 0; i < v.numel(); i += step) {
      float& w = p.values()[v.offset + i];
      const float saved = w;
      const double center = model.forward(input, Mode::kTrain);
      w = static_cast<float>(saved + h);
      const double plus = model.forward(input, Mode::kTrain);
      w = static_cast<float>(saved - h);
      const double minus = model.forward(input, Mode::kTrain);
      w = saved;
      const double numeric = (plus - minus) / (2 * h);
      ++checked;
      if (std::fabs((plus - center) - (center - minus)) / h > 0.1 * (std::fabs(numeric) + 0.1)) {
        ++kinks;
        continue;
      }
      INFO(v.name << "[" << i << "]: analytic " << analytic[v.offset + i] << " numeric " << numeric);
      CHECK(std::fabs(analytic[v.offset + i] - numeric) <= atol + rtol * std::fabs(numeric));
    }
  }
  INFO(kinks << " of " << checked << " skipped at kinks");
  CHECK(kinks * 10 <= checked);
}

}  // namespace trainer::testing
