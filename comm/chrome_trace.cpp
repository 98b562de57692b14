#include "comm/chrome_trace.h"

#include <nlohmann/json.hpp>

#include "comm/comm_log.h"
#include "comm/comm_summary.h"

namespace trainer::comm {

namespace {

constexpr int kCollectiveTid = 1;
int p2p_tid(int peer, bool receive) { return 2 + 2 * peer + (receive ? 1 : 0); }

// This rank's events, timestamps already on rank 0's clock.
nlohmann::json rank_events(const CommLog& log, const std::vector<TraceSpan>& spans, int rank) {
  nlohmann::json events = nlohmann::json::array();
  const ClockFit& clock = log.clock();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", "rank " + std::to_string(rank)}}}});
  events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
  events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", 0}, {"args", {{"name", "steps"}}}});
  events.push_back(
      {{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", kCollectiveTid}, {"args", {{"name", "collectives"}}}});
  for (const TraceSpan& s : spans) {
    events.push_back({{"name", s.name}, {"cat", "compute"}, {"ph", "X"}, {"pid", rank}, {"tid", 0},
                      {"ts", clock.to_global(s.t_start_us)}, {"dur", s.t_end_us - s.t_start_us},
                      {"args", {{"step", s.step}}}});
  }
  std::vector<bool> named(0);
  const std::vector<int64_t>& waits = log.waits();
  for (const TracedCall& c : log.traced()) {
    const CommRecord& r = c.record;
    nlohmann::json args{{"op", r.op},       {"kind", op_kind_name(c.kind)}, {"step", r.step},
                        {"phase", phase_name(r.phase)}, {"bytes", r.bytes},        {"bytes_recv", r.bytes_recv},
                        {"peer", r.peer}};
    int tid = kCollectiveTid;
    if (c.collective >= 0) {
      if (static_cast<size_t>(c.collective) < waits.size()) {
        args["wait_us"] = waits[static_cast<size_t>(c.collective)];
        args["transfer_us"] = r.t_end_us - r.t_start_us - waits[static_cast<size_t>(c.collective)];
      }
    } else if (r.peer >= 0) {
      const bool receive = r.bytes_recv > 0 || r.bytes == 0;
      tid = p2p_tid(r.peer, receive);
      if (named.size() <= static_cast<size_t>(tid)) named.resize(static_cast<size_t>(tid) + 1, false);
      if (!named[static_cast<size_t>(tid)]) {
        named[static_cast<size_t>(tid)] = true;
        events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", tid},
                          {"args", {{"name", (receive ? "recv from " : "send to ") + std::to_string(r.peer)}}}});
      }
    }
    events.push_back({{"name", r.op}, {"cat", "comm"}, {"ph", "X"}, {"pid", rank}, {"tid", tid},
                      {"ts", clock.to_global(r.t_start_us)}, {"dur", r.t_end_us - r.t_start_us}, {"args", args}});
  }
  return events;
}

}  // namespace

int64_t write_chrome_trace(Communicator& comm, const std::vector<TraceSpan>& spans, const std::string& path) {
  CommLog::Pause pause(comm.log());
  const std::string mine = rank_events(comm.log(), spans, comm.rank()).dump();
  const int world_size = comm.size();
  int64_t length = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lengths(world_size);
  comm.allgather(&length, 1, lengths.data(), DType::kI64, "TRACE_LENGTHS");
  if (comm.rank() != 0) {
    Request r = comm.isend(mine.data(), length, DType::kU8, 0, 0, "TRACE_EVENTS");
    comm.wait(r);
    return 0;
  }
  std::vector<std::string> blobs(world_size);
  std::vector<Request> requests;
  for (int r = 1; r < world_size; ++r) {
    blobs[r].resize(static_cast<size_t>(lengths[r]));
    requests.push_back(comm.irecv(blobs[r].data(), lengths[r], DType::kU8, r, 0, "TRACE_EVENTS"));
  }
  comm.wait_all(requests);
  blobs[0] = mine;
  nlohmann::json all = nlohmann::json::array();
  int64_t comm_events = 0;
  for (const std::string& b : blobs) {
    for (auto& e : nlohmann::json::parse(b)) {
      if (e.value("cat", "") == "comm") ++comm_events;
      all.push_back(std::move(e));
    }
  }
  const nlohmann::json trace{{"traceEvents", all}, {"displayTimeUnit", "ms"}};
  write_comm_summary(trace.dump() + "\n", path);  // the same atomic write
  return comm_events;
}

}  // namespace trainer::comm
