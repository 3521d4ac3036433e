#include "io/paths.h"

#include <sys/stat.h>

#include <filesystem>

#include "error.h"

namespace packbert::io {

namespace fs = std::filesystem;

namespace {

bool identity(const std::string& p, dev_t& dev, ino_t& ino) {
  struct stat st{};
  if (p.empty() || ::stat(p.c_str(), &st) != 0) return false;
  dev = st.st_dev, ino = st.st_ino;
  return true;
}

[[noreturn]] void refuse(const NamedPath& out, const NamedPath& in, const char* how) {
  throw InputError(out.role + " " + out.path + ": " + how + " " + in.role + " (" + in.path +
                   "); an output never replaces an input: choose another " + out.role);
}

}  // namespace

bool same_file(const std::string& a, const std::string& b) {
  dev_t da, db;
  ino_t ia, ib;
  return identity(a, da, ia) && identity(b, db, ib) && da == db && ia == ib;
}

void refuse_outputs_over_inputs(const std::vector<NamedPath>& outputs,
                                const std::vector<NamedPath>& inputs) {
  for (const NamedPath& out : outputs)
    for (const NamedPath& in : inputs)
      if (!out.path.empty() && !in.path.empty() && same_file(out.path, in.path))
        refuse(out, in, "is also");
}

void refuse_directory_over_inputs(const NamedPath& dir, const std::vector<NamedPath>& inputs) {
  if (dir.path.empty() || !fs::exists(dir.path)) return;
  for (const NamedPath& in : inputs) {
    if (in.path.empty() || !fs::exists(in.path)) continue;
    // The input and each directory above it, compared with the output directory.
    std::error_code ec;
    const fs::path input = fs::canonical(in.path, ec);
    if (ec) continue;
    for (fs::path p = input; !p.empty(); p = p.parent_path()) {
      if (same_file(p.string(), dir.path)) refuse(dir, in, p == input ? "is also" : "holds");
      if (p == p.parent_path()) break;
    }
  }
}

}  // namespace packbert::io
