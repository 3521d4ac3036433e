// `packbert demo`: the embedded default job. Until training lands it (1) packs the embedded
// Wikipedia-512 histogram with every packer, with and without a depth cap, and (2) turns the
// demo corpus (Debian dict-gcide) into a packed pre-training dataset and summarises it.
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/pack_report.h"
#include "data/corpus.h"
#include "data/embedded.h"
#include "data/gcide.h"
#include "data/sequences.h"
#include "io/atomic_file.h"
#include "pack/histogram.h"

namespace packbert::cli {

namespace {

struct DemoArgs {
  std::string workdir = "out/demo", vocab = PACKBERT_DEFAULT_VOCAB;
};

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

void packing_tables() {
  pack::Histogram h =
      pack::parse_histogram(data::kWikipedia512Histogram, "data/wikipedia_512.hist", 512);
  std::cout << "== 1. Packing English Wikipedia's BERT sequence lengths ("
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
  std::cout << "\nEfficiency is the share of real tokens; gap is packs above the proven LP "
               "lower bound.\n";
}

void demo_corpus(const DemoArgs& a) {
  std::cout << "\n== 2. The demo corpus: Debian's dict-gcide, one dictionary entry a document\n";
  std::filesystem::create_directories(a.workdir);
  auto t0 = std::chrono::steady_clock::now();
  size_t entries = 0;
  std::string text = data::gcide_to_text("/usr/share/dictd/gcide.index",
                                         "/usr/share/dictd/gcide.dict.dz", &entries);
  const std::string txt = a.workdir + "/gcide.txt", seqs = a.workdir + "/gcide.seqs",
                    packs = a.workdir + "/gcide.packs";
  io::write_file_atomic(txt, text);
  data::Vocab vocab = data::Vocab::load(a.vocab);
  data::Tokenizer tok(vocab, true);
  auto docs = data::read_corpus({txt}, tok, false);
  data::PretrainingOptions o;
  o.max_seq_len = 128;
  data::SequencesFile f = data::create_pretraining_data(docs, vocab, o);
  data::write_sequences(seqs, f);
  pack::PackOptions po;
  po.max_len = 128;
  pack::PackPlan plan;
  data::PacksFile p =
      data::make_packs(f, data::sequences_checksum(seqs), pack::Algo::optimal, po, 1, &plan);
  data::write_packs(packs, p);
  std::cout << with_commas(static_cast<int64_t>(entries)) << " entries → "
            << with_commas(static_cast<int64_t>(f.size())) << " sequences of at most 128 tokens ("
            << with_commas(static_cast<int64_t>(f.tokens.size())) << " tokens) in "
            << fixed(since(t0), 1) << " s; wrote " << seqs << " and " << packs << "\n";
  const double unpacked =
      static_cast<double>(f.tokens.size()) / (static_cast<double>(f.size()) * 128);
  Table t({"layout", "rows", "efficiency %", "rows saved"});
  t.add_row({"one per row (padded)", with_commas(static_cast<int64_t>(f.size())),
             fixed(100 * unpacked, 2), "-"});
  t.add_row(
      {"packed (optimal)", with_commas(plan.packs()), fixed(100 * plan.efficiency(), 2),
       fixed(100.0 * (1.0 - static_cast<double>(plan.packs()) / static_cast<double>(f.size())), 1) +
           " %"});
  t.print(std::cout);
  std::cout << "\nLook inside: build/packbert inspect " << seqs << "\n";
}

}  // namespace

void register_demo(CLI::App& app) {
  auto a = std::make_shared<DemoArgs>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "Run the embedded default job: packing comparison, then the demo corpus pipeline");
  cmd->add_option("--workdir", a->workdir, "Where the demo writes its files")
      ->capture_default_str();
  cmd->add_option("--vocab", a->vocab)->capture_default_str();
  cmd->callback([a] {
    packing_tables();
    demo_corpus(*a);
  });
}

}  // namespace packbert::cli
