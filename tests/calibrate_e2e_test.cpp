// `trainer calibrate` under mpiexec at P = 2 with tiny sizes (a smoke test: it runs, prints its table,
// writes a file that loads and fits), and `trainer whatif --calibration` reading that file. Plain
// test that launches mpiexec itself, like parallel_e2e_test.
#include <catch2/catch.hpp>

#include <string>

#include "comm/network_calibration.h"
#include "process.h"

using Catch::Matchers::Contains;
using trainer::testing::run_command;
using trainer::testing::TempDir;

namespace {

std::string calibrate(int ranks, const std::string& out, const std::string& extra = "") {
  return std::string(TRAINER_MPIEXEC) + " -n " + std::to_string(ranks) + " -x OMP_NUM_THREADS=1 " + TRAINER_BINARY +
         " calibrate --out " + out + " --min-bytes 256 --max-bytes 1048576 --repeats 3" + extra;
}

const std::string kRun = std::string(TRAINER_SOURCE_DIR) + "/tests/fixtures/report_run";  // 2 ranks, oktopk

}  // namespace

TEST_CASE("trainer calibrate at P = 2 measures, fits and writes a file whatif reads") {
  TempDir dir("calibrate_e2e");
  const std::string file = dir.file("net.json");
  const auto done = run_command(calibrate(2, file, " --nominal 10gbit"));
  INFO(done.output);
  REQUIRE(done.exit_code == 0);
  CHECK_THAT(done.output, Contains("calibrate: P = 2") && Contains("fit allreduce: latency") &&
                              Contains("fit p2p:") && Contains("wrote " + file));
  const trainer::comm::NetworkCalibration c = trainer::comm::load_calibration(file);
  CHECK(c.ranks == 2);
  CHECK(c.hosts.size() == 2);
  CHECK(c.repeats == 3);
  CHECK(c.nominal_bandwidth == Approx(1.25e9));
  // 256 B by 4 up to 1 MiB: seven sizes of each kind (unless a call took over 0.25 s).
  CHECK(c.allreduce.size() >= 2);
  CHECK(c.allreduce.size() <= 7);
  CHECK(c.p2p.size() >= 2);
  CHECK(c.allreduce.front().bytes == 256);
  CHECK(c.allreduce.front().samples_s.size() == 3);
  CHECK(c.allreduce_fit.network.bandwidth > 0);
  CHECK(c.p2p_fit.network.bandwidth > 0);

  const auto same = run_command(std::string(TRAINER_BINARY) + " whatif " + kRun + " --calibration " + file);
  INFO(same.output);
  CHECK(same.exit_code == 0);
  CHECK_THAT(same.output, Contains("rates: calibrated: ") && Contains("measured at P=2 on " + c.date));
  CHECK_THAT(same.output, !Contains("extrapolated"));
  const auto four = run_command(std::string(TRAINER_BINARY) + " whatif " + kRun + " --calibration " + file +
                                " --ranks 4");
  CHECK_THAT(four.output, Contains("extrapolated from P=2 to P=4"));
}

TEST_CASE("trainer calibrate and whatif --calibration: bad use is one error line") {
  TempDir dir("calibrate_e2e_bad");
  const auto alone = run_command(calibrate(1, dir.file("one.json")));
  CHECK(alone.exit_code == 1);
  CHECK_THAT(alone.output, Contains("error: trainer calibrate needs at least 2 ranks"));
  const auto unit = run_command(calibrate(2, dir.file("two.json"), " --nominal fast"));
  CHECK(unit.exit_code == 1);
  CHECK_THAT(unit.output, Contains("error: bandwidth 'fast'"));
  const auto missing = run_command(std::string(TRAINER_BINARY) + " whatif " + kRun + " --calibration " +
                                   dir.file("absent.json"));
  CHECK(missing.exit_code == 1);
  CHECK_THAT(missing.output, Contains("error: " + dir.file("absent.json") + ": cannot open the calibration file"));
  const auto both = run_command(std::string(TRAINER_BINARY) + " whatif " + kRun + " --bandwidth 1gbit --calibration " +
                                dir.file("absent.json"));
  CHECK(both.exit_code == 1);
  CHECK_THAT(both.output, Contains("not both"));
}
