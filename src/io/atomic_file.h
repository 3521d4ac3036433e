// Whole-file reads, and writes that never leave a half-written file behind (a crash or bad
// input loses nothing).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace packbert::io {

// Writes `data` to a temporary file beside `path`, fsyncs it, and renames it over `path`.
// Throws InputError (naming the path) if the directory is not writable or the disk is full.
void write_file_atomic(const std::string& path, std::string_view data);
// The same for a file made of `pieces` in order (written as they are, never joined in memory).
void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces);

// The whole file as bytes. Throws InputError naming the path when it cannot be opened or read.
std::string read_file(const std::string& path);

// Creates `dir` (and parents) if missing. Throws InputError naming `flag` and the reason when it
// cannot be created or is not a directory.
void make_output_dir(const std::string& dir, const std::string& flag);

// Removes `<name>.tmp.PID` files and `<name>.partial.PID` directories in `dir`, for each of
// `names` (the outputs packbert writes there), left by a killed packbert (PID no longer
// running). Nothing else in `dir` is touched. Returns how many were removed.
int remove_stale_temporaries(const std::string& dir, const std::vector<std::string>& names);

// A directory whose contents appear whole or not at all: everything is written under path()
// (`<dir>.partial.<pid>`), and publish() swaps it into place atomically (an earlier `dir` is
// removed only after the swap). Not published (an exception on the way): the staging directory
// is removed and `dir` is untouched. An existing non-empty `dir` is replaced only with
// `overwrite`, and only when it holds a model (config.json): never a directory of other files.
class StagedDirectory {
 public:
  StagedDirectory(const std::string& dir, const std::string& flag, bool overwrite);
  ~StagedDirectory();
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;
  const std::string& path() const { return staging_; }
  void publish();

 private:
  std::string dir_, staging_;
  bool published_ = false;
};

}  // namespace packbert::io
