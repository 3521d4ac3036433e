// `packbert plot`: curves from metrics.jsonl files (pretrain's and finetune's), one line per run,
// as a standalone SVG (the demo's plot code).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/commands.h"
#include "cli/plot.h"
#include "error.h"
#include "io/atomic_file.h"
#include "io/input_file.h"
#include "io/paths.h"

namespace packbert::cli {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct PlotArgs {
  std::vector<std::string> runs;
  std::string out, metric = "loss", x = "step", title;
};

// The run's points: (step or elapsed seconds, metric) of the records of the metric's type.
Series read_series(const std::string& run, const std::string& metric, const std::string& x,
                   std::set<std::string>& keys_seen, int64_t& without_x) {
  const std::string path = fs::is_directory(run) ? (fs::path(run) / "metrics.jsonl").string() : run;
  io::require_text_input(path);
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open for reading");
  // "eval.mlm_acc" reads eval records; a bare name reads step records.
  const size_t dot = metric.find('.');
  const std::string type = dot == std::string::npos ? "step" : metric.substr(0, dot);
  const std::string key = dot == std::string::npos ? metric : metric.substr(dot + 1);
  const std::string x_key = x == "seconds" ? "elapsed" : "step";
  Series s;
  s.name = fs::path(run).filename().string() == "metrics.jsonl"
               ? fs::path(run).parent_path().filename().string()
               : fs::path(run).filename().string();
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    const json r = json::parse(line, nullptr, false);
    if (r.is_discarded() || !r.is_object())
      throw InputError(path + ":" + std::to_string(line_no) + ": not a JSON record");
    if (r.value("type", std::string("step")) != type) continue;
    for (const auto& [k, v] : r.items())
      if (v.is_number()) keys_seen.insert(type == "step" ? k : type + "." + k);
    if (!r.contains(key) || !r[key].is_number()) continue;
    if (r.contains(x_key) && r[x_key].is_number())
      s.points.push_back({r[x_key].get<double>(), r[key].get<double>()});
    else
      ++without_x;
  }
  return s;
}

void run_plot(const PlotArgs& a) {
  if (a.x != "step" && a.x != "seconds")
    throw InputError("--x " + a.x + ": expected step or seconds");
  std::vector<io::NamedPath> inputs;
  for (const std::string& r : a.runs) inputs.push_back({r, "input"});
  io::refuse_outputs_over_inputs({{a.out, "--out"}}, inputs);
  static const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                        "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  std::vector<Series> series;
  std::set<std::string> keys;
  for (const std::string& run : a.runs) {
    int64_t without_x = 0;  // records with the metric but not the x axis
    Series s = read_series(run, a.metric, a.x, keys, without_x);
    if (s.points.empty() && without_x > 0)
      throw InputError(run + ": its " + std::to_string(without_x) + " records with '" + a.metric +
                       "' have no '" + (a.x == "seconds" ? "elapsed" : "step") +
                       "' to place them by `--x " + a.x +
                       "` (a run written before records "
                       "carried it); plot them by --x " +
                       (a.x == "seconds" ? "step" : "seconds"));
    if (s.points.empty()) {
      std::string known;
      for (const std::string& k : keys) known += (known.empty() ? "" : ", ") + k;
      throw InputError(run + ": no record has '" + a.metric +
                       "' (numbers its records have: " + (known.empty() ? "none" : known) + ")");
    }
    s.color = kColors[series.size() % std::size(kColors)];
    series.push_back(std::move(s));
  }
  const std::string title = a.title.empty() ? a.metric + " by " + a.x : a.title;
  io::write_file_atomic(
      a.out, svg_plot(series, title, a.x == "seconds" ? "training seconds" : "step", a.metric));
  std::cout << "wrote " << a.out << " (" << series.size() << " run"
            << (series.size() > 1 ? "s" : "") << ", " << a.metric << ")\n";
}

}  // namespace

void register_plot(CLI::App& app) {
  auto a = std::make_shared<PlotArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plot", "Curves from metrics.jsonl files (or run directories), one line per run, as SVG");
  cmd->add_option("runs", a->runs, "metrics.jsonl files or the run directories holding them")
      ->required();
  cmd->add_option("--out", a->out, "SVG file to write")->required();
  cmd->add_option("--metric", a->metric,
                  "A number of the step records (loss, mlm_acc, lr, grad_norm, ...), or of "
                  "another record type as TYPE.NAME (eval.mlm_acc, eval.mlm_loss, eval.dev_acc)")
      ->capture_default_str();
  cmd->add_option("--x", a->x, "step | seconds (training seconds)")->capture_default_str();
  cmd->add_option("--title", a->title, "Title (default: the metric by the x axis)");
  cmd->callback([a] { run_plot(*a); });
}

}  // namespace packbert::cli
