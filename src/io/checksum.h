// 64-bit FNV-1a, the checksum of packbert's binary files and the vocabulary fingerprint.
#pragma once

#include <cstddef>
#include <cstdint>

namespace packbert::io {

constexpr uint64_t kFnvOffsetBasis = 14695981039346656037ULL;  // FNV-1a 64, as published
constexpr uint64_t kFnvPrime = 1099511628211ULL;
// Format version 1 files were written with this basis (the published one with a digit lost);
// readers of version 1 still use it.
constexpr uint64_t kFnvOffsetBasisV1 = 1469598103934665603ULL;

// Continues a hash `h` over n bytes (start with the offset basis).
inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnvOffsetBasis) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

// The offset basis files of `format_version` use.
constexpr uint64_t fnv_basis_for(uint32_t format_version) {
  return format_version == 1 ? kFnvOffsetBasisV1 : kFnvOffsetBasis;
}

}  // namespace packbert::io
