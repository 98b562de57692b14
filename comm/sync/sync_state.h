// The small binary header every sync method's saved state starts with, so that loading the state
// of another method or another format version is one clear error instead of garbage.
#pragma once

#include <cstdint>
#include <istream>
#include <ostream>
#include <string>

namespace trainer::comm {

void write_sync_header(std::ostream& out, const std::string& method, uint32_t version);
// Returns the version read, one of [oldest, version] (oldest 0: only `version`); throws
// std::runtime_error when the stream holds another method's state or another version.
uint32_t read_sync_header(std::istream& in, const std::string& method, uint32_t version, uint32_t oldest = 0);
// The method name of the header at the stream's position, which is left where it was ("" when
// there is no header there).
std::string peek_sync_method(std::istream& in);

template <class T>
void write_pod(std::ostream& out, const T& value) {
  out.write(reinterpret_cast<const char*>(&value), sizeof(T));
}
template <class T>
T read_pod(std::istream& in) {
  T value{};
  in.read(reinterpret_cast<char*>(&value), sizeof(T));
  return value;
}

}  // namespace trainer::comm
