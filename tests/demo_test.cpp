// DeMo (comm/sync/methods/demo/demo.h) and its DCT (comm/sync/methods/demo/chunk_dct.h): the transform is orthonormal and its
// inverse undoes it; the method against DeMo's step written out in NumPy
// (scripts/make_demo_fixtures.py) at P = 2, in fp32 and 4-bit components; resume and the elastic
// mean of the momenta. Run under mpiexec at 2 ranks (tests/CMakeLists.txt).
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "comm/sync/methods/demo/chunk_dct.h"
#include "comm/sync/methods/demo/demo.h"
#include "comm/sync/gradient_sync.h"
#include "tests/reference_fixture.h"

using namespace trainer;
using Catch::Matchers::Contains;

TEST_CASE("chunk DCT: orthonormal per tile and run, the inverse undoes it", "[dct]") {
  std::vector<models::ParamView> views{{"w", 0, {65, 66}}, {"b", 65 * 66, {100}}};
  const int64_t n = 65 * 66 + 100;
  const auto chunks = comm::plan_chunks(comm::Fragment{0, n, 0, 2}, &views, 0.1, 64);
  REQUIRE(chunks.size() == 4 + 2);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = std::sin(0.1f * static_cast<float>(i)) + 0.01f * static_cast<float>(i % 13);
  std::vector<float> y = x;
  comm::ChunkDct dct;
  dct.forward(chunks, y.data());
  // Each chunk's norm is kept; a constant run goes to its first component alone.
  for (const auto& c : chunks) {
    double a = 0, b = 0;
    for (int64_t j = 0; j < c.size(); ++j) {
      a += static_cast<double>(x[c.at(j)]) * x[c.at(j)];
      b += static_cast<double>(y[c.at(j)]) * y[c.at(j)];
    }
    CHECK(b == Approx(a).epsilon(1e-5));
  }
  dct.inverse(chunks, y.data());
  for (int64_t i = 0; i < n; ++i) REQUIRE(y[static_cast<size_t>(i)] == Approx(x[static_cast<size_t>(i)]).margin(1e-5));
  std::vector<float> ones(100, 2.f);
  comm::Chunk run;
  run.cols = run.stride = 64;
  dct.forward({run}, ones.data());
  CHECK(ones[0] == Approx(16.f));  // 2 x sqrt(64)
  CHECK(std::fabs(ones[1]) < 1e-6f);
}

namespace {

// The NumPy reference (scripts/make_demo_fixtures.py), read once.
struct Fixture {
  static const testing::ReferenceFixture& get() {
    static const testing::ReferenceFixture f = testing::load_reference_fixture("demo_reference");
    return f;
  }
};

// One rank of the fixture: each step's gradient from the script's formula, through reduce().
struct Rank {
  std::vector<models::ParamView> views;
  int64_t n = 0;
  std::vector<float> params, grads;
  comm::SyncBuffers b;
  std::unique_ptr<comm::GradientSync> sync;
  int64_t steps = 0;

  explicit Rank(const nlohmann::json& c) {
    for (const auto& v : c["views"]) views.push_back({v["name"], v["offset"].get<int64_t>(), v["shape"].get<models::Shape>()});
    n = c["n"].get<int64_t>();
    params.assign(static_cast<size_t>(n), 0.f);
    grads.resize(static_cast<size_t>(n));
    b = comm::SyncBuffers{params.data(), grads.data(), n, nullptr, 0, &views};
    comm::SyncOptions o;
    o.method = "demo";
    o.set("density", c["density"].get<double>());
    o.set("value_bits", c["bits"].get<int64_t>());
    o.set("error_decay", c["beta"].get<double>());
    sync = comm::make_gradient_sync(o, comm::world(), n, &views);
  }
  const comm::Demo& demo() const { return dynamic_cast<const comm::Demo&>(*sync); }
  void step() {
    const int r = comm::world().rank();
    for (int64_t i = 0; i < n; ++i)
      grads[static_cast<size_t>(i)] = static_cast<float>((i * 7919 + steps * 104729 + r * 1299709) % 2001 - 1000) * 1e-3f;
    sync->reduce(b, steps);
    ++steps;
  }
};

}  // namespace

TEST_CASE("demo: DeMo's step in NumPy, the signs and the momenta", "[reference]") {
  const auto& f = Fixture::get();
  REQUIRE(comm::world().size() == 2);
  for (const auto& c : f.meta["cases"]) {
    CAPTURE(c["bits"].get<int>());
    Rank r(c);
    const int64_t n = r.n, at = c["at"];
    for (int64_t t = 0; t < c["steps"].get<int64_t>(); ++t) {
      r.step();
      int64_t differ = 0, nonzero = 0;
      for (int64_t i = 0; i < n; ++i) {
        differ += r.grads[static_cast<size_t>(i)] != f.values[static_cast<size_t>(at + t * n + i)];
        nonzero += r.grads[static_cast<size_t>(i)] != 0.f;
      }
      CHECK(differ == 0);
      CHECK(nonzero > n / 2);  // the IDCT spreads the few components over the chunks
    }
    // The momentum: float64 DCT sums in another order than NumPy's, rounded to float32: equal
    // within a few float32 roundings of the momentum's size.
    const float* want = f.values.data() + at + c["steps"].get<int64_t>() * n + comm::world().rank() * n;
    const auto& m = r.demo().momentum();
    for (int64_t i = 0; i < n; ++i) REQUIRE(m[static_cast<size_t>(i)] == Approx(want[i]).margin(2e-6));
  }
}

TEST_CASE("demo: resume bit for bit, and on another number of ranks the mean of the momenta", "[resume]") {
  const auto& c = Fixture::get().meta["cases"][0];
  Rank straight(c), first(c);
  for (int t = 0; t < 2; ++t) {
    straight.step();
    first.step();
  }
  std::ostringstream out;
  first.sync->save(out);
  Rank resumed(c);
  resumed.steps = first.steps;
  std::istringstream in(out.str());
  resumed.sync->load(in);
  straight.step();
  resumed.step();
  CHECK(resumed.grads == straight.grads);
  CHECK(resumed.demo().momentum() == straight.demo().momentum());
  // Elastic: two saved ranks' states, the mean of their momenta.
  auto& comm = comm::world();
  const std::string mine = out.str();
  std::vector<char> all(mine.size() * 2);
  comm.allgather(mine.data(), static_cast<int64_t>(mine.size()), all.data(), comm::DType::kU8, "TEST");
  const std::vector<std::string> states{std::string(all.data(), mine.size()), std::string(all.data() + mine.size(), mine.size())};
  Rank wider(c);
  CHECK_THAT(wider.sync->load_resharded(states), Contains("mean of the 2 saved"));
  std::vector<std::vector<float>> saved;
  for (const auto& s : states) {
    Rank one(c);
    std::istringstream is(s);
    one.sync->load(is);
    saved.push_back(one.demo().momentum());
  }
  for (size_t i = 0; i < saved[0].size(); ++i)
    REQUIRE(wider.demo().momentum()[i] == static_cast<float>((static_cast<double>(saved[0][i]) + saved[1][i]) / 2));
}
