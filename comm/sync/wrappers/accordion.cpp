#include "comm/sync/wrappers/accordion.h"

#include <cmath>
#include <istream>
#include <ostream>
#include <stdexcept>

#include "comm/sync/sync_state.h"

namespace trainer::comm {

Accordion::Accordion(int64_t n, std::vector<AccordionGroup> groups, const AccordionOptions& options)
    : n_(n),
      groups_(std::move(groups)),
      options_(options),
      low_(groups_.size(), 1),  // training starts critical
      previous_(groups_.size(), 0.0),
      change_(groups_.size(), -1.0) {
  if (options_.interval < 0) throw std::invalid_argument("adaptive_interval must be at least 0");
  if (!(options_.threshold > 0)) throw std::invalid_argument("adaptive_threshold must be above 0");
  for (const AccordionGroup& g : groups_)
    if (g.offset < 0 || g.count < 0 || g.offset + g.count > n_)
      throw std::invalid_argument("adaptive: a group of entries outside the gradient");
}

bool Accordion::critical(bool has_previous, double previous_norm, double norm, double threshold) {
  if (!has_previous) return true;
  if (!(previous_norm > 0)) return true;  // the paper's code: a zero previous norm counts as a large change
  return std::fabs(previous_norm - norm) / previous_norm >= threshold;
}

double Accordion::low_fraction() const {
  double low = 0, all = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    all += static_cast<double>(groups_[g].count);
    if (low_[g]) low += static_cast<double>(groups_[g].count);
  }
  return all > 0 ? low / all : 0.0;
}

bool Accordion::add(const float* grads, int64_t step) {
  if (options_.interval < 1)
    throw std::logic_error("adaptive_interval = 0 means an epoch, and the method was built without the "
                           "run's steps per epoch: set adaptive_interval");
  fresh_ = false;
  if (sum_.empty()) sum_.assign(n_, 0.f);
  float* sum = sum_.data();
  // Element-wise in a fixed order: the same bits on every rank and on both sides of a resume.
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n_; ++i) sum[i] += grads[i];
  ++summed_;
  if ((step + 1) % options_.interval != 0) return false;
  const std::vector<uint8_t> before = low_;
  decide(step);
  fresh_ = before != low_;
  switches_ += fresh_;
  return fresh_;
}

void Accordion::decide(int64_t step) {
  // An interval the method did not run through (it began in the dense warmup) is no measurement: its
  // sum covers fewer steps than the next one's. It stays critical, as the start does.
  if (summed_ < options_.interval) {
    summed_ = 0;
    std::fill(sum_.begin(), sum_.end(), 0.f);
    return;
  }
  summed_ = 0;
  std::vector<double> norms(groups_.size(), 0.0);
  for (size_t g = 0; g < groups_.size(); ++g) {
    double s = 0;  // serial, in double: the same bits everywhere
    for (int64_t i = groups_[g].offset; i < groups_[g].offset + groups_[g].count; ++i)
      s += static_cast<double>(sum_[i]) * sum_[i];
    norms[g] = std::sqrt(s);
  }
  // The paper's second rule: the interval after a learning-rate decay is critical, whatever the norms.
  const int64_t begin = step + 1 - options_.interval, next = step + 1;
  bool decayed = false;
  for (int64_t d : options_.lr_decay_steps) decayed |= d > begin && d <= next;
  for (size_t g = 0; g < groups_.size(); ++g) {
    change_[g] = has_previous_ && previous_[g] > 0 ? std::fabs(previous_[g] - norms[g]) / previous_[g] : -1.0;
    low_[g] = decayed || critical(has_previous_, previous_[g], norms[g], options_.threshold);
  }
  previous_ = std::move(norms);
  has_previous_ = true;
  std::fill(sum_.begin(), sum_.end(), 0.f);
}

void Accordion::save(std::ostream& out) const {
  write_sync_header(out, "accordion", 1);
  write_pod(out, n_);
  write_pod(out, static_cast<int64_t>(groups_.size()));
  write_pod(out, options_.interval);
  write_pod(out, static_cast<uint8_t>(has_previous_));
  write_pod(out, static_cast<uint8_t>(fresh_));
  write_pod(out, switches_);
  write_pod(out, summed_);
  out.write(reinterpret_cast<const char*>(low_.data()), static_cast<std::streamsize>(low_.size()));
  out.write(reinterpret_cast<const char*>(previous_.data()),
            static_cast<std::streamsize>(previous_.size() * sizeof(double)));
  out.write(reinterpret_cast<const char*>(change_.data()), static_cast<std::streamsize>(change_.size() * sizeof(double)));
  write_pod(out, static_cast<uint8_t>(!sum_.empty()));
  if (!sum_.empty())
    out.write(reinterpret_cast<const char*>(sum_.data()), static_cast<std::streamsize>(sum_.size() * sizeof(float)));
}

void Accordion::load(std::istream& in) {
  read_sync_header(in, "accordion", 1);
  const auto n = read_pod<int64_t>(in);
  const auto groups = read_pod<int64_t>(in);
  const auto interval = read_pod<int64_t>(in);
  if (!in) throw std::runtime_error("adaptive compression state: truncated");
  if (n != n_ || groups != static_cast<int64_t>(groups_.size()))
    throw std::runtime_error("adaptive compression state is for " + std::to_string(groups) + " groups of " +
                             std::to_string(n) + " entries, this run has " + std::to_string(groups_.size()) + " of " +
                             std::to_string(n_));
  if (interval != options_.interval)
    throw std::runtime_error("adaptive compression state was saved with an interval of " + std::to_string(interval) +
                             " steps, this run has " + std::to_string(options_.interval) +
                             " (adaptive_interval)");
  const auto has_previous = read_pod<uint8_t>(in);
  const auto fresh = read_pod<uint8_t>(in);
  const auto switches = read_pod<int64_t>(in);
  const auto summed = read_pod<int64_t>(in);
  std::vector<uint8_t> low(groups_.size());
  std::vector<double> previous(groups_.size()), change(groups_.size());
  in.read(reinterpret_cast<char*>(low.data()), static_cast<std::streamsize>(low.size()));
  in.read(reinterpret_cast<char*>(previous.data()), static_cast<std::streamsize>(previous.size() * sizeof(double)));
  in.read(reinterpret_cast<char*>(change.data()), static_cast<std::streamsize>(change.size() * sizeof(double)));
  const auto has_sum = read_pod<uint8_t>(in);
  std::vector<float> sum;
  if (has_sum) {
    sum.resize(n_);
    in.read(reinterpret_cast<char*>(sum.data()), static_cast<std::streamsize>(sum.size() * sizeof(float)));
  }
  if (!in) throw std::runtime_error("adaptive compression state: truncated");
  for (uint8_t l : low)
    if (l > 1) throw std::runtime_error("adaptive compression state: a setting that is neither low nor high");
  low_ = std::move(low);
  previous_ = std::move(previous);
  change_ = std::move(change);
  sum_ = std::move(sum);
  has_previous_ = has_previous != 0;
  fresh_ = fresh != 0;
  switches_ = switches;
  summed_ = summed;
}

}  // namespace trainer::comm
