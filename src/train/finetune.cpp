#include "train/finetune.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/casing.h"
#include "data/utf8.h"
#include "dist/comm.h"
#include "error.h"
#include "io/atomic_file.h"
#include "io/checksum.h"
#include "io/fault.h"
#include "io/input_file.h"
#include "io/paths.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "pack/assign.h"
#include "pack/plan.h"
#include "rng.h"
#include "stopwatch.h"
#include "text.h"
#include "train/checkpoint.h"
#include "train/finetune_loop.h"
#include "train/finetune_resume.h"
#include "train/memory_plan.h"
#include "train/metrics.h"
#include "train/metrics_log.h"
#include "train/model_files.h"
#include "train/optimizer.h"
#include "train/progress.h"
#include "train/scores.h"
#include "train/sparsity.h"
#include "train/task_model.h"

namespace packbert::train {

namespace {

// The model to fine-tune from --init (any form load_model reads), its head (and any other
// tensor outside the encoder that --init lacks) initialised from the seed and named in
// `initialized`.
std::unique_ptr<model::BertModel> model_from(const std::string& init, model::Heads heads,
                                             int num_labels, uint64_t seed,
                                             std::vector<std::string>& initialized,
                                             bool new_heads = false) {
  FreshTensors fresh{seed, num_labels, {}, new_heads};
  auto m = load_model(init, heads, {}, &fresh);
  initialized = std::move(fresh.initialized);
  return m;
}

// Regression (STS-B): one output trained towards each example's value by mean squared error,
// scored by Pearson's and Spearman's correlation; the model is written with problem_type
// "regression", as transformers' BertForSequenceClassification with one label.
FinetuneResult finetune_regressor(const FinetuneOptions& o, const data::Tokenizer& tok,
                                  const data::Casing& casing, std::ostream& log,
                                  const ModelLabels& model,
                                  std::vector<data::ClassifyExample> train,
                                  const std::map<std::string, int32_t>& seen) {
  data::set_targets(train, seen, o.train);
  std::map<std::string, int32_t> dev_seen;
  std::vector<data::ClassifyExample> dev =
      data::read_classification_tsv(o.dev, tok, o.max_seq_len, dev_seen, true, o.columns);
  data::set_targets(dev, dev_seen, o.dev);
  if (!o.save_best.empty() && !regression_metric(o.save_best))
    throw OptionError("save_best", "'" + o.save_best +
                                       "' is a classification metric; this task is a regression "
                                       "(pearson, spearman)");
  FinetuneResult res;
  res.num_labels = 1;
  const bool new_head = o.new_head || !model.heads.classifier;
  if (!new_head && !model.regression())
    throw InputError(o.init + ": its classifier has " + std::to_string(model.num_labels) +
                     " outputs, a regression head one; give `new_head` to train a new head");
  res.label_note = new_head ? "a new regression head (one output, mean squared error)"
                            : "the model's regression head (" + model.source + ")";
  model::Heads heads;
  heads.pretraining = false;
  heads.classifier = true;
  auto m = model_from(o.init, heads, 1, o.loop.seed, res.initialized, new_head);
  check_model(*m, tok.vocab(), o.init, o.vocab, o.max_seq_len);
  say_casing(casing, "finetune", o.say);
  say(o.say, "finetune: " + res.label_note);
  const auto tr = make_rows(lengths_of(train), o.max_seq_len, o.packed, o.loop.seed);
  const auto dv = make_rows(lengths_of(dev), o.max_seq_len, o.packed, o.loop.seed);
  res.train_sequences = static_cast<int64_t>(train.size());
  res.dev_sequences = static_cast<int64_t>(dev.size());
  res.train_rows = static_cast<int64_t>(tr.size());
  const std::vector<double> truth = targets_of(dev);
  const ModelFiles files = task_model_files(o, casing);
  train_epochs(*m, o, train, tr, log, res, files, [&](double epoch, double elapsed) {
    const RegressionScore sc = regression_score(
        truth, predict_values(*m, dev, dv, o.loop.rows_per_batch, o.max_seq_len, o.loop.precision));
    res.dev_regression.push_back(sc);
    auto number = [](double v) { return std::isnan(v) ? nlohmann::json() : nlohmann::json(v); };
    log << nlohmann::json{{"type", "eval"},
                          {"epoch", json_epoch(epoch)},
                          {"step", res.steps},
                          {"elapsed", elapsed},
                          {"dev_pearson", number(sc.pearson)},
                          {"dev_spearman", number(sc.spearman)},
                          {"dev_mse", sc.mse},
                          {"metric", "pearson"}}
               .dump()
        << std::endl;
  });
  write_published(o, *m, casing);
  return res;
}

FinetuneResult finetune_classifier(const FinetuneOptions& o, const data::Tokenizer& tok,
                                   const data::Casing& casing, std::ostream& log) {
  std::map<std::string, int32_t> seen;  // the training file's labels, by first appearance
  std::vector<data::ClassifyExample> train =
      data::read_classification_tsv(o.train, tok, o.max_seq_len, seen, true, o.columns);
  const std::string task = data::glue_task(o.train, o.columns);
  const ModelLabels model = model_labels(o.init);  // (the head --init has, if any)
  if (regression_task(o, model, seen, task)) {
    FinetuneResult r = finetune_regressor(o, tok, casing, log, model, std::move(train), seen);
    r.glue_task = task, r.metric = "pearson";
    return r;
  }
  if (regression_metric(o.save_best))
    throw OptionError("save_best", "'" + o.save_best +
                                       "' is a regression metric; this task has classes "
                                       "(accuracy, f1, mcc)");
  FinetuneResult res;
  const ClassLabels chosen = class_labels(model, seen, o.new_head, o.train);
  std::map<std::string, int32_t> labels = chosen.ids;
  data::relabel(train, seen, labels, o.train);
  std::vector<data::ClassifyExample> dev =
      data::read_classification_tsv(o.dev, tok, o.max_seq_len, labels, false, o.columns);
  res.num_labels = static_cast<int>(labels.size());
  res.label_note = chosen.note;
  res.glue_task = task;
  res.metric = headline_metric(task, res.num_labels);
  if (res.num_labels < 2) throw InputError(o.train + ": needs at least two labels");
  if (o.save_best == "f1" && res.num_labels != 2)
    throw OptionError("save_best", "f1 is the positive label's, for two labels; this task has " +
                                       std::to_string(res.num_labels) + ": use accuracy or mcc");
  model::Heads heads;
  heads.pretraining = false;
  heads.classifier = true;
  auto m = model_from(o.init, heads, res.num_labels, o.loop.seed, res.initialized, chosen.new_head);
  check_model(*m, tok.vocab(), o.init, o.vocab, o.max_seq_len);
  say_casing(casing, "finetune", o.say);
  say(o.say, "finetune: " + chosen.note);
  std::vector<int64_t> per_label(res.num_labels, 0);
  for (const auto& e : train) ++per_label[e.label];
  int32_t majority = static_cast<int32_t>(std::max_element(per_label.begin(), per_label.end()) -
                                          per_label.begin());
  int64_t maj_ok = 0;
  for (const auto& e : dev) maj_ok += e.label == majority;
  res.majority_baseline = static_cast<double>(maj_ok) / static_cast<double>(dev.size());

  const auto tr = make_rows(lengths_of(train), o.max_seq_len, o.packed, o.loop.seed);
  const auto dv = make_rows(lengths_of(dev), o.max_seq_len, o.packed, o.loop.seed);
  res.train_sequences = static_cast<int64_t>(train.size());
  res.dev_sequences = static_cast<int64_t>(dev.size());
  res.train_rows = static_cast<int64_t>(tr.size());
  std::vector<std::string> names(labels.size());
  for (auto& [name, id] : labels) names[static_cast<size_t>(id)] = name;
  const ModelFiles files = task_model_files(o, casing, names);
  train_epochs(*m, o, train, tr, log, res, files, [&](double epoch, double elapsed) {
    const ClassifyScore sc =
        score_classifier(*m, dev, dv, o.loop.rows_per_batch, o.max_seq_len, o.loop.precision);
    res.dev_scores.push_back(sc);
    res.dev_accuracy.push_back(sc.accuracy);
    nlohmann::json line{{"type", "eval"},
                        {"epoch", json_epoch(epoch)},
                        {"step", res.steps},
                        {"elapsed", elapsed},
                        {"dev_acc", sc.accuracy},
                        {"dev_mcc", sc.mcc},
                        {"majority_baseline", res.majority_baseline}};
    if (sc.f1) line["dev_f1"] = *sc.f1;
    if (!task.empty()) line["glue_task"] = task;
    line["metric"] = res.metric;
    log << line.dump() << std::endl;
  });
  write_published(o, *m, casing, names);
  return res;
}

FinetuneResult finetune_squad(const FinetuneOptions& o, const data::Tokenizer& tok,
                              const data::Casing& casing, std::ostream& log) {
  data::SquadOptions so = squad_options(o.squad, o.max_seq_len);
  std::vector<data::SquadExample> train = data::read_squad(o.train), dev = data::read_squad(o.dev);
  // SQuAD v2.0: unanswerable questions train towards [CLS] and are predicted by the null score.
  so.v2 = data::squad_has_unanswerable(train) || data::squad_has_unanswerable(dev);
  data::SquadFeatures tf = data::squad_features(train, tok, so, true);
  data::SquadFeatures df = data::squad_features(dev, tok, so, false);
  if (tf.features.empty()) throw InputError(o.train + ": no answerable question");
  FinetuneResult res;
  res.skipped = tf.unanswerable;
  model::Heads heads;
  heads.pretraining = false;
  heads.span = true;
  auto m = model_from(o.init, heads, 0, o.loop.seed, res.initialized);
  check_model(*m, tok.vocab(), o.init, o.vocab, o.max_seq_len);
  say_casing(casing, "finetune", o.say);
  const auto tr = make_rows(lengths_of(tf.features), o.max_seq_len, o.packed, o.loop.seed);
  const auto dv = make_rows(lengths_of(df.features), o.max_seq_len, o.packed, o.loop.seed);
  res.train_sequences = static_cast<int64_t>(tf.features.size());
  res.dev_sequences = static_cast<int64_t>(df.features.size());
  res.train_rows = static_cast<int64_t>(tr.size());
  const ModelFiles files = task_model_files(o, casing);
  train_epochs(*m, o, tf.features, tr, log, res, files, [&](double epoch, double elapsed) {
    std::vector<std::string> pred = squad_answers(*m, dev, df.features, dv, o.loop.rows_per_batch,
                                                  o.max_seq_len, o.loop.precision, tok, so);
    res.dev_squad.push_back(data::squad_score(dev, pred));
    if (dist::Comm::world().root()) write_predictions(o.out_dir + "/predictions.json", dev, pred);
    log << nlohmann::json{{"type", "eval"},
                          {"epoch", json_epoch(epoch)},
                          {"step", res.steps},
                          {"elapsed", elapsed},
                          {"exact_match", res.dev_squad.back().exact_match},
                          {"f1", res.dev_squad.back().f1},
                          {"has_ans_exact", res.dev_squad.back().has_exact},
                          {"has_ans_f1", res.dev_squad.back().has_f1},
                          {"no_ans_exact", res.dev_squad.back().no_exact},
                          {"no_ans_f1", res.dev_squad.back().no_f1}}
               .dump()
        << std::endl;
  });
  write_published(o, *m, casing);
  return res;
}

// The options' own checks (one line each, naming the field), before anything is read.
void check_finetune_options(const FinetuneOptions& o) {
  check_loop_options(o.loop);
  if (o.epochs < 1) throw OptionError("epochs", "must be at least 1");
  if (o.max_seq_len < 8) throw OptionError("max_seq_len", "must be at least 8");
  if (o.checkpoint_every < 0) throw OptionError("checkpoint_every", "must be at least 0");
  if (o.max_steps < 0) throw OptionError("max_steps", "must be at least 0 (0: `epochs`)");
  if (o.eval_steps < 0) throw OptionError("eval_steps", "must be at least 0 (0: each epoch)");
  if (o.keep_checkpoints < 0) throw OptionError("keep_checkpoints", "must be at least 0");
  if (o.warmup_ratio && !(*o.warmup_ratio >= 0 && *o.warmup_ratio <= 1))
    throw OptionError("warmup_ratio", "must be within [0, 1]");
  if (o.early_stopping_patience < 0)
    throw OptionError("early_stopping_patience", "must be at least 0");
  if (!(o.early_stopping_threshold >= 0))
    throw OptionError("early_stopping_threshold", "must be at least 0");
  if (o.early_stopping_patience > 0 && o.save_best.empty())
    throw OptionError("early_stopping_patience",
                      "watches the dev metric that `save_best` METRIC names: give both");
  const bool squad = o.task == FinetuneTask::squad;
  if (!o.save_best.empty() && !(squad ? o.save_best == "exact_match" || o.save_best == "f1"
                                      : o.save_best == "accuracy" || o.save_best == "f1" ||
                                            o.save_best == "mcc" || regression_metric(o.save_best)))
    throw OptionError("save_best", "'" + o.save_best + "' is not a dev metric of " +
                                       (squad ? "squad (exact_match, f1)"
                                              : "classify (accuracy, f1, mcc; regression: "
                                                "pearson, spearman)"));
}

}  // namespace

FinetuneResult finetune(const FinetuneOptions& o) {
  check_finetune_options(o);
  const std::string resume_path = o.out_dir + ".resume.safetensors";
  const std::string best_path = o.out_dir + ".best.safetensors";
  if (o.resume && !std::filesystem::exists(resume_path))
    throw InputError(resume_path +
                     ": no fine-tuning run to resume (it is written every "
                     "`checkpoint_every` steps, at each epoch's end and on "
                     "SIGINT/SIGTERM)");
  if (!o.resume && !o.overwrite && std::filesystem::exists(resume_path))
    throw InputError(resume_path +
                     ": an interrupted fine-tuning run is there; continue it with "
                     "`resume`, or start over with `overwrite`");
  data::Vocab vocab = data::Vocab::load(o.vocab);
  const data::Casing casing = data::decide_casing(o.lower_case, o.init, vocab, o.vocab);
  data::Tokenizer tok(vocab, casing.lower_case);
  // Everything is written into a staging directory that replaces out_dir only at the end: a
  // failed or interrupted run leaves out_dir as it was. Rank 0 alone writes.
  dist::Comm& comm = dist::Comm::world();
  std::optional<io::StagedDirectory> out;
  FinetuneOptions staged = o;
  staged.resume_path = resume_path;
  staged.best_path = best_path;
  staged.checkpoints_dir = o.out_dir + ".checkpoints";
  staged.final_dir = o.out_dir;
  MetricsLog log;
  dist::fail_together(comm, [&] {
    if (!comm.root()) return;
    {  // a killed run's staging directory and partly written resume and best files
      const std::filesystem::path out_path = std::filesystem::absolute(o.out_dir);
      if (std::filesystem::is_directory(out_path.parent_path()))
        io::remove_stale_temporaries(
            out_path.parent_path().string(),
            {out_path.filename().string(), out_path.filename().string() + ".resume.safetensors",
             out_path.filename().string() + ".best.safetensors",
             out_path.filename().string() + ".checkpoints"});
    }
    // A new run's best epoch is its own (a resumed run keeps the one its epochs chose).
    if (!o.resume) std::filesystem::remove(best_path);
    io::refuse_directory_over_inputs(
        {o.out_dir, "`out_dir`"},
        {{o.train, "`train`"}, {o.dev, "`dev`"}, {o.init, "`init`"}, {o.vocab, "`vocab`"}});
    out.emplace(o.out_dir, "`out_dir`", o.overwrite);
    staged.out_dir = out->path();
    // (a new run's checkpoints are its own)
    if (!o.resume) std::filesystem::remove_all(staged.checkpoints_dir);
    log.open(staged.out_dir + "/metrics.jsonl", false, o.report, staged.out_dir + "/runs");
  });
  FinetuneResult r = o.task == FinetuneTask::squad ? finetune_squad(staged, tok, casing, log)
                                                   : finetune_classifier(staged, tok, casing, log);
  r.resume_path = resume_path;
  if (r.stopped) return r;  // (the staging directory goes; the resume file stays)
  if (comm.root()) {
    log.close();
    out->publish();
    move_checkpoints(staged);
    std::filesystem::remove(resume_path);  // the run is done: its model is out_dir
    std::filesystem::remove(best_path);
  }
  return r;
}

}  // namespace packbert::train
