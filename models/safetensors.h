// safetensors files (https://github.com/huggingface/safetensors): the checkpoint weight format and
// the format of the PyTorch reference fixtures in tests/fixtures.
//
// Layout: 8-byte little-endian u64 header length N; N bytes of JSON
//   {"__metadata__": {"k": "v"}, "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}}
// (offsets relative to the first byte after the header); then the raw little-endian tensor data.
// Supported dtypes: F32, F64, I64, I32 (anything else is a clear error).
//
// The reader is strict, as the reference implementation is: the data section must be covered exactly
// by the tensors (no overlap, no holes, no trailing bytes), every size must match dtype x shape, and
// names are unique. Every problem throws std::runtime_error with one line that starts with
// "safetensors: <path>: ". This code depends on nothing else in models/ so it builds on its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace trainer::models {

// Bytes per element of a safetensors dtype name ("F32" -> 4); throws for an unsupported dtype.
size_t safetensors_dtype_size(const std::string& dtype);

struct SafeTensor {
  std::string name;
  std::string dtype;             // "F32", "F64", "I64" or "I32"
  std::vector<int64_t> shape;    // [] is a scalar (one element); a 0 anywhere is an empty tensor
  std::vector<uint8_t> bytes;    // row-major, little-endian, exactly numel * dtype size

  int64_t numel() const;
  // Element values converted to the requested type. as_f32 / as_f64 accept every supported dtype;
  // as_i64 accepts I32 and I64 only (a float tensor is an error, not a silent truncation).
  std::vector<float> as_f32() const;
  std::vector<double> as_f64() const;
  std::vector<int64_t> as_i64() const;
};

struct SafeTensorsFile {
  std::string path;                           // where it was read from (for error messages)
  std::vector<SafeTensor> tensors;            // in file (data offset) order
  std::map<std::string, std::string> metadata;  // "__metadata__"; empty when the file has none

  // Throws "safetensors: <path>: no tensor named '<name>' ..." when absent.
  const SafeTensor& at(const std::string& name) const;
  bool contains(const std::string& name) const;
};

SafeTensorsFile read_safetensors(const std::string& path);

// A tensor to write; data points at numel * dtype-size bytes owned by the caller (no copy is made).
struct SafeTensorRef {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes tensors in the given order (header and data), metadata as "__metadata__" (omitted when
// empty). Atomic: writes <path>.tmp, fflush + fsync, renames it over <path>, then fsyncs the folder,
// so a crash leaves either the old file or the complete new one. Throws std::runtime_error naming the
// file on bad input (unknown dtype, duplicate or empty name, null data) or I/O failure.
void write_safetensors(const std::string& path, const std::vector<SafeTensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace trainer::models
