// `packbert demo`: the embedded default job. (1) packs the embedded Wikipedia-512 histogram with
// every packer, with and without a depth cap; (2) turns the demo corpus (Debian dict-gcide) into
// a packed pre-training dataset; (3) pre-trains a small BERT on it packed and padded with the
// same sequences per step, and prints the time-to-accuracy table and an SVG plot.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/pack_report.h"
#include "cli/plot.h"
#include "data/corpus.h"
#include "data/embedded.h"
#include "data/gcide.h"
#include "data/sequences.h"
#include "io/atomic_file.h"
#include "pack/histogram.h"
#include "stopwatch.h"
#include "train/trainer.h"

namespace packbert::cli {

namespace {

struct DemoArgs {
  std::string workdir = "out/demo", vocab, preset = "mini";
  int64_t steps = 250;
  int sequences_per_step = 64;
  double lr = 1e-3;
};

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

void pretrain_comparison(const DemoArgs& a, const std::string& seqs, const std::string& packs,
                         double packing_factor) {
  std::cout << "\n== 3. Pre-training bert-" << a.preset << " on it, packed vs padded, the same "
            << a.sequences_per_step << " sequences per optimizer step\n";
  struct Run {
    std::string name, color;
    std::vector<std::pair<double, double>> curve;  // (training seconds, held-out MLM accuracy)
    double seconds = 0, acc = 0;
    int rows = 0;
    int64_t masked = 0;  // held-out masked tokens the accuracy is over
  } runs[2] = {{"padded (framework-style: padding computed)", "#d62728", {}, 0, 0, 0, 0},
               {"packed (optimal packing)", "#1f77b4", {}, 0, 0, 0, 0}};
  const bool tty = ::isatty(2);
  for (int r = 0; r < 2; ++r) {
    train::PretrainOptions o;
    o.sequences = seqs;
    o.packs = r == 1 ? packs : "";
    o.compute_padding = r == 0;
    o.vocab = a.vocab;
    o.out_dir = a.workdir + (r == 1 ? "/pretrain_packed" : "/pretrain_padded");
    o.preset = a.preset;
    o.rows_per_batch =
        r == 1 ? std::max(1, static_cast<int>(std::lround(a.sequences_per_step / packing_factor)))
               : a.sequences_per_step;
    o.max_steps = a.steps;
    o.lr = a.lr;
    o.warmup_steps = std::max<int64_t>(1, a.steps / 10);
    o.optimizer.kind = train::OptimizerKind::adamw;
    o.eval_every = std::max<int64_t>(1, a.steps / 5);
    o.eval_fraction = 0.005;  // ~1,100 sequences, the same for both runs
    std::filesystem::remove_all(o.out_dir);
    train::Trainer t(o, false);
    Run& run = runs[r];
    run.rows = o.rows_per_batch;
    run.curve.push_back({0.0, t.evaluate().mlm_acc});
    std::atomic<bool> stop{false};
    double last = 0;
    t.run(
        stop,
        [&](const train::StepMetrics& s) {
          last = s.elapsed;
          if (tty || s.step % 20 == 0 || s.step == a.steps)  // steps count from 1
            std::cerr << (tty ? "\r  " : "  ") << run.name << ": step " << s.step << "/" << a.steps
                      << ", loss " << fixed(s.loss, 3) << ", " << fixed(s.elapsed, 0) << " s"
                      << (tty ? "\033[K" : "\n") << std::flush;
        },
        [&](const train::EvalMetrics& e) {
          run.curve.push_back({last, e.mlm_acc});
          run.masked = e.mlm_count;
        });
    if (tty) std::cerr << '\n';
    run.seconds = last;
    run.acc = run.curve.back().second;
  }
  // Time for the packed run to reach the padded run's final held-out accuracy (interpolated).
  const double target = runs[0].acc;
  double reach = -1;
  const auto& c = runs[1].curve;
  for (size_t i = 1; i < c.size() && reach < 0; ++i)
    if (c[i].second >= target) {
      double f = (target - c[i - 1].second) / std::max(c[i].second - c[i - 1].second, 1e-12);
      reach = c[i - 1].first + std::clamp(f, 0.0, 1.0) * (c[i].first - c[i - 1].first);
    }
  Table t(
      {"run", "rows/step", "training s", "final held-out MLM acc", "time to padded's final acc"});
  t.add_row({runs[0].name, std::to_string(runs[0].rows), fixed(runs[0].seconds, 1),
             fixed(runs[0].acc, 4), fixed(runs[0].seconds, 1) + " s (1.00x)"});
  t.add_row(
      {runs[1].name, std::to_string(runs[1].rows), fixed(runs[1].seconds, 1), fixed(runs[1].acc, 4),
       reach >= 0
           ? fixed(reach, 1) + " s (" + fixed(reach / std::max(runs[0].seconds, 1e-9), 2) + "x)"
           : std::string("not reached")});
  t.print(std::cout);
  // Context for the table: the cost ratio for the same steps, and how large a difference in
  // final accuracy is noise (binomial standard error of the difference on the held-out tokens).
  const double p = (runs[0].acc + runs[1].acc) / 2;
  const double se =
      std::sqrt(p * (1 - p) * 2.0 / static_cast<double>(std::max<int64_t>(runs[0].masked, 1)));
  std::cout << "packed/padded training time for the same steps and sequences: "
            << fixed(runs[1].seconds / std::max(runs[0].seconds, 1e-9), 2)
            << "x; final accuracy difference " << fixed(runs[1].acc - runs[0].acc, 4)
            << " (standard error " << fixed(se, 4) << " over " << with_commas(runs[0].masked)
            << " held-out masked tokens)\n";
  std::vector<Series> series;
  for (const Run& r : runs) series.push_back({r.name, r.color, r.curve});
  const std::string svg = a.workdir + "/pretrain.svg";
  io::write_file_atomic(svg,
                        svg_plot(series, "bert-" + a.preset + " on GCIDE: held-out MLM accuracy",
                                 "training time (s)", "masked-LM accuracy"));
  std::cout << "plot: " << svg << "; metrics: " << a.workdir
            << "/pretrain_{packed,padded}/metrics.jsonl\n";
}

void demo_corpus(const DemoArgs& a) {
  std::cout << "\n== 2. The demo corpus: Debian's dict-gcide, one dictionary entry a document\n";
  std::filesystem::create_directories(a.workdir);
  const Stopwatch clock;
  size_t entries = 0;
  std::string text = data::gcide_to_text("/usr/share/dictd/gcide.index",
                                         "/usr/share/dictd/gcide.dict.dz", &entries);
  const std::string txt = a.workdir + "/gcide.txt", seqs = a.workdir + "/gcide.seqs",
                    packs = a.workdir + "/gcide.packs";
  io::write_file_atomic(txt, text);
  data::Vocab vocab = data::Vocab::load(a.vocab);
  data::Tokenizer tok(vocab, true);
  auto docs = data::read_corpus({txt}, tok, {});
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
            << fixed(clock.seconds(), 1) << " s; wrote " << seqs << " and " << packs << "\n";
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
  if (a.steps > 0)
    pretrain_comparison(a, seqs, packs,
                        static_cast<double>(p.ids.size()) / static_cast<double>(p.packs()));
}

}  // namespace

void register_demo(CLI::App& app) {
  auto a = std::make_shared<DemoArgs>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "Run the embedded default job: packing comparison, then the demo corpus pipeline");
  cmd->add_option("--workdir", a->workdir, "Where the demo writes its files")
      ->capture_default_str();
  vocab_option(cmd, a->vocab, "vocab.txt for the demo corpus");
  cmd->add_option("--preset", a->preset, "Model for the pre-training comparison")
      ->capture_default_str();
  number(cmd, "--steps", a->steps, "Optimizer steps of each pre-training run (0 = skip)", 0,
         kMaxCount);
  number(cmd, "--sequences-per-step", a->sequences_per_step, "Sequences per optimizer step", 1,
         1e6);
  number(cmd, "--lr", a->lr, "Peak learning rate", 1e-12, 10);
  cmd->callback([a] {
    packing_tables();
    demo_corpus(*a);
  });
}

}  // namespace packbert::cli
