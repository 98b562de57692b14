// Fuzz target: the CIFAR-10 binary reader (read_cifar10_files, the path of read_cifar10) on any
// bytes. Errors must be one line naming the file.
#include <stdexcept>

#include "data/cifar.h"
#include "tests/fuzz/fuzz_input.h"

using namespace trainer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = (fuzz::scratch_dir() / "data_batch_1.bin").string();
  fuzz::write_file(path, std::string(reinterpret_cast<const char*>(data), size));
  data::ImageSet set;
  try {
    set = data::read_cifar10_files({path});
  } catch (const std::runtime_error& e) {
    fuzz::check_error_message(e.what(), path);
    return 0;
  }
  // Accepted: whole records, labels in range, pixels exactly as in the file.
  if (size == 0 || size % data::kCifarRecordBytes != 0 ||
      set.size() != static_cast<int64_t>(size / data::kCifarRecordBytes) ||
      set.pixels.size() != static_cast<size_t>(set.size()) * data::kCifarImageBytes)
    std::abort();
  for (int64_t i = 0; i < set.size(); ++i)
    if (set.labels[i] >= data::kCifarClasses || set.labels[i] != data[i * data::kCifarRecordBytes]) std::abort();
  return 0;
}
