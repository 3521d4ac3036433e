// The one error type for bad user input, shared by every module.
// what() is a single line: "<where>: <what was wrong>[, expected <what>]". The CLI prints it and
// exits 2. Internal invariants use assert, never this.
#pragma once

#include <stdexcept>
#include <string>

namespace packbert {

struct InputError : std::runtime_error {
  explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace packbert
