#include "comm/sync/methods/demo/demo.h"

#include <algorithm>
#include <istream>
#include <sstream>
#include <stdexcept>

#include "comm/sync/codecs/rank_mean.h"
#include "comm/sync/registry.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {
namespace {

constexpr int64_t kDemoRun = 64;  // DeMo chunks vectors in runs of 64 (its tiles are 64 x 64)

DemoOptions demo_options(const SyncSettings& o) { return options_of<DemoOptions>(o); }

std::vector<std::string> demo_notes(const SyncOptions& o) {
  if (o.recipe.optimizer == "sgd" && o.recipe.momentum == 0) return {};
  return {"note: demo's update is the sign of the decoded momentum components, stepped by the optimizer: DeMo "
          "uses plain SGD (optim.name = \"sgd\", optim.momentum = 0); this run has " + o.recipe.optimizer +
          (o.recipe.optimizer == "sgd" ? " with momentum" : "")};
}

}  // namespace

std::vector<SyncOptionProblem> demo_problems(const DemoOptions& o) {
  std::vector<SyncOptionProblem> found;
  if (o.value_bits != 2 && o.value_bits != 4 && o.value_bits != 8 && o.value_bits != 32)
    found.push_back(
        {{"value_bits"}, "value_bits = " + std::to_string(o.value_bits) + " must be 2, 4, 8 or 32"});
  return found;
}

SyncMethod demo_method() {
  SyncMethod m;
  m.name = "demo";
  m.doc =
      "DeMo (decoupled momentum): every step each rank adds its gradient to its own momentum, sends the largest "
      "DCT components of each chunk of it (an allgather) and removes them from it; the sign of the decoded sum is "
      "the gradient the optimizer steps with";
  m.can.device_buffers = false;  // host loops (the DCT, the codec); a device run stages host copies
  declare_options<DemoOptions>(m);
  m.start_notes = demo_notes;
  m.check = [](const SyncOptions& o) { return demo_problems(demo_options(o)); };
  m.make = [](const SyncOptions& o, const SyncContext& c) -> std::unique_ptr<GradientSync> {
    return std::make_unique<Demo>(c.comm, c.host_backend("demo"), c.n, c.views, demo_options(o));
  };
  return m;
}

Demo::Demo(Communicator& comm, models::Backend& backend, int64_t n, const std::vector<models::ParamView>* views,
           const DemoOptions& o)
    : comm_(comm),
      backend_(backend),
      n_(n),
      options_(o),
      codec_(plan_chunks(Fragment{0, n, 0, views ? static_cast<int64_t>(views->size()) : 1}, views, o.density, kDemoRun),
             static_cast<int>(o.value_bits)) {
  components_.resize(static_cast<size_t>(n));
  decoded_.resize(static_cast<size_t>(n));
  payload_.resize(static_cast<size_t>(codec_.payload_bytes()));
  gathered_.resize(payload_.size() * static_cast<size_t>(comm.size()));
}

std::string Demo::describe() const {
  std::ostringstream out;
  out << "demo: every step m = " << options_.error_decay << " m + g, the top " << options_.density * 100
      << "% of the DCT components of each of " << codec_.chunks().size() << " chunks (" << codec_.kept()
      << " components) in " << options_.value_bits << "-bit values allgathered (ALLGATHER_DEMO), "
      << static_cast<double>(codec_.payload_bytes()) / 1e6 << " MB per rank and step against "
      << 4.0 * static_cast<double>(n_) / 1e6 << " MB of fp32 (" << 4.0 * static_cast<double>(n_) / static_cast<double>(codec_.payload_bytes())
      << "x); the update is the sign of their decoded sum";
  return out.str();
}

SyncStats Demo::reduce(SyncBuffers& b, int64_t step) {
  comm_.log().set_step(step, Phase::kCompressed);
  if (momentum_.empty()) momentum_.assign(static_cast<size_t>(n_), 0.f);
  const auto& chunks = codec_.chunks();
  // m = beta m + g (the backend's loops: each op rounded once).
  backend_.scale(n_, static_cast<float>(options_.error_decay), momentum_.data());
  backend_.add(n_, momentum_.data(), b.grads, momentum_.data());
  // Its DCT, the top components sent, and what was sent taken out of m.
  std::copy(momentum_.begin(), momentum_.end(), components_.begin());
  dct_.forward(chunks, components_.data());
  codec_.encode(components_.data(), payload_.data());
  std::fill(decoded_.begin(), decoded_.end(), 0.f);
  codec_.decode_add(payload_.data(), 1.f, decoded_.data());
  dct_.inverse(chunks, decoded_.data());
  backend_.subtract(n_, momentum_.data(), decoded_.data(), momentum_.data());
  // Every rank's components, summed in rank order, back from the DCT; their sign is the gradient.
  comm_.allgather(payload_.data(), codec_.payload_bytes(), gathered_.data(), DType::kU8, "ALLGATHER_DEMO");
  std::fill(decoded_.begin(), decoded_.end(), 0.f);
  for (int r = 0; r < comm_.size(); ++r)
    codec_.decode_add(gathered_.data() + static_cast<size_t>(r) * payload_.size(), 1.f, decoded_.data());
  dct_.inverse(chunks, decoded_.data());
  for (int64_t i = 0; i < n_; ++i) {
    const float v = decoded_[static_cast<size_t>(i)];
    b.grads[i] = v > 0 ? 1.f : v < 0 ? -1.f : 0.f;
  }
  return {Phase::kCompressed, static_cast<double>(codec_.kept()) / static_cast<double>(n_)};
}

void Demo::save(std::ostream& out) const {
  write_sync_header(out, "demo", 1);
  write_pod(out, n_);
  write_pod(out, static_cast<uint8_t>(!momentum_.empty()));
  out.write(reinterpret_cast<const char*>(momentum_.data()),
            static_cast<std::streamsize>(momentum_.size() * sizeof(float)));
}

void Demo::load(std::istream& in) {
  read_sync_header(in, "demo", 1);
  const auto n = read_pod<int64_t>(in);
  const bool started = read_pod<uint8_t>(in) != 0;
  if (!in) throw std::runtime_error("demo state: truncated");
  if (n != n_)
    throw std::runtime_error("demo state holds " + std::to_string(n) + " parameters, the model has " +
                             std::to_string(n_));
  std::vector<float> momentum(started ? static_cast<size_t>(n) : 0);
  in.read(reinterpret_cast<char*>(momentum.data()), static_cast<std::streamsize>(momentum.size() * sizeof(float)));
  if (!in) throw std::runtime_error("demo state: truncated momentum");
  momentum_ = std::move(momentum);
}

std::string Demo::load_resharded(const std::vector<std::string>& states) {
  if (states.empty()) throw std::runtime_error("demo: no saved state to resume from");
  const std::vector<float> before = momentum_;
  RankMean mean(n_);
  bool started = false;
  try {
    for (const std::string& s : states) {
      std::istringstream in(s);
      load(in);
      started = !momentum_.empty();
      if (started) mean.add(momentum_.data());
    }
  } catch (...) {
    momentum_ = before;
    throw;
  }
  if (started && mean.ranks() != static_cast<int>(states.size())) {
    momentum_ = before;
    throw std::runtime_error("demo: some saved ranks have a momentum and some none");
  }
  momentum_ = started ? mean.mean() : std::vector<float>{};
  return "demo state: each rank's momentum the mean of the " + std::to_string(states.size()) + " saved ranks'";
}

}  // namespace trainer::comm
