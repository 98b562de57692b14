// CIFAR-10 in its binary distribution format, read exactly.
//
// A file is a sequence of 3073-byte records: one label byte (0..9), then the 32x32 image as three
// planes of 1024 bytes (R, G, B), each row-major. The training split is data_batch_1.bin ..
// data_batch_5.bin (10,000 records each in the real data set), the test split is test_batch.bin.
// The synthetic generator (synthetic_cifar.h) writes the same format, so this reader is the only
// path into the pipeline for both.
//
// Pixels stay uint8 and planar, as in the file: 150 MB of float would be 600 MB, and the loader
// converts to normalized channels-last floats in the same pass that augments (loader.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer::data {

constexpr int kCifarSide = 32;
constexpr int kCifarChannels = 3;
constexpr int kCifarPlaneBytes = kCifarSide * kCifarSide;              // 1024
constexpr int kCifarImageBytes = kCifarChannels * kCifarPlaneBytes;    // 3072
constexpr int kCifarRecordBytes = 1 + kCifarImageBytes;                // 3073
constexpr int kCifarClasses = 10;
constexpr int kCifarTrainFiles = 5;

struct ImageSet {
  std::vector<uint8_t> pixels;  // N x 3 x 32 x 32, planar per image, exactly as in the file
  std::vector<uint8_t> labels;  // N, each 0..9
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  const uint8_t* image(int64_t i) const { return pixels.data() + i * kCifarImageBytes; }
};

// The files of one split under root, in reading order (train: data_batch_1..5.bin; test:
// test_batch.bin). The generator writes exactly these names.
std::vector<std::string> cifar10_files(const std::string& root, bool train);

// Reads every file of the split, in order. Throws std::runtime_error with one line naming the file
// (missing, empty, truncated, bad label).
ImageSet read_cifar10(const std::string& root, bool train);

// Reads the given files in order and concatenates their records.
ImageSet read_cifar10_files(const std::vector<std::string>& paths);

}  // namespace trainer::data
