// The durable-file steps checkpoints are made of (trainer/checkpoint/checkpoint.h): CRC-32 checksums of what
// was written, and small files replaced atomically. A crash at any point leaves either the old
// file or the new one, never a mix, because every write goes to a temporary name, is fsync'd,
// renamed over the target, and the folder is fsync'd so the rename itself survives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace trainer {

// CRC-32 (IEEE, the polynomial of zlib.crc32, so Python checks a file in one call). Start from 0
// and feed the bytes in any number of pieces.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);
uint32_t crc32_of(const std::string& s);

struct FileSum {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};
// Size and CRC-32 of a whole file; throws std::runtime_error naming the file when it cannot be read.
FileSum checksum_file(const std::string& path);

// fsync of a folder, so renames and creations in it are durable (a file system that cannot sync
// folders, EINVAL, is accepted: the data is synced already). Empty means ".".
void fsync_folder(std::filesystem::path dir);
// Writes `text` to <path>.tmp, fsyncs it, renames it over `path` and fsyncs the folder. Throws
// std::runtime_error naming the file on any failure (the temporary is removed).
void write_text_atomic(const std::filesystem::path& path, const std::string& text);

}  // namespace trainer
