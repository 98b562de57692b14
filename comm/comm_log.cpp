#include "comm/comm_log.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>

#include <unistd.h>

namespace trainer::comm {

namespace {

// Records are written when this many are pending at a step boundary: a few hundred kB per write,
// and a step's records normally land in one batch.
constexpr size_t kBatchRecords = 4096;
// A single step that produces this many is written mid-step, so memory stays bounded.
constexpr size_t kMaxPendingRecords = 1 << 16;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

const char* phase_name(Phase phase) { return phase == Phase::kDense ? "dense" : "compressed"; }

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kAllgatherv: return "allgatherv";
    case OpKind::kAlltoall: return "alltoall";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kPointToPoint: return "p2p";
    case OpKind::kOther: return "other";
  }
  return "other";
}

CommLog::~CommLog() { close(); }

void CommLog::open(const CommLogOptions& options, int rank, int world_size) {
  close();
  options_ = options;
  if (options_.every < 1) options_.every = 1;
  rank_ = rank;
  world_ = world_size;
  sent_ = received_ = 0;
  ops_.clear();
  last_op_ = 0;
  last_tag_ = nullptr;
  phases_[0] = phases_[1] = PhaseStats{};
  pending_.clear();
  pending_collective_.clear();
  collectives_.clear();
  waits_.clear();
  wait_note_.clear();
  clock_ = ClockFit{};
  traced_.clear();
  file_start_bytes_ = 0;
  records_written_ = 0;
  written_collectives_.clear();
  t0_ns_ = steady_ns();
  if (options_.enabled && !options_.path.empty()) {
    const std::filesystem::path parent = std::filesystem::path(options_.path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    file_ = std::fopen(options_.path.c_str(), options_.append ? "ab" : "wb");
    if (!file_) {
      throw std::runtime_error("comm log: cannot open " + options_.path + " for writing: " + std::strerror(errno));
    }
    std::fseek(file_, 0, SEEK_END);
    file_start_bytes_ = std::ftell(file_);
    committed_ = file_start_bytes_;
    pending_.reserve(kBatchRecords);
  }
  active_ = options_.enabled;
  set_step(step_, phase_);
}

void CommLog::set_step(int64_t step, Phase phase) {
  step_ = step;
  phase_ = phase;
  in_window_ = file_ != nullptr && step >= options_.first_step &&
               (options_.last_step < 0 || step <= options_.last_step) && step % options_.every == 0;
  in_trace_ = options_.enabled && step >= options_.trace_first_step && step <= options_.trace_last_step;
  if (pending_.size() >= kBatchRecords) write_pending();
}

void CommLog::replay(const std::vector<DeferredCall>& calls, int64_t step, Phase phase) {
  const int64_t step_now = step_;
  const Phase phase_now = phase_;
  set_step(step, phase);
  for (const DeferredCall& c : calls)
    record(c.op, c.kind, c.size_bytes, c.bytes, c.bytes_recv, c.peer, c.t_start_us, c.t_end_us, c.every_rank);
  set_step(step_now, phase_now);
}

int64_t CommLog::now_us() const { return (steady_ns() - t0_ns_) / 1000; }

void CommLog::record_enabled(const char* op, OpKind kind, int64_t size_bytes, int64_t bytes, int64_t bytes_recv,
                             int peer, int64_t t_start_us, int64_t t_end_us, bool every_rank) {
  // Few distinct tags per run (about ten), so a linear search with a one-entry cache is enough; the
  // pointer test avoids strcmp when the same literal comes back.
  OpStats* s = nullptr;
  if (op == last_tag_ && last_op_ < ops_.size()) {
    s = &ops_[last_op_];
  } else {
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (ops_[i].op == op) {
        s = &ops_[i];
        last_op_ = i;
        break;
      }
    }
    if (!s) {
      ops_.push_back(OpStats{});
      s = &ops_.back();
      s->op = op;
      s->kind = kind;
      last_op_ = ops_.size() - 1;
    }
    last_tag_ = op;
  }
  const int64_t dt = t_end_us - t_start_us;
  s->calls += 1;
  s->bytes += bytes;
  s->bytes_recv += bytes_recv;
  s->time_us += dt;
  s->sizes.push_back(size_bytes);
  PhaseStats& p = phases_[static_cast<int>(phase_)];
  p.calls += 1;
  p.bytes += bytes;
  p.bytes_recv += bytes_recv;
  p.time_us += dt;
  // Calls every rank makes in the same order; the short form's kOther carries no such promise.
  const bool collective = every_rank && kind != OpKind::kPointToPoint && kind != OpKind::kOther;
  const int64_t index = collective ? static_cast<int64_t>(collectives_.size()) : -1;
  if (collective) collectives_.push_back(CollectiveCall{t_start_us, t_end_us, static_cast<int32_t>(last_op_), phase_});
  if (in_trace_)
    traced_.push_back(TracedCall{CommRecord{step_, phase_, op, bytes, bytes_recv, peer, t_start_us, t_end_us}, kind,
                                 index});

  const int64_t ready_us = std::exchange(ready_us_, -1);
  if (!in_window_) return;
  pending_.push_back(CommRecord{step_, phase_, op, bytes, bytes_recv, peer, t_start_us, t_end_us, ready_us});
  pending_collective_.push_back(index);
  if (pending_.size() >= kMaxPendingRecords) write_pending();
}

