#include "io/tfevents.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "error.h"
#include "io/atomic_file.h"

namespace packbert::io {

namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0x82F63B78u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// Protocol buffer wire format: varints, and fields by number and wire type.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, int field, int wire) {
  varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire));
}
void bytes_field(std::string& out, int field, std::string_view bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out.append(bytes);
}
template <typename T>
void fixed_field(std::string& out, int field, T value) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  key(out, field, sizeof(T) == 8 ? 1 : 5);
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));  // (x86-64: little-endian, as the wire format)
  out.append(raw, sizeof(T));
}

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
// summary = 5 (Summary), session_log = 6 (SessionLog).
std::string event_head(int64_t step) {
  const double wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string e;
  fixed_field(e, 1, wall);
  key(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  const auto& t = crc_table();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = t[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

EventFileWriter::EventFileWriter(const std::string& dir, int64_t restart_step) {
  make_output_dir(dir, "TensorBoard's directory");
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  // (a restarted run within the same second gets a name of its own)
  for (int n = 0;; ++n) {
    path_ = dir + "/events.out.tfevents." + std::to_string(seconds) + "." + host + "." +
            std::to_string(::getpid()) + "." + std::to_string(n);
    if (!std::filesystem::exists(path_)) break;
  }
  out_.open(path_, std::ios::binary);
  if (!out_) throw InputError(path_ + ": cannot open for writing");
  std::string version = event_head(0);
  bytes_field(version, 3, "brain.Event:2");
  record(version);
  if (restart_step >= 0) {
    std::string log;  // SessionLog: status = 1 (START = 1)
    key(log, 1, 0);
    varint(log, 1);
    std::string e = event_head(restart_step + 1);
    bytes_field(e, 6, log);
    record(e);
  }
  out_.flush();
}

void EventFileWriter::scalars(int64_t step,
                              const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string v;  // Summary.Value: tag = 1, simple_value = 2 (float)
    bytes_field(v, 1, tag);
    fixed_field(v, 2, static_cast<float>(value));
    bytes_field(summary, 1, v);
  }
  std::string e = event_head(step);
  bytes_field(e, 5, summary);
  record(e);
}

void EventFileWriter::record(const std::string& event) {
  char len[8];
  const uint64_t n = event.size();
  std::memcpy(len, &n, 8);
  const std::string_view length(len, 8);
  const uint32_t len_crc = masked_crc32c(length), data_crc = masked_crc32c(event);
  out_.write(len, 8);
  out_.write(reinterpret_cast<const char*>(&len_crc), 4);
  out_.write(event.data(), static_cast<std::streamsize>(event.size()));
  out_.write(reinterpret_cast<const char*>(&data_crc), 4);
  if (!out_) throw InputError(path_ + ": cannot write (disk full?)");
}

}  // namespace packbert::io
