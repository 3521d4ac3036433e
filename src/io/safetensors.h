// safetensors: an 8-byte little-endian header length N, N bytes of JSON header
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__":
// {string: string}}, then the raw little-endian tensor bytes. Reading validates everything a
// hostile or truncated file could get wrong and names the tensor at fault.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "io/input_file.h"

namespace packbert::io {

// Bytes per element of a safetensors dtype (F32, BF16, I64, ...); 0 for an unknown one.
size_t dtype_size(const std::string& dtype);

struct TensorEntry {
  std::string dtype;  // F32, F64, I32, I64, F16, BF16, U8, I8, BOOL, ...
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // byte offsets into the data section
};

class SafetensorsFile {
 public:
  // Throws InputError "<path>: ..." on any malformed content.
  static SafetensorsFile read(const std::string& path);
  // `bytes`: the whole file (mapped by read(), or in memory). Only the header and the tensors
  // asked for are ever touched.
  static SafetensorsFile parse(FileBytes bytes, const std::string& source);

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorEntry& entry(const std::string& name) const;  // throws InputError if missing
  const std::map<std::string, TensorEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor converted to float / int32 (F32/F64/F16/BF16 → float; I32/I64 → int32), checked
  // against `expected_shape` when given. Throws InputError naming the tensor.
  std::vector<float> floats(const std::string& name,
                            const std::vector<int64_t>* expected_shape = nullptr) const;
  std::vector<int32_t> ints(const std::string& name) const;
  // The tensor's bytes as stored (little-endian, its own dtype). Throws InputError if missing.
  std::string_view raw(const std::string& name) const;
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  FileBytes bytes_;
  size_t data_start_ = 0;
  std::map<std::string, TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The file's __metadata__, reading only its header; empty when the file cannot be read, is not
// safetensors or has none (a probe: nothing here is an error).
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);

struct TensorToWrite {
  std::string name;
  std::string dtype;  // "F32" or "I32"
  std::vector<int64_t> shape;
  const void* data;
  size_t bytes;
};

// Serialises tensors (in the given order) with metadata; write_safetensors stores it atomically.
std::string serialize_safetensors(const std::vector<TensorToWrite>& tensors,
                                  const std::map<std::string, std::string>& metadata);
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace packbert::io
