#include "data/cifar.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>

namespace trainer::data {
namespace fs = std::filesystem;

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

[[noreturn]] void fail(const std::string& message) { throw std::runtime_error(message); }

// The missing-file message names the folder the user configured, so it can be fixed in the config.
[[noreturn]] void fail_missing(const std::string& path, const std::string& root) {
  fail("cifar10: missing file " + path + " (expected data_batch_1.bin..data_batch_5.bin and " +
       "test_batch.bin under data.root = " + root + ")");
}

// Appends the records of one file. The whole file is read with a single fread (30 MB for a real
// batch file; the OS streams it far faster than record-sized reads would).
void read_one(const std::string& path, const std::string& root, ImageSet& set) {
  std::error_code ec;
  fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) fail_missing(path, root);
  if (ec) fail(path + ": cannot access (" + ec.message() + ")");
  if (!fs::is_regular_file(status)) fail(path + ": not a regular file");
  uintmax_t bytes = fs::file_size(path, ec);
  if (ec) fail(path + ": cannot read its size (" + ec.message() + ")");
  if (bytes == 0) fail(path + ": file is empty (a CIFAR-10 file holds 3073-byte records)");
  if (bytes % kCifarRecordBytes != 0) {
    fail(path + ": size " + std::to_string(bytes) + " bytes is not a multiple of the " +
         std::to_string(kCifarRecordBytes) + "-byte CIFAR-10 record");
  }

  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) fail(path + ": cannot open (" + std::strerror(errno) + ")");
  std::vector<uint8_t> raw(bytes);
  if (std::fread(raw.data(), 1, raw.size(), file.get()) != raw.size()) {
    fail(path + ": short read (expected " + std::to_string(bytes) + " bytes)");
  }

  const int64_t records = static_cast<int64_t>(bytes / kCifarRecordBytes);
  const int64_t first = set.size();
  set.labels.resize(first + records);
  set.pixels.resize((first + records) * kCifarImageBytes);
  for (int64_t r = 0; r < records; ++r) {
    const uint8_t* rec = raw.data() + r * kCifarRecordBytes;
    if (rec[0] >= kCifarClasses) {
      fail(path + ": record " + std::to_string(r) + " has label " + std::to_string(rec[0]) +
           " (CIFAR-10 labels are 0..9)");
    }
    set.labels[first + r] = rec[0];
    std::memcpy(set.pixels.data() + (first + r) * kCifarImageBytes, rec + 1, kCifarImageBytes);
  }
}

}  // namespace

std::vector<std::string> cifar10_files(const std::string& root, bool train) {
  std::vector<std::string> paths;
  if (train) {
    for (int i = 1; i <= kCifarTrainFiles; ++i) {
      paths.push_back((fs::path(root) / ("data_batch_" + std::to_string(i) + ".bin")).string());
    }
  } else {
    paths.push_back((fs::path(root) / "test_batch.bin").string());
  }
  return paths;
}

ImageSet read_cifar10(const std::string& root, bool train) {
  ImageSet set;
  for (const std::string& path : cifar10_files(root, train)) read_one(path, root, set);
  return set;
}

ImageSet read_cifar10_files(const std::vector<std::string>& paths) {
  ImageSet set;
  for (const std::string& path : paths) {
    std::string root = fs::path(path).parent_path().string();
    read_one(path, root.empty() ? "." : root, set);
  }
  return set;
}

}  // namespace trainer::data
