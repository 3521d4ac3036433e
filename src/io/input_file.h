// What a reader may open, and a file's bytes for the binary readers. Binary formats are read
// from regular files only, through a read-only mapping: a reader touches the header first and
// then only the bytes the header declares (a 40 GB sparse file with a 16-byte header costs
// nothing). Text readers stream, and take regular files, pipes and stdin but never a device
// (/dev/zero would never end) or a directory.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace packbert::io {

// Throws InputError "<path>: ..." unless `path` (after links) is a regular file.
void require_regular_file(const std::string& path);
// Throws InputError "<path>: ..." unless `path` (after links) is a regular file or a pipe.
void require_text_input(const std::string& path);

// A binary file's bytes: mapped read-only from a regular file (pages are read when touched),
// or owned (bytes built in memory, for parsers under test). A copy owns its bytes.
class FileBytes {
 public:
  FileBytes() = default;
  FileBytes(std::string owned) : owned_(std::move(owned)) {}  // NOLINT: implicit by design
  // Throws InputError naming the path when it is not a regular file or cannot be mapped.
  static FileBytes map(const std::string& path);
  FileBytes(FileBytes&& o) noexcept { *this = std::move(o); }
  FileBytes& operator=(FileBytes&& o) noexcept;
  FileBytes(const FileBytes& o) : owned_(o.view()) {}
  FileBytes& operator=(const FileBytes& o) { return *this = FileBytes(std::string(o.view())); }
  ~FileBytes();

  const char* data() const { return mapped_ ? mapped_ : owned_.data(); }
  size_t size() const { return mapped_ ? mapped_size_ : owned_.size(); }
  std::string_view view() const { return {data(), size()}; }

 private:
  std::string owned_;
  const char* mapped_ = nullptr;
  size_t mapped_size_ = 0;
};

}  // namespace packbert::io
