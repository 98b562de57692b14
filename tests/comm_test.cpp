// The MPI communicator, the communication log and the summary, run under mpiexec with 1 to 4 ranks
// (tests/CMakeLists.txt). Every rank runs every test case in the same order, so collectives match;
// checks use CHECK rather than REQUIRE where a rank leaving a test early would leave the others
// waiting in a collective. Expected values are computed locally from what each rank is known to
// contribute.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "comm/comm_log.h"
#include "comm/comm_summary.h"
#include "comm/comm_wait.h"
#include "comm/communicator.h"
#include "comm/wire_format.h"

using namespace trainer::comm;

namespace {

// A folder all ranks share: rank 0 creates it and broadcasts its name.
std::string shared_temp_dir() {
  Communicator& c = world();
  static std::string dir;
  if (!dir.empty()) return dir;
  char name[256] = {0};
  if (c.rank() == 0) {
    std::string pattern = (std::filesystem::temp_directory_path() / "comm_test_XXXXXX").string();
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) std::abort();
    std::strncpy(name, buf.data(), sizeof name - 1);
  }
  c.broadcast(name, sizeof name, DType::kU8, 0, "TEST_DIR");
  dir = name;
  return dir;
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Rank r's contribution at index i: integers, so float sums are exact; signs vary so min and max
// come from different ranks.
double contribution(int r, int64_t i) { return static_cast<double>(((r * 7 + i * 3) % 11) - 5 + r); }

template <typename T>
void check_allreduce(DType type) {
  Communicator& c = world();
  const int64_t n = 257;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<T> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<T>(contribution(c.rank(), i));
    c.allreduce(x.data(), n, type, op, "ALLREDUCE_TEST");
    int wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      double want = contribution(0, i);
      for (int r = 1; r < c.size(); ++r) {
        const double v = contribution(r, i);
        want = op == ReduceOp::kSum ? want + v : op == ReduceOp::kMax ? std::max(want, v) : std::min(want, v);
      }
      if (x[i] != static_cast<T>(want)) ++wrong;
    }
    CHECK(wrong == 0);
  }
}

// What the helper sequence below sends and receives, by op tag, on a rank (the log's definitions).
struct Expect {
  int64_t calls = 0, bytes = 0, bytes_recv = 0;
};


// Every type and op, exact expectations (small integers).
void check_allreduce_all_types() {
  check_allreduce<float>(DType::kF32);
  check_allreduce<double>(DType::kF64);
  check_allreduce<int32_t>(DType::kI32);
  check_allreduce<int64_t>(DType::kI64);
  // Bytes: sum only, with small values that cannot overflow.
  Communicator& c = world();
  std::vector<uint8_t> b(40);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(c.rank() + i % 5);
  c.allreduce(b.data(), static_cast<int64_t>(b.size()), DType::kU8, ReduceOp::kSum, "ALLREDUCE_TEST");
  int wrong = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    int want = 0;
    for (int r = 0; r < c.size(); ++r) want += r + static_cast<int>(i % 5);
    if (b[i] != want) ++wrong;
  }
  CHECK(wrong == 0);
}

void check_sixteen_bit_allreduce() {
  Communicator& c = world();
  const int64_t n = 257;
  for (const WireDType wire : {WireDType::kBF16, WireDType::kF16}) {
    INFO(wire_dtype_name(wire));
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
      // Small integers: every contribution and every partial sum is exact in both formats, so the
      // result does not depend on the order MPI combines in.
      std::vector<float> x(n);
      for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(contribution(c.rank(), i));
      std::vector<uint16_t> h(n);
      narrow(wire, x.data(), n, 1.f, h.data());
      CommLogOptions options;
      options.enabled = true;
      c.log().open(options, c.rank(), c.size());
      c.allreduce(h.data(), n, wire_comm_dtype(wire), op, "ALLREDUCE_TEST");
      int64_t bytes = -1;
      for (const auto& s : c.log().op_stats())
        if (s.op == "ALLREDUCE_TEST") bytes = s.bytes;
      c.log().open(CommLogOptions{}, c.rank(), c.size());
      CHECK(bytes == 2 * n);
      widen(wire, h.data(), n, x.data());
      int wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        double want = contribution(0, i);
        for (int r = 1; r < c.size(); ++r) {
          const double v = contribution(r, i);
          want = op == ReduceOp::kSum ? want + v : op == ReduceOp::kMax ? std::max(want, v) : std::min(want, v);
        }
        if (x[i] != want) ++wrong;
      }
      CHECK(wrong == 0);
    }
  }
}

}  // namespace

