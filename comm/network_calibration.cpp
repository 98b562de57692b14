#include "comm/network_calibration.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace trainer::comm {

namespace {

using nlohmann::json;

constexpr const char* kFormat = "trainer network calibration";
constexpr int kVersion = 1;

json size_to_json(const CalibrationSize& s) {
  return json{{"bytes", s.bytes}, {"calls_per_sample", s.calls_per_sample}, {"samples_s", s.samples_s},
              {"median_s", s.median_s}};
}

json fit_to_json(const AlphaBetaFit& f) {
  return json{{"latency_s", f.network.latency},
              {"bandwidth_bytes_per_s", f.network.bandwidth},
              {"max_relative_error", f.max_relative_error}};
}

// Reads keys of one file, each error one line naming the file and the key's path.
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw std::runtime_error(path_ + ": " + (key.empty() ? "" : "key '" + key + "' ") + what);
  }

  const json& at(const json& object, const std::string& parent, const char* name) const {
    const std::string key = parent.empty() ? name : parent + "." + name;
    if (!object.is_object() || !object.contains(name)) fail(key, "missing");
    return object.at(name);
  }
  double number(const json& object, const std::string& parent, const char* name) const {
    const json& v = at(object, parent, name);
    if (!v.is_number()) fail(join(parent, name), "must be a number, got " + v.dump());
    const double d = v.get<double>();
    if (!std::isfinite(d)) fail(join(parent, name), "must be finite");
    return d;
  }
  std::string text(const json& object, const std::string& parent, const char* name) const {
    const json& v = at(object, parent, name);
    if (!v.is_string()) fail(join(parent, name), "must be a string, got " + v.dump());
    return v.get<std::string>();
  }
  const json& array(const json& object, const std::string& parent, const char* name) const {
    const json& v = at(object, parent, name);
    if (!v.is_array()) fail(join(parent, name), "must be an array");
    return v;
  }
  static std::string join(const std::string& parent, const char* name) {
    return parent.empty() ? name : parent + "." + name;
  }

  std::vector<CalibrationSize> sizes(const json& measurements, const char* kind) const {
    const std::string parent = std::string("measurements.") + kind;
    std::vector<CalibrationSize> out;
    const json& list = array(measurements, "measurements", kind);
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string item = parent + "[" + std::to_string(i) + "]";
      CalibrationSize s;
      s.bytes = number(list[i], item, "bytes");
      s.calls_per_sample = static_cast<int>(number(list[i], item, "calls_per_sample"));
      for (const json& t : array(list[i], item, "samples_s")) {
        if (!t.is_number()) fail(item + ".samples_s", "must hold numbers");
        s.samples_s.push_back(t.get<double>());
      }
      s.median_s = number(list[i], item, "median_s");
      out.push_back(s);
    }
    return out;
  }

  AlphaBetaFit fit(const json& fits, const char* kind) const {
    const std::string parent = std::string("fit.") + kind;
    const json& f = at(fits, "fit", kind);
    AlphaBetaFit out;
    out.network.latency = number(f, parent, "latency_s");
    out.network.bandwidth = number(f, parent, "bandwidth_bytes_per_s");
    out.max_relative_error = number(f, parent, "max_relative_error");
    if (out.network.latency < 0) fail(parent + ".latency_s", "must not be negative");
    if (!(out.network.bandwidth > 0)) fail(parent + ".bandwidth_bytes_per_s", "must be positive");
    return out;
  }

 private:
  std::string path_;
};

std::string format_latency(double seconds) {
  char buf[32];
  if (seconds >= 1e-3) std::snprintf(buf, sizeof buf, "%.3g ms", seconds * 1e3);
  else std::snprintf(buf, sizeof buf, "%.3g us", seconds * 1e6);
  return buf;
}

}  // namespace

std::string format_rate(double bytes_per_second) {
  const double bits = bytes_per_second * 8;
  char buf[48];
  if (bits >= 1e9) std::snprintf(buf, sizeof buf, "%.3g Gbit/s", bits / 1e9);
  else std::snprintf(buf, sizeof buf, "%.3g Mbit/s", bits / 1e6);
  return buf;
}

