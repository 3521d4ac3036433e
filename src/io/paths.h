// No output may replace an input: each command names its outputs and inputs, and this refuses
// (InputError, before any work) an output that is an input after links are resolved (the same
// device and inode), or a directory replaced whole that is or holds an input.
#pragma once

#include <string>
#include <vector>

namespace packbert::io {

struct NamedPath {
  std::string path;
  std::string role;  // how the user named it: "`out_dir`", "input", "`vocab`" (an option field)
};

// True when both paths exist and are the same file (device and inode, after links).
bool same_file(const std::string& a, const std::string& b);

// Throws InputError "<role> <path>: is also <role> (<path>); an output never replaces an input"
// for the first output file that is one of `inputs`. Empty paths are skipped.
void refuse_outputs_over_inputs(const std::vector<NamedPath>& outputs,
                                const std::vector<NamedPath>& inputs);

// The same for an output directory that is replaced whole (staged and swapped into place): it
// must not be an input nor hold one.
void refuse_directory_over_inputs(const NamedPath& dir, const std::vector<NamedPath>& inputs);

}  // namespace packbert::io