TEST_CASE("allreduce sum, max and min for every type") { check_allreduce_all_types(); }

TEST_CASE("allreduce of the 16-bit wire formats: sum, max and min, 2 bytes per element in the log") {
  check_sixteen_bit_allreduce();
}

TEST_CASE("two ranks: large allreduces are one exchange of pieces, with MPI's results bit for bit") {
  // At P = 2 the exchange (comm/pair_allreduce.h) takes buffers from 1 MiB; lowered here to every
  // buffer, in 24-byte pieces, so the checks above run through it. Other sizes use MPI throughout.
  Communicator& c = world();
  const PairExchangeSizes previous = set_pair_exchange_sizes({1, 24});
  check_allreduce_all_types();
  check_sixteen_bit_allreduce();

  // Arbitrary floats (rounding in every add) and more pieces than MPI has tags for (32768): the
  // same bits as MPI's own allreduce, and the same on both ranks.
  const int64_t n = 40000;
  std::mt19937 rng(1234u + static_cast<unsigned>(c.rank()));
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> mine(n);
  for (float& v : mine) v = normal(rng);
  mine[7] = c.rank() == 0 ? std::numeric_limits<float>::infinity() : 1.f;
  std::vector<float> exchanged = mine, by_mpi = mine;
  set_pair_exchange_sizes({1, 4});
  c.allreduce(exchanged.data(), n, DType::kF32, ReduceOp::kSum, "ALLREDUCE_TEST");
  set_pair_exchange_sizes({int64_t(1) << 62, 4});
  c.allreduce(by_mpi.data(), n, DType::kF32, ReduceOp::kSum, "ALLREDUCE_TEST");
  CHECK(std::memcmp(exchanged.data(), by_mpi.data(), n * sizeof(float)) == 0);
  std::vector<float> rank0 = exchanged;
  c.broadcast(rank0.data(), n, DType::kF32, 0, "BROADCAST_TEST");
  CHECK(std::memcmp(exchanged.data(), rank0.data(), n * sizeof(float)) == 0);
  set_pair_exchange_sizes(previous);
}

TEST_CASE("allgather, separate buffers and in place") {
  Communicator& c = world();
  const int p = c.size(), me = c.rank();
  const int64_t n = 5;
  std::vector<int32_t> send(n), recv(n * p, -1);
  for (int64_t i = 0; i < n; ++i) send[i] = me * 100 + static_cast<int32_t>(i);
  c.allgather(send.data(), n, recv.data(), DType::kI32, "ALLGATHER_TEST");
  for (int r = 0; r < p; ++r)
    for (int64_t i = 0; i < n; ++i) CHECK(recv[r * n + i] == r * 100 + i);

  std::vector<double> inplace(n * p, -1.0);
  for (int64_t i = 0; i < n; ++i) inplace[me * n + i] = me + i * 0.5;
  c.allgather(inplace.data() + me * n, n, inplace.data(), DType::kF64, "ALLGATHER_TEST");
  for (int r = 0; r < p; ++r)
    for (int64_t i = 0; i < n; ++i) CHECK(inplace[r * n + i] == r + i * 0.5);
}

