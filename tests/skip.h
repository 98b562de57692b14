// Ending a test as skipped, not passed: a case whose dependency or CPU feature is missing prints
// why and exits with ctest's skip code, so the suite's closing line counts it as skipped and
// scripts/test.sh lists it with the reason. Only for tests that run one case per process (the
// discovered Catch2 cases, which CMake registers with SKIP_RETURN_CODE 77); a case of a program
// run whole under mpiexec would end every case after it, so those are registered only where
// they apply (the [some_world_sizes] tags in tests/CMakeLists.txt).
#pragma once

#include <cstdlib>
#include <iostream>
#include <string>

namespace trainer::testing {

inline constexpr int kSkipExitCode = 77;

// Call before the case makes anything that must be cleaned up: exit() does not unwind the stack.
[[noreturn]] inline void skip_test(const std::string& why) {
  std::cout << "SKIPPED: " << why << std::endl;
  std::exit(kSkipExitCode);
}

}  // namespace trainer::testing
