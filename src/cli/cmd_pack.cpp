// `packbert pack`: pack a length histogram with one packer or all of them, print the
// comparison table, and write the chosen plan as JSON.
#include <algorithm>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "io/paths.h"
#include "cli/flags.h"
#include "cli/pack_report.h"
#include "data/sequences.h"
#include "error.h"
#include "io/atomic_file.h"
#include "pack/histogram.h"

namespace packbert::cli {

namespace {

struct PackArgs {
  std::string input;
  std::string algo = "optimal";
  std::optional<int> max_seq_len;  // unset: 512 for a histogram, the file's own for sequences
  int max_per_pack = 0;
  std::string out;
  uint64_t seed = 1;
};

// A sequences file in, a packs file out (concrete sequence ids per pack).
void pack_sequences_file(const PackArgs& a) {
  if (a.algo == "all")
    throw InputError("--algo all compares packers on a histogram; pick one to write packs");
  if (a.out.empty()) throw InputError("--out is required when packing a sequences file");
  io::refuse_outputs_over_inputs({{a.out, "--out"}}, {{a.input, "input"}});
  data::SequencesFile f = data::read_sequences(a.input);
  pack::PackOptions po;
  po.max_len = a.max_seq_len.value_or(f.max_seq_len);
  po.max_per_pack = a.max_per_pack;
  pack::PackPlan plan;
  data::PacksFile p = data::make_packs(f, data::sequences_checksum(a.input),
                                       pack::parse_algo(a.algo), po, a.seed, &plan);
  pack::PackBound bound =
      plan.lower_bound >= 0
          ? pack::PackBound{plan.lp_value, plan.lower_bound}
          : pack::packing_lower_bound(pack::histogram_of(f.lengths(), po.max_len), po);
  std::cout << a.input << ": " << with_commas(static_cast<int64_t>(f.size())) << " sequences, "
            << with_commas(static_cast<int64_t>(f.tokens.size())) << " tokens, max length "
            << po.max_len << '\n';
  plan_table({plan}, bound).print(std::cout);
  data::write_packs(a.out, p);
  std::cout << "wrote " << with_commas(static_cast<int64_t>(p.packs())) << " packs to " << a.out
            << '\n';
}

void run_pack(PackArgs a) {
  if (data::file_kind(a.input) == "sequences") return pack_sequences_file(a);
  const int max_seq_len = a.max_seq_len.value_or(512);
  if (a.max_per_pack < 0)
    throw InputError("--max-per-pack: " + std::to_string(a.max_per_pack) +
                     " is negative (0 means unlimited)");
  pack::PackOptions options{.max_len = max_seq_len, .max_per_pack = a.max_per_pack};
  std::vector<pack::Algo> algos;
  if (a.algo == "all") {
    for (pack::Algo algo : pack::kAllAlgos)
      if (pack::algo_supports(algo, options)) algos.push_back(algo);
  } else {
    algos.push_back(pack::parse_algo(a.algo));
  }
  pack::Histogram h = pack::read_histogram(a.input, max_seq_len);

  std::vector<pack::PackPlan> plans;
  for (pack::Algo algo : algos) plans.push_back(pack::run_packer(algo, h, options));
  pack::PackBound bound;
  auto opt = std::find_if(plans.begin(), plans.end(), [](auto& p) { return p.lower_bound >= 0; });
  if (opt != plans.end())
    bound = {opt->lp_value, opt->lower_bound};
  else
    bound = pack::packing_lower_bound(h, options);

  std::cout << a.input << ": " << with_commas(h.sequences()) << " sequences, "
            << with_commas(h.tokens()) << " tokens, max length " << max_seq_len << ", max per pack "
            << (a.max_per_pack ? std::to_string(a.max_per_pack) : std::string("unlimited"))
            << "; LP bound " << fixed(bound.lp_value, 2) << " packs\n";
  plan_table(plans, bound).print(std::cout);

  if (!a.out.empty()) {
    const pack::PackPlan& best = *std::min_element(
        plans.begin(), plans.end(), [](auto& x, auto& y) { return x.packs() < y.packs(); });
    io::write_file_atomic(a.out, plan_to_json(best, bound).dump(1) + "\n");
    std::cout << "wrote " << best.algo << " plan (" << best.recipes.size() << " recipes) to "
              << a.out << '\n';
  }
}

}  // namespace

void register_pack(CLI::App& app) {
  auto args = std::make_shared<PackArgs>();
  CLI::App* cmd = app.add_subcommand(
      "pack",
      "Pack sequences into fixed-length rows: compare packers on a length histogram, or write "
      "the packs file of a sequences file");
  cmd->add_option("input", args->input,
                  "A length histogram ('length count' lines, '#' comments, e.g. "
                  "data/wikipedia_512.hist) or a sequences file from prepare (then --out names "
                  "the packs file to write)")
      ->required();
  cmd->add_option("--algo", args->algo,
                  "none|spfhp|lpfhp|nnlshp|optimal, or all to compare every packer")
      ->capture_default_str();
  number(cmd, "--max-seq-len", args->max_seq_len,
         "Tokens per pack (default 512, or the sequences file's max length)", 1, 65536);
  number(cmd, "--max-per-pack", args->max_per_pack,
         "Most sequences in one pack (0 = unlimited; nnlshp needs 1-3)", 0, 65536);
  cmd->add_option("--out", args->out,
                  "Histogram input: write the plan (with --algo all, the one with fewest packs) "
                  "as JSON. Sequences input: the packs file to write");
  number(cmd, "--seed", args->seed, "Seed for assigning sequences to packs and pack order", 0,
         kMaxSeed);
  cmd->callback([args] { run_pack(*args); });
}

}  // namespace packbert::cli
