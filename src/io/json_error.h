// nlohmann's exceptions as the one-line input errors the CLI prints.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace packbert::io {

// e.what() without nlohmann's "[json.exception.out_of_range.406] " prefix, e.g. "number
// overflow parsing '1e999'".
inline std::string json_error_text(const nlohmann::json::exception& e) {
  const std::string what = e.what();
  const size_t close = what.find("] ");
  return what.starts_with("[json.exception.") && close != std::string::npos
             ? what.substr(close + 2)
             : what;
}

}  // namespace packbert::io
