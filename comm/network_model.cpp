#include "comm/network_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>

namespace trainer::comm {

namespace {

double log2_ceil(int p) { return std::ceil(std::log2(static_cast<double>(p))); }

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Splits "12.5mbit" into 12.5 and "mbit" (lower case); throws when no number leads.
double number_and_unit(const std::string& text, std::string& unit, const char* what) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || !std::isfinite(value) || value < 0)
    throw std::invalid_argument(std::string(what) + " '" + text + "' is not a non-negative number with a unit");
  unit = text.substr(used);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return value;
}

}  // namespace

AlphaBetaTerms collective_terms(OpKind kind, double s, int ranks, const Network& net) {
  if (ranks <= 1 && kind != OpKind::kPointToPoint && kind != OpKind::kOther) return {};
  const double p = ranks, rounds = log2_ceil(ranks);
  switch (kind) {
    case OpKind::kAllreduce: {
      const AlphaBetaTerms ring{2 * (p - 1), 2 * (p - 1) / p * s};
      const AlphaBetaTerms doubling{rounds, rounds * s};
      return doubling.seconds(net) <= ring.seconds(net) ? doubling : ring;  // P = 2: always doubling
    }
    case OpKind::kAllgather:
    case OpKind::kAllgatherv: return {p - 1, (p - 1) / p * s};
    case OpKind::kAlltoall: return {p - 1, (p - 1) * s / p};
    case OpKind::kBroadcast: return {rounds, rounds * s};
    case OpKind::kBarrier: return {rounds, 0};
    case OpKind::kPointToPoint:
    case OpKind::kOther: return {1, s};
  }
  return {};
}

double NetworkRates::allreduce_seconds(double size_bytes, int ranks) const {
  const auto& c = allreduce_curve;
  if (ranks != curve_ranks || c.size() < 2 || size_bytes < c.front().first || size_bytes > c.back().first)
    return collective_seconds(OpKind::kAllreduce, size_bytes, ranks, allreduce);
  size_t i = 1;
  while (i + 1 < c.size() && c[i].first < size_bytes) ++i;
  const double x = (std::log(size_bytes) - std::log(c[i - 1].first)) / (std::log(c[i].first) - std::log(c[i - 1].first));
  return std::exp(std::log(c[i - 1].second) + x * (std::log(c[i].second) - std::log(c[i - 1].second)));
}

double collective_seconds(OpKind kind, double s, int ranks, const Network& net) {
  return collective_terms(kind, s, ranks, net).seconds(net);
}

double p2p_seconds(int64_t sends, int64_t receives, double sent_bytes, double received_bytes, const Network& net) {
  if (sends == 0 && receives == 0) return 0;
  return static_cast<double>(std::max(sends, receives)) * net.latency +
         std::max(sent_bytes, received_bytes) / net.bandwidth;
}

OpKind kind_from_tag(const std::string& op) {
  if (starts_with(op, "ALLREDUCE")) return OpKind::kAllreduce;
  if (starts_with(op, "ALLGATHERV")) return OpKind::kAllgatherv;
  if (starts_with(op, "ALLGATHER")) return OpKind::kAllgather;
  if (starts_with(op, "ALLTOALL")) return OpKind::kAlltoall;
  if (starts_with(op, "BROADCAST")) return OpKind::kBroadcast;
  if (starts_with(op, "BARRIER")) return OpKind::kBarrier;
  if (starts_with(op, "ISEND") || starts_with(op, "IRECV") || starts_with(op, "SEND") || starts_with(op, "RECV"))
    return OpKind::kPointToPoint;
  return OpKind::kOther;
}

double parse_bandwidth(const std::string& text) {
  std::string unit;
  const double v = number_and_unit(text, unit, "bandwidth");
  double bytes = 0;
  if (unit.empty() || unit == "bit") bytes = v / 8;
  else if (unit == "kbit") bytes = v * 1e3 / 8;
  else if (unit == "mbit") bytes = v * 1e6 / 8;
  else if (unit == "gbit") bytes = v * 1e9 / 8;
  else if (unit == "tbit") bytes = v * 1e12 / 8;
  else if (unit == "b/s") bytes = v;
  else if (unit == "kb/s") bytes = v * 1e3;
  else if (unit == "mb/s") bytes = v * 1e6;
  else if (unit == "gb/s") bytes = v * 1e9;
  else
    throw std::invalid_argument("bandwidth '" + text + "': unknown unit '" + unit +
                                "' (use kbit, mbit, gbit, tbit or kB/s, MB/s, GB/s)");
  if (bytes <= 0) throw std::invalid_argument("bandwidth '" + text + "' must be positive");
  return bytes;
}

double parse_latency(const std::string& text) {
  std::string unit;
  const double v = number_and_unit(text, unit, "latency");
  if (unit == "s") return v;
  if (unit == "ms") return v * 1e-3;
  if (unit == "us") return v * 1e-6;
  if (unit == "ns") return v * 1e-9;
  if (unit.empty() && v == 0) return 0;
  throw std::invalid_argument("latency '" + text + "': unknown unit '" + unit + "' (use s, ms, us or ns)");
}

}  // namespace trainer::comm
