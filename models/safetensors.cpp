#include "models/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.cpp copies little-endian file data straight into memory: little-endian hosts only"
#endif

namespace trainer::models {
namespace {

// The reference implementation refuses headers above 100 MB; so do we, before allocating one.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Error messages are one line whatever the file contains (names and JSON errors quote file bytes).
std::string one_line(std::string s) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  return s;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(one_line("safetensors: " + path + ": " + what));
}

std::string ticked(const std::string& name) { return "'" + name + "'"; }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// numel of a shape, or -1 when it does not fit in int64.
int64_t checked_numel(const std::vector<int64_t>& shape) {
  for (int64_t d : shape)
    if (d == 0) return 0;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

bool known_dtype(const std::string& dtype) {
  return dtype == "F32" || dtype == "F64" || dtype == "I64" || dtype == "I32";
}

template <typename From, typename To>
std::vector<To> convert(const std::vector<uint8_t>& bytes) {
  const size_t n = bytes.size() / sizeof(From);
  std::vector<To> out(n);
  for (size_t i = 0; i < n; ++i) {
    From v;
    std::memcpy(&v, bytes.data() + i * sizeof(From), sizeof(From));
    out[i] = static_cast<To>(v);
  }
  return out;
}

template <typename To>
std::vector<To> convert_any(const SafeTensor& t) {
  if (t.dtype == "F32") return convert<float, To>(t.bytes);
  if (t.dtype == "F64") return convert<double, To>(t.bytes);
  if (t.dtype == "I64") return convert<int64_t, To>(t.bytes);
  if (t.dtype == "I32") return convert<int32_t, To>(t.bytes);
  throw std::runtime_error("safetensors: tensor " + ticked(t.name) + " has unsupported dtype " + t.dtype);
}

struct FileCloser {
  FILE* f;
  ~FileCloser() {
    if (f) std::fclose(f);
  }
};

// Reads exactly n bytes at the current position; false on short read.
bool read_exact(FILE* f, void* dst, size_t n) { return n == 0 || std::fread(dst, 1, n, f) == n; }

}  // namespace

size_t safetensors_dtype_size(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "F64" || dtype == "I64") return 8;
  throw std::runtime_error("safetensors: unsupported dtype '" + dtype + "' (supported: F32, F64, I64, I32)");
}

int64_t SafeTensor::numel() const { return checked_numel(shape); }

std::vector<float> SafeTensor::as_f32() const { return convert_any<float>(*this); }
std::vector<double> SafeTensor::as_f64() const { return convert_any<double>(*this); }

std::vector<int64_t> SafeTensor::as_i64() const {
  if (dtype == "I64") return convert<int64_t, int64_t>(bytes);
  if (dtype == "I32") return convert<int32_t, int64_t>(bytes);
  throw std::runtime_error("safetensors: tensor " + ticked(name) + " is " + dtype +
                           ", not an integer tensor (as_i64 needs I32 or I64)");
}

bool SafeTensorsFile::contains(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return true;
  return false;
}

const SafeTensor& SafeTensorsFile::at(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return t;
  std::string have;
  const size_t show = std::min<size_t>(tensors.size(), 8);
  for (size_t i = 0; i < show; ++i) have += (i ? ", " : "") + tensors[i].name;
  if (tensors.size() > show) have += ", ...";
  fail(path, "no tensor named " + ticked(name) + " (the file has " + std::to_string(tensors.size()) +
                 " tensors" + (have.empty() ? "" : ": " + have) + ")");
}

