// The optimizers' binary state: a 4-byte magic naming the optimizer, a format version (bump it
// whenever a layout changes, so an old checkpoint fails loudly instead of loading garbage), then
// plain fields and raw float32 buffers in host byte order.
#pragma once

#include <cstdint>
#include <cstring>
#include <istream>
#include <ostream>
#include <stdexcept>
#include <string>

namespace trainer::optim::state_format {

// Every machine we run on is little-endian; saying so here makes a port to a big-endian one fail at
// compile time rather than read swapped floats.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "state files are little-endian");

struct Format {
  char magic[4];
  const char* name;  // "SGD", "Adam": as error messages say it
};
inline constexpr Format kSgd{{'T', 'S', 'G', 'D'}, "SGD"};
inline constexpr Format kAdam{{'T', 'A', 'D', 'M'}, "Adam"};
inline constexpr uint32_t kVersion = 1;

template <class T>
void write_pod(std::ostream& out, const T& v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <class T>
bool read_pod(std::istream& in, T& v) {
  return static_cast<bool>(in.read(reinterpret_cast<char*>(&v), sizeof(T)));
}

inline void write_header(std::ostream& out, const Format& mine) {
  out.write(mine.magic, sizeof(mine.magic));
  write_pod(out, kVersion);
}

// Reads and checks the magic and version of a state that should be `mine`; the other optimizer's
// state is named as such (the usual cause: optim.name changed between runs).
inline void read_header(std::istream& in, const Format& mine, const Format& other) {
  const std::string what = std::string(mine.name) + " state: ";
  char magic[4];
  if (!in.read(magic, sizeof(magic)))
    throw std::runtime_error(what + "not an " + mine.name + " optimizer state (bad magic: empty or truncated)");
  if (std::memcmp(magic, other.magic, sizeof(magic)) == 0)
    throw std::runtime_error(what + "this is an " + other.name + " optimizer state, not an " + mine.name +
                             " one (bad magic; was optim.name changed?)");
  if (std::memcmp(magic, mine.magic, sizeof(magic)) != 0)
    throw std::runtime_error(what + "not an " + mine.name + " optimizer state (bad magic)");
  uint32_t version = 0;
  if (!read_pod(in, version) || version != kVersion)
    throw std::runtime_error(what + "unsupported format version " + std::to_string(version) + " (expected " +
                             std::to_string(kVersion) + ")");
}

}  // namespace trainer::optim::state_format
