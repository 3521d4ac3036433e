#include "train/metrics_log.h"

#include <nlohmann/json.hpp>

#include "error.h"

namespace packbert::train {

ReportTo ReportTo::parse(const std::string& names) {
  ReportTo r;
  size_t at = 0;
  while (at <= names.size()) {
    size_t comma = names.find(',', at);
    if (comma == std::string::npos) comma = names.size();
    const std::string name = names.substr(at, comma - at);
    if (name == "tensorboard")
      r.tensorboard = true;
    else if (name != "jsonl" && name != "none")
      throw OptionError("report_to", "'" + name +
                                         "' is not one packbert reports to (jsonl, tensorboard, "
                                         "none, or a list: jsonl,tensorboard)");
    at = comma + 1;
  }
  return r;
}

std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& record) {
  std::vector<std::pair<std::string, double>> out;
  if (!record.is_object()) return out;
  const std::string type = record.value("type", std::string("step"));
  const std::string prefix = type == "step" ? "train/" : type + "/";
  for (const auto& [key, value] : record.items())
    if (key != "step" && value.is_number()) out.emplace_back(prefix + key, value.get<double>());
  return out;
}

MetricsLog::MetricsLog() : std::ostream(&buf_) {}
MetricsLog::~MetricsLog() {
  close();
}

void MetricsLog::open(const std::string& path, bool append, const ReportTo& report,
                      const std::string& tensorboard_dir, int64_t resumed_step) {
  buf_.file.open(path, append ? std::ios::app : std::ios::trunc);
  if (!buf_.file) throw InputError(path + ": cannot open for writing");
  if (report.tensorboard)
    buf_.events = std::make_unique<io::EventFileWriter>(tensorboard_dir, resumed_step);
  clear();
}

void MetricsLog::close() {
  buf_.pubsync();
  if (!buf_.line.empty()) buf_.take_line();
  buf_.file.close();
  buf_.events.reset();
}

int MetricsLog::LineBuf::overflow(int c) {
  if (c == traits_type::eof()) return 0;
  line.push_back(static_cast<char>(c));
  if (c == '\n') take_line();
  return c;
}

std::streamsize MetricsLog::LineBuf::xsputn(const char* s, std::streamsize n) {
  for (std::streamsize i = 0; i < n; ++i) overflow(static_cast<unsigned char>(s[i]));
  return n;
}

int MetricsLog::LineBuf::sync() {
  file.flush();
  if (events) events->flush();
  return file ? 0 : -1;
}

// A whole line (overflow hands over each one at its newline; close() a last one without):
// to metrics.jsonl as it is, and its JSON record's numbers to the event file.
void MetricsLog::LineBuf::take_line() {
  file << line;
  if (events) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_object() && record.contains("step") && record["step"].is_number_integer())
      events->scalars(record["step"].get<int64_t>(), tensorboard_scalars(record));
  }
  line.clear();
}

}  // namespace packbert::train
