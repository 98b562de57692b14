#include "comm/network_fit.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace trainer::comm {

namespace {

// Least squares of absolute residuals for t_i ~ m_i alpha + b_i beta over beta alone (alpha given).
// beta is seconds per byte.
double solve_beta(const std::vector<AlphaBetaTerms>& terms, const std::vector<SizeSample>& samples, double alpha) {
  double bb = 0, b_rest = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    bb += terms[i].bytes * terms[i].bytes;
    b_rest += terms[i].bytes * (samples[i].seconds - alpha * terms[i].messages);
  }
  return bb > 0 ? b_rest / bb : 0;
}

std::vector<AlphaBetaTerms> terms_for(OpKind kind, int ranks, const std::vector<SizeSample>& samples,
                                      const Network& net) {
  std::vector<AlphaBetaTerms> out;
  for (const SizeSample& s : samples) out.push_back(collective_terms(kind, s.bytes, ranks, net));
  return out;
}

bool same_choices(const std::vector<AlphaBetaTerms>& a, const std::vector<AlphaBetaTerms>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].messages != b[i].messages || a[i].bytes != b[i].bytes) return false;
  return true;
}

}  // namespace

AlphaBetaFit fit_network(OpKind kind, int ranks, const std::vector<SizeSample>& samples) {
  std::vector<SizeSample> sorted = samples;
  std::sort(sorted.begin(), sorted.end(), [](const SizeSample& a, const SizeSample& b) { return a.bytes < b.bytes; });
  for (const SizeSample& s : sorted)
    if (!(s.seconds > 0) || !std::isfinite(s.seconds) || !(s.bytes >= 0))
      throw std::invalid_argument("network fit: a sample of " + std::to_string(s.bytes) + " bytes has time " +
                                  std::to_string(s.seconds) + " s (must be positive)");
  if (sorted.size() < 2 || sorted.front().bytes == sorted.back().bytes)
    throw std::invalid_argument("network fit: needs samples of at least two different sizes");
  if (!(sorted.back().seconds > sorted.front().seconds))
    throw std::invalid_argument("network fit: the largest size (" + std::to_string(sorted.back().bytes) +
                                " bytes) was not slower than the smallest: no bandwidth to fit (use larger sizes)");
  // The larger half of the sizes (at least two) sets the bandwidth.
  const size_t n_large = std::max<size_t>(2, (sorted.size() + 1) / 2);
  const std::vector<SizeSample> large(sorted.end() - static_cast<std::ptrdiff_t>(n_large), sorted.end());
  const SizeSample& smallest = sorted.front();

  // Start from the two ends: latency from the smallest call, bandwidth from the largest.
  Network net{sorted.back().bytes / sorted.back().seconds, smallest.seconds};
  AlphaBetaFit fit;
  std::vector<AlphaBetaTerms> terms = terms_for(kind, ranks, sorted, net);
  for (fit.iterations = 1; fit.iterations <= 100; ++fit.iterations) {
    const std::vector<AlphaBetaTerms> large_terms(terms.end() - static_cast<std::ptrdiff_t>(n_large), terms.end());
    const double beta = solve_beta(large_terms, large, net.latency);
    if (!(beta > 0))
      throw std::invalid_argument("network fit: the larger sizes took no longer than the latency of the smallest: no "
                                  "bandwidth to fit (use larger sizes)");
    const AlphaBetaTerms& t0 = terms.front();
    const double latency = t0.messages > 0 ? std::max(0.0, (smallest.seconds - t0.bytes * beta) / t0.messages) : 0;
    const bool settled = std::abs(latency - net.latency) <= 1e-12 * smallest.seconds &&
                         std::abs(1 / beta - net.bandwidth) <= 1e-12 * net.bandwidth;
    net = Network{1 / beta, latency};
    std::vector<AlphaBetaTerms> next = terms_for(kind, ranks, sorted, net);
    if (settled && same_choices(next, terms)) break;
    terms = std::move(next);
  }
  fit.iterations = std::min(fit.iterations, 100);
  fit.network = net;
  for (const SizeSample& s : sorted)
    fit.max_relative_error = std::max(
        fit.max_relative_error, std::abs(collective_seconds(kind, s.bytes, ranks, net) - s.seconds) / s.seconds);
  return fit;
}

}  // namespace trainer::comm
