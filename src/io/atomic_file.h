// Whole-file reads, and writes that never leave a half-written file behind (a crash or bad
// input loses nothing).
#pragma once

#include <string>
#include <string_view>

namespace packbert::io {

// Writes `data` to a temporary file beside `path`, fsyncs it, and renames it over `path`.
// Throws InputError (naming the path) if the directory is not writable or the disk is full.
void write_file_atomic(const std::string& path, std::string_view data);

// The whole file as bytes. Throws InputError naming the path when it cannot be opened or read.
std::string read_file(const std::string& path);

}  // namespace packbert::io
