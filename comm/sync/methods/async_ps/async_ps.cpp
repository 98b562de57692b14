#include "comm/sync/methods/async_ps/async_ps.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "comm/sync/registry.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {

PsLayout PsLayout::make(int world_size, int64_t servers) {
  if (servers < 1 || servers >= world_size)
    throw std::invalid_argument("sync.async_ps.servers = " + std::to_string(servers) + " must be at least 1 and below the " +
                                "number of processes (" + std::to_string(world_size) +
                                ") so that some rank is a worker: async_ps needs mpiexec -n " +
                                std::to_string(servers + 1) + " or more");
  PsLayout l;
  l.world = world_size;
  l.servers = static_cast<int>(servers);
  l.workers = world_size - l.servers;
  return l;
}

std::pair<int64_t, int64_t> PsLayout::shard(int64_t n, int parts, int s) {
  const int64_t base = n / parts, extra = n % parts;
  const int64_t begin = s * base + std::min<int64_t>(s, extra);
  return {begin, begin + base + (s < extra ? 1 : 0)};
}

SyncMethod async_ps_method() {
  SyncMethod m;
  m.name = "async_ps";
  m.doc =
      "asynchronous parameter server: the last sync.async_ps.servers ranks hold the parameters and run the optimizer, the "
      "others push gradients and pull parameters without waiting for each other";
  m.can.applies_update = true;
  m.can.keeps_parameters_equal = false;
  m.can.wrapped_in_warmup = false;  // the servers run the warmup's synchronous rounds
  m.can.device_buffers = true;      // a worker on a device stages its push and pull (async_ps.h)
  declare_options<AsyncPsOptions>(m);
  m.server_ranks = [](const SyncSettings& s) { return options_of<AsyncPsOptions>(s).servers; };
  m.make = [](const SyncOptions& o, const SyncContext& c) -> std::unique_ptr<GradientSync> {
    return std::make_unique<AsyncPsWorker>(c.comm.host_side(), c.backend, o, c.n);
  };
  return m;
}

AsyncPsWorker::AsyncPsWorker(Communicator& world, models::DeviceMemory& memory, const SyncOptions& options,
                             int64_t n)
    : world_(world), memory_(memory), options_(options), ps_(options_of<AsyncPsOptions>(options)), n_(n) {}

std::string AsyncPsWorker::describe() const {
  const int p = world_.size();
  std::ostringstream out;
  if (ps_.servers >= p) {
    out << "async_ps: servers = " << ps_.servers << " leaves no worker among " << p << " processes";
    return out.str();
  }
  const PsLayout l = PsLayout::make(p, ps_.servers);
  out << "async_ps: ranks 0.." << l.workers - 1 << " are workers, ranks " << l.workers << ".." << p - 1
      << " parameter servers (each owns about " << n_ / l.servers << " of " << n_
      << " parameters and runs the optimizer on them)\n"
      << "per worker step: PUSH_GRAD " << n_ * 4 / 1e6 << " MB (" << n_ * 4 << " bytes) to the servers and PULL_PARAMS "
      << n_ * 4 / 1e6 << " MB back, plus the BN statistics both ways (PUSH_STATE, PULL_STATE) and a "
      << 8 * (kPushHeaderSize + kReplyHeaderSize) << "-byte header pair (PS_HEADER) per server; "
      << "each server receives and sends " << n_ * 4 / 1e6 / l.servers * l.workers
      << " MB per round of one step of every worker";
  return out.str();
}

SyncStats AsyncPsWorker::reduce(SyncBuffers& device, int64_t step) {
  // The protocol's buffers: the caller's on the host, else host copies (the pushed ones filled here).
  SyncBuffers host = device;
  const bool staged = !memory_.is_host();
  if (staged) {
    host_grads_.resize(static_cast<size_t>(device.n));
    host_params_.resize(static_cast<size_t>(device.n));
    host_state_.resize(static_cast<size_t>(device.n_state));
    state_out_.resize(static_cast<size_t>(device.n_state));
    models::copy_to_host(memory_, device.grads, device.n, host_grads_.data());
    models::copy_to_host(memory_, device.state, device.n_state, state_out_.data());
    host.grads = host_grads_.data();
    host.params = host_params_.data();
    host.state = host_state_.data();
  } else {
    // The BN statistics go out from a copy: the pull writes the same buffer while the push is in flight.
    state_out_.assign(device.state, device.state + device.n_state);
  }
  const SyncStats stats = exchange(host, step);
  if (staged) {
    models::copy_to_device(memory_, host.params, host.n, device.params);
    models::copy_to_device(memory_, host.state, host.n_state, device.state);
  }
  return stats;
}

