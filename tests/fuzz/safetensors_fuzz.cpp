// Fuzz target: read_safetensors (checkpoint weights, rank state files, test fixtures) on any bytes,
// then every tensor's conversions. Errors must be "safetensors: <path>: ..." on one line.
#include <cmath>
#include <stdexcept>

#include "models/safetensors.h"
#include "tests/fuzz/fuzz_input.h"

using namespace trainer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = (fuzz::scratch_dir() / "input.safetensors").string();
  fuzz::write_file(path, std::string(reinterpret_cast<const char*>(data), size));
  models::SafeTensorsFile file;
  try {
    file = models::read_safetensors(path);
  } catch (const std::runtime_error& e) {
    fuzz::check_error_message(e.what(), "safetensors: " + path + ": ");
    return 0;
  }
  // What was accepted is self-consistent: sizes match dtype x shape and names resolve.
  for (const models::SafeTensor& t : file.tensors) {
    if (static_cast<int64_t>(t.bytes.size()) != t.numel() * static_cast<int64_t>(models::safetensors_dtype_size(t.dtype)) ||
        &file.at(t.name) != &t)
      std::abort();
    if (t.as_f32().size() != static_cast<size_t>(t.numel()) || t.as_f64().size() != static_cast<size_t>(t.numel()))
      std::abort();
    if (t.dtype == "I32" || t.dtype == "I64") t.as_i64();
  }
  return 0;
}
