#include "trainer/config_defaults.h"

#include <sstream>
#include <stdexcept>

namespace trainer {
namespace {

// The key's field in the config (const or not, as c); every method-dependent default is one of these.
template <class C>
auto double_field(C& c, const std::string& key) -> decltype(&c.sync.outer_momentum) {
  if (key == "sync.outer_momentum") return &c.sync.outer_momentum;
  if (key == "sync.density") return &c.sync.density;
  return nullptr;
}
template <class C>
auto int_field(C& c, const std::string& key) -> decltype(&c.sync.period) {
  if (key == "sync.period") return &c.sync.period;
  if (key == "sync.rank") return &c.sync.rank;
  if (key == "sync.adaptive_rank") return &c.sync.adaptive_rank;
  return nullptr;
}

double value_of(const Config& c, const std::string& key) {
  if (const double* d = double_field(c, key)) return *d;
  if (const int64_t* i = int_field(c, key)) return static_cast<double>(*i);
  throw std::logic_error("config_defaults: no field for " + key);
}

std::string str(double v) {
  std::ostringstream s;
  s << v;  // 0.5, not to_string's 0.500000
  return s.str();
}

}  // namespace

std::vector<MethodDefault> method_defaults(const Config& c) {
  const std::string& m = c.sync.method;
  std::vector<MethodDefault> d;
  if (m == "diloco") {
    d.push_back({"sync.period", 8,
                 "diloco's H: at H = 8 with outer momentum 0.5, within 1 point of dense over seeds on CIFAR "
                 "ResNet-20 and LAS; H = 1 with the paper's outer momentum ended at CER 94% on a speech corpus"});
    const bool sgd_momentum = c.optim.name == "sgd" && c.optim.momentum > 0;
    if (sgd_momentum)
      d.push_back({"sync.outer_momentum", 0.5,
                   "diloco's outer momentum over SGD with momentum inner steps (the paper's 0.9 is for AdamW "
                   "inner steps; over SGD momentum it lost 6.7 points on CIFAR and 11 CER points on LAS)"});
    else
      d.push_back({"sync.outer_momentum", 0.9, "diloco's outer momentum over " + c.optim.name +
                                                   " inner steps: the DiLoCo paper's (AdamW inner steps)"});
  } else if (m == "local_sgd") {
    d.push_back({"sync.period", 4,
                 "local_sgd's period: H = 8 lost 2.8 points on CIFAR ResNet-20 and 2 CER points on LAS over "
                 "seeds"});
  } else if (c.sync.adaptive && (m == "oktopk" || m == "topka" || m == "gaussiank" || m == "gtopk")) {
    d.push_back({"sync.density", 0.01,
                 "the sparse methods' density outside critical regimes under sync.adaptive (ten times below "
                 "sync.adaptive_density's 0.1, Accordion's ratio; this pair is not measured here yet)"});
  } else if (m == "powersgd" && c.sync.adaptive) {
    d.push_back({"sync.rank", 1,
                 "powersgd's rank outside critical regimes under sync.adaptive (Accordion's pair: rank 1 and "
                 "sync.adaptive_rank 4 measured within 0.3 points of fixed rank 4 at 61% of its bytes)"});
    d.push_back({"sync.adaptive_rank", 4, "powersgd's rank in critical regimes under sync.adaptive"});
  }
  return d;
}

void apply_method_defaults(Config& c, const std::function<bool(const std::string&)>& is_set) {
  for (const MethodDefault& d : method_defaults(c)) {
    if (is_set(d.key)) continue;
    if (double* v = double_field(c, d.key)) *v = d.value;
    else if (int64_t* i = int_field(c, d.key)) *i = static_cast<int64_t>(d.value);
    else throw std::logic_error("config_defaults: no field for " + d.key);
  }
}

std::vector<std::string> method_default_lines(const Config& c) {
  std::vector<std::string> lines;
  for (const MethodDefault& d : method_defaults(c))
    if (value_of(c, d.key) == d.value) lines.push_back(d.key + " = " + str(d.value) + ": " + d.why);
  return lines;
}

}  // namespace trainer
