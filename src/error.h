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

// An InputError every process of a distributed run raised together (they agreed on it): printed
// once, and the processes end normally instead of aborting each other.
struct SharedError : InputError {
  using InputError::InputError;
};

// Bad input in an options struct's field: what() starts with the field's name ("rows_per_batch
// must be at least 1"), and other fields the message names are in backquotes (`packs`); the
// CLI, which alone knows flag names, says the flags instead.
struct OptionError : InputError {
  OptionError(const std::string& field, const std::string& rest)
      : InputError(field + " " + rest), field_(field), rest_(rest) {}
  const std::string& field() const { return field_; }
  const std::string& rest() const { return rest_; }

 private:
  std::string field_, rest_;
};

}  // namespace packbert
