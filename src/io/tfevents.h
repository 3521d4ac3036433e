// TensorBoard event files, written by hand: TFRecord framing (a little-endian length, its masked
// CRC-32C, the record, its masked CRC-32C) around tensorflow.Event protocol buffers (wall_time,
// step, file_version, a Summary of simple_value scalars, a SessionLog). Five message fields are
// all packbert writes, so a small encoder beats generating code from TensorFlow's .proto files.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace packbert::io {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `data`, and TFRecord's mask of it.
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

class EventFileWriter {
 public:
  // Creates `dir` if missing and opens events.out.tfevents.<seconds>.<host>.<pid> in it (the
  // name TensorFlow's writers use), starting with the file_version event. `restart_step` >= 0:
  // a run resumed after that step; a SessionLog START at restart_step + 1 makes TensorBoard drop
  // the earlier files' events from that step on (the resumed run writes them again).
  EventFileWriter(const std::string& dir, int64_t restart_step = -1);
  const std::string& path() const { return path_; }
  // One Event holding a Summary with a scalar per (tag, value).
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  void flush() { out_.flush(); }

 private:
  void record(const std::string& event);
  std::string path_;
  std::ofstream out_;
};

}  // namespace packbert::io
