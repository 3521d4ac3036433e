// Where a run's metrics records go: metrics.jsonl always (resume cuts it back and replays it,
// `packbert plot` and trainer_state.json read it), and TensorBoard event files under
// <run>/runs/ with `--report-to tensorboard`. The drivers write JSON lines to one ostream; each
// whole line goes to the file and, parsed, to the reporters.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <ostream>
#include <streambuf>
#include <string>
#include <utility>
#include <vector>

#include "io/tfevents.h"

namespace packbert::train {

// `--report-to`: Hugging Face's report_to names. jsonl (the default) and none report nowhere
// besides metrics.jsonl; tensorboard adds event files.
struct ReportTo {
  bool tensorboard = false;
  // "jsonl", "none", "tensorboard", or a comma-separated list of them (HF's list form); an
  // unknown name is an OptionError naming the field `report_to`.
  static ReportTo parse(const std::string& names);
};

// A metrics record's TensorBoard scalars: each number but "step", tagged "train/<key>" for step
// records, "eval/<key>" for evaluations, "<type>/<key>" for the others (NaN, written as null,
// and non-numbers are left out).
std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& record);

class MetricsLog : public std::ostream {
 public:
  MetricsLog();
  ~MetricsLog() override;
  // Opens `path` (appending or starting it over) and, with report.tensorboard, a new event file
  // in `tensorboard_dir`; a run resumed after `resumed_step` (>= 0) tells TensorBoard to drop
  // the earlier files' records after it.
  void open(const std::string& path, bool append, const ReportTo& report,
            const std::string& tensorboard_dir, int64_t resumed_step = -1);
  bool is_open() const { return buf_.file.is_open(); }
  void close();

 private:
  struct LineBuf : std::streambuf {
    std::ofstream file;
    std::unique_ptr<io::EventFileWriter> events;
    std::string line;
    int overflow(int c) override;
    std::streamsize xsputn(const char* s, std::streamsize n) override;
    int sync() override;
    void take_line();
  };
  LineBuf buf_;
};

}  // namespace packbert::train
