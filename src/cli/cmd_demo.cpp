// `packbert demo`: the embedded default job. (1) packs the embedded Wikipedia-512 histogram with
// every packer, with and without a depth cap; (2) turns the demo corpus (Debian dict-gcide) into
// a packed pre-training dataset; (3) pre-trains a small BERT on it packed and padded, the same
// sequences per step in the same order, each until it reaches a held-out accuracy target, and
// prints the time-to-target table, an SVG plot and summary.json.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "cli/demo_plan.h"
#include "cli/flags.h"
#include "cli/pack_report.h"
#include "cli/plot.h"
#include "data/corpus.h"
#include "data/embedded.h"
#include "data/gcide.h"
#include "data/sequences.h"
#include "error.h"
#include "io/atomic_file.h"
#include "kernels/cpu_features.h"
#include "kernels/ops.h"
#include "pack/histogram.h"
#include "stopwatch.h"
#include "text.h"
#include "train/trainer.h"

namespace packbert::cli {

namespace {

struct DemoArgs {
  std::string workdir = "out/demo", vocab, preset = "mini";
  int packs_per_step = 16;
  // At the defaults the calibration chooses the preset, lr and target that fit the budget.
  bool calibrated = true;
  double budget_minutes = 15;  // the whole demo's wall time, which the calibration fits
  double started = 0;          // when the demo started (now_seconds)
  int64_t max_steps = 2000;    // the cap; 0 skips pre-training
  int64_t warmup = 40, eval_every = 100;
  double lr = 0, target = 0.20;
  std::optional<double> lr_given;  // --lr; unset: the preset's (demo_settings), else 5e-3
  uint64_t seed = 1;
  std::string precision = "auto";  // auto: bf16 where the CPU runs it natively, else fp32
  model::Precision resolved = model::Precision::fp32;
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

// One pre-training run of the comparison, trained until its held-out accuracy reaches the target
// (or the step cap).
struct Run {
  std::string name, color;
  bool packed = false;
  std::vector<std::pair<double, double>> curve;  // (training seconds, held-out MLM accuracy)
  double first_loss = 0, rows = 0, seconds = 0;  // rows: average rows per step
  int64_t steps = 0, masked = 0;                 // masked: held-out tokens the accuracy is over
  int64_t steps_to_target = -1;                  // -1: not reached
  double seconds_to_target = -1, acc_at_target = 0;
};

train::PretrainOptions run_options(const DemoArgs& a, const std::string& seqs,
                                   const std::string& packs, bool packed) {
  train::PretrainOptions o;
  o.sequences = seqs;
  o.packs = packs;
  o.one_per_row = !packed;
  o.compute_padding = !packed;
  o.vocab = a.vocab;
  o.out_dir = a.workdir + (packed ? "/pretrain_packed" : "/pretrain_padded");
  o.overwrite = true;
  o.shape.preset = a.preset;
  o.loop.rows_per_batch = a.packs_per_step;
  o.max_steps = a.max_steps;
  o.loop.lr = a.lr;
  o.loop.warmup_steps = std::min(a.warmup, a.max_steps);
  o.loop.optimizer.kind = train::OptimizerKind::lamb;
  o.eval_every = a.eval_every;
  o.eval_fraction = 0.005;  // ~1,100 sequences, the same for both runs
  o.loop.seed = a.seed;
  o.loop.precision = a.resolved;
  o.target_accuracy = a.target;
  return o;
}

void train_to_target(const DemoArgs& a, const std::string& seqs, const std::string& packs,
                     Run& run) {
  const train::PretrainOptions o = run_options(a, seqs, packs, run.packed);
  std::filesystem::remove_all(o.out_dir);
  train::Trainer t(o, false);
  run.curve.push_back({0.0, t.evaluate().mlm_acc});
  const std::atomic<bool> stop{false};
  const bool tty = ::isatty(2);
  double last = 0, acc = run.curve.back().second, row_sum = 0;
  int64_t acc_step = 0;  // the step of the evaluation `acc` comes from (it runs after that step)
  train::EvalMetrics final_eval;
  const train::StopReason reason = t.run(
      stop,
      [&](const train::StepMetrics& s) {
        if (s.step == 1) run.first_loss = s.loss;
        last = s.elapsed;
        run.steps = s.step;
        row_sum += static_cast<double>(s.sequences);
        if (tty || s.step % 50 == 0)
          std::cerr << (tty ? "\r  " : "  ") << run.name << ": step " << s.step << " (cap "
                    << a.max_steps << "), loss " << fixed(s.loss, 3) << ", held-out accuracy "
                    << fixed(acc, 3) << " at step " << acc_step << " (target " << fixed(a.target, 2)
                    << "), " << fixed(s.elapsed, 0) << " s, "
                    << fixed(s.step / std::max(s.elapsed, 1e-9), 2) << " steps/s"
                    << (tty ? "\033[K" : "\n") << std::flush;
      },
      [&](const train::EvalMetrics& e) {
        acc = e.mlm_acc;
        acc_step = e.step;
        run.curve.push_back({last, e.mlm_acc});
        run.masked = e.mlm_count;
        final_eval = e;
      });
  if (tty) std::cerr << '\n';
  if (reason == train::StopReason::target_reached) {  // the trainer stopped at that evaluation
    run.steps_to_target = final_eval.step;
    run.seconds_to_target = final_eval.elapsed;
    run.acc_at_target = final_eval.mlm_acc;
  }
  run.seconds = last;
  // rows per step: packs when packed; sequences (one per row) when padded.
  run.rows = run.packed ? a.packs_per_step
                        : row_sum / static_cast<double>(std::max<int64_t>(run.steps, 1));
}

// Seconds a step of each run takes: the median of steps 2-5 of a short run of each layout (step 1
// sets up), evaluation and checkpoint writing left out.
DemoStepTimes step_seconds(const DemoArgs& a, const std::string& seqs, const std::string& packs) {
  double both[2] = {0, 0};
  for (const bool packed : {false, true}) {
    train::PretrainOptions o = run_options(a, seqs, packs, packed);
    o.out_dir = a.workdir + "/calibration";
    o.max_steps = 5;
    o.eval_every = 0;
    o.eval_fraction = 0.0;  // no held-out set: nothing to evaluate at the end
    o.target_accuracy = 0;
    std::filesystem::remove_all(o.out_dir);
    std::vector<double> seconds;
    {
      train::Trainer t(o, false);
      const std::atomic<bool> stop{false};
      t.run(
          stop,
          [&](const train::StepMetrics& s) {
            if (s.step > 1) seconds.push_back(s.seconds);
          },
          [](const train::EvalMetrics&) {});
    }
    std::filesystem::remove_all(o.out_dir);
    std::sort(seconds.begin(), seconds.end());
    both[packed] = seconds.empty() ? 0 : seconds[seconds.size() / 2];
  }
  return {both[0], both[1]};
}

// A short measured calibration. At the defaults (no --target, --preset, --packs-per-step, --lr or
// --warmup given) it chooses the model and target that fit --budget-minutes (choose_demo_setting:
// a smaller model before a lower target); otherwise it measures the run as given and, where the
// steps to its target are known, says what they project to. Prints what it measured and why.
void calibrate(DemoArgs& a, const std::string& seqs, const std::string& packs) {
  const kernels::CpuFeatures& cpu = kernels::cpu_features();
  std::cout << "Calibration (" << cpu.model << ", " << cpu.isa() << "; kernels "
            << kernels::kernel_isa() << "): ";
  if (a.calibrated) {
    const DemoBudget budget{a.budget_minutes, (now_seconds() - a.started) / 60};
    const DemoChoice c = choose_demo_setting(budget, [&](const DemoSetting& s) {
      DemoArgs trial = a;
      trial.preset = s.preset;
      trial.lr = s.lr;
      return step_seconds(trial, seqs, packs);
    });
    std::cout << c.why << "\n";
    a.preset = c.setting->preset;
    a.lr = c.setting->lr;
    a.target = c.at.accuracy;
    return;
  }
  const DemoStepTimes t = step_seconds(a, seqs, packs);
  std::cout << "a step takes " << fixed(t.padded, 3) << " s padded, " << fixed(t.packed, 3)
            << " s packed";
  const DemoSetting* s = demo_setting(a.preset);
  const DemoReached* r = s && a.packs_per_step == 16 && a.lr == s->lr ? s->find(a.target) : nullptr;
  if (r)
    std::cout << "; the " << with_commas(r->step) << " steps bert-" << a.preset << " took to "
              << fixed(a.target, 2) << " at the defaults would take both runs ~"
              << fixed(t.minutes(r->step), 1) << " min";
  std::cout << ".\n";
}

// The comparison's files: summary.json (seconds and steps to the target, the settings, the
// CPU) and pretrain.svg (both curves).
void write_comparison(const DemoArgs& a, const Run (&runs)[2], double ratio) {
  const Run &padded = runs[0], &packed = runs[1];
  const bool both = padded.steps_to_target > 0 && packed.steps_to_target > 0;
  nlohmann::json summary = {
      {"seed", a.seed},
      {"preset", a.preset},
      {"target_accuracy", a.target},
      {"packed_seconds_to_target",
       packed.steps_to_target > 0 ? nlohmann::json(packed.seconds_to_target) : nlohmann::json()},
      {"padded_seconds_to_target",
       padded.steps_to_target > 0 ? nlohmann::json(padded.seconds_to_target) : nlohmann::json()},
      {"ratio", both ? nlohmann::json(ratio) : nlohmann::json()},
      {"packed_steps_to_target",
       packed.steps_to_target > 0 ? nlohmann::json(packed.steps_to_target) : nlohmann::json()},
      {"padded_steps_to_target",
       padded.steps_to_target > 0 ? nlohmann::json(padded.steps_to_target) : nlohmann::json()},
      {"max_steps", a.max_steps},
      {"packs_per_step", a.packs_per_step},
      {"lr", a.lr},
      {"precision", model::precision_name(a.resolved)},
      {"cpu", kernels::cpu_features().model},
      {"isa", kernels::cpu_features().isa()},
      {"kernel_isa", kernels::kernel_isa()}};
  io::write_file_atomic(a.workdir + "/summary.json", summary.dump(2) + "\n");

  std::vector<Series> series;
  for (const Run& r : runs) series.push_back({r.name, r.color, r.curve});
  const std::string svg = a.workdir + "/pretrain.svg";
  io::write_file_atomic(svg,
                        svg_plot(series, "bert-" + a.preset + " on GCIDE: held-out MLM accuracy",
                                 "training time (s)", "masked-LM accuracy"));
  std::cout << "plot: " << svg << "; summary: " << a.workdir
            << "/summary.json; metrics: " << a.workdir
            << "/pretrain_{packed,padded}/metrics.jsonl\n";
}

void pretrain_comparison(DemoArgs a, const std::string& seqs, const std::string& packs) {
  std::cout << "\n== 3. Pre-training, packed vs padded\n";
  calibrate(a, seqs, packs);
  std::cout << "Pre-training bert-" << a.preset << " (LAMB, lr " << general(a.lr, 3)
            << "), both runs to " << fixed(a.target, 2) << " held-out MLM accuracy (seed " << a.seed
            << ", " << model::precision_name(a.resolved)
            << (a.precision != "auto"                  ? ""
                : a.resolved == model::Precision::bf16 ? ", which this CPU runs natively"
                                                       : ": this CPU has no native bf16")
            << ")\n";
  Run runs[2];
  runs[0].name = "padded (one sequence per row, padding computed)";
  runs[0].color = "#d62728";
  runs[1].name = "packed (optimal packing)";
  runs[1].color = "#1f77b4";
  runs[1].packed = true;
  for (Run& r : runs) train_to_target(a, seqs, packs, r);

  const Run &padded = runs[0], &packed = runs[1];
  const bool both = padded.steps_to_target > 0 && packed.steps_to_target > 0;
  const double ratio = both ? packed.seconds_to_target / padded.seconds_to_target : -1;
  Table t({"run", "rows/step", "steps to target", "training s to target", "held-out acc there",
           "time vs padded"});
  for (const Run& r : runs) {
    const bool hit = r.steps_to_target > 0;
    t.add_row({r.name, fixed(r.rows, 1),
               hit ? with_commas(r.steps_to_target) : "not in " + with_commas(r.steps),
               hit ? fixed(r.seconds_to_target, 1) : "> " + fixed(r.seconds, 1),
               hit ? fixed(r.acc_at_target, 4) : fixed(r.curve.back().second, 4),
               !r.packed ? std::string("1.00x")
               : both    ? fixed(ratio, 2) + "x"
                         : std::string("-")});
  }
  t.print(std::cout);
  std::cout << "Target: " << fixed(a.target, 2) << " held-out MLM accuracy over "
            << with_commas(packed.masked)
            << " masked tokens, past the frequent-token plateau (about 0.11-0.15, where a model "
               "predicts only the commonest tokens and the step it leaves it varies from run to "
               "run).\nBoth runs train on the same sequences in the same order with the same "
               "dropout draws (the padded run lays each pack's sequences out one per row); step-1 "
               "loss "
            << fixed(packed.first_loss, 6) << " packed, " << fixed(padded.first_loss, 6)
            << " padded. What differs is the cost of a step: "
            << fixed(packed.seconds / std::max<int64_t>(packed.steps, 1), 3) << " s packed, "
            << fixed(padded.seconds / std::max<int64_t>(padded.steps, 1), 3) << " s padded.\n";
  if (both)
    std::cout << "Conclusion: packing reached the target in " << fixed(ratio, 2)
              << "x the training time of the padded run.\n";
  else
    std::cout << "Conclusion: none; a run did not reach the target within " << a.max_steps
              << " steps (raise --max-steps)\n";

  write_comparison(a, runs, ratio);
}

void demo_corpus(const DemoArgs& a) {
  std::cout << "\n== 2. The demo corpus: Debian's dict-gcide, one dictionary entry a document\n";
  const Stopwatch clock;
  // Every input is read and checked before the work directory is made.
  data::Vocab vocab = data::Vocab::load(a.vocab);
  (void)model::bert_preset(a.preset);
  size_t entries = 0;
  std::string text = data::gcide_to_text("/usr/share/dictd/gcide.index",
                                         "/usr/share/dictd/gcide.dict.dz", &entries);
  io::make_output_dir(a.workdir, "--workdir");
  const std::string txt = a.workdir + "/gcide.txt", seqs = a.workdir + "/gcide.seqs",
                    packs = a.workdir + "/gcide.packs";
  io::write_file_atomic(txt, text);
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
  if (a.max_steps > 0) pretrain_comparison(a, seqs, packs);
}

}  // namespace

void register_demo(CLI::App& app) {
  auto a = std::make_shared<DemoArgs>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "Run the embedded default job: packing comparison, then the demo corpus pipeline");
  cmd->add_option("--workdir", a->workdir, "Where the demo writes its files")
      ->capture_default_str();
  vocab_option(cmd, a->vocab, "vocab.txt for the demo corpus");
  cmd->add_option("--preset", a->preset,
                  "Model for the pre-training comparison (default mini, or tiny where the "
                  "calibration says this CPU needs it to fit --budget-minutes)")
      ->capture_default_str();
  number(cmd, "--max-steps", a->max_steps,
         "Cap on each pre-training run's optimizer steps (0 = skip pre-training)", 0, kMaxCount);
  number(cmd, "--packs-per-step", a->packs_per_step,
         "Packs per optimizer step (the padded run takes the same packs' sequences)", 1, 1e6);
  number(cmd, "--budget-minutes", a->budget_minutes,
         "Wall time of the whole demo that a short calibration fits the defaults into: bert-mini "
         "to 0.20, else bert-tiny, and only then a target of 0.19 or 0.18",
         0.1, 1e6);
  number(cmd, "--lr", a->lr_given,
         "Peak learning rate (LAMB; default 5e-3 for bert-mini, 1e-2 for bert-tiny, as measured)",
         1e-12, 10);
  number(cmd, "--warmup", a->warmup, "Warmup steps", 0, kMaxCount);
  number(cmd, "--target", a->target,
         "Held-out MLM accuracy each run trains to (default 0.20, or 0.19 or 0.18 where the "
         "calibration says this CPU needs it to fit --budget-minutes even with bert-tiny)",
         1e-6, 1);
  number(cmd, "--eval-every", a->eval_every, "Steps between held-out evaluations", 1, kMaxCount);
  number(cmd, "--seed", a->seed, "Seed of both runs (initialisation, order, dropout)", 0, kMaxSeed);
  cmd->add_option("--precision", a->precision,
                  "auto | fp32 | bf16 for the pre-training runs (auto: bf16 where the CPU has "
                  "AVX512-BF16 or AMX-BF16, else fp32)")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}))
      ->capture_default_str();
  cmd->callback([a, cmd] {
    a->started = now_seconds();
    for (const char* flag : {"--target", "--preset", "--packs-per-step", "--lr", "--warmup"})
      if (cmd->count(flag) > 0) a->calibrated = false;
    const DemoSetting* s = demo_setting(a->preset);
    a->lr = a->lr_given ? *a->lr_given : s ? s->lr : 5e-3;
    const std::string why = kernels::bf16_unavailable_reason();
    if (a->precision == "bf16" && !why.empty()) throw InputError(why);
    a->resolved = a->precision == "bf16" || (a->precision == "auto" && why.empty())
                      ? model::Precision::bf16
                      : model::Precision::fp32;
    packing_tables();
    demo_corpus(*a);
  });
}

}  // namespace packbert::cli
