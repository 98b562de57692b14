// sync.<method>.keep_dense (comm/sync/wrappers/keep_dense.h), under mpiexec at 2 and 3 ranks: the kept tensors come
// out as the exact average (allreduce_average's bits, as dense sync) and the rest as the same method run alone on
// the remaining entries, bit for bit, for each sparse method; PowerSGD sends a kept matrix dense
// (its bytes and its exact average); the state resumes; bad patterns and methods are clear errors.
#include "comm/sync/wrappers/keep_dense.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <sstream>

#include "comm/communicator.h"
#include "comm/sync/methods/dense/dense.h"
#include "comm/sync/gradient_sync.h"
#include "comm/sync/methods/powersgd/powersgd.h"
#include "tests/method_keys.h"

using namespace trainer;
using models::ParamView;

namespace {

// An encoder, a decoder and an output layer, as named in a speech model.
std::vector<ParamView> views() {
  std::vector<ParamView> v;
  int64_t offset = 0;
  for (const auto& [name, shape] : std::vector<std::pair<std::string, models::Shape>>{{"enc.weight", {64, 40}},
                                                                                       {"enc.bias", {64}},
                                                                                       {"dec.weight", {32, 64}},
                                                                                       {"dec.bias", {32}},
                                                                                       {"out.weight", {10, 32}}}) {
    v.push_back({name, offset, shape});
    offset += v.back().numel();
  }
  return v;
}

int64_t total(const std::vector<ParamView>& v) { return v.back().offset + v.back().numel(); }

std::vector<float> gradient(int64_t step, int rank, int64_t n) {
  // One distribution per engine: a normal_distribution caches its second value, so sharing one
  // between two engines would hand every rank the shared engine's numbers.
  std::mt19937_64 shared(300 + step), own(9100 + 37 * step + rank);
  std::normal_distribution<float> normal_shared, normal_own;
  std::vector<float> g(n);
  for (auto& x : g) x = 0.5f * normal_shared(shared) + normal_own(own);
  return g;
}

comm::SyncOptions options(const std::string& method, const std::string& keep) {
  comm::SyncOptions o;
  o.method = method;
  testing::set_if_own(o, "density", 0.05);
  testing::set_if_own(o, "local_threshold_every", 1);
  testing::set_if_own(o, "global_threshold_every", 1);
  testing::set_if_own(o, "keep_dense", keep);
  testing::set_if_own(o, "rank", 2);  // powersgd: the factors' sizes below are rank 2's
  return o;
}

// The entries of `g` in the views `pick` selects, in model order.
std::vector<float> part(const std::vector<float>& g, const std::vector<ParamView>& v, bool kept,
                        const std::vector<bool>& pick) {
  std::vector<float> out;
  for (size_t i = 0; i < v.size(); ++i)
    if (pick[i] == kept) out.insert(out.end(), g.begin() + v[i].offset, g.begin() + v[i].offset + v[i].numel());
  return out;
}

}  // namespace