SafeTensorsFile read_safetensors(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  FileCloser closer{f};

  struct stat st {};
  if (fstat(fileno(f), &st) != 0) fail(path, std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);

  if (file_size < 8)
    fail(path, "truncated file: " + std::to_string(file_size) +
                   " bytes, shorter than the 8-byte header length");
  uint8_t len_bytes[8];
  if (!read_exact(f, len_bytes, 8)) fail(path, "cannot read the header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > file_size - 8)
    fail(path, "header length " + std::to_string(header_len) + " is larger than the file (" +
                   std::to_string(file_size) + " bytes): truncated or not a safetensors file");
  if (header_len > kMaxHeaderBytes)
    fail(path, "header length " + std::to_string(header_len) + " exceeds the 100 MB limit");
  if (header_len < 2) fail(path, "header of " + std::to_string(header_len) + " bytes is not a JSON object");

  std::string header(header_len, '\0');
  if (!read_exact(f, header.data(), header.size())) fail(path, "cannot read the header");
  if (header[0] != '{') fail(path, "header does not start with '{': not a safetensors file");

  // nlohmann keeps the last of duplicate keys silently; the format forbids duplicates.
  std::set<std::string> seen;
  std::string duplicate;
  nlohmann::json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t event,
                                                   nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(header, on_event);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("invalid JSON header: ") + e.what());
  }
  if (!h.is_object()) fail(path, "JSON header is not an object");
  if (!duplicate.empty()) fail(path, "duplicate entry " + ticked(duplicate) + " in the header");

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;

  SafeTensorsFile out;
  out.path = path;
  struct Span {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Span> spans;

  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, "__metadata__ is not an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail(path, "__metadata__ value of " + ticked(m.key()) + " is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string what = "tensor " + ticked(name);
    if (!v.is_object()) fail(path, what + ": entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) fail(path, what + ": missing or non-string dtype");
    if (!v.contains("shape") || !v["shape"].is_array()) fail(path, what + ": missing or non-array shape");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      fail(path, what + ": data_offsets must be an array of two integers");

    SafeTensor t;
    t.name = name;
    t.dtype = v["dtype"].get<std::string>();
    if (!known_dtype(t.dtype))
      fail(path, what + ": unknown dtype '" + t.dtype + "' (supported: F32, F64, I64, I32)");
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned() ||
          d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(path, what + ": shape entries must be non-negative integers, got " + v["shape"].dump());
      t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    for (const auto& o : v["data_offsets"])
      if (!o.is_number_unsigned())
        fail(path, what + ": data_offsets must be non-negative integers, got " + v["data_offsets"].dump());
    const uint64_t begin = v["data_offsets"][0].get<uint64_t>();
    const uint64_t end = v["data_offsets"][1].get<uint64_t>();
    const std::string offs = "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
    if (end < begin) fail(path, what + ": data_offsets " + offs + " end before they begin");
    if (end > data_size)
      fail(path, what + ": data_offsets " + offs + " out of bounds: the data section has " +
                     std::to_string(data_size) + " bytes (truncated file?)");
    const size_t elem = safetensors_dtype_size(t.dtype);
    const int64_t n = checked_numel(t.shape);
    if (n < 0) fail(path, what + ": shape " + shape_str(t.shape) + " has more elements than fit in int64");
    // n <= data_size / elem first, so n * elem cannot overflow.
    if (static_cast<uint64_t>(n) > data_size / elem || end - begin != static_cast<uint64_t>(n) * elem)
      fail(path, what + ": data_offsets " + offs + " hold " + std::to_string(end - begin) +
                     " bytes but " + t.dtype + " " + shape_str(t.shape) + " needs " + std::to_string(n) +
                     " x " + std::to_string(elem) + " bytes");
    spans.push_back({begin, end, out.tensors.size()});
    out.tensors.push_back(std::move(t));
  }

  // The tensors must tile the data section exactly, as the reference implementation requires.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    const std::string& name = out.tensors[s.index].name;
    if (s.begin < covered)
      fail(path, "tensor " + ticked(name) + " overlaps tensor " + ticked(out.tensors[spans[i - 1].index].name) +
                     " (data_offsets begin at " + std::to_string(s.begin) + ", before byte " +
                     std::to_string(covered) + ")");
    if (s.begin > covered)
      fail(path, "hole in the data section: bytes [" + std::to_string(covered) + ", " +
                     std::to_string(s.begin) + ") belong to no tensor (before tensor " + ticked(name) + ")");
    covered = s.end;
  }
  if (covered != data_size)
    fail(path, std::to_string(data_size - covered) + " trailing bytes after the last tensor (data section " +
                   std::to_string(data_size) + " bytes, tensors cover " + std::to_string(covered) + ")");

  // Data in file order: one forward pass over the file.
  std::vector<SafeTensor> ordered;
  ordered.reserve(spans.size());
  for (const Span& s : spans) {
    SafeTensor& t = out.tensors[s.index];
    t.bytes.resize(s.end - s.begin);
    if (!t.bytes.empty()) {
      if (fseeko(f, static_cast<off_t>(data_start + s.begin), SEEK_SET) != 0 ||
          !read_exact(f, t.bytes.data(), t.bytes.size()))
        fail(path, "cannot read the data of tensor " + ticked(t.name) + " (file changed or truncated?)");
    }
    ordered.push_back(std::move(t));
  }
  out.tensors = std::move(ordered);
  return out;
}