TEST_CASE("allgatherv with uneven counts, including zero") {
  Communicator& c = world();
  const int p = c.size(), me = c.rank();
  std::vector<int64_t> counts(p);
  for (int r = 0; r < p; ++r) counts[r] = (r * 3) % 4;  // 0, 3, 2, 1
  int64_t total = 0, mine_at = 0;
  for (int r = 0; r < p; ++r) {
    if (r == me) mine_at = total;
    total += counts[r];
  }
  std::vector<float> send(counts[me]);
  for (int64_t i = 0; i < counts[me]; ++i) send[i] = static_cast<float>(me * 1000 + i);
  std::vector<float> recv(std::max<int64_t>(total, 1), -1.0f);
  c.allgatherv(send.data(), counts[me], recv.data(), counts, DType::kF32, "ALLGATHERV_TEST");
  int64_t at = 0;
  for (int r = 0; r < p; ++r)
    for (int64_t i = 0; i < counts[r]; ++i) CHECK(recv[at++] == static_cast<float>(r * 1000 + i));

  // In place: this rank's block already sits in the output.
  std::vector<float> inplace(std::max<int64_t>(total, 1), -1.0f);
  for (int64_t i = 0; i < counts[me]; ++i) inplace[mine_at + i] = static_cast<float>(me * 1000 + i);
  c.allgatherv(inplace.data() + mine_at, counts[me], inplace.data(), counts, DType::kF32, "ALLGATHERV_TEST");
  CHECK(std::equal(inplace.begin(), inplace.begin() + total, recv.begin()));

  // Every rank contributing nothing is a valid call.
  std::vector<int64_t> zeros(p, 0);
  float dummy = 0;
  c.allgatherv(&dummy, 0, &dummy, zeros, DType::kF32, "ALLGATHERV_TEST");
}

TEST_CASE("alltoall delivers block r to rank r") {
  Communicator& c = world();
  const int p = c.size(), me = c.rank();
  const int64_t n = 3;
  std::vector<int64_t> send(n * p), recv(n * p, -1);
  for (int d = 0; d < p; ++d)
    for (int64_t i = 0; i < n; ++i) send[d * n + i] = me * 100 + d * 10 + i;
  c.alltoall(send.data(), n, recv.data(), DType::kI64, "ALLTOALL_TEST");
  for (int s = 0; s < p; ++s)
    for (int64_t i = 0; i < n; ++i) CHECK(recv[s * n + i] == s * 100 + me * 10 + i);
}

TEST_CASE("broadcast from the last rank") {
  Communicator& c = world();
  const int root = c.size() - 1;
  std::vector<double> x(33, -1.0);
  if (c.rank() == root)
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25 * i + root;
  c.broadcast(x.data(), static_cast<int64_t>(x.size()), DType::kF64, root, "BROADCAST_TEST");
  for (size_t i = 0; i < x.size(); ++i) CHECK(x[i] == 0.25 * i + root);
}

TEST_CASE("isend/irecv ring exchange with several channels in flight") {
  Communicator& c = world();
  const int p = c.size(), me = c.rank();
  const int next = (me + 1) % p, prev = (me - 1 + p) % p;
  const int channels = 3;
  // Several rounds, so finished request slots are reused.
  for (int round = 0; round < 3; ++round) {
    std::vector<std::vector<float>> out(channels), in(channels);
    std::vector<Request> requests;
    for (int ch = 0; ch < channels; ++ch) {
      const int64_t n = 10 + 7 * ch + round;  // channels differ in size, so a mix-up shows
      in[ch].assign(n, -1.0f);
      requests.push_back(c.irecv(in[ch].data(), n, DType::kF32, prev, ch, "IRECV_TEST"));
    }
    for (int ch = channels - 1; ch >= 0; --ch) {  // sent in the opposite order to the receives
      const int64_t n = 10 + 7 * ch + round;
      out[ch].resize(n);
      for (int64_t i = 0; i < n; ++i) out[ch][i] = static_cast<float>(me * 10000 + ch * 100 + i + round);
      requests.push_back(c.isend(out[ch].data(), n, DType::kF32, next, ch, "ISEND_TEST"));
    }
    if (round == 0) {
      // One by one.
      for (Request& r : requests) c.wait(r);
    } else {
      c.wait_all(requests);
    }
    for (const Request& r : requests) CHECK(r.id == -1);
    for (int ch = 0; ch < channels; ++ch)
      for (size_t i = 0; i < in[ch].size(); ++i)
        CHECK(in[ch][i] == static_cast<float>(prev * 10000 + ch * 100 + static_cast<int>(i) + round));
  }
}

