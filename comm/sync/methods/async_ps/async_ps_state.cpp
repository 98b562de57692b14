#include "comm/sync/methods/async_ps/async_ps_state.h"

#include <istream>
#include <ostream>
#include <stdexcept>
#include <string>

#include "comm/sync/sync_state.h"

namespace trainer::comm {
namespace {

constexpr const char* kFormat = "async_ps_server";
constexpr uint32_t kVersion = 3, kOldestVersion = 2;

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

void PsServerState::write(std::ostream& out) const {
  write_sync_header(out, kFormat, kVersion);
  for (int64_t v : {workers, servers, version, pushes, total_steps, steps_per_epoch, next}) write_pod(out, v);
  for (int64_t c : clocks) write_pod(out, c);  // workers' clocks differ at a meet
  write_pod(out, static_cast<uint8_t>(gap ? 1 : 0));
  if (gap) gap->save(out);
}

PsServerState PsServerState::read(std::istream& in) {
  const uint32_t format = read_sync_header(in, kFormat, kVersion, kOldestVersion);
  PsServerState s;
  for (int64_t* v : {&s.workers, &s.servers, &s.version, &s.pushes, &s.total_steps, &s.steps_per_epoch, &s.next})
    *v = read_pod<int64_t>(in);
  if (!in || s.workers < 1 || s.workers > (1 << 20) || s.next < 0 || s.next >= s.workers)
    throw std::runtime_error("async_ps server state: truncated");
  s.clocks.resize(static_cast<size_t>(s.workers));
  for (int64_t& c : s.clocks) c = read_pod<int64_t>(in);
  if (!in) throw std::runtime_error("async_ps server state: truncated");
  if (format >= 3 && read_pod<uint8_t>(in) != 0) s.gap = GapAwareDamping::read(in);
  return s;
}

PsServerPart join_ps_servers(const std::vector<PsServerPart>& saved) {
  if (saved.empty()) throw std::runtime_error("async_ps: no saved server to re-shard");
  const PsServerPart& first = saved.front();
  PsServerPart whole;
  whole.optimizer.resize(first.optimizer.size());
  whole.optimizer_steps = first.optimizer_steps;
  whole.state = first.state;
  whole.state.servers = static_cast<int64_t>(saved.size());
  std::vector<GapAwareDamping> gaps;
  for (size_t s = 0; s < saved.size(); ++s) {
    const PsServerPart& p = saved[s];
    const PsServerState &a = p.state, &b = first.state;
    // Every server applies every push: these are one run's counters, whichever server saved them.
    if (a.workers != b.workers || a.servers != static_cast<int64_t>(saved.size()) || a.version != b.version ||
        a.pushes != b.pushes || a.total_steps != b.total_steps || a.steps_per_epoch != b.steps_per_epoch ||
        p.optimizer_steps != first.optimizer_steps || p.optimizer.size() != first.optimizer.size() ||
        a.gap.has_value() != b.gap.has_value())
      throw std::runtime_error("async_ps server " + str(static_cast<int64_t>(s)) + " of " +
                               str(static_cast<int64_t>(saved.size())) + " saved version " + str(a.version) + ", " +
                               str(a.pushes) + " pushes and " + str(p.optimizer_steps) +
                               " optimizer steps (or another layout, plan or optimizer), server 0 " + str(b.version) +
                               ", " + str(b.pushes) + " and " + str(first.optimizer_steps));
    for (size_t k = 0; k < p.optimizer.size(); ++k)
      whole.optimizer[k].insert(whole.optimizer[k].end(), p.optimizer[k].begin(), p.optimizer[k].end());
    if (a.gap) gaps.push_back(*a.gap);
  }
  if (whole.state.gap) whole.state.gap = GapAwareDamping::join(gaps);
  return whole;
}

PsServerPart split_ps_servers(const PsServerPart& joined, int64_t n, const PsLayout& layout, int s, int64_t step) {
  const PsServerState& w = joined.state;
  if (w.pushes != step * w.workers)
    throw std::runtime_error("async_ps: the servers' checkpoint of step " + str(step) + " holds " + str(w.pushes) +
                             " pushes of " + str(w.workers) + " workers, expected " + str(step * w.workers));
  const auto [begin, end] = PsLayout::shard(n, layout.servers, s);
  PsServerPart part;
  for (const std::vector<float>& a : joined.optimizer) {
    if (static_cast<int64_t>(a.size()) != n)
      throw std::runtime_error("async_ps: the servers' optimizer state covers " + str(static_cast<int64_t>(a.size())) +
                               " parameters, the model has " + str(n));
    part.optimizer.emplace_back(a.begin() + begin, a.begin() + end);
  }
  part.optimizer_steps = joined.optimizer_steps;
  PsServerState& p = part.state;
  p.workers = layout.workers;
  p.servers = layout.servers;
  p.version = w.version;
  p.pushes = step * layout.workers;
  p.total_steps = w.total_steps;
  p.steps_per_epoch = w.steps_per_epoch;
  p.next = 0;
  p.clocks.assign(static_cast<size_t>(layout.workers), step);
  if (w.gap && w.gap->size() != n)
    throw std::runtime_error("async_ps: the servers' gap-aware state covers " + str(w.gap->size()) +
                             " parameters, the model has " + str(n));
  if (w.gap) p.gap = w.gap->slice(begin, end);
  return part;
}

std::vector<float> join_shards(const std::vector<const std::vector<float>*>& wholes) {
  std::vector<float> out;
  const int parts = static_cast<int>(wholes.size());
  for (int s = 0; s < parts; ++s) {
    const std::vector<float>& whole = *wholes[s];
    const auto [begin, end] = PsLayout::shard(static_cast<int64_t>(whole.size()), parts, s);
    out.insert(out.end(), whole.begin() + begin, whole.begin() + end);
  }
  return out;
}

}  // namespace trainer::comm
