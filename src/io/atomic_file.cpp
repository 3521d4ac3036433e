#include "io/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "error.h"
#include "io/fault.h"
#include "io/input_file.h"
#include "io/memory.h"

namespace packbert::io {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  AllocationScope scope("reading " + path);
  const FileBytes bytes = FileBytes::map(path);  // (regular files only: a device could be endless)
  return std::string(bytes.view());
}

void write_file_atomic(const std::string& path, std::string_view data) {
  write_file_atomic(path, std::vector<std::string_view>{data});
}

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  auto fail = [&](const char* what) {
    std::string msg = path + ": " + what + ": " + std::strerror(errno);
    ::unlink(tmp.c_str());
    throw InputError(msg);
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::string msg = path + ": cannot create: " + std::strerror(errno);
    throw InputError(msg);
  }
  size_t total = 0, written = 0;  // over all pieces
  for (std::string_view p : pieces) total += p.size();
  bool halfway = false;
  for (std::string_view data : pieces) {
    size_t done = 0;
    while (done < data.size()) {
      if (!halfway && written >= total / 2) crash_point("write"), halfway = true;
      // Up to the file's half, so the crash point above sits between two writes of a real file.
      const size_t chunk =
          halfway ? data.size() - done : std::min(data.size() - done, total / 2 - written);
      ssize_t n = ::write(fd, data.data() + done, std::max<size_t>(chunk, 1));
      if (n < 0) {
        if (errno == EINTR) continue;
        ::close(fd);
        fail("write failed");
      }
      done += static_cast<size_t>(n);
      written += static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("fsync failed");
  }
  if (::close(fd) != 0) fail("close failed");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("rename failed");
}

void make_output_dir(const std::string& dir, const std::string& flag) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw InputError(flag + " " + dir + ": cannot create the directory: " + ec.message());
  if (!fs::is_directory(dir))
    throw InputError(flag + " " + dir + ": exists and is not a directory");
  if (::access(dir.c_str(), W_OK) != 0)
    throw InputError(flag + " " + dir + ": not writable: " + std::strerror(errno));
}

int remove_stale_temporaries(const std::string& dir, const std::vector<std::string>& names) {
  int removed = 0;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string entry = e.path().filename().string();
    for (const std::string& name : names)
      for (const char* tag : {".tmp.", ".partial."}) {
        const std::string prefix = name + tag;
        if (entry.size() <= prefix.size() || entry.compare(0, prefix.size(), prefix) != 0) continue;
        const std::string pid = entry.substr(prefix.size());
        if (pid.find_first_not_of("0123456789") != std::string::npos || pid.size() > 9) continue;
        const long p = std::stol(pid);
        if (p == ::getpid() || ::kill(static_cast<pid_t>(p), 0) == 0 || errno != ESRCH) continue;
        std::error_code rm;
        if (fs::remove_all(e.path(), rm) > 0 && !rm) ++removed;
      }
  }
  return removed;
}

StagedDirectory::StagedDirectory(const std::string& dir, const std::string& flag, bool overwrite)
    : dir_(dir) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  if (fs::exists(dir_) && !fs::is_directory(dir_))
    throw InputError(flag + " " + dir_ + ": exists and is not a directory");
  if (fs::is_directory(dir_) && !fs::is_empty(dir_)) {
    if (!overwrite)
      throw InputError(flag + " " + dir_ + ": already holds files; choose another " + flag +
                       " (or `overwrite` to replace the model there)");
    if (!fs::exists(dir_ + "/config.json"))
      throw InputError(flag + " " + dir_ +
                       ": holds files but no model (no config.json); refusing to replace it");
  }
  const fs::path parent = fs::absolute(dir_).parent_path();
  make_output_dir(parent.string(), flag);
  remove_stale_temporaries(parent.string(), {fs::path(dir_).filename().string()});
  staging_ = dir_ + ".partial." + std::to_string(::getpid());
  fs::remove_all(staging_);
  make_output_dir(staging_, flag);
}

StagedDirectory::~StagedDirectory() {
  std::error_code ec;
  if (!published_) fs::remove_all(staging_, ec);
}

void StagedDirectory::publish() {
  if (fs::exists(dir_)) {
    // Swap the finished directory with the old one in one step, then drop the old one.
    if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, dir_.c_str(), RENAME_EXCHANGE) != 0)
      throw InputError(dir_ + ": cannot replace the directory: " + std::strerror(errno));
    std::error_code ec;
    fs::remove_all(staging_, ec);
  } else if (std::rename(staging_.c_str(), dir_.c_str()) != 0) {
    throw InputError(dir_ + ": cannot rename " + staging_ + " into place: " + std::strerror(errno));
  }
  published_ = true;
}

}  // namespace packbert::io