TEST_CASE("split: the last rank alone and the others, each with its own collectives, one log") {
  Communicator& c = world();
  const int p = c.size(), me = c.rank();
  const bool last = me == p - 1;
  CommLogOptions options;
  options.enabled = true;
  c.log().open(options, me, p);
  // Colors: the last rank is "server" (1), the others "workers" (0); a negative color joins none.
  std::unique_ptr<Communicator> group = c.split(last ? 1 : 0, me);
  REQUIRE(group != nullptr);
  CHECK(group->size() == (last ? 1 : p - 1));
  CHECK(group->rank() == (last ? 0 : me));
  CHECK(&group->log() == &c.log());  // one log per process
  // A sum over the group only: the workers' ranks 0..p-2, or the last rank's own.
  int64_t x = me;
  const size_t world_collectives = c.log().collectives().size();
  group->allreduce(&x, 1, DType::kI64, ReduceOp::kSum, "ALLREDUCE_GROUP");
  CHECK(x == (last ? me : static_cast<int64_t>(p - 1) * (p - 2) / 2));
  // Not a collective of every rank: left out of the wait split, which matches calls across the job.
  CHECK(c.log().collectives().size() == world_collectives);
  std::unique_ptr<Communicator> none = c.split(me == 0 ? -1 : 0, 0);
  CHECK((none == nullptr) == (me == 0));
  if (none) CHECK(none->size() == p - 1);
  // The group's call is in the shared log under its own tag.
  const auto& ops = c.log().op_stats();
  const auto it = std::find_if(ops.begin(), ops.end(), [](const OpStats& o) { return o.op == "ALLREDUCE_GROUP"; });
  REQUIRE(it != ops.end());
  CHECK(it->calls == 1);
  CHECK(it->bytes == 8);
  c.log().open(CommLogOptions{}, me, p);
}

TEST_CASE("any-source receive: rank 0 learns who sent each message and how much", "[some_world_sizes][P2][P3][P4]") {
  Communicator& c = world();
  const int p = c.size(), me = c.rank();
  REQUIRE(p >= 2);  // someone to send
  const int channel = 7;
  if (me == 0) {
    // One message from every other rank, of 10 + r elements, in whatever order they arrive.
    std::vector<int> seen(p, 0);
    for (int k = 1; k < p; ++k) {
      std::vector<int32_t> in(64, -1);
      Request r = c.irecv(in.data(), 64, DType::kI32, kAnySource, channel, "IRECV_ANY");
      const Completion done = c.wait_completion(r);
      REQUIRE(done.peer >= 1);
      REQUIRE(done.peer < p);
      CHECK(done.count == 10 + done.peer);
      CHECK(in[0] == done.peer);
      CHECK(in[done.count - 1] == done.peer);
      CHECK(in[done.count] == -1);
      seen[done.peer] += 1;
    }
    for (int r = 1; r < p; ++r) CHECK(seen[r] == 1);
  } else {
    std::vector<int32_t> out(10 + me, me);
    Request s = c.isend(out.data(), static_cast<int64_t>(out.size()), DType::kI32, 0, channel, "ISEND_ANY");
    const Completion done = c.wait_completion(s);
    CHECK(done.peer == 0);
    CHECK(done.count == 10 + me);
  }
  c.barrier("BARRIER_TEST");
}

