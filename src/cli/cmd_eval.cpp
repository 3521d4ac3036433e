// `packbert eval`: pre-training metrics over a sequences file (the same evaluation pretrain runs
// on its held-out split), or a fine-tuned model's accuracy / SQuAD exact match and F1.
#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/table.h"
#include "error.h"
#include "train/finetune.h"
#include "train/model_files.h"
#include "train/progress.h"
#include "train/trainer.h"

namespace packbert::cli {

namespace {

struct EvalArgs {
  std::string task = "mlm", model, data, packs, vocab, predictions;
  int rows = 16;
  std::optional<int> max_seq_len;  // unset: the task's default
  data::SquadOptions squad;
  model::Precision precision = model::Precision::fp32;
  kernels::BackendKind backend = kernels::BackendKind::cpu;
  std::optional<bool> lower_case;
  data::TsvColumns columns;
  bool all = false;           // mlm: every sequence, not only the held-out split
  int64_t max_sequences = 0;  // mlm: at most this many (0 = no limit)
  int64_t logging_steps =
      1000;  // mlm: without a terminal, a progress line every this many sequences
};

void run_task_eval(const EvalArgs& a) {
  train::TaskEvalOptions o;
  o.task = a.task == "squad" ? train::FinetuneTask::squad : train::FinetuneTask::classify;
  o.model = a.model;
  o.data = a.data;
  o.vocab = model_vocab(a.vocab, a.model);
  o.predictions = a.predictions;
  o.rows_per_batch = a.rows;
  o.max_seq_len = a.max_seq_len.value_or(a.task == "squad" ? 384 : 128);
  o.squad = a.squad;
  o.precision = a.precision;
  o.backend = a.backend;
  o.lower_case = a.lower_case;
  o.columns = a.columns;
  o.say = say_on_stderr;
  train::TaskEvalResult r = train::evaluate_task(o);
  Table t({"metric", "value"});
  if (o.task == train::FinetuneTask::squad) {
    t.add_row({"exact match %", fixed(r.squad.exact_match, 2)});
    t.add_row({"F1 %", fixed(r.squad.f1, 2)});
    if (r.squad.v2) {  // as the official v2.0 script prints them
      t.add_row({"HasAns exact %", fixed(r.squad.has_exact, 2)});
      t.add_row({"HasAns F1 %", fixed(r.squad.has_f1, 2)});
      t.add_row({"HasAns questions", with_commas(r.squad.has_total)});
      t.add_row({"NoAns exact %", fixed(r.squad.no_exact, 2)});
      t.add_row({"NoAns F1 %", fixed(r.squad.no_f1, 2)});
      t.add_row({"NoAns questions", with_commas(r.squad.no_total)});
    }
    t.add_row({"questions", with_commas(r.examples)});
    t.add_row({"windows", with_commas(r.sequences)});
  } else if (r.regression) {
    t.add_row({"Pearson", fixed(r.regression->pearson, 4)});
    t.add_row({"Spearman", fixed(r.regression->spearman, 4)});
    t.add_row({"MSE", fixed(r.regression->mse, 4)});
    t.add_row({"examples", with_commas(r.examples)});
  } else {  // the task's GLUE metric first
    std::vector<std::pair<std::string, std::string>> rows = {{"accuracy", fixed(r.accuracy, 4)}};
    if (r.scores.f1) rows.push_back({"f1", fixed(*r.scores.f1, 4)});
    rows.push_back({"mcc", fixed(r.scores.mcc, 4)});
    std::stable_partition(rows.begin(), rows.end(),
                          [&](const auto& kv) { return kv.first == r.metric; });
    for (const auto& [key, value] : rows)
      t.add_row({key == "f1" ? "F1 (label 1)" : metric_title(key), value});
    t.add_row({"examples", with_commas(r.examples)});
  }
  if (!r.glue_task.empty())
    t.add_row({"GLUE task", r.glue_task + " (" + metric_title(r.metric) + ")"});
  t.print(std::cout);
  if (!a.predictions.empty()) std::cout << "predictions in " << a.predictions << '\n';
}

void run_eval(const EvalArgs& a) {
  if (a.task != "mlm") return run_task_eval(a);
  // A masked-LM model (BertForMaskedLM: no pooler, no NSP head) is scored on MLM, its NSP rows
  // said absent; any other missing tensor (the MLM head itself) is an error.
  train::FreshTensors fresh{1, 0, {}};
  auto m = train::load_model(a.model, model::Heads{}, {}, &fresh);
  m->set_backend(a.backend);
  bool nsp = m->config().family == model::Family::bert;  // (ModernBERT has no NSP head)
  for (const std::string& t : fresh.initialized) {
    if (t.starts_with("cls.seq_relationship.") || t.starts_with("bert.pooler.")) {
      nsp = false;
      continue;
    }
    throw InputError(a.model + ": has no tensor '" + t +
                     "' (eval --task mlm needs the MLM head: a pre-training or masked-LM model)");
  }
  if (const std::string bad = train::non_finite_weights(*m); !bad.empty())
    std::cerr << "eval: warning: " << a.model << ": " << bad << "; its metrics will be NaN\n";
  data::SequencesFile f = data::read_sequences(a.data);
  // What is scored: the held-out split the file records (its training sequences say nothing
  // about generalisation), unless --all; at most --max-sequences.
  uint64_t begin = 0, end = f.size();
  if (f.has_heldout_split() && !a.all) begin = f.heldout_begin;
  if (a.max_sequences > 0) end = std::min<uint64_t>(end, begin + a.max_sequences);
  const bool part = begin > 0 || end < f.size();
  if (part && !a.packs.empty())
    throw InputError("--packs lays out the whole file; it cannot score " +
                     std::string(begin > 0 ? "the held-out split (--all scores every sequence)"
                                           : "--max-sequences of it"));
  if (m->config().vocab_size != f.vocab_size)
    throw InputError(a.model + ": vocab_size " + std::to_string(m->config().vocab_size) +
                     " does not match " + a.data + "'s vocabulary of " +
                     std::to_string(f.vocab_size));
  std::optional<data::PacksFile> packs;
  if (!a.packs.empty()) packs = data::read_packs(a.packs);
  train::LoaderOptions lo;
  lo.rows_per_batch = a.rows;
  lo.shuffle = false;
  lo.row_begin = begin, lo.row_end = end;
  train::BatchLoader loader(f, data::sequences_checksum(a.data), packs ? &*packs : nullptr, nullptr,
                            lo, {});
  // (said once every input is read and good: a bad input's error stays the only line)
  std::cerr << "eval: scoring " << with_commas(static_cast<int64_t>(end - begin)) << " of "
            << with_commas(static_cast<int64_t>(f.size())) << " sequences"
            << (begin > 0 ? " (the held-out split the file records; --all for every one)" : "")
            << '\n';
  train::ProgressLine progress("eval", "sequence", 0, static_cast<int64_t>(end - begin), "seq",
                               a.logging_steps);
  int64_t scored = 0;
  const train::EvalMetrics e =
      train::evaluate_mlm(*m, loader, a.precision, [&](int64_t sequences, double seconds) {
        scored += sequences;
        progress.update(scored, static_cast<double>(sequences), seconds, "");
      });
  progress.finish();
  Table t({"metric", "value"});
  t.add_row({"MLM loss", fixed(e.mlm_loss, 4)});
  t.add_row({"MLM accuracy", fixed(e.mlm_acc, 4)});
  const std::string no_nsp = m->config().family == model::Family::modernbert
                                 ? "absent (ModernBERT has no NSP head)"
                                 : "absent (a masked-LM model)";
  t.add_row({"NSP loss", nsp ? fixed(e.nsp_loss, 4) : no_nsp});
  t.add_row({"NSP accuracy", nsp ? fixed(e.nsp_acc, 4) : no_nsp});
  t.add_row({"masked tokens", with_commas(e.mlm_count)});
  t.add_row({"sequences", with_commas(e.sequences)});
  t.print(std::cout);
}

}  // namespace

void register_eval(CLI::App& app) {
  auto e = std::make_shared<EvalArgs>();
  CLI::App* ev = app.add_subcommand(
      "eval",
      "Evaluate a model over a whole file: MLM/NSP loss and accuracy (sequences file), or a "
      "fine-tuned model's accuracy or correlation (TSV) or SQuAD exact match/F1 (JSON)");
  ev->add_option("--task", e->task, "mlm (pre-training metrics) | classify | squad")
      ->capture_default_str()
      ->check(CLI::IsMember({"mlm", "classify", "squad"}));
  ev->add_option("--model,--init,--checkpoint", e->model,
                 "Hugging Face-layout directory or packbert checkpoint")
      ->required();
  ev->add_option("--data", e->data,
                 "mlm: sequences file; classify: TSV, CSV or JSONL; squad: SQuAD v1.1 or v2.0 JSON")
      ->required();
  ev->add_option("--packs", e->packs,
                 "mlm: the sequences file's packs file (same result; about as fast, since one "
                 "sequence per row computes no padding either)");
  number(ev, "--batch-rows", e->rows, "Rows per forward pass", 1, 1e6);
  model_vocab_option(ev, e->vocab, "classify/squad: vocab.txt or tokenizer.json for tokenising");
  casing_flags(ev, e->lower_case);
  column_flags(ev, e->columns);
  number(ev, "--max-seq-len", e->max_seq_len,
         "classify/squad: tokens per sequence (default 128 / 384)", 8, 65536);
  ev->add_option("--predictions", e->predictions,
                 "squad: write {question id: answer} here; classify: each example's predicted "
                 "label, as run_glue's predict_results (index, prediction)");
  ev->add_flag("--all", e->all,
               "mlm: score every sequence of a file that records a held-out split (by default "
               "only that split)");
  number(ev, "--max-sequences", e->max_sequences, "mlm: score at most this many (0 = all)", 0,
         kMaxCount);
  number(ev, "--logging-steps", e->logging_steps,
         "mlm: without a terminal, a progress line every this many sequences", 1, 1e12);
  squad_flags(ev, e->squad);
  precision_flag(ev, e->precision);
  backend_flag(ev, e->backend);
  ev->callback([e] { run_eval(*e); });
}

}  // namespace packbert::cli
