#include "comm/sync/sync_state.h"

#include <istream>
#include <ostream>
#include <stdexcept>

namespace trainer::comm {

namespace {
constexpr uint32_t kMagic = 0x434e5953;  // "SYNC"
}

void write_sync_header(std::ostream& out, const std::string& method, uint32_t version) {
  write_pod(out, kMagic);
  write_pod(out, version);
  write_pod(out, static_cast<uint32_t>(method.size()));
  out.write(method.data(), static_cast<std::streamsize>(method.size()));
}

uint32_t read_sync_header(std::istream& in, const std::string& method, uint32_t version, uint32_t oldest) {
  const auto magic = read_pod<uint32_t>(in);
  const auto v = read_pod<uint32_t>(in);
  const auto len = read_pod<uint32_t>(in);
  if (!in || magic != kMagic || len > 64) throw std::runtime_error("sync state: not a gradient-sync state");
  std::string saved(len, '\0');
  in.read(saved.data(), len);
  if (!in) throw std::runtime_error("sync state: truncated");
  if (saved != method)
    throw std::runtime_error("sync state was saved by method '" + saved + "', this run uses '" + method + "'");
  if (oldest == 0) oldest = version;
  if (v < oldest || v > version)
    throw std::runtime_error("sync state of '" + method + "' has format version " + std::to_string(v) +
                             ", this build reads " +
                             (oldest == version ? "version " + std::to_string(version)
                                                : "versions " + std::to_string(oldest) + " to " + std::to_string(version)));
  return v;
}

std::string peek_sync_method(std::istream& in) {
  const std::streampos at = in.tellg();
  const auto magic = read_pod<uint32_t>(in);
  read_pod<uint32_t>(in);
  const auto len = read_pod<uint32_t>(in);
  std::string saved;
  if (in && magic == kMagic && len <= 64) {
    saved.resize(len);
    in.read(saved.data(), len);
    if (!in) saved.clear();
  }
  in.clear();
  in.seekg(at);
  return saved;
}

}  // namespace trainer::comm