TEST_CASE("messages larger than a piece are cut and put back together") {
  // The 2^30-byte limit lowered to 64 bytes: every call below takes its many-piece path.
  Communicator& c = world();
  const int p = c.size(), me = c.rank();
  const int64_t previous = set_message_piece_bytes(64);

  std::vector<float> x(100);
  for (int64_t i = 0; i < 100; ++i) x[i] = static_cast<float>(contribution(me, i));
  c.allreduce(x.data(), 100, DType::kF32, ReduceOp::kSum, "ALLREDUCE_TEST");
  for (int64_t i = 0; i < 100; ++i) {
    double want = 0;
    for (int r = 0; r < p; ++r) want += contribution(r, i);
    CHECK(x[i] == static_cast<float>(want));
  }

  const int64_t n = 20;
  std::vector<int32_t> send(n), recv(n * p, -1);
  for (int64_t i = 0; i < n; ++i) send[i] = me * 100 + static_cast<int32_t>(i);
  c.allgather(send.data(), n, recv.data(), DType::kI32, "ALLGATHER_TEST");
  for (int r = 0; r < p; ++r)
    for (int64_t i = 0; i < n; ++i) CHECK(recv[r * n + i] == r * 100 + i);

  std::vector<int64_t> counts(p);
  int64_t total = 0;
  for (int r = 0; r < p; ++r) total += counts[r] = (r % 2) * 30;
  std::vector<int32_t> vsend(counts[me], me), vrecv(std::max<int64_t>(total, 1), -1);
  c.allgatherv(vsend.data(), counts[me], vrecv.data(), counts, DType::kI32, "ALLGATHERV_TEST");
  int64_t at = 0;
  for (int r = 0; r < p; ++r)
    for (int64_t i = 0; i < counts[r]; ++i) CHECK(vrecv[at++] == r);

  std::vector<int64_t> a_send(n * p), a_recv(n * p, -1);
  for (int d = 0; d < p; ++d)
    for (int64_t i = 0; i < n; ++i) a_send[d * n + i] = me * 1000 + d * 100 + i;
  c.alltoall(a_send.data(), n, a_recv.data(), DType::kI64, "ALLTOALL_TEST");
  for (int s = 0; s < p; ++s)
    for (int64_t i = 0; i < n; ++i) CHECK(a_recv[s * n + i] == s * 1000 + me * 100 + i);

  std::vector<double> b(50, me == 0 ? 3.5 : 0.0);
  c.broadcast(b.data(), 50, DType::kF64, 0, "BROADCAST_TEST");
  CHECK(std::all_of(b.begin(), b.end(), [](double v) { return v == 3.5; }));

  std::vector<float> out(75, static_cast<float>(me)), in(75, -1.0f);
  std::vector<Request> requests = {c.irecv(in.data(), 75, DType::kF32, (me - 1 + p) % p, 0, "IRECV_TEST"),
                                   c.isend(out.data(), 75, DType::kF32, (me + 1) % p, 0, "ISEND_TEST")};
  c.wait_all(requests);
  CHECK(std::all_of(in.begin(), in.end(), [&](float v) { return v == static_cast<float>((me - 1 + p) % p); }));

  set_message_piece_bytes(previous);
}

