// Numbers as text, the printf way, for messages and tables: fixed(v, 2) is "%.2f", general(v, 4)
// is "%.4g".
#pragma once

#include <cstdio>
#include <string>

namespace packbert {

inline std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

inline std::string general(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

}  // namespace packbert
