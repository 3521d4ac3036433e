#include "data/utf8.h"

#include <cstdio>

#include "error.h"

namespace packbert::data {

size_t invalid_utf8_offset(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // Lead byte: the sequence length and the allowed range of the second byte.
    int len;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;  // overlong
      if (c == 0xed) hi = 0x9f;  // surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;  // overlong
      if (c == 0xf4) hi = 0x8f;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + 1 >= n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (int k = 2; k < len; ++k)
      if (i + k >= n || p[i + k] < 0x80 || p[i + k] > 0xbf) return i;
    i += static_cast<size_t>(len);
  }
  return kValidUtf8;
}

void check_utf8(std::string_view s, const std::string& where, size_t base_offset) {
  const size_t at = invalid_utf8_offset(s);
  if (at == kValidUtf8) return;
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(s[at]));
  throw InputError(where + ": invalid UTF-8 at byte " + std::to_string(base_offset + at) + " (" +
                   byte + ")");
}

namespace {

// Windows-1252's 0x80-0x9f (0 where it defines nothing; those map to U+FFFD).
constexpr char32_t kCp1252High[32] = {
    0x20ac, 0,      0x201a, 0x0192, 0x201e, 0x2026, 0x2020, 0x2021, 0x02c6, 0x2030, 0x0160,
    0x2039, 0x0152, 0,      0x017d, 0,      0,      0x2018, 0x2019, 0x201c, 0x201d, 0x2022,
    0x2013, 0x2014, 0x02dc, 0x2122, 0x0161, 0x203a, 0x0153, 0,      0x017e, 0x0178};

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x800) {
    out += static_cast<char>(0xc0 | (c >> 6));
  } else {
    out += static_cast<char>(0xe0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
  }
  out += static_cast<char>(0x80 | (c & 0x3f));
}

}  // namespace

std::string repair_cp1252_bytes(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  while (!s.empty()) {
    const size_t bad = invalid_utf8_offset(s);
    if (bad == kValidUtf8) {
      out.append(s);
      break;
    }
    out.append(s.substr(0, bad));
    const auto b = static_cast<unsigned char>(s[bad]);
    const char32_t c = b < 0xa0 ? kCp1252High[b - 0x80] : b;  // 0xa0-0xff: Latin-1
    append_utf8(out, c ? c : 0xfffd);
    s.remove_prefix(bad + 1);
  }
  return out;
}

}  // namespace packbert::data