TEST_CASE("the log records every call with the defined byte counts") {
  Communicator& c = world();
  const int p = c.size(), me = c.rank();
  const int64_t P = p;
  const std::string path = shared_temp_dir() + "/log/rank" + std::to_string(me) + ".jsonl";
  CommLogOptions options;
  options.enabled = true;
  options.path = path;
  c.log().open(options, me, p);

  // A scripted sequence; expectations per op tag follow the definitions in communicator.h.
  std::map<std::string, Expect> want;
  auto expect = [&](const char* op, int64_t bytes, int64_t bytes_recv) {
    Expect& e = want[op];
    e.calls += 1;
    e.bytes += bytes;
    e.bytes_recv += bytes_recv;
  };
  c.log().set_step(0, Phase::kDense);
  std::vector<float> g(10, 1.0f);
  c.allreduce(g.data(), 10, DType::kF32, ReduceOp::kSum, "ALLREDUCE_DENSE");
  expect("ALLREDUCE_DENSE", 40, 40);

  c.log().set_step(1, Phase::kCompressed);
  std::vector<int32_t> one(3, me), all(3 * P);
  c.allgather(one.data(), 3, all.data(), DType::kI32, "ALLGATHER_COUNTS");
  expect("ALLGATHER_COUNTS", 12, 12 * (P - 1));

  std::vector<int64_t> counts(p);
  int64_t total = 0;
  for (int r = 0; r < p; ++r) total += counts[r] = r + 1;
  std::vector<float> vs(counts[me]), vr(total);
  c.allgatherv(vs.data(), counts[me], vr.data(), counts, DType::kF32, "ALLGATHERV_FINAL");
  expect("ALLGATHERV_FINAL", 4 * counts[me], 4 * (total - counts[me]));

  std::vector<int64_t> a(2 * P), b(2 * P);
  c.alltoall(a.data(), 2, b.data(), DType::kI64, "ALLTOALL_COUNTS");
  expect("ALLTOALL_COUNTS", (P - 1) * 16, (P - 1) * 16);

  std::vector<double> bc(5);
  c.broadcast(bc.data(), 5, DType::kF64, 0, "BROADCAST_PARAMS");
  expect("BROADCAST_PARAMS", me == 0 ? 40 : 0, me == 0 ? 0 : 40);

  c.barrier("BARRIER");
  expect("BARRIER", 0, 0);

  // The receive posts room for 10 floats and gets 7: the log says 7.
  std::vector<float> out(7, 1.0f), in(10);
  std::vector<Request> rq = {c.irecv(in.data(), 10, DType::kF32, (me - 1 + p) % p, 5, "IRECV_VALUE"),
                             c.isend(out.data(), 7, DType::kF32, (me + 1) % p, 5, "ISEND_VALUE")};
  c.wait_all(rq);
  expect("ISEND_VALUE", 28, 0);
  expect("IRECV_VALUE", 0, 28);

  int64_t sent = 0, received = 0;
  c.log().take_totals(sent, received);
  int64_t want_sent = 0, want_received = 0;
  for (const auto& [op, e] : want) {
    want_sent += e.bytes;
    want_received += e.bytes_recv;
  }
  CHECK(sent == want_sent);
  CHECK(received == want_received);
  c.log().take_totals(sent, received);
  CHECK(sent == 0);
  CHECK(received == 0);

  c.log().flush();
  std::map<std::string, Expect> got;
  for (const nlohmann::json& r : read_jsonl(path)) {
    const std::string op = r.at("op").get<std::string>();
    Expect& e = got[op];
    e.calls += 1;
    e.bytes += r.at("bytes").get<int64_t>();
    e.bytes_recv += r.at("bytes_recv").get<int64_t>();
    CHECK(r.size() == 8);  // exactly the published fields
    CHECK(r.at("t_end_us").get<int64_t>() >= r.at("t_start_us").get<int64_t>());
    const int64_t step = r.at("step").get<int64_t>();
    CHECK(r.at("phase") == (step == 0 ? "dense" : "compressed"));
    const int peer = r.at("peer").get<int>();
    if (op == "ISEND_VALUE") {
      CHECK(peer == (me + 1) % p);
    } else if (op == "IRECV_VALUE") {
      CHECK(peer == (me - 1 + p) % p);
    } else {
      CHECK(peer == -1);
    }
  }
  CHECK(got.size() == want.size());
  for (const auto& [op, e] : want) {
    INFO(op);
    CHECK(got[op].calls == e.calls);
    CHECK(got[op].bytes == e.bytes);
    CHECK(got[op].bytes_recv == e.bytes_recv);
  }
  // The in-memory statistics agree with the file.
  for (const OpStats& s : c.log().op_stats()) {
    INFO(s.op);
    CHECK(s.calls == want[s.op].calls);
    CHECK(s.bytes == want[s.op].bytes);
  }
  CHECK(c.log().phase_stats(Phase::kDense).calls == 1);
  CHECK(c.log().phase_stats(Phase::kCompressed).calls == static_cast<int64_t>(want.size()) - 1);
  c.log().open(CommLogOptions{}, me, p);
}

