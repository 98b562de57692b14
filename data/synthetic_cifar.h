// A synthetic, learnable stand-in for CIFAR-10, written in the exact binary format.
//
// The pipeline (reader, loader, trainer, quickstart) must run and be tested without a download, on
// data that a ResNet actually has to learn: ten classes that differ by shape and texture (disc,
// square, triangle, cross, ring, horizontal stripes, vertical stripes, checker, diagonal stripes,
// two blobs), drawn with a class-typical but jittered and often random colour, at random position,
// size and rotation, over random backgrounds (colour, gradient, blotches), often a distractor blob, and
// pixel noise. No pixel or global colour statistic separates the classes (tests/data_test.cpp checks
// that the nearest class-mean colour stays near chance).
//
// Every image comes from its own generator seeded by (seed, split, index), so the bytes depend only
// on the arguments: not on thread count, and not on the C++ standard library (the uniform and normal
// transforms are our own; std::normal_distribution differs between libstdc++ and libc++). A libm
// whose sin/cos/log differ in the last bit could, rarely, move a pixel by one grey level.
// scripts/calibrate_synthetic_cifar.py measures how hard the result is for a PyTorch ResNet.
//
// That is the "easy" variant (data.synthetic_variant): a ResNet-20 learns it to 98% in the 6-epoch
// recipe, where real CIFAR-10 gives 71%, and easy data hides what gradient compression costs. The
// "hard" variant (data/synthetic_cifar_hard.h) has the same classes and format, calibrated so that
// the recipe lands near real CIFAR-10's accuracy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace trainer::data {

// The class names, index = label.
extern const char* const kSyntheticCifarClasses[10];

enum class SyntheticVariant { kEasy, kHard };

// "easy" or "hard"; the name a config and README.txt use.
const char* synthetic_variant_name(SyntheticVariant variant);
// The variant named by `name`, or nullopt for any other string.
std::optional<SyntheticVariant> parse_synthetic_variant(const std::string& name);
// The variant a synthetic dataset in dir was written with, read from its README.txt ("variant = ..."
// line; a synthetic README without one predates the hard variant, so it is easy), or nullopt when
// dir holds no synthetic README (real CIFAR-10, or nothing).
std::optional<SyntheticVariant> synthetic_variant_in(const std::string& dir);

// Writes data_batch_1..5.bin (the n_train training records split as evenly as possible over the
// five files), test_batch.bin (n_test records) and README.txt into dir, creating it. Labels are
// balanced (each class count differs by at most one). Each file is written to a temporary name and
// renamed, so an interrupted run never leaves a half-written file under a final name.
// Requires n_train >= 5 (no file may be empty) and n_test >= 1; throws std::invalid_argument or,
// for file-system errors, std::runtime_error naming the path.
void write_synthetic_cifar10(const std::string& dir, int64_t n_train, int64_t n_test, uint64_t seed,
                             SyntheticVariant variant = SyntheticVariant::kEasy);

}  // namespace trainer::data
