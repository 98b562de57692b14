// A NumPy reference kept in tests/fixtures as a pair: NAME.json (the cases and their parameters)
// and NAME.bin (the cases' float32 arrays, which the JSON locates).
// Written by the scripts/make_*_fixtures.py generators; read here once per test program.
#pragma once

#include <catch2/catch.hpp>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trainer::testing {

struct ReferenceFixture {
  nlohmann::json meta;
  std::vector<float> values;
};

inline ReferenceFixture load_reference_fixture(const std::string& name) {
  ReferenceFixture x;
  std::ifstream j(std::string(TRAINER_FIXTURES) + "/" + name + ".json");
  REQUIRE(j);
  x.meta = nlohmann::json::parse(j);
  std::ifstream b(std::string(TRAINER_FIXTURES) + "/" + name + ".bin", std::ios::binary);
  REQUIRE(b);
  b.seekg(0, std::ios::end);
  x.values.resize(static_cast<size_t>(b.tellg()) / 4);
  b.seekg(0);
  b.read(reinterpret_cast<char*>(x.values.data()), static_cast<std::streamsize>(x.values.size() * 4));
  return x;
}

}  // namespace trainer::testing