TEST_CASE("the step window and sampling limit records, not totals") {
  Communicator& c = world();
  const int p = c.size(), me = c.rank();
  const std::string path = shared_temp_dir() + "/window/rank" + std::to_string(me) + ".jsonl";
  CommLogOptions options;
  options.enabled = true;
  options.path = path;
  options.first_step = 2;
  options.last_step = 6;
  options.every = 2;
  c.log().open(options, me, p);
  std::vector<float> x(4, 1.0f);
  for (int64_t step = 0; step < 10; ++step) {
    c.log().set_step(step, Phase::kDense);
    c.allreduce(x.data(), 4, DType::kF32, ReduceOp::kSum, "ALLREDUCE_DENSE");
  }
  int64_t sent = 0, received = 0;
  c.log().take_totals(sent, received);
  CHECK(sent == 10 * 16);
  CHECK(received == 10 * 16);
  REQUIRE(c.log().op_stats().size() == 1);
  CHECK(c.log().op_stats()[0].calls == 10);  // the summary covers every step
  c.log().flush();
  std::vector<int64_t> steps;
  for (const nlohmann::json& r : read_jsonl(path)) steps.push_back(r.at("step").get<int64_t>());
  CHECK(steps == std::vector<int64_t>{2, 4, 6});

  // Disabled: nothing is timed or kept, but totals still count.
  c.log().open(CommLogOptions{}, me, p);
  c.allreduce(x.data(), 4, DType::kF32, ReduceOp::kSum, "ALLREDUCE_DENSE");
  c.log().take_totals(sent, received);
  CHECK(sent == 16);
  CHECK(c.log().op_stats().empty());

  // Enabled without a path: statistics for the summary, no records.
  CommLogOptions stats_only;
  stats_only.enabled = true;
  c.log().open(stats_only, me, p);
  c.allreduce(x.data(), 4, DType::kF32, ReduceOp::kSum, "ALLREDUCE_DENSE");
  REQUIRE(c.log().op_stats().size() == 1);
  CHECK(c.log().op_stats()[0].calls == 1);
  c.log().take_totals(sent, received);
  CHECK(sent == 16);
  const std::string text = comm_summary(c);
  if (me == 0) CHECK(text.find("disabled") == std::string::npos);
  c.log().open(CommLogOptions{}, me, p);
  const std::string disabled_text = comm_summary(c);
  const std::string note = "the comm log was disabled on " + std::to_string(p) + " of";
  if (me == 0) CHECK(disabled_text.find(note) != std::string::npos);

  // Paused: not even the totals move.
  {
    CommLog::Pause pause(c.log());
    c.allreduce(x.data(), 4, DType::kF32, ReduceOp::kSum, "ALLREDUCE_DENSE");
  }
  c.log().take_totals(sent, received);
  CHECK(sent == 0);
}

