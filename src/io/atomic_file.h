// Writing outputs so a crash or bad input never leaves a half-written file behind.
#pragma once

#include <string>
#include <string_view>

namespace packbert::io {

// Writes `data` to a temporary file beside `path`, fsyncs it, and renames it over `path`.
// Throws InputError (naming the path) if the directory is not writable or the disk is full.
void write_file_atomic(const std::string& path, std::string_view data);

}  // namespace packbert::io
