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

}  // namespace packbert::data
