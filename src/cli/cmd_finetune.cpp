// `packbert finetune`: sequence classification (TSV) or SQuAD span extraction.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/signals.h"
#include "cli/table.h"
#include "dist/comm.h"
#include "train/finetune.h"

namespace packbert::cli {

namespace {

// An evaluation's epoch (fractional mid-epoch) and step, marked when its model is the one
// written (--save-best).
std::pair<std::string, std::string> when(const train::FinetuneResult& r, size_t e) {
  const double epoch = e < r.dev_epochs.size() ? r.dev_epochs[e] : 0;
  std::string at =
      epoch == std::floor(epoch) ? std::to_string(static_cast<int64_t>(epoch)) : fixed(epoch, 2);
  std::string step = e < r.dev_steps.size() ? std::to_string(r.dev_steps[e]) : "";
  if (r.best == static_cast<int>(e)) step += " *";
  return {at, step};
}

// The dev scores of each evaluation, as a table, and what the run made.
void print_result(const train::FinetuneOptions& opt, const train::FinetuneResult& r) {
  if (opt.task == train::FinetuneTask::squad) {
    const bool v2 = !r.dev_squad.empty() && r.dev_squad[0].v2;
    std::vector<std::string> head = {"epoch", "step", "dev exact match %", "dev F1 %"};
    if (v2) head.insert(head.end(), {"HasAns EM %", "HasAns F1 %", "NoAns EM %"});
    Table t(head);
    for (size_t e = 0; e < r.dev_squad.size(); ++e) {
      const data::SquadScore& s = r.dev_squad[e];
      std::vector<std::string> row = {when(r, e).first, when(r, e).second, fixed(s.exact_match, 2),
                                      fixed(s.f1, 2)};
      if (v2)
        row.insert(row.end(), {fixed(s.has_exact, 2), fixed(s.has_f1, 2), fixed(s.no_exact, 2)});
      t.add_row(row);
    }
    t.print(std::cout);
    std::cout << r.train_sequences << " training windows in " << r.train_rows << " rows";
    if (r.skipped) std::cout << " (" << r.skipped << " questions skipped: answer not found)";
  } else if (r.regression()) {
    Table t({"epoch", "step", "dev Pearson", "dev Spearman", "dev MSE"});
    for (size_t e = 0; e < r.dev_regression.size(); ++e) {
      const train::RegressionScore& s = r.dev_regression[e];
      t.add_row({when(r, e).first, when(r, e).second, fixed(s.pearson, 4), fixed(s.spearman, 4),
                 fixed(s.mse, 4)});
    }
    t.print(std::cout);
    std::cout << "regression, " << r.train_sequences << " examples in " << r.train_rows << " rows";
  } else {
    // The task's GLUE metric first: accuracy, F1 (two labels) and MCC, led by r.metric.
    std::vector<std::string> keys = {"accuracy"};
    if (r.num_labels == 2) keys.push_back("f1");
    keys.push_back("mcc");
    std::stable_partition(keys.begin(), keys.end(),
                          [&](const std::string& k) { return k == r.metric; });
    std::vector<std::string> head = {"epoch", "step"};
    for (const std::string& k : keys) head.push_back("dev " + metric_title(k));
    head.push_back("majority baseline");
    Table t(head);
    for (size_t e = 0; e < r.dev_scores.size(); ++e) {
      const train::ClassifyScore& s = r.dev_scores[e];
      std::vector<std::string> row = {when(r, e).first, when(r, e).second};
      for (const std::string& k : keys)
        row.push_back(fixed(k == "accuracy" ? s.accuracy
                            : k == "f1"     ? s.f1.value_or(0)
                                            : s.mcc,
                            4));
      row.push_back(fixed(r.majority_baseline, 4));
      t.add_row(row);
    }
    t.print(std::cout);
    std::cout << r.num_labels << " labels, " << r.train_sequences << " examples in " << r.train_rows
              << " rows";
  }
  if (!r.glue_task.empty())
    std::cout << "; GLUE task " << r.glue_task << ", scored by " << metric_title(r.metric);
  std::cout << ", " << r.steps << " steps; model in " << opt.out_dir << '\n';
  if (!r.initialized.empty()) {
    std::cout << "initialised from --seed (not in --init):";
    for (const std::string& name : r.initialized) std::cout << ' ' << name;
    std::cout << '\n';
  }
  if (r.best >= 0)
    std::cout << "* the model written: step " << r.dev_steps[static_cast<size_t>(r.best)]
              << "'s, the best dev " << opt.save_best << "\n";
}

// What is fine-tuned on what, into where: the data, the model, the head.
void data_flags(CLI::App* cmd, train::FinetuneOptions& o) {
  cmd->add_option("--train", o.train,
                  "classify: TSV, CSV (.csv) or JSONL (.jsonl) with a header or keys naming the "
                  "columns (label, sentence[, sentence2], or a GLUE task's); squad: JSON")
      ->required();
  cmd->add_option("--dev", o.dev, "The same format; squad writes its answers to predictions.json")
      ->required();
  cmd->add_option("--init,--model", o.init,
                  "Pre-trained model: HF directory or packbert checkpoint (--model is the name "
                  "every command takes)")
      ->required();
  cmd->add_option("--out", o.out_dir,
                  "Directory for the fine-tuned model (HF layout) and metrics; it appears when "
                  "fine-tuning has finished, whole (written as <out>.partial.PID until then)")
      ->required();
  cmd->add_flag("--overwrite", o.overwrite, "Replace an --out that already holds a model");
  cmd->add_flag("--new-head", o.new_head,
                "classify: train a new classifier, the data's labels sorted, even when --init has "
                "one (by default a classifier with named labels keeps them: the data's labels are "
                "matched to its config.json id2label by name)");
  auto kind = [&o](bool regression) {
    if (o.regression && *o.regression != regression)
      throw CLI::ValidationError("--regression and --classification contradict each other");
    o.regression = regression;
  };
  cmd->add_flag_callback(
      "--regression", [kind] { kind(true); },
      "classify: train a regression head (one output, mean squared error; Pearson and Spearman "
      "on dev) towards the labels' values. Default: --model's head when it has one, else "
      "regression when the labels are decimal numbers (STS-B's 3.800), as run_glue decides");
  cmd->add_flag_callback(
      "--classification", [kind] { kind(false); },
      "classify: train a classifier even when the labels are decimal numbers");
  model_vocab_option(cmd, o.vocab, "vocab.txt or tokenizer.json to tokenise the examples with");
  casing_flags(cmd, o.lower_case);
  column_flags(cmd, o.columns);
}

// Evaluation, early stopping, checkpoints and the run's state.
void evaluation_flags(CLI::App* cmd, train::FinetuneOptions& o) {
  number(cmd, "--eval-steps", o.eval_steps,
         "Score dev every this many steps and after the last (default: after each epoch)", 1,
         kMaxCount);
  number(cmd, "--early-stopping-patience", o.early_stopping_patience,
         "Stop after this many dev evaluations in a row that do not beat the best before them "
         "(on --save-best's metric, by more than --early-stopping-threshold); the best one's "
         "model is written",
         1, 1e9);
  number(cmd, "--early-stopping-threshold", o.early_stopping_threshold,
         "How much an evaluation must beat the best before it by to count as better (default 0)", 0,
         1e9);
  number(cmd, "--keep-checkpoints", o.keep_checkpoints,
         "Keep checkpoint-STEP/ directories that transformers loads as they are (config.json, "
         "model.safetensors, vocab and tokenizer files, trainer_state.json): the latest this many "
         "and the best evaluation's (Hugging Face's save_total_limit). One is written at each "
         "evaluation, epoch end and --checkpoint-every; they gather in <out>.checkpoints/ and move "
         "into --out with the model (default 0: none)",
         0, 1e9);
  report_to_flag(cmd, o.report);
  number(cmd, "--checkpoint-every", o.checkpoint_every,
         "Steps between saves of the run's state to <out>.resume.safetensors (0: only at each "
         "evaluation, each epoch's end and on SIGINT/SIGTERM); removed when the model is written",
         0, kMaxCount);
  cmd->add_option(
         "--save-best", o.save_best,
         "Write the model of the evaluation with the best dev METRIC instead of the last one "
         "(Hugging Face's load_best_model_at_end): accuracy, f1 (two labels) or mcc for "
         "classify; pearson or spearman for regression; exact_match or f1 for squad. "
         "Ties keep the earlier evaluation")
      ->option_text("METRIC");
  cmd->add_flag("--resume", o.resume,
                "Continue the run that <out>.resume.safetensors holds, bit-exactly (the same data "
                "and flags)");
  number(cmd, "--logging-steps", o.logging_steps,
         "Without a terminal, a progress line every this many steps (on one, a line rewritten "
         "in place)",
         1, 1e9);
}

}  // namespace

void register_finetune(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<train::FinetuneOptions>();
  auto task = std::make_shared<std::string>("classify");
  auto no_pack = std::make_shared<bool>(false);
  CLI::App* cmd =
      app.add_subcommand("finetune",
                         "Fine-tune a classifier or regressor on TSV, CSV or JSONL data "
                         "or a span "
                         "extractor on SQuAD v1.1 or v2.0 JSON (packed), "
                         "report dev accuracy, correlation or exact match / F1");
  cmd->add_option("--task", *task,
                  "classify (sequence or pair classification: TSV, CSV, JSONL) | squad (SQuAD v1.1 "
                  "or v2.0 JSON)")
      ->capture_default_str()
      ->check(CLI::IsMember({"classify", "squad"}));
  data_flags(cmd, *o);
  CLI::Option* len =
      number(cmd, "--max-seq-len", o->max_seq_len,
             "Tokens per sequence and per packed row (default 128; squad 384)", 8, 65536);
  number(cmd, "--epochs", o->epochs, "Passes over the training data", 1, 1e6);
  number(cmd, "--steps", o->max_steps,
         "Optimizer steps in all (Hugging Face's max_steps); given, it overrides --epochs: the "
         "data is visited as often as it takes, the last pass cut short",
         1, kMaxCount);
  auto warmup_ratio = std::make_shared<double>(0);
  CLI::Option* ratio = number(cmd, "--warmup-ratio", *warmup_ratio,
                              "Warm-up over this share of the run's steps (ceil(ratio x steps), "
                              "as Hugging Face's warmup_ratio); instead of --warmup",
                              0, 1);
  evaluation_flags(cmd, *o);
  const LoopFlags loop =
      loop_flags(cmd, o->loop, "adamw", 1e-3, 5e-5,
                 "Peak learning rate (default 5e-5 with AdamW, as BERT's authors fine-tuned; "
                 "1e-3 with LAMB, an untuned default)");
  squad_flags(cmd, o->squad);
  cmd->add_flag("--no-pack", *no_pack, "One example per row");
  cmd->callback([o, task, no_pack, len, loop, ratio, warmup_ratio, cmd, &exit_code] {
    StopOnSignals signals;  // before any thread starts
    train::FinetuneOptions opt = *o;
    opt.stop = &signals.stop();
    loop.finish(opt.loop);
    if (ratio->count() > 0) {
      if (cmd->get_option("--warmup")->count() > 0)
        throw CLI::ValidationError("--warmup and --warmup-ratio contradict each other: give one");
      opt.warmup_ratio = *warmup_ratio;
    }
    opt.packed = !*no_pack;
    opt.task = *task == "squad" ? train::FinetuneTask::squad : train::FinetuneTask::classify;
    if (opt.task == train::FinetuneTask::squad && len->count() == 0) opt.max_seq_len = 384;
    opt.say = say_on_stderr;
    opt.vocab = model_vocab(opt.vocab, opt.init);
    train::FinetuneResult r = train::finetune(opt);
    if (r.stopped) {
      const int sig = signals.signal() ? signals.signal() : SIGTERM;
      exit_code = 128 + sig;
      if (dist::Comm::world().root())
        std::cerr << "finetune: stopped by " << (sig == SIGINT ? "SIGINT" : "SIGTERM")
                  << " after step " << r.steps << "; its state is in " << r.resume_path
                  << " (continue with --resume); no model written\n";
      return;
    }
    if (dist::Comm::world().root()) print_result(opt, r);  // rank 0 alone reports
  });
}

}  // namespace packbert::cli
