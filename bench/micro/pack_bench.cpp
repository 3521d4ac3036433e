// Packing benchmark: every packer on both embedded histograms (Wikipedia-512, SQuAD-384) at
// depth caps 2, 3, 4, 8 and unlimited. Runs are interleaved across packers (run r of every
// packer before run r+1 of any) and the median wall time is reported.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/pack_report.h"
#include "data/embedded.h"
#include "io/atomic_file.h"
#include "kernels/cpu_features.h"
#include "pack/histogram.h"

using namespace packbert;

int main(int argc, char** argv) {
  CLI::App app{"pack_bench: every packer on the embedded histograms, median of interleaved runs"};
  int runs = 5;
  std::string markdown;
  app.add_option("--runs", runs, "Timed runs per packer and case")->capture_default_str();
  app.add_option("--markdown", markdown, "Also write the tables as Markdown to this file");
  CLI11_PARSE(app, argc, argv);
  std::cout << "CPU: " << kernels::cpu_features().model << " (" << kernels::cpu_features().isa()
            << ")\n";

  struct Case {
    const char* name;
    const char* text;
    int max_len;
  } cases[] = {{"wikipedia_512", data::kWikipedia512Histogram, 512},
               {"squad_384", data::kSquad384Histogram, 384}};
  std::ostringstream md;
  md << "Command: `build/pack_bench --runs " << runs << "` (median of " << runs
     << " interleaved runs; seconds are the packer alone).\n\n";
  for (const Case& c : cases) {
    pack::Histogram h = pack::parse_histogram(c.text, c.name, c.max_len);
    cli::Table table({"depth", "algo", "packs", "efficiency %", "packing factor", "lower bound",
                      "gap", "median s"});
    for (int depth : {2, 3, 4, 8, 0}) {
      pack::PackOptions o;
      o.max_len = c.max_len;
      o.max_per_pack = depth;
      std::vector<pack::Algo> algos;
      for (pack::Algo a : pack::kAllAlgos)
        if (pack::algo_supports(a, o)) algos.push_back(a);
      std::vector<std::vector<double>> seconds(algos.size());
      std::vector<pack::PackPlan> plans(algos.size());
      for (int r = 0; r < runs; ++r)
        for (size_t i = 0; i < algos.size(); ++i) {
          plans[i] = pack::run_packer(algos[i], h, o);
          seconds[i].push_back(plans[i].seconds);
        }
      const pack::PackPlan& opt = plans.back();
      for (size_t i = 0; i < algos.size(); ++i) {
        std::sort(seconds[i].begin(), seconds[i].end());
        const pack::PackPlan& p = plans[i];
        table.add_row({depth ? std::to_string(depth) : "unlimited", p.algo,
                       cli::with_commas(p.packs()), cli::fixed(100 * p.efficiency(), 3),
                       cli::fixed(p.packing_factor(), 4), cli::with_commas(opt.lower_bound),
                       cli::with_commas(p.packs() - opt.lower_bound),
                       cli::seconds_text(seconds[i][seconds[i].size() / 2])});
      }
    }
    std::cout << c.name << " (" << cli::with_commas(h.sequences()) << " sequences)\n";
    table.print(std::cout);
    std::cout << '\n';
    md << "### " << c.name << " (" << cli::with_commas(h.sequences()) << " sequences)\n\n";
    table.print_markdown(md);
    md << '\n';
  }
  if (!markdown.empty()) io::write_file_atomic(markdown, md.str());
  return 0;
}