TEST_CASE("Tensors kept dense are the exact average; the rest is the method alone on the other entries, bit for bit",
          "[keep_dense][mpi]") {
  comm::Communicator& comm = comm::world();
  const auto v = views();
  const int64_t n = total(v);
  const std::vector<bool> kept = comm::match_keep_dense("dec.*", v);
  REQUIRE(kept == std::vector<bool>{false, false, true, true, false});
  const int64_t n_kept = 32 * 64 + 32;
  for (const std::string method : {"oktopk", "topka", "gaussiank"}) {
    CAPTURE(method);
    auto with_keep = comm::make_gradient_sync(options(method, "dec.*"), comm, n, &v);
    auto alone = comm::make_gradient_sync(options(method, ""), comm, n - n_kept, nullptr);
    CHECK(with_keep->describe().find("kept dense") != std::string::npos);
    for (int64_t step = 0; step < 4; ++step) {
      std::vector<float> g = gradient(step, comm.rank(), n);
      std::vector<float> rest = part(g, v, false, kept), dec = part(g, v, true, kept);
      comm::SyncBuffers b{nullptr, g.data(), n, nullptr, 0, &v};
      const comm::SyncStats stats = with_keep->reduce(b, step);
      comm::SyncBuffers rb{nullptr, rest.data(), n - n_kept};
      alone->reduce(rb, step);
      comm::allreduce_average(comm, models::cpu_backend(), dec.data(), n_kept, comm::bucket_elements(8.0), "TEST");
      CHECK(part(g, v, false, kept) == rest);
      CHECK(part(g, v, true, kept) == dec);
      CHECK(stats.phase == comm::Phase::kCompressed);
      CHECK(stats.density > static_cast<double>(n_kept) / n);
    }
    // The state is the method's over the other entries: it resumes to the same bits.
    std::stringstream saved;
    with_keep->save(saved);
    auto resumed = comm::make_gradient_sync(options(method, "dec.*"), comm, n, &v);
    resumed->load(saved);
    std::vector<float> g1 = gradient(9, comm.rank(), n), g2 = g1;
    comm::SyncBuffers b1{nullptr, g1.data(), n, nullptr, 0, &v}, b2{nullptr, g2.data(), n, nullptr, 0, &v};
    with_keep->reduce(b1, 9);
    resumed->reduce(b2, 9);
    CHECK(std::memcmp(g1.data(), g2.data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("PowerSGD sends a kept matrix dense: its exact average, and its entries in the bytes", "[keep_dense][mpi]") {
  comm::Communicator& comm = comm::world();
  const auto v = views();
  const int64_t n = total(v);
  comm::SyncOptions o = options("powersgd", "");
  auto all = comm::make_gradient_sync(o, comm, n, &v);
  o.set("keep_dense", "dec.weight");
  auto keep = comm::make_gradient_sync(o, comm, n, &v);
  const auto& a = dynamic_cast<const comm::PowerSgd&>(*all);
  const auto& k = dynamic_cast<const comm::PowerSgd&>(*keep);
  REQUIRE(k.matrices().size() + 1 == a.matrices().size());
  // dec.weight (32 x 64) leaves the factors ((32 + 64) x 2) and joins the dense part.
  CHECK(k.floats_per_step() == a.floats_per_step() - (32 + 64) * 2 + 32 * 64);

  std::vector<float> g = gradient(0, comm.rank(), n);
  std::vector<float> dec(g.begin() + v[2].offset, g.begin() + v[2].offset + v[2].numel());
  comm::SyncBuffers b{nullptr, g.data(), n, nullptr, 0, &v};
  keep->reduce(b, 0);
  comm::allreduce_average(comm, models::cpu_backend(), dec.data(), v[2].numel(), comm::bucket_elements(8.0), "TEST");
  CHECK(std::memcmp(g.data() + v[2].offset, dec.data(), dec.size() * sizeof(float)) == 0);
}

TEST_CASE("sync.keep_dense errors name the key", "[keep_dense]") {
  comm::Communicator& comm = comm::world();
  const auto v = views();
  const int64_t n = total(v);
  CHECK_THROWS_WITH(comm::make_gradient_sync(options("oktopk", "dec.*,decoder.*"), comm, n, &v),
                    Catch::Contains("keep_dense: 'decoder.*' matches no parameter tensor"));
  // dense has no such key in its table (the config refuses the flat spelling: config_test.cpp).
  comm::SyncOptions dense;
  CHECK_THROWS_WITH(dense.set("keep_dense", "dec.*"), Catch::Contains("no sync method has a key sync.dense.keep_dense"));
  CHECK_THROWS_WITH(comm::make_gradient_sync(options("topka", "*"), comm, n, &v),
                    Catch::Contains("nothing is left to compress"));
  CHECK_THROWS_WITH(comm::make_gradient_sync(options("topka", "dec.*"), comm, n, nullptr),
                    Catch::Contains("needs the model's tensor names"));
  // Spaces around the commas are allowed; several patterns add up.
  CHECK(comm::match_keep_dense(" enc.bias , out.* ", v) == std::vector<bool>{false, true, false, false, true});
}