void CommLog::record_compute(const char* name, int64_t t_start_us, int64_t t_end_us) {
  if (!active_ || !in_window_) return;
  CommRecord r{step_, phase_, name, 0, 0, -1, t_start_us, t_end_us};
  r.compute = true;
  pending_.push_back(r);
  pending_collective_.push_back(-1);
  if (pending_.size() >= kMaxPendingRecords) write_pending();
}

void CommLog::take_totals(int64_t& sent, int64_t& received) {
  sent = sent_;
  received = received_;
  sent_ = received_ = 0;
}

void CommLog::write_pending() {
  if (pending_.empty() || !file_) {
    pending_.clear();
    pending_collective_.clear();
    return;
  }
  // The field order and names are the published format (docs/architecture.md section 3); op tags are plain
  // identifiers, so they need no escaping.
  line_buffer_.clear();
  char line[320];
  for (const CommRecord& r : pending_) {
    const int len = std::snprintf(line, sizeof line,
                                  "{\"step\":%" PRId64 ",\"phase\":\"%s\",\"op\":\"%s\",\"bytes\":%" PRId64
                                  ",\"bytes_recv\":%" PRId64 ",\"peer\":%d,\"t_start_us\":%" PRId64
                                  ",\"t_end_us\":%" PRId64 "}\n",
                                  r.step, phase_name(r.phase), r.op, r.bytes, r.bytes_recv, r.peer, r.t_start_us,
                                  r.t_end_us);
    if (len <= 0) continue;
    line_buffer_.append(line, std::min<size_t>(static_cast<size_t>(len), sizeof line - 1) - 2);  // without "}\n"
    if (r.ready_us >= 0) line_buffer_ += ",\"ready_us\":" + std::to_string(r.ready_us);
    if (r.compute) line_buffer_ += ",\"kind\":\"compute\"";
    line_buffer_ += "}\n";
  }
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (pending_collective_[i] >= 0) written_collectives_.emplace_back(records_written_, pending_collective_[i]);
    ++records_written_;
  }
  pending_.clear();
  pending_collective_.clear();
  if (std::fwrite(line_buffer_.data(), 1, line_buffer_.size(), file_) != line_buffer_.size()) stop_logging(errno);
}

void CommLog::stop_logging(int err) {
  // A full disk must not kill a training run; stop logging and say so once. stdio may already have
  // written part of a record: cut the file back to what the last successful flush vouched for.
  std::fprintf(stderr, "comm log: write to %s failed (%s); logging stops, records up to the last flush kept\n",
               options_.path.c_str(), std::strerror(err));
  std::fclose(file_);
  file_ = nullptr;
  in_window_ = false;
  if (truncate(options_.path.c_str(), committed_) != 0)
    std::fprintf(stderr, "comm log: cannot cut %s back to its last whole record (%s)\n", options_.path.c_str(),
                 std::strerror(errno));
}