SyncStats AsyncPsWorker::exchange(SyncBuffers& b, int64_t step) {
  if (layout_.world == 0) {
    layout_ = PsLayout::make(world_.size(), ps_.servers);
    if (pulled_version_.empty()) pulled_version_.assign(layout_.servers, 0);
  }
  if (layout_.is_server(world_.rank())) throw std::logic_error("async_ps: reduce() called on a server rank");
  world_.log().set_step(step, Phase::kDense);

  const int S = layout_.servers;
  std::vector<int64_t> headers(static_cast<size_t>(S) * kPushHeaderSize);
  std::vector<int64_t> replies(static_cast<size_t>(S) * kReplyHeaderSize);
  std::vector<Request> requests;
  requests.reserve(static_cast<size_t>(S) * 6);
  for (int s = 0; s < S; ++s) {
    const int server = layout_.server_rank(s);
    const auto [p0, p1] = PsLayout::shard(b.n, S, s);
    const auto [s0, s1] = PsLayout::shard(b.n_state, S, s);
    int64_t* h = headers.data() + s * kPushHeaderSize;
    h[0] = step;
    h[1] = pulled_version_[s];
    h[2] = options_.recipe.total_steps;
    h[3] = options_.recipe.steps_per_epoch;
    // Receives first, so the server's replies never wait for a posted buffer.
    requests.push_back(world_.irecv(replies.data() + s * kReplyHeaderSize, kReplyHeaderSize, DType::kI64, server,
                                    kPsReplyChannel, "PS_HEADER"));
    requests.push_back(world_.irecv(b.params + p0, p1 - p0, DType::kF32, server, kPsParamsChannel, "PULL_PARAMS"));
    requests.push_back(world_.irecv(b.state + s0, s1 - s0, DType::kF32, server, kPsPulledStateChannel, "PULL_STATE"));
    requests.push_back(world_.isend(h, kPushHeaderSize, DType::kI64, server, kPsHeaderChannel, "PS_HEADER"));
    requests.push_back(world_.isend(b.grads + p0, p1 - p0, DType::kF32, server, kPsGradChannel, "PUSH_GRAD"));
    requests.push_back(
        world_.isend(state_out_.data() + s0, s1 - s0, DType::kF32, server, kPsStateChannel, "PUSH_STATE"));
  }
  world_.wait_all(requests);

  // Server 0's reply completing a meet: the others' replies that did not complete it were sent
  // before their meet (the push was answered at once); their meet reply follows on the same channels.
  const int64_t meet = replies[kReplyMeet];
  requests.clear();
  for (int s = 1; s < S && meet >= 0; ++s) {
    if (replies[s * kReplyHeaderSize + kReplyMeet] == meet) continue;
    const int server = layout_.server_rank(s);
    const auto [p0, p1] = PsLayout::shard(b.n, S, s);
    const auto [s0, s1] = PsLayout::shard(b.n_state, S, s);
    requests.push_back(world_.irecv(replies.data() + s * kReplyHeaderSize, kReplyHeaderSize, DType::kI64, server,
                                    kPsReplyChannel, "PS_HEADER"));
    requests.push_back(world_.irecv(b.params + p0, p1 - p0, DType::kF32, server, kPsParamsChannel, "PULL_PARAMS"));
    requests.push_back(world_.irecv(b.state + s0, s1 - s0, DType::kF32, server, kPsPulledStateChannel, "PULL_STATE"));
  }
  world_.wait_all(requests);

  SyncStats stats;
  stats.phase = Phase::kDense;
  stats.density = 1.0;
  stats.staleness = 0;
  stats.global_step = replies[kReplyGlobalStep];
  stats.round = meet;
  for (int s = 0; s < S; ++s) {
    const int64_t* r = replies.data() + s * kReplyHeaderSize;
    if (r[kReplyMeet] != meet)
      throw std::runtime_error("async_ps: server " + std::to_string(s) + " answered for meet " +
                               std::to_string(r[kReplyMeet]) + ", server 0 for " + std::to_string(meet));
    pulled_version_[s] = r[0];
    stats.staleness = std::max(stats.staleness, r[1]);
    std::memcpy(&stats.lr, &r[2], sizeof(double));
  }
  return stats;
}

void AsyncPsWorker::save(std::ostream& out) const {
  write_sync_header(out, "async_ps", 1);
  // Before the first step nothing was pulled: version 0 of every server.
  const std::vector<int64_t> versions =
      pulled_version_.empty() ? std::vector<int64_t>(static_cast<size_t>(ps_.servers), 0) : pulled_version_;
  write_pod(out, static_cast<int64_t>(versions.size()));
  for (int64_t v : versions) write_pod(out, v);
}

namespace {

// A worker's saved state: the version of each server's shard it pulled.
std::vector<int64_t> read_pulled_versions(std::istream& in) {
  read_sync_header(in, "async_ps", 1);
  const auto count = read_pod<int64_t>(in);
  if (!in || count < 0 || count > (1 << 20)) throw std::runtime_error("async_ps worker state: truncated");
  std::vector<int64_t> versions(static_cast<size_t>(count));
  for (int64_t& v : versions) v = read_pod<int64_t>(in);
  if (!in) throw std::runtime_error("async_ps worker state: truncated");
  return versions;
}

}  // namespace

void AsyncPsWorker::load(std::istream& in) {
  std::vector<int64_t> versions = read_pulled_versions(in);
  if (static_cast<int64_t>(versions.size()) != ps_.servers)
    throw std::runtime_error("async_ps state was saved with servers = " + std::to_string(versions.size()) +
                             ", this run has " + std::to_string(ps_.servers));
  pulled_version_ = std::move(versions);
}

std::string AsyncPsWorker::load_resharded(const std::vector<std::string>& states) {
  // A checkpoint is a meet: every worker pulled every server's shard there, and every server had
  // applied every push, so all hold one version. The new servers carry it on (async_ps_state.h).
  int64_t version = -1;
  for (size_t w = 0; w < states.size(); ++w) {
    std::istringstream in(states[w]);
    for (int64_t v : read_pulled_versions(in)) {
      if (version >= 0 && v != version)
        throw std::runtime_error("async_ps: saved worker " + std::to_string(w) + " pulled version " +
                                 std::to_string(v) + ", another " + std::to_string(version) +
                                 " (not a checkpoint at a meet)");
      version = v;
    }
  }
  if (version < 0) throw std::runtime_error("async_ps: no saved worker state to resume from");
  pulled_version_.assign(static_cast<size_t>(ps_.servers), version);
  return "every worker holds the checkpoint's parameters (version " + std::to_string(version) +
         "), nothing was in flight";
}

}  // namespace trainer::comm
