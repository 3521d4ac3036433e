#include "io/zip.h"

#include <zlib.h>

#include <cstring>

#include "error.h"
#include "io/atomic_file.h"

namespace packbert::io {

namespace {

// Little-endian fields at checked offsets of the archive.
class Reader {
 public:
  Reader(std::string_view bytes, const std::string& source) : b_(bytes), source_(source) {}
  void need(uint64_t at, uint64_t n, const char* what) const {
    if (at > b_.size() || n > b_.size() - at)
      throw InputError(source_ + ": truncated zip archive (" + what + " at byte " +
                       std::to_string(at) + " runs past the end)");
  }
  uint64_t le(uint64_t at, int n) const {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(b_[at + i]);
    return v;
  }

 private:
  std::string_view b_;
  const std::string& source_;
};

constexpr uint32_t kLocalHeader = 0x04034b50, kCentralHeader = 0x02014b50, kEnd = 0x06054b50,
                   kEnd64 = 0x06064b50, kEnd64Locator = 0x07064b50;

}  // namespace

uint32_t crc32(std::string_view bytes) {
  // zlib's (crc32_z takes a size_t length: a storage past 4 GiB is one call).
  return static_cast<uint32_t>(::crc32_z(::crc32_z(0, nullptr, 0),
                                         reinterpret_cast<const Bytef*>(bytes.data()),
                                         bytes.size()));
}

ZipArchive ZipArchive::read(const std::string& path) {
  return parse(FileBytes::map(path), path);
}

ZipArchive ZipArchive::parse(FileBytes bytes, const std::string& source) {
  ZipArchive z;
  z.source_ = source;
  z.bytes_ = std::move(bytes);
  const std::string_view b = z.bytes_.view();
  const Reader r(b, source);
  auto fail = [&](const std::string& what) { throw InputError(source + ": " + what); };

  // The end-of-central-directory record: the last 22 bytes, or earlier by a comment (< 64 KiB).
  if (b.size() < 22) fail("not a zip archive (too short)");
  uint64_t end = b.size() - 22;
  const uint64_t lowest = b.size() >= 22 + 65535 ? b.size() - 22 - 65535 : 0;
  while (r.le(end, 4) != kEnd || end + 22 + r.le(end + 20, 2) != b.size()) {
    if (end == lowest) fail("not a zip archive (no end-of-central-directory record)");
    --end;
  }
  uint64_t count = r.le(end + 10, 2), dir_size = r.le(end + 12, 4), dir = r.le(end + 16, 4);
  if (count == 0xffff || dir_size == 0xffffffff || dir == 0xffffffff) {  // zip64
    if (end < 20 || r.le(end - 20, 4) != kEnd64Locator) fail("zip64 archive without its locator");
    const uint64_t end64 = r.le(end - 20 + 8, 8);
    r.need(end64, 56, "zip64 end record");
    if (r.le(end64, 4) != kEnd64) fail("bad zip64 end record");
    count = r.le(end64 + 32, 8), dir_size = r.le(end64 + 40, 8), dir = r.le(end64 + 48, 8);
  }
  r.need(dir, dir_size, "central directory");

  uint64_t at = dir;
  for (uint64_t i = 0; i < count; ++i) {
    r.need(at, 46, "central directory entry");
    if (r.le(at, 4) != kCentralHeader)
      fail("bad central directory entry " + std::to_string(i) + " at byte " + std::to_string(at));
    Entry e;
    e.method = static_cast<uint16_t>(r.le(at + 10, 2));
    e.crc = static_cast<uint32_t>(r.le(at + 16, 4));
    uint64_t packed = r.le(at + 20, 4), size = r.le(at + 24, 4);
    const uint64_t name_len = r.le(at + 28, 2), extra_len = r.le(at + 30, 2),
                   comment_len = r.le(at + 32, 2);
    e.header = r.le(at + 42, 4);
    r.need(at + 46, name_len + extra_len + comment_len, "central directory entry");
    std::string name(b.substr(at + 46, name_len));
    // The zip64 extra field holds, in this order, each 32-bit field that overflowed.
    for (uint64_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      const uint64_t id = r.le(x, 2), len = r.le(x + 2, 2);
      if (x + 4 + len > at + 46 + name_len + extra_len) fail(name + ": bad zip extra field");
      if (id == 1) {
        uint64_t y = x + 4;
        for (uint64_t* f : {&size, &packed, &e.header})
          if (*f == 0xffffffff) {
            if (y + 8 > x + 4 + len) fail(name + ": short zip64 extra field");
            *f = r.le(y, 8), y += 8;
          }
      }
      x += 4 + len;
    }
    if (e.method == 0 && packed != size) fail(name + ": stored entry with two sizes");
    e.size = packed;
    if (!z.entries_.emplace(name, e).second) fail(name + ": appears twice in the archive");
    at += 46 + name_len + extra_len + comment_len;
  }
  return z;
}

std::string_view ZipArchive::bytes(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw InputError(source_ + ": no entry '" + name + "' in the archive");
  const Entry& e = it->second;
  const std::string where = source_ + ": " + name;
  if (e.method != 0)
    throw InputError(where + ": compressed (zip method " + std::to_string(e.method) +
                     "); torch.save stores entries uncompressed, re-save the file with torch.save");
  const Reader r(bytes_.view(), source_);
  r.need(e.header, 30, "local file header");
  if (r.le(e.header, 4) != kLocalHeader) throw InputError(where + ": bad local file header");
  const uint64_t data = e.header + 30 + r.le(e.header + 26, 2) + r.le(e.header + 28, 2);
  r.need(data, e.size, name.c_str());
  std::string_view v(bytes_.data() + data, e.size);
  if (!e.checked) {  // (storages shared by several tensors are checked once)
    if (crc32(v) != e.crc) throw InputError(where + ": corrupted (CRC-32 mismatch)");
    e.checked = true;
  }
  return v;
}

}  // namespace packbert::io
