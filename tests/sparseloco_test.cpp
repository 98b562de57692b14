// SparseLoCo (comm/sync/methods/outer/sparseloco.h) and its codec (comm/sync/codecs/chunk_codec.h): the chunks, top-k per
// chunk, the 2/4/8-bit values and their bytes; the method against the paper's equations in NumPy
// (scripts/make_sparseloco_fixtures.py) at P = 2 and 3, plain and as Streaming DiLoCo with a delayed,
// overlapped exchange; the comm log's bytes; resume in flight bit for bit; the elastic mean.
// Run under mpiexec at 2 and 3 ranks (tests/CMakeLists.txt); each fixture case runs at its own P.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "comm/sync/codecs/chunk_codec.h"
#include "comm/sync/gradient_sync.h"
#include "comm/sync/methods/outer/sparseloco.h"
#include "models/backend.h"
#include "tests/reference_fixture.h"

using namespace trainer;
using Catch::Matchers::Contains;

namespace {

comm::Fragment whole(int64_t n, int64_t tensors) {
  comm::Fragment f;
  f.end = n;
  f.tensors = tensors;
  return f;
}

std::vector<models::ParamView> views_of(const std::vector<std::pair<std::string, models::Shape>>& shapes) {
  std::vector<models::ParamView> views;
  int64_t at = 0;
  for (const auto& [name, shape] : shapes) {
    views.push_back({name, at, shape});
    at += models::numel(shape);
  }
  return views;
}

// The value a code stands for at `bits` with scale s (chunk_codec.h).
float level(int64_t q, int bits, float s) { return (static_cast<float>(q) - static_cast<float>((1 << bits) - 1) / 2.f) * s; }

}  // namespace

TEST_CASE("chunk codec: 64 x 64 tiles of matrices (ragged at the edges), runs of 4096 of vectors", "[codec]") {
  const auto views = views_of({{"w", {65, 66}}, {"conv", {5, 3, 3, 3}}, {"v", {5000}}, {"row", {1, 40}}});
  const int64_t n = views.back().offset + 40;
  const auto chunks = comm::plan_chunks(whole(n, 4), &views, 0.02);
  REQUIRE(chunks.size() == 4 + 1 + 2 + 1);
  // The matrix 65 x 66: 64 x 64, 64 x 2, 1 x 64, 1 x 2, row-major over the tiles.
  CHECK(chunks[0].rows == 64);
  CHECK(chunks[0].cols == 64);
  CHECK(chunks[0].stride == 66);
  CHECK(chunks[1].begin == 64);
  CHECK(chunks[1].cols == 2);
  CHECK(chunks[2].begin == 64 * 66);
  CHECK(chunks[2].rows == 1);
  CHECK(chunks[3].size() == 2);
  CHECK(chunks[0].at(64) == 66);  // the second row of the first tile
  CHECK(chunks[0].k == 82);       // ceil(0.02 x 4096)
  CHECK(chunks[3].k == 1);        // at least one
  // conv 5 x 27: one tile; the vector: 4096 + 904; the 1 x 40 row: a run.
  CHECK(chunks[4].rows == 5);
  CHECK(chunks[4].cols == 27);
  CHECK(chunks[5].size() == 4096);
  CHECK(chunks[6].size() == 904);
  CHECK(chunks[6].begin == views[2].offset + 4096);
  CHECK(chunks[7].rows == 1);
  CHECK(chunks[7].size() == 40);
  // Every entry in exactly one chunk.
  std::vector<int> seen(static_cast<size_t>(n), 0);
  for (const auto& c : chunks)
    for (int64_t j = 0; j < c.size(); ++j) ++seen[static_cast<size_t>(c.at(j))];
  CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
}