void write_safetensors(const std::string& path, const std::vector<SafeTensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the header in the order written: metadata first, then tensors as given.
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  std::set<std::string> names;
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const std::string what = "tensor " + ticked(t.name);
    if (t.name.empty() || t.name == "__metadata__") fail(path, "invalid tensor name " + ticked(t.name));
    if (!names.insert(t.name).second) fail(path, "duplicate " + what);
    if (!known_dtype(t.dtype))
      fail(path, what + ": unknown dtype '" + t.dtype + "' (supported: F32, F64, I64, I32)");
    const int64_t n = checked_numel(t.shape);
    if (n < 0) fail(path, what + ": invalid shape " + shape_str(t.shape));
    const uint64_t bytes = static_cast<uint64_t>(n) * safetensors_dtype_size(t.dtype);
    if (bytes > 0 && t.data == nullptr) fail(path, what + ": null data");
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    sizes.push_back(bytes);
    offset += bytes;
  }
  std::string header = h.dump();
  // Pad with spaces so the data section starts 8-byte aligned (as the reference writer does).
  header.append((8 - header.size() % 8) % 8, ' ');
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(uint64_t(header.size()) >> (8 * i));

  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail(path, "cannot create " + tmp + ": " + std::strerror(errno));
  auto abort_write = [&](const std::string& what) {
    const int err = errno;
    if (f) std::fclose(f);
    std::remove(tmp.c_str());
    fail(path, what + ": " + std::strerror(err));
  };
  if (std::fwrite(len_bytes, 1, 8, f) != 8 || std::fwrite(header.data(), 1, header.size(), f) != header.size())
    abort_write("cannot write " + tmp);
  for (size_t i = 0; i < tensors.size(); ++i)
    if (sizes[i] > 0 && std::fwrite(tensors[i].data, 1, sizes[i], f) != sizes[i])
      abort_write("cannot write " + tmp);
  if (std::fflush(f) != 0) abort_write("cannot flush " + tmp);
  if (fsync(fileno(f)) != 0) abort_write("cannot fsync " + tmp);
  const int close_rc = std::fclose(f);
  f = nullptr;
  if (close_rc != 0) abort_write("cannot close " + tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) abort_write("cannot rename " + tmp + " over the file");

  // The rename is durable only once the folder's entry is on disk.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd < 0) fail(path, "cannot open folder " + dir + " to fsync it: " + std::strerror(errno));
  // Some file systems cannot fsync a folder (EINVAL); the data itself is already synced.
  if (fsync(dfd) != 0 && errno != EINVAL) {
    const int err = errno;
    ::close(dfd);
    fail(path, "cannot fsync folder " + dir + ": " + std::strerror(err));
  }
  ::close(dfd);
}

}  // namespace trainer::models
