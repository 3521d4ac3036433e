// `packbert predict`: a fine-tuned model run on new text. Classification and regression from a
// TSV, CSV or JSONL file with or without a label column, SQuAD questions with or without answers;
// packed batches, dropout off, fp32 or 16-bit, a progress line over more than a few batches.
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/table.h"
#include "train/predict.h"

namespace packbert::cli {

namespace {

struct PredictArgs {
  std::string task, model, data, vocab, out;
  int rows = 16;
  std::optional<int> max_seq_len;  // unset: the task's default
  data::SquadOptions squad;
  bool v2 = false;
  model::Precision precision = model::Precision::fp32;
  kernels::BackendKind backend = kernels::BackendKind::cpu;
  std::optional<bool> lower_case;
  std::vector<std::string> text_columns;
};

void run_predict(const PredictArgs& a) {
  train::PredictOptions o;
  // The task: as given, else SQuAD for a .json file (JSON Lines is .jsonl), classify otherwise.
  const bool squad =
      a.task.empty() ? std::filesystem::path(a.data).extension() == ".json" : a.task == "squad";
  o.task = squad ? train::FinetuneTask::squad : train::FinetuneTask::classify;
  o.model = a.model;
  o.data = a.data;
  o.vocab = model_vocab(a.vocab, a.model);
  o.out = !a.out.empty() ? a.out : squad ? "predictions.json" : "predictions.tsv";
  o.rows_per_batch = a.rows;
  o.max_seq_len = a.max_seq_len.value_or(squad ? 384 : 128);
  o.squad = a.squad;
  if (a.v2) o.v2 = true;
  o.precision = a.precision;
  o.backend = a.backend;
  o.lower_case = a.lower_case;
  o.columns.text = a.text_columns;
  o.say = say_on_stderr;
  const train::PredictResult r = train::predict_file(o);
  std::cout << "predict: " << with_commas(r.examples)
            << (squad          ? " questions (" + with_commas(r.sequences) + " windows)"
                : r.regression ? " examples (a regression: each one's value)"
                               : " examples (each one's label and every label's probability)")
            << " -> ";
  for (size_t i = 0; i < r.written.size(); ++i)
    std::cout << (i ? (squad ? ", null odds " : ", ") : "") << r.written[i];
  std::cout << '\n';
}

}  // namespace

void register_predict(CLI::App& app) {
  auto p = std::make_shared<PredictArgs>();
  CLI::App* cmd = app.add_subcommand(
      "predict",
      "Run a fine-tuned model on new text: each example's label and its probabilities (or "
      "value), or each SQuAD question's answer; labels and answers in the file are not needed");
  cmd->add_option("--model,--init", p->model,
                  "Fine-tuned model: a Hugging Face-layout directory or packbert checkpoint")
      ->required();
  cmd->add_option("--data", p->data,
                  "classify: TSV, CSV or JSONL with the text column(s), a label column optional; "
                  "squad: SQuAD v1.1 or v2.0 JSON, answers optional")
      ->required();
  cmd->add_option("--task", p->task, "classify | squad (default: squad for a .json file)")
      ->check(CLI::IsMember({"classify", "squad"}));
  cmd->add_option("--out", p->out,
                  "classify: TSV of index, prediction and one probability column per label "
                  "(default predictions.tsv); squad: {question id: answer} (default "
                  "predictions.json), for v2.0 with the null odds beside it (...predictions.json: "
                  "...null_odds.json, as run_qa names them; another name: NAME.null_odds.json)");
  number(cmd, "--batch-rows", p->rows, "Rows per forward pass", 1, 1e6);
  model_vocab_option(cmd, p->vocab, "vocab.txt or tokenizer.json for tokenising");
  casing_flags(cmd, p->lower_case);
  cmd->add_option("--text-columns", p->text_columns,
                  "classify: the text column, or two for a pair (A,B); default: recognised from "
                  "the header as fine-tuning does (sentence; sentence1,sentence2; ...)")
      ->delimiter(',')
      ->expected(1, 2);
  number(cmd, "--max-seq-len", p->max_seq_len, "Tokens per sequence (default 128; squad 384)", 8,
         65536);
  squad_flags(cmd, p->squad);
  cmd->add_flag("--version-2-with-negative", p->v2,
                "squad: questions may have no answer (SQuAD v2.0: \"\" when the null span wins, "
                "and null odds written); default: as the file shows (is_impossible, or empty "
                "answers)");
  precision_flag(cmd, p->precision);
  backend_flag(cmd, p->backend);
  cmd->callback([p] { run_predict(*p); });
}

}  // namespace packbert::cli
