#include "io/input_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "error.h"

namespace packbert::io {

namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISFIFO(m)) return "a pipe";
  return "not a regular file";
}

struct stat stat_or_throw(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw InputError(path + ": cannot open: " + std::strerror(errno));
  return st;
}

}  // namespace

void require_regular_file(const std::string& path) {
  const struct stat st = stat_or_throw(path);
  if (!S_ISREG(st.st_mode))
    throw InputError(path + ": is " + kind_of(st.st_mode) + ", expected a regular file");
}

void require_text_input(const std::string& path) {
  const struct stat st = stat_or_throw(path);
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode))
    throw InputError(path + ": is " + kind_of(st.st_mode) + ", expected a text file or a pipe");
}

FileBytes FileBytes::map(const std::string& path) {
  // O_NONBLOCK: a FIFO without a writer opens at once (and is refused below) instead of blocking
  // the open; regular files ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw InputError(path + ": cannot open for reading: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(path + ": is " + kind_of(st.st_mode) + ", expected a regular file");
  }
  FileBytes b;
  if (st.st_size > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw InputError(path + ": cannot map for reading: " + why);
    }
    b.mapped_ = static_cast<const char*>(p);
    b.mapped_size_ = static_cast<size_t>(st.st_size);
  }
  ::close(fd);
  return b;
}

FileBytes& FileBytes::operator=(FileBytes&& o) noexcept {
  if (this == &o) return *this;
  if (mapped_) ::munmap(const_cast<char*>(mapped_), mapped_size_);
  owned_ = std::move(o.owned_);
  mapped_ = o.mapped_, mapped_size_ = o.mapped_size_;
  o.mapped_ = nullptr, o.mapped_size_ = 0;
  return *this;
}

FileBytes::~FileBytes() {
  if (mapped_) ::munmap(const_cast<char*>(mapped_), mapped_size_);
}

}  // namespace packbert::io