TEST_CASE("waits: the last rank to enter a collective waits 0, the others wait for it") {
  Communicator& c = world();
  const int p = c.size(), me = c.rank();
  const std::string path = shared_temp_dir() + "/wait/rank" + std::to_string(me) + ".jsonl";
  CommLogOptions options;
  options.enabled = true;
  options.path = path;
  c.log().open(options, me, p);
  align_log_clock(c);
  CHECK(c.log().clock().valid);

  std::vector<float> g(100, 1.0f);
  c.log().set_step(0, Phase::kDense);
  c.allreduce(g.data(), 100, DType::kF32, ReduceOp::kSum, "ALLREDUCE_DENSE");
  // The last rank arrives 200 ms late at the second call: a skew far above the clock precision.
  if (me == p - 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  c.allreduce(g.data(), 100, DType::kF32, ReduceOp::kSum, "ALLREDUCE_DENSE");
  std::vector<float> in(10);
  std::vector<Request> rq = {c.irecv(in.data(), 10, DType::kF32, (me - 1 + p) % p, 0, "IRECV_INDEX"),
                             c.isend(g.data(), 10, DType::kF32, (me + 1) % p, 0, "ISEND_INDEX")};
  c.wait_all(rq);
  c.barrier("BARRIER_TEST");

  resolve_waits(c);
  REQUIRE(c.log().waits().size() == 3);  // the two allreduces and the barrier; messages have none
  CHECK(c.log().wait_note().empty());
  const std::vector<int64_t> w = c.log().waits();
  if (me == p - 1) {
    CHECK(w[1] == 0);
  } else {
    CHECK(w[1] > 50000);
  }
  {
    CommLog::Pause pause(c.log());  // the test's own checks are not part of the log
    for (size_t i = 0; i < w.size(); ++i) {  // someone entered last and waited exactly 0
      int64_t least = w[i];
      c.allreduce(&least, 1, DType::kI64, ReduceOp::kMin, "TEST_MIN");
      CHECK(least == 0);
    }
  }
  // The records of the collectives carry the split; messages do not.
  c.log().flush();
  int collectives = 0;
  for (const nlohmann::json& r : read_jsonl(path)) {
    INFO(r.dump());
    const int64_t duration = r["t_end_us"].get<int64_t>() - r["t_start_us"].get<int64_t>();
    if (r["peer"] == -1) {
      CHECK(r["wait_us"].get<int64_t>() == w[static_cast<size_t>(collectives)]);
      CHECK(r["wait_us"].get<int64_t>() + r["transfer_us"].get<int64_t>() == duration);
      ++collectives;
    } else {
      CHECK_FALSE(r.contains("wait_us"));
    }
  }
  CHECK(collectives == 3);
  // The summary splits the per-op time and names every rank's wait.
  const std::string text = comm_summary(c);
  if (me == 0) {
    INFO(text);
    CHECK(text.find("wait per rank in collectives, ms: r0 ") != std::string::npos);
    CHECK(text.find("r" + std::to_string(p - 1) + " ") != std::string::npos);
  }
  c.log().open(CommLogOptions{}, me, p);
  c.barrier("TEST_END");
}

TEST_CASE("the summary on rank 0 lists every op with its calls over all ranks") {
  Communicator& c = world();
  const int p = c.size(), me = c.rank();
  const std::string dir = shared_temp_dir() + "/summary";
  CommLogOptions options;
  options.enabled = true;
  options.path = dir + "/rank" + std::to_string(me) + ".jsonl";
  c.log().open(options, me, p);

  std::vector<float> g(1000, 1.0f);
  c.log().set_step(0, Phase::kDense);
  for (int i = 0; i < 3; ++i) c.allreduce(g.data(), 1000, DType::kF32, ReduceOp::kSum, "ALLREDUCE_DENSE");
  c.log().set_step(1, Phase::kCompressed);
  std::vector<int64_t> counts(p, 10);
  std::vector<float> all(10 * p);
  for (int i = 0; i < 2; ++i)
    c.allgatherv(g.data(), 10, all.data(), counts, DType::kF32, "ALLGATHERV_FINAL");
  std::vector<float> in(10);
  std::vector<Request> rq = {c.irecv(in.data(), 10, DType::kF32, (me - 1 + p) % p, 0, "IRECV_INDEX"),
                             c.isend(g.data(), 10, DType::kF32, (me + 1) % p, 0, "ISEND_INDEX")};
  c.wait_all(rq);

  int64_t sent_before = 0, received_before = 0;
  c.log().take_totals(sent_before, received_before);
  const std::string text = comm_summary(c);
  int64_t sent_after = -1, received_after = -1;
  c.log().take_totals(sent_after, received_after);
  CHECK(sent_after == 0);  // the summary's own traffic is not part of the run
  CHECK(received_after == 0);

  if (me != 0) {
    CHECK(text.empty());
  } else {
    INFO(text);
    // Row: op, kind, calls, ...
    std::map<std::string, std::pair<std::string, long>> rows;
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream words(line);
      std::string op, kind;
      long calls = -1;
      if (words >> op >> kind >> calls) rows[op] = {kind, calls};
    }
    CHECK(rows["ALLREDUCE_DENSE"] == std::make_pair(std::string("allreduce"), 3L * p));
    CHECK(rows["ALLGATHERV_FINAL"] == std::make_pair(std::string("allgatherv"), 2L * p));
    CHECK(rows["ISEND_INDEX"] == std::make_pair(std::string("p2p"), 1L * p));
    CHECK(rows["IRECV_INDEX"] == std::make_pair(std::string("p2p"), 1L * p));
    CHECK(rows.count("SUMMARY_LENGTHS") == 0);
    CHECK(rows.count("SUMMARY_STATS") == 0);
    // Phase rows have no kind column: the first number follows the name.
    auto phase_calls = [&](const std::string& name) {
      std::istringstream all_lines(text);
      std::string l;
      while (std::getline(all_lines, l)) {
        std::istringstream words(l);
        std::string first;
        long calls = -1;
        if (words >> first && first == name && words >> calls) return calls;
      }
      return -1L;
    };
    CHECK(phase_calls("dense") == 3L * p);
    CHECK(phase_calls("compressed") == 4L * p);
    CHECK(phase_calls("total") == 7L * p);
    CHECK(text.find("busbw GB/s") != std::string::npos);

    write_comm_summary(text, dir + "/summary.txt");
    std::ifstream f(dir + "/summary.txt");
    std::stringstream back;
    back << f.rdbuf();
    CHECK(back.str() == text);
    CHECK_FALSE(std::filesystem::exists(dir + "/summary.txt.tmp"));
  }
  c.log().open(CommLogOptions{}, me, p);
  c.barrier("TEST_END");
  if (me == 0) std::filesystem::remove_all(shared_temp_dir());
}
