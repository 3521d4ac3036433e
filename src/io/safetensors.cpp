#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "error.h"
#include "io/atomic_file.h"

namespace packbert::io {

size_t dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "U8" || d == "I8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

namespace {

// The header's length: the file's first 8 bytes, little-endian.
uint64_t header_length(const char* first8) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(first8[i]);
  return n;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) mant <<= 1, --exp;
      bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  return parse(FileBytes::map(path), path);
}

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  try {
    require_regular_file(path);  // (a pipe or device would block or never end)
  } catch (const InputError&) {
    return {};
  }
  std::ifstream in(path, std::ios::binary);
  char first8[8];
  if (!in.read(first8, 8)) return {};
  const uint64_t n = header_length(first8);
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(8);
  if (n > (uint64_t{1} << 28) || n > size - 8) return {};
  std::string header(n, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(n))) return {};
  const nlohmann::json j = nlohmann::json::parse(header, nullptr, false);
  if (!j.is_object() || !j.contains("__metadata__") || !j["__metadata__"].is_object()) return {};
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : j["__metadata__"].items())
    out[k] = v.is_string() ? v.get<std::string>() : v.dump();  // (parse() refuses non-strings)
  return out;
}

SafetensorsFile SafetensorsFile::parse(FileBytes bytes, const std::string& source) {
  SafetensorsFile f;
  f.source_ = source;
  f.bytes_ = std::move(bytes);
  auto fail = [&](const std::string& what) { throw InputError(source + ": " + what); };
  if (f.bytes_.size() < 8) fail("truncated: shorter than the 8-byte header length");
  const uint64_t n = header_length(f.bytes_.data());
  if (n > f.bytes_.size() - 8)
    fail("truncated: header claims " + std::to_string(n) + " bytes, file has " +
         std::to_string(f.bytes_.size() - 8) + " after the length");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(f.bytes_.data() + 8, f.bytes_.data() + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) fail("header is not a JSON object");
  f.data_start_ = 8 + n;
  const size_t data_size = f.bytes_.size() - f.data_start_;
  std::vector<std::pair<size_t, std::string>> spans;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail("__metadata__ is not an object");
      for (auto& [k, m] : v.items()) {
        if (!m.is_string()) fail("__metadata__ value for '" + k + "' is not a string");
        f.metadata_[k] = m.get<std::string>();
      }
      continue;
    }
    auto tfail = [&](const std::string& what) { fail("tensor '" + name + "': " + what); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets"))
      tfail("needs dtype, shape and data_offsets");
    TensorEntry e;
    if (!v["dtype"].is_string()) tfail("dtype is not a string");
    e.dtype = v["dtype"].get<std::string>();
    size_t elem = dtype_size(e.dtype);
    if (!elem) tfail("unknown dtype " + e.dtype);
    if (!v["shape"].is_array()) tfail("shape is not an array");
    uint64_t numel = 1;
    for (auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) tfail("shape has a non-integer or negative dimension");
      uint64_t dim = d.get<uint64_t>();
      if (dim && numel > (uint64_t{1} << 62) / dim) tfail("shape overflows");
      numel *= dim;
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      tfail("data_offsets must be two non-negative integers");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_size)
      tfail("data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
            "] outside the " + std::to_string(data_size) + "-byte data section (truncated file?)");
    if (e.end - e.begin != numel * elem)
      tfail("holds " + std::to_string(e.end - e.begin) + " bytes, but " + e.dtype + " " +
            shape_text(e.shape) + " needs " + std::to_string(numel * elem));
    spans.push_back({e.begin, name});
    f.tensors_[name] = e;
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    const TensorEntry& prev = f.tensors_[spans[i - 1].second];
    if (spans[i].first < prev.end)
      fail("tensors '" + spans[i - 1].second + "' and '" + spans[i].second + "' overlap");
  }
  return f;
}

const TensorEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw InputError(source_ + ": missing tensor '" + name + "'");
  return it->second;
}

std::vector<float> SafetensorsFile::floats(const std::string& name,
                                           const std::vector<int64_t>* expected_shape) const {
  const TensorEntry& e = entry(name);
  if (expected_shape && e.shape != *expected_shape)
    throw InputError(source_ + ": tensor '" + name + "' has shape " + shape_text(e.shape) +
                     ", the config needs " + shape_text(*expected_shape));
  const char* p = bytes_.data() + data_start_ + e.begin;
  const size_t bytes = e.end - e.begin;
  std::vector<float> out;
  if (e.dtype == "F32") {
    out.resize(bytes / 4);
    std::memcpy(out.data(), p, bytes);
  } else if (e.dtype == "F64") {
    out.resize(bytes / 8);
    for (size_t i = 0; i < out.size(); ++i) {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      out[i] = static_cast<float>(d);
    }
  } else if (e.dtype == "F16" || e.dtype == "BF16") {
    out.resize(bytes / 2);
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      if (e.dtype == "F16") {
        out[i] = half_to_float(h);
      } else {
        uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(&out[i], &bits, 4);
      }
    }
  } else {
    throw InputError(source_ + ": tensor '" + name + "' has dtype " + e.dtype +
                     ", expected a floating-point type");
  }
  return out;
}

std::string_view SafetensorsFile::raw(const std::string& name) const {
  const TensorEntry& e = entry(name);
  return {bytes_.data() + data_start_ + e.begin, e.end - e.begin};
}

std::vector<int32_t> SafetensorsFile::ints(const std::string& name) const {
  const TensorEntry& e = entry(name);
  const char* p = bytes_.data() + data_start_ + e.begin;
  const size_t bytes = e.end - e.begin;
  std::vector<int32_t> out;
  if (e.dtype == "I32") {
    out.resize(bytes / 4);
    std::memcpy(out.data(), p, bytes);
  } else if (e.dtype == "I64") {
    out.resize(bytes / 8);
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t v;
      std::memcpy(&v, p + 8 * i, 8);
      if (v < INT32_MIN || v > INT32_MAX)
        throw InputError(source_ + ": tensor '" + name + "' value " + std::to_string(v) +
                         " does not fit int32");
      out[i] = static_cast<int32_t>(v);
    }
  } else {
    throw InputError(source_ + ": tensor '" + name + "' has dtype " + e.dtype +
                     ", expected I32 or I64");
  }
  return out;
}

namespace {

// The length and header of a safetensors file of `tensors` (their bytes follow in order).
std::string safetensors_header(const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8) h += ' ';  // align the data section to 8 bytes
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i) & 0xff);
  return out + h;
}

}  // namespace

std::string serialize_safetensors(const std::vector<TensorToWrite>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  std::string out = safetensors_header(tensors, metadata);
  size_t bytes = 0;
  for (const TensorToWrite& t : tensors) bytes += t.bytes;
  out.reserve(out.size() + bytes);
  for (const TensorToWrite& t : tensors) out.append(static_cast<const char*>(t.data), t.bytes);
  return out;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Written tensor by tensor from where they lie: a checkpoint costs no second copy in memory.
  const std::string header = safetensors_header(tensors, metadata);
  std::vector<std::string_view> pieces = {header};
  for (const TensorToWrite& t : tensors)
    pieces.emplace_back(static_cast<const char*>(t.data), t.bytes);
  write_file_atomic(path, pieces);
}

}  // namespace packbert::io