TEST_CASE("chunk codec: top-k per chunk, 2/4/8-bit levels within half a step, the payload's bytes", "[codec]") {
  for (int bits : {2, 4, 8}) {
    CAPTURE(bits);
    // Two runs of 100 with known largest entries: chunk 0's are at 7 (-5), 30 (4), 99 (1.5); chunk 1
    // holds one large entry and ties among the rest (the lower positions win).
    std::vector<float> x(200, 0.f);
    for (int i = 0; i < 100; ++i) x[static_cast<size_t>(i)] = 0.01f * static_cast<float>(i % 7);
    x[7] = -5.f;
    x[30] = 4.f;
    x[99] = 1.5f;
    for (int i = 100; i < 200; ++i) x[static_cast<size_t>(i)] = 1.f;
    x[150] = -3.f;
    std::vector<comm::Chunk> chunks(2);
    for (int c = 0; c < 2; ++c) {
      chunks[static_cast<size_t>(c)].begin = 100 * c;
      chunks[static_cast<size_t>(c)].cols = 100;
      chunks[static_cast<size_t>(c)].stride = 100;
      chunks[static_cast<size_t>(c)].k = 3;
    }
    const comm::ChunkCodec codec(chunks, bits);
    CHECK(codec.kept() == 6);
    CHECK(codec.payload_bytes() == 2 * 4 + (6 * 12 + 7) / 8 + (6 * bits + 7) / 8);
    std::vector<uint8_t> payload(static_cast<size_t>(codec.payload_bytes()), 0xAB);
    codec.encode(x.data(), payload.data());
    std::vector<float> out(200, 0.f);
    codec.decode_add(payload.data(), 1.f, out.data());
    std::vector<int> sent;
    for (int i = 0; i < 200; ++i)
      if (out[static_cast<size_t>(i)] != 0.f) sent.push_back(i);
    CHECK(sent == std::vector<int>{7, 30, 99, 100, 101, 150});
    const float s0 = 5.f / (static_cast<float>((1 << bits) - 1) / 2.f), s1 = 3.f / (static_cast<float>((1 << bits) - 1) / 2.f);
    CHECK(out[7] == -5.f);  // the extremes are levels
    CHECK(out[150] == -3.f);
    for (int i : {30, 99}) CHECK(std::fabs(out[static_cast<size_t>(i)] - x[static_cast<size_t>(i)]) <= s0 / 2 * 1.0001f);
    for (int i : {100, 101}) CHECK(std::fabs(out[static_cast<size_t>(i)] - x[static_cast<size_t>(i)]) <= s1 / 2 * 1.0001f);
    if (bits == 2) {  // 2 bits: +-max and +-max / 3 only
      CHECK(out[30] == level(3, 2, s0));  // 4 -> 5 (nearer than 5/3)
      CHECK(out[99] == level(2, 2, s0));  // 1.5 -> 5/3
      CHECK(out[100] == level(2, 2, s1)); // 1 -> 1 (3 / 3)
    }
    // decode_add with -1 and an origin: what error feedback subtracts. out[0] stands for entry 50,
    // so out = shifted + 50 puts entry e at shifted[e]. (This case once decoded all 200 entries into
    // a buffer of 100, a heap overrun that only a changed allocation pattern made crash.)
    std::vector<float> shifted(200, 0.f);
    codec.decode_add(payload.data(), -1.f, shifted.data() + 50, 50);
    for (int i = 0; i < 200; ++i) CHECK(shifted[static_cast<size_t>(i)] == -out[static_cast<size_t>(i)]);
  }
  CHECK_THROWS_WITH(comm::ChunkCodec({}, 3), Contains("value_bits = 3"));
  // 32 bits: the values themselves, no scale.
  std::vector<float> x(100);
  for (int i = 0; i < 100; ++i) x[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i)) * static_cast<float>(i);
  comm::Chunk run;
  run.cols = run.stride = 100;
  run.k = 7;
  const comm::ChunkCodec exact({run}, 32);
  CHECK(exact.payload_bytes() == (7 * 12 + 7) / 8 + 7 * 4);
  std::vector<uint8_t> payload(static_cast<size_t>(exact.payload_bytes()));
  exact.encode(x.data(), payload.data());
  std::vector<float> out(100, 0.f);
  exact.decode_add(payload.data(), 1.f, out.data());
  int sent = 0;
  for (int i = 0; i < 100; ++i)
    if (out[static_cast<size_t>(i)] != 0.f) {
      ++sent;
      CHECK(out[static_cast<size_t>(i)] == x[static_cast<size_t>(i)]);
      CHECK(std::fabs(x[static_cast<size_t>(i)]) > 80.f);  // the 7 largest of |sin(0.37 i)| i < 100
    }
  CHECK(sent == 7);
}

