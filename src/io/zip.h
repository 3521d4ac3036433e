// Reading a zip archive whose entries are stored uncompressed, as torch.save writes them
// (PyTorchStreamWriter: method 0, data aligned to 64 bytes through the local header's extra
// field, zip64 records once the archive passes 4 GiB). Every offset and size is checked against
// the archive's bytes, and an entry's CRC-32 is verified when it is read, so a truncated or
// corrupted file is an InputError naming the entry, never a read out of bounds.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "io/input_file.h"

namespace packbert::io {

uint32_t crc32(std::string_view bytes);

class ZipArchive {
 public:
  // Throws InputError "<source>: ..." when `bytes` is not a readable zip archive.
  static ZipArchive parse(FileBytes bytes, const std::string& source);
  static ZipArchive read(const std::string& path);

  struct Entry {
    uint64_t header = 0;  // offset of the local file header
    uint64_t size = 0;    // bytes, compressed and not (method 0 only)
    uint16_t method = 0;  // 0 stored, 8 deflated (refused when read)
    uint32_t crc = 0;
    mutable bool checked = false;  // the CRC-32 matched once already
  };
  const std::map<std::string, Entry>& entries() const { return entries_; }
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  // The entry's bytes (a view into the archive), CRC-checked. Throws InputError naming the
  // entry when it is missing, compressed, out of bounds or corrupted.
  std::string_view bytes(const std::string& name) const;
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  FileBytes bytes_;
  std::map<std::string, Entry> entries_;
};

}  // namespace packbert::io
