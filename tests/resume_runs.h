// The end-to-end tests' resumed run: the trainer stopped after some steps (--stop-after) and then
// continued in the same folder (--resume latest), for a comparison with a run that never stopped.
#pragma once

#include <catch2/catch.hpp>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "process.h"

namespace trainer::testing {

// A trainer command line that writes to `out`, with `extra` (the stop or the resume) appended.
using RunCommand = std::function<std::string(const std::filesystem::path& out, const std::string& extra)>;

// `command` in a fresh folder, stopped after `stop` steps, then resumed there by `resumed` (another
// number of ranks, or arguments for the resumed run only) or else by `command` again. Both runs must
// succeed and the second must say it resumed. Both outputs are INFO for as long as this object lives,
// as a test's own INFO lines would be, so that a later comparison that fails shows them.
struct ResumedRun {
  TempDir dir;
  Outcome first, second;

  ResumedRun(const RunCommand& command, int stop, const RunCommand& resumed = nullptr) {
    first = run_command(command(dir.path, " --stop-after " + std::to_string(stop)));
    info_[0].emplace(Catch::MessageBuilder("INFO", CATCH_INTERNAL_LINEINFO, Catch::ResultWas::Info) << first.output);
    REQUIRE(first.exit_code == 0);
    second = run_command((resumed ? resumed : command)(dir.path, " --resume latest"));
    info_[1].emplace(Catch::MessageBuilder("INFO", CATCH_INTERNAL_LINEINFO, Catch::ResultWas::Info) << second.output);
    REQUIRE(second.exit_code == 0);
    CHECK_THAT(second.output, Catch::Matchers::Contains("resumed from"));
  }

 private:
  std::optional<Catch::ScopedMessage> info_[2];  // what INFO makes, kept past the constructor's scope
};

}  // namespace trainer::testing
