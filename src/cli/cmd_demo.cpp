// `packbert demo`: the embedded default job. Until training lands it packs the embedded
// Wikipedia-512 histogram with every packer, with and without a depth cap, and prints the
// comparison tables.
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/pack_report.h"
#include "data/embedded.h"
#include "pack/histogram.h"

namespace packbert::cli {

namespace {

void run_demo() {
  pack::Histogram h =
      pack::parse_histogram(data::kWikipedia512Histogram, "data/wikipedia_512.hist", 512);
  std::cout << "packbert demo: packing English Wikipedia's BERT sequence lengths ("
            << with_commas(h.sequences()) << " sequences, " << with_commas(h.tokens())
            << " tokens, max length 512)\n";
  for (int depth : {0, 3}) {
    pack::PackOptions options{.max_len = 512, .max_per_pack = depth};
    std::vector<pack::PackPlan> plans;
    for (pack::Algo algo : pack::kAllAlgos)
      if (pack::algo_supports(algo, options)) plans.push_back(pack::run_packer(algo, h, options));
    const pack::PackPlan& opt = plans.back();
    std::cout << "\nmax sequences per pack: " << (depth ? std::to_string(depth) : "unlimited")
              << "\n";
    plan_table(plans, {opt.lp_value, opt.lower_bound}).print(std::cout);
  }
  std::cout << "\nPacking halves the rows BERT computes on: efficiency is the share of real "
               "tokens; gap is packs above the proven LP lower bound.\n";
}

}  // namespace

void register_demo(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("demo", "Run the embedded default job (packing comparison)");
  cmd->callback(run_demo);
}

}  // namespace packbert::cli