std::string calibration_to_json(const NetworkCalibration& c) {
  json allreduce = json::array(), p2p = json::array();
  for (const CalibrationSize& s : c.allreduce) allreduce.push_back(size_to_json(s));
  for (const CalibrationSize& s : c.p2p) p2p.push_back(size_to_json(s));
  const json j{{"format", kFormat},
               {"version", kVersion},
               {"ranks", c.ranks},
               {"hosts", c.hosts},
               {"cpu", c.cpu},
               {"isa", c.isa},
               {"mpi", c.mpi},
               {"date", c.date},
               {"nominal_bandwidth_bytes_per_s", c.nominal_bandwidth},
               {"repeats", c.repeats},
               {"measurements", {{"allreduce", allreduce}, {"p2p", p2p}}},
               {"fit", {{"allreduce", fit_to_json(c.allreduce_fit)}, {"p2p", fit_to_json(c.p2p_fit)}}}};
  return j.dump(1) + "\n";
}

void save_calibration(const NetworkCalibration& calibration, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << calibration_to_json(calibration);
    out.flush();
    if (!out) throw std::runtime_error(path + ": cannot write the calibration file");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw std::runtime_error(path + ": cannot write the calibration file (" + ec.message() + ")");
}

NetworkCalibration load_calibration(const std::string& path) {
  const Reader r(path);
  std::ifstream in(path);
  if (!in) r.fail("", "cannot open the calibration file (make one with: mpiexec -n P trainer calibrate --out FILE)");
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::exception& e) {
    r.fail("", std::string("not JSON (") + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat)
    r.fail("", std::string("not a network calibration (its \"format\" is not \"") + kFormat + "\")");
  if (r.number(j, "", "version") != kVersion)
    r.fail("version", "is " + j["version"].dump() + "; this trainer reads version " + std::to_string(kVersion));
  NetworkCalibration c;
  const double ranks = r.number(j, "", "ranks");
  if (ranks < 2 || ranks != std::floor(ranks)) r.fail("ranks", "must be a whole number of at least 2");
  c.ranks = static_cast<int>(ranks);
  for (const json& h : r.array(j, "", "hosts")) {
    if (!h.is_string()) r.fail("hosts", "must hold strings");
    c.hosts.push_back(h.get<std::string>());
  }
  c.cpu = r.text(j, "", "cpu");
  c.isa = r.text(j, "", "isa");
  c.mpi = r.text(j, "", "mpi");
  c.date = r.text(j, "", "date");
  c.nominal_bandwidth = r.number(j, "", "nominal_bandwidth_bytes_per_s");
  if (c.nominal_bandwidth < 0) r.fail("nominal_bandwidth_bytes_per_s", "must not be negative (0: not given)");
  c.repeats = static_cast<int>(r.number(j, "", "repeats"));
  const json& measurements = r.at(j, "", "measurements");
  c.allreduce = r.sizes(measurements, "allreduce");
  c.p2p = r.sizes(measurements, "p2p");
  const json& fits = r.at(j, "", "fit");
  c.allreduce_fit = r.fit(fits, "allreduce");
  c.p2p_fit = r.fit(fits, "p2p");
  return c;
}

std::string describe_rates(const NetworkCalibration& c) {
  std::string out = format_rate(c.allreduce_fit.network.bandwidth) + " achieved allreduce bus rate, " +
                    format_latency(c.allreduce_fit.network.latency) + " latency";
  if (c.nominal_bandwidth > 0) {
    char share[96];
    std::snprintf(share, sizeof share, " (%.0f%% of the nominal %s)",
                  100 * c.allreduce_fit.network.bandwidth / c.nominal_bandwidth, format_rate(c.nominal_bandwidth).c_str());
    out += share;
  }
  out += "; point to point " + format_rate(c.p2p_fit.network.bandwidth) + ", " +
         format_latency(c.p2p_fit.network.latency);
  return out;
}

}  // namespace trainer::comm