void CommLog::flush() {
  write_pending();
  if (!file_) return;
  if (std::fflush(file_) != 0) return stop_logging(errno);
  committed_ = std::ftell(file_);
}

void CommLog::set_waits(const std::vector<int64_t>& wait_us) {
  if (wait_us.size() != collectives_.size()) throw std::logic_error("set_waits: one wait per collective is needed");
  waits_ = wait_us;
  wait_note_.clear();
  for (OpStats& s : ops_) s.wait_us = 0;
  phases_[0].wait_us = phases_[1].wait_us = 0;
  for (size_t i = 0; i < collectives_.size(); ++i) {
    ops_[static_cast<size_t>(collectives_[i].op)].wait_us += waits_[i];
    phases_[static_cast<int>(collectives_[i].phase)].wait_us += waits_[i];
  }
  write_pending();
  if (written_collectives_.empty() || !file_) return;

  // Rewrite this run's part of the file: the bytes a previous run left are copied unchanged, and
  // each collective record gets ",\"wait_us\":W,\"transfer_us\":T" before its closing brace.
  std::fclose(file_);
  file_ = nullptr;
  const std::string tmp = options_.path + ".tmp";
  std::FILE* in = std::fopen(options_.path.c_str(), "rb");
  std::FILE* out = std::fopen(tmp.c_str(), "wb");
  auto fail = [&](const char* what) {
    if (in) std::fclose(in);
    if (out) std::fclose(out);
    std::remove(tmp.c_str());
    throw std::runtime_error(std::string("comm log: ") + what + " " + options_.path + ": " + std::strerror(errno));
  };
  if (!in || !out) fail("cannot rewrite");
  std::vector<char> head(1 << 16);
  for (int64_t left = file_start_bytes_; left > 0;) {
    const size_t n = std::fread(head.data(), 1, std::min<int64_t>(left, static_cast<int64_t>(head.size())), in);
    if (n == 0 || std::fwrite(head.data(), 1, n, out) != n) fail("cannot copy");
    left -= static_cast<int64_t>(n);
  }
  char* line = nullptr;
  size_t capacity = 0;
  ssize_t len = 0;
  int64_t record = 0;
  size_t next = 0;
  while ((len = getline(&line, &capacity, in)) > 0) {
    std::string text(line, static_cast<size_t>(len));
    if (next < written_collectives_.size() && written_collectives_[next].first == record) {
      const int64_t c = written_collectives_[next++].second;
      const int64_t duration = collectives_[static_cast<size_t>(c)].t_end_us - collectives_[static_cast<size_t>(c)].t_start_us;
      const size_t brace = text.rfind('}');
      if (brace != std::string::npos) {
        char extra[96];
        std::snprintf(extra, sizeof extra, ",\"wait_us\":%" PRId64 ",\"transfer_us\":%" PRId64, waits_[static_cast<size_t>(c)],
                      duration - waits_[static_cast<size_t>(c)]);
        text.insert(brace, extra);
      }
    }
    if (std::fwrite(text.data(), 1, text.size(), out) != text.size()) {
      std::free(line);
      fail("cannot write");
    }
    ++record;
  }
  std::free(line);
  std::fclose(in);
  in = nullptr;
  if (std::fflush(out) != 0) fail("cannot write");
  std::fclose(out);
  out = nullptr;
  if (std::rename(tmp.c_str(), options_.path.c_str()) != 0) fail("cannot replace");
  // Later records (none in a finished run) append after the rewritten ones.
  file_ = std::fopen(options_.path.c_str(), "ab");
  if (!file_) {
    std::fprintf(stderr, "comm log: cannot reopen %s (%s); logging stops\n", options_.path.c_str(), std::strerror(errno));
    in_window_ = false;
    return;
  }
  std::fseek(file_, 0, SEEK_END);
  file_start_bytes_ = std::ftell(file_);
  committed_ = file_start_bytes_;
  records_written_ = 0;
  written_collectives_.clear();
}

void CommLog::close() {
  flush();
  if (file_) std::fclose(file_);
  file_ = nullptr;
  active_ = false;
  in_window_ = false;
}

}  // namespace trainer::comm
