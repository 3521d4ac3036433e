// UTF-8 validation for text inputs: invalid bytes are an error naming where, never silently
// dropped.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace packbert::data {

constexpr size_t kValidUtf8 = std::string_view::npos;

// Offset of the first byte that does not start or continue a well-formed UTF-8 sequence
// (overlong forms, surrogates and code points above U+10FFFF are ill-formed, as in Unicode's
// Table 3-7), or kValidUtf8.
size_t invalid_utf8_offset(std::string_view s);

// Throws InputError "<where>: invalid UTF-8 at byte <offset> (0xNN)" when s is not valid UTF-8.
// base_offset is added to the offset reported (the line's offset in its file).
void check_utf8(std::string_view s, const std::string& where, size_t base_offset = 0);

// s with every byte that is not part of well-formed UTF-8 read as Windows-1252 (the usual
// stray encoding in old text, e.g. 0x92 for ’) and re-encoded as UTF-8; valid text is unchanged.
std::string repair_cp1252_bytes(std::string_view s);

}  // namespace packbert::data