TEST_CASE("chunk codec: a zero chunk decodes to zeros; bytes at 2% and 2 bits are over 50x below fp32", "[codec]") {
  const auto views = views_of({{"w", {256, 576}}, {"b", {256}}});
  const int64_t n = 256 * 576 + 256;
  const comm::ChunkCodec codec(comm::plan_chunks(whole(n, 2), &views, 0.02), 2);
  std::vector<float> x(static_cast<size_t>(n), 0.f);
  std::vector<uint8_t> payload(static_cast<size_t>(codec.payload_bytes()));
  codec.encode(x.data(), payload.data());
  std::vector<float> out(static_cast<size_t>(n), 0.f);
  codec.decode_add(payload.data(), 1.f, out.data());
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.f; }));
  const double ratio = 4.0 * static_cast<double>(n) / static_cast<double>(codec.payload_bytes());
  CAPTURE(codec.payload_bytes(), ratio);
  CHECK(ratio > 100);  // 14 bits per kept entry at 2%, one scale per 4096 entries: about 110x
}

namespace {

// The NumPy reference (scripts/make_sparseloco_fixtures.py), read once.
struct Fixture {
  static const testing::ReferenceFixture& get() {
    static const testing::ReferenceFixture f = testing::load_reference_fixture("sparseloco_reference");
    return f;
  }
};

comm::SyncOptions options(int64_t period, int64_t fragments, int64_t delay, const nlohmann::json& c) {
  comm::SyncOptions o;
  o.method = "sparseloco";
  o.set("period", period);
  o.set("fragments", fragments);
  o.set("sync_delay", delay);
  o.set("density", c["density"].get<double>());
  o.set("value_bits", c["bits"].get<int64_t>());
  o.set("error_decay", c["beta"].get<double>());
  o.set("outer_lr", c["alpha"].get<double>());
  return o;
}

// One rank of the fixture's run: round t starts with the local parameters at theta_outer - d[t][r]
// (the script's formula), then `period` steps that leave them as they are (the inner steps are given).
struct Replica {
  std::vector<models::ParamView> views;
  int64_t n = 0;
  std::vector<float> params, grads;
  comm::SyncBuffers b;
  std::unique_ptr<comm::GradientSync> sync;
  int64_t steps = 0;

  Replica(const nlohmann::json& c, const comm::SyncOptions& o) {
    for (const auto& v : c["views"]) views.push_back({v["name"], v["offset"].get<int64_t>(), v["shape"].get<models::Shape>()});
    n = c["n"].get<int64_t>();
    params.resize(static_cast<size_t>(n));
    grads.assign(static_cast<size_t>(n), 0.f);
    for (int64_t i = 0; i < n; ++i) params[static_cast<size_t>(i)] = static_cast<float>((i * 6151) % 4001 - 2000) * 1e-3f;
    b = comm::SyncBuffers{params.data(), grads.data(), n, nullptr, 0, &views};
    sync = comm::make_gradient_sync(o, comm::world(), n, &views);
    sync->reduce(b, 0);  // theta_outer = theta0, before round 0 moves the local parameters
  }
  comm::SparseLoco& method() { return dynamic_cast<comm::SparseLoco&>(*sync); }
  void begin_round(int64_t t, int rank) {
    const std::vector<float> outer = method().outer_parameters();
    std::vector<float> d(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      d[static_cast<size_t>(i)] = static_cast<float>((i * 7919 + t * 104729 + rank * 1299709) % 2001 - 1000) * 1e-5f;
    // The backend's subtraction (its own loop): outer - k x 1e-5 written in one expression here may
    // become a fused multiply-add, which NumPy's two roundings do not match.
    models::cpu_backend().subtract(n, outer.data(), d.data(), params.data());
  }
  void step() {
    sync->reduce(b, steps);
    sync->after_step(b, steps);
    ++steps;
  }
};

}  // namespace

TEST_CASE("sparseloco: the paper's equations in NumPy, bit for bit, plain and streaming with an overlapped delay", "[reference]") {
  const auto& f = Fixture::get();
  auto& world = comm::world();
  int ran = 0;
  for (const auto& c : f.meta["cases"]) {
    if (c["P"].get<int>() != world.size()) continue;
    ++ran;
    const int64_t rounds = c["rounds"], n = c["n"], at = c["at"];
    // H = 2, one fragment; and H = 4, two fragments, tau = 1 (the exchange on its thread): with the
    // local parameters still during a round, both must reproduce the same numbers.
    for (const auto& [H, F, tau] : std::vector<std::array<int64_t, 3>>{{2, 1, 0}, {4, 2, 1}}) {
      CAPTURE(c["P"].get<int>(), c["bits"].get<int>(), H, F, tau);
      Replica r(c, options(H, F, tau, c));
      for (int64_t t = 0; t < rounds; ++t) {
        r.begin_round(t, world.rank());
        for (int64_t k = 0; k < H; ++k) r.step();
        const std::vector<float> outer = r.method().outer_parameters();
        const float* want = f.values.data() + at + t * n;
        int64_t differ = 0;
        for (int64_t i = 0; i < n; ++i) differ += outer[static_cast<size_t>(i)] != want[i];
        CHECK(differ == 0);
        // Every rank's local parameters are theta_outer after the round.
        CHECK(r.params == outer);
      }
      const std::vector<float> e = r.method().accumulator();
      const float* want = f.values.data() + at + rounds * n + world.rank() * n;
      int64_t differ = 0;
      double largest = 0;
      for (int64_t i = 0; i < n; ++i) {
        differ += e[static_cast<size_t>(i)] != want[i];
        largest = std::max(largest, static_cast<double>(std::fabs(want[i])));
      }
      CHECK(differ == 0);
      CHECK(largest > 0);  // the accumulator holds what was not sent
    }
  }
  CHECK(ran > 0);
}

TEST_CASE("sparseloco: the comm log records each fragment's payload, its true size, once per sync", "[log]") {
  const auto& f = Fixture::get();
  auto& comm = comm::world();
  const auto& c = f.meta["cases"][0];
  comm::CommLogOptions log_options;
  log_options.enabled = true;
  comm.log().open(log_options, comm.rank(), comm.size());
  Replica r(c, options(4, 2, 1, c));
  r.begin_round(0, comm.rank());
  for (int k = 0; k < 8; ++k) r.step();
  r.sync->complete_in_flight();
  const auto ops = comm.log().op_stats();
  comm.log().open(comm::CommLogOptions{}, comm.rank(), comm.size());
  const auto gather = std::find_if(ops.begin(), ops.end(), [](const auto& op) { return op.op == "ALLGATHER_SPARSELOCO"; });
  REQUIRE(gather != ops.end());
  CHECK(gather->calls == 4);  // two rounds of two fragments
  const int64_t payloads = r.method().codec(0).payload_bytes() + r.method().codec(1).payload_bytes();
  // The log's convention for a collective: the data this rank puts in (an allgather's own payload;
  // diloco's ALLREDUCE_OUTER: the 4 n_f bytes of its fragment).
  CHECK(gather->bytes == 2 * payloads);
  CHECK(gather->bytes_recv == 2 * payloads * (comm.size() - 1));  // the others' payloads
  CHECK_THAT(r.sync->describe(), Contains("ALLGATHER_SPARSELOCO") && Contains("x)"));
}

TEST_CASE("sparseloco: a checkpoint with a fragment in flight resumes bit for bit", "[resume]") {
  const auto& f = Fixture::get();
  auto& comm = comm::world();
  const auto& c = f.meta["cases"][0];
  Replica straight(c, options(4, 2, 1, c)), first(c, options(4, 2, 1, c));
  std::string saved;
  for (int64_t t = 0; t < 3; ++t) {
    straight.begin_round(t, comm.rank());
    first.begin_round(t, comm.rank());
    for (int k = 0; k < 4; ++k) {
      straight.step();
      first.step();
      if (t == 1 && k == 0) {  // fragment 0 was sent after this step and is in flight
        std::ostringstream out;
        first.sync->save(out);
        saved = out.str();
        break;
      }
    }
    if (!saved.empty()) break;
  }
  // A new replica from the checkpoint: the parameters as saved, then the same steps.
  Replica resumed(c, options(4, 2, 1, c));
  resumed.params = first.params;
  resumed.steps = first.steps;
  std::istringstream in(saved);
  resumed.sync->load(in);
  for (int k = 1; k < 4; ++k) {
    straight.step();
    resumed.step();
  }
  for (int64_t t = 2; t < 4; ++t) {
    straight.begin_round(t, comm.rank());
    resumed.begin_round(t, comm.rank());
    for (int k = 0; k < 4; ++k) {
      straight.step();
      resumed.step();
    }
  }
  CHECK(resumed.method().outer_parameters() == straight.method().outer_parameters());
  CHECK(resumed.method().accumulator() == straight.method().accumulator());
  CHECK(resumed.params == straight.params);
  // Another run's options are refused, naming the key.
  Replica other(c, options(4, 2, 0, c));
  std::istringstream again(saved);
  CHECK_THROWS_WITH(other.sync->load(again), Contains("sync_delay"));
}

TEST_CASE("sparseloco: on another number of ranks each accumulator is the mean of the saved ones", "[reshard]") {
  const auto& f = Fixture::get();
  auto& comm = comm::world();
  const auto& c = f.meta["cases"][0];
  Replica r(c, options(2, 1, 0, c));
  r.begin_round(0, comm.rank());
  r.step();
  r.step();
  std::ostringstream out;
  r.sync->save(out);
  // This rank's saved state and its neighbour's: gathered so every rank sees all of them.
  const std::string mine = out.str();
  std::vector<char> all(mine.size() * static_cast<size_t>(comm.size()));
  comm.allgather(mine.data(), static_cast<int64_t>(mine.size()), all.data(), comm::DType::kU8, "TEST");
  std::vector<std::string> states;
  for (int p = 0; p < comm.size(); ++p) states.emplace_back(all.data() + p * mine.size(), mine.size());
  Replica fresh(c, options(2, 1, 0, c));
  CHECK_THAT(fresh.sync->load_resharded(states), Contains("mean of the " + std::to_string(comm.size())));
  CHECK(fresh.method().outer_parameters() == r.method().outer_parameters());
  // The mean, checked against the float64 sum of the saved accumulators (exact for 2-3 floats of
  // near magnitudes) divided by P.
  std::vector<double> sum(static_cast<size_t>(r.n), 0.0);
  for (const std::string& s : states) {
    Replica one(c, options(2, 1, 0, c));
    std::istringstream in(s);
    one.sync->load(in);
    const auto e = one.method().accumulator();
    for (size_t i = 0; i < e.size(); ++i) sum[i] += e[i];
  }
  const auto e = fresh.method().accumulator();
  for (size_t i = 0; i < e.size(); ++i) REQUIRE(e[i] == static_cast<float>(sum[i] / comm.size()));
  // A saved rank whose theta_outer differs is refused (a quarter in: inside theta_outer, the first
  // of the two n-float arrays).
  states.back()[states.back().size() / 4] ^= 0x40;
  Replica broken(c, options(2, 1, 0, c));
  CHECK_THROWS(broken.sync->load_resharded(states));
}
