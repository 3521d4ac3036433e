// `packbert pretrain`, `packbert eval`, `packbert export`.
#include <unistd.h>

#include <csignal>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/table.h"
#include "error.h"
#include "train/finetune.h"
#include "train/trainer.h"

namespace packbert::cli {

namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) {
  g_stop = true;
}

std::string eta_text(double seconds) {
  int s = static_cast<int>(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

void run_pretrain(const train::PretrainOptions& o, bool resume, const std::string& optimizer) {
  train::PretrainOptions opt = o;
  if (optimizer == "adamw")
    opt.optimizer.kind = train::OptimizerKind::adamw;
  else if (optimizer == "lamb")
    opt.optimizer.kind = train::OptimizerKind::lamb;
  else
    throw InputError("--optimizer: expected adamw|lamb, got '" + optimizer + "'");
  train::Trainer trainer(opt, resume);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  const bool tty = ::isatty(2);
  const model::BertConfig& c = trainer.config();
  std::cerr << "pretrain: " << c.num_hidden_layers << " layers, hidden " << c.hidden_size << ", "
            << (opt.packs.empty() ? "padded rows" : "packs") << ", from step " << trainer.step()
            << " to " << opt.max_steps << "; metrics in " << opt.out_dir << "/metrics.jsonl\n";
  double tokens = 0, seconds = 0;
  int64_t first = trainer.step();
  trainer.run(
      g_stop,
      [&](const train::StepMetrics& s) {
        tokens += static_cast<double>(s.real_tokens);
        seconds += s.seconds;
        double rate = tokens / std::max(seconds, 1e-9);
        double eta = seconds / static_cast<double>(s.step + 1 - first) *
                     static_cast<double>(opt.max_steps - s.step - 1);
        char line[256];
        std::snprintf(
            line, sizeof line,
            "step %lld/%lld  loss %.4f  mlm acc %.3f  nsp acc %.3f  lr %.2e  %.0f tok/s  ETA %s%s",
            static_cast<long long>(s.step + 1), static_cast<long long>(opt.max_steps), s.loss,
            s.mlm_acc, s.nsp_acc, s.lr, rate, eta_text(eta).c_str(),
            s.skipped ? "  (skipped: non-finite loss)" : "");
        if (tty)
          std::cerr << '\r' << line << "\033[K" << std::flush;
        else if (s.skipped || (s.step + 1) % 10 == 0 || s.step + 1 == opt.max_steps)
          std::cerr << line << '\n';
      },
      [&](const train::EvalMetrics& e) {
        std::cerr << (tty ? "\n" : "") << "eval @ step " << e.step << ": mlm acc "
                  << fixed(e.mlm_acc, 4) << ", mlm loss " << fixed(e.mlm_loss, 4) << ", nsp acc "
                  << fixed(e.nsp_acc, 4) << " (" << with_commas(e.mlm_count) << " masked tokens)\n";
      });
  if (tty) std::cerr << '\n';
  std::cerr << (g_stop ? "pretrain: stopped on signal; " : "pretrain: ") << "checkpoint at step "
            << trainer.step() << " in " << trainer.checkpoint_path() << '\n';
}

struct EvalArgs {
  std::string task = "mlm", model, data, packs, vocab = PACKBERT_DEFAULT_VOCAB, predictions;
  int rows = 16, max_seq_len = 0;  // 0 = the task's default
  train::SquadOptions squad;
};

void run_task_eval(const EvalArgs& a) {
  train::TaskEvalOptions o;
  o.task = a.task == "squad" ? train::FinetuneTask::squad : train::FinetuneTask::classify;
  o.model = a.model;
  o.data = a.data;
  o.vocab = a.vocab;
  o.predictions = a.predictions;
  o.rows_per_batch = a.rows;
  o.max_seq_len = a.max_seq_len ? a.max_seq_len : (a.task == "squad" ? 384 : 128);
  o.squad = a.squad;
  train::TaskEvalResult r = train::evaluate_task(o);
  Table t({"metric", "value"});
  if (o.task == train::FinetuneTask::squad) {
    t.add_row({"exact match %", fixed(r.squad.exact_match, 2)});
    t.add_row({"F1 %", fixed(r.squad.f1, 2)});
    t.add_row({"questions", with_commas(r.examples)});
    t.add_row({"windows", with_commas(r.sequences)});
  } else {
    t.add_row({"accuracy", fixed(r.accuracy, 4)});
    t.add_row({"examples", with_commas(r.examples)});
  }
  t.print(std::cout);
  if (!a.predictions.empty()) std::cout << "answers in " << a.predictions << '\n';
}

void run_eval(const EvalArgs& a) {
  if (a.task != "mlm") return run_task_eval(a);
  auto m = train::load_model(a.model, model::Heads{});
  train::PretrainOptions o;
  o.sequences = a.data;
  o.packs = a.packs;
  o.vocab = a.vocab;
  o.out_dir = "/tmp";  // unused: evaluation writes nothing
  o.eval_fraction = 0;
  data::SequencesFile f = data::read_sequences(a.data);
  if (m->config().vocab_size != f.vocab_size)
    throw InputError(a.model + ": vocab_size " + std::to_string(m->config().vocab_size) +
                     " does not match " + a.data + "'s vocabulary of " +
                     std::to_string(f.vocab_size));
  std::optional<data::PacksFile> packs;
  if (!a.packs.empty()) packs = data::read_packs(a.packs);
  train::LoaderOptions lo;
  lo.rows_per_batch = a.rows;
  lo.shuffle = false;
  train::BatchLoader loader(f, data::sequences_checksum(a.data), packs ? &*packs : nullptr, nullptr,
                            lo, {});
  double mlm = 0, nsp = 0;
  int64_t mlm_n = 0, nsp_n = 0, mlm_ok = 0, nsp_ok = 0;
  while (loader.cursor().epoch == 0) {
    model::Outputs out = m->forward(loader.next(), model::StepOptions{});
    mlm += out.mlm_loss * static_cast<double>(out.mlm_count);
    nsp += out.nsp_loss * static_cast<double>(out.nsp_count);
    mlm_n += out.mlm_count, nsp_n += out.nsp_count, mlm_ok += out.mlm_correct,
        nsp_ok += out.nsp_correct;
  }
  Table t({"metric", "value"});
  t.add_row({"MLM loss", fixed(mlm / std::max<int64_t>(mlm_n, 1), 4)});
  t.add_row({"MLM accuracy", fixed(static_cast<double>(mlm_ok) / std::max<int64_t>(mlm_n, 1), 4)});
  t.add_row({"NSP loss", fixed(nsp / std::max<int64_t>(nsp_n, 1), 4)});
  t.add_row({"NSP accuracy", fixed(static_cast<double>(nsp_ok) / std::max<int64_t>(nsp_n, 1), 4)});
  t.add_row({"masked tokens", with_commas(mlm_n)});
  t.add_row({"sequences", with_commas(nsp_n)});
  t.print(std::cout);
}

}  // namespace

void register_pretrain(CLI::App& app) {
  auto o = std::make_shared<train::PretrainOptions>();
  auto resume = std::make_shared<bool>(false);
  auto optimizer = std::make_shared<std::string>("lamb");
  o->vocab = PACKBERT_DEFAULT_VOCAB;
  CLI::App* cmd = app.add_subcommand(
      "pretrain", "Pre-train BERT (MLM + NSP) on a sequences file, packed or padded");
  cmd->add_option("--data", o->sequences, "Sequences file (packbert prepare)")->required();
  cmd->add_option("--packs", o->packs,
                  "Packs file for it (omit: padded baseline, one sequence per row)");
  cmd->add_option("--out", o->out_dir, "Run directory: checkpoint.safetensors, metrics.jsonl")
      ->required();
  cmd->add_option("--vocab", o->vocab, "vocab.txt the data was made with")->capture_default_str();
  cmd->add_option("--init", o->init, "Start from a Hugging Face-layout directory or a checkpoint");
  cmd->add_option("--preset", o->preset, "Model shape: tiny|mini|small|medium|base|large")
      ->capture_default_str();
  cmd->add_option("--batch-rows", o->rows_per_batch, "Packs (or padded rows) per micro-batch")
      ->capture_default_str();
  cmd->add_option("--accumulation", o->accumulation, "Micro-batches per optimizer step")
      ->capture_default_str();
  cmd->add_option("--packing-adjust", o->packing_adjust,
                  "none | ga (divide accumulation by the packing factor) | beta (LAMB betas ^ "
                  "packing factor)")
      ->capture_default_str();
  cmd->add_option("--steps", o->max_steps, "Optimizer steps")->capture_default_str();
  cmd->add_option("--lr", o->lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--warmup", o->warmup_steps, "Linear warmup steps")->capture_default_str();
  cmd->add_option("--decay-power", o->decay_power, "1 = linear decay to 0 at --steps")
      ->capture_default_str();
  cmd->add_option("--optimizer", *optimizer, "lamb | adamw")->capture_default_str();
  cmd->add_option("--weight-decay", o->optimizer.weight_decay)->capture_default_str();
  cmd->add_option("--clip", o->clip_norm, "Global gradient-norm clip (0 = off)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed)->capture_default_str();
  cmd->add_option("--checkpoint-every", o->checkpoint_every,
                  "Steps between checkpoints (0 = at the end)")
      ->capture_default_str();
  cmd->add_option("--eval-every", o->eval_every,
                  "Steps between held-out evaluations (0 = at the end)")
      ->capture_default_str();
  cmd->add_option("--eval-fraction", o->eval_fraction,
                  "Share of sequences held out for evaluation (the file's last; the same packed "
                  "or padded)")
      ->capture_default_str();
  cmd->add_option("--nan-abort", o->nan_abort, "Abort after this many non-finite steps in a row")
      ->capture_default_str();
  cmd->add_flag("--dynamic-masking", o->dynamic_masking, "New masks every epoch (RoBERTa style)");
  cmd->add_option("--max-minutes", o->max_minutes,
                  "Stop (with a checkpoint) after this much training time");
  cmd->add_flag("--resume", *resume, "Continue from --out/checkpoint.safetensors, bit-exactly");
  cmd->add_flag("--compute-padding", o->compute_padding,
                "Padded baseline only: compute the padding slots as frameworks do (same results, "
                "framework cost)");
  cmd->callback([o, resume, optimizer] { run_pretrain(*o, *resume, *optimizer); });

  auto e = std::make_shared<EvalArgs>();
  CLI::App* ev = app.add_subcommand(
      "eval",
      "Evaluate a model over a whole file: MLM/NSP loss and accuracy (sequences file), or a "
      "fine-tuned model's accuracy (TSV) or SQuAD exact match/F1 (JSON)");
  ev->add_option("--task", e->task, "mlm (pre-training metrics) | classify | squad")
      ->capture_default_str()
      ->check(CLI::IsMember({"mlm", "classify", "squad"}));
  ev->add_option("--model", e->model, "Hugging Face-layout directory or packbert checkpoint")
      ->required();
  ev->add_option("--data", e->data, "mlm: sequences file; classify: TSV; squad: SQuAD v1.1 JSON")
      ->required();
  ev->add_option("--packs", e->packs, "mlm: the sequences file's packs file (faster; same result)");
  ev->add_option("--batch-rows", e->rows)->capture_default_str();
  ev->add_option("--vocab", e->vocab, "classify/squad: vocab.txt for tokenising")
      ->capture_default_str();
  ev->add_option("--max-seq-len", e->max_seq_len, "classify/squad: default 128 / 384");
  ev->add_option("--predictions", e->predictions, "squad: write {question id: answer} here");
  ev->add_option("--doc-stride", e->squad.doc_stride)->capture_default_str();
  ev->add_option("--max-query-length", e->squad.max_query_length)->capture_default_str();
  ev->add_option("--max-answer-length", e->squad.max_answer_length)->capture_default_str();
  ev->callback([e] { run_eval(*e); });

  auto x = std::make_shared<std::pair<std::string, std::string>>();
  auto xv = std::make_shared<std::string>(PACKBERT_DEFAULT_VOCAB);
  CLI::App* ex = app.add_subcommand(
      "export", "Write config.json + model.safetensors + vocab.txt (Hugging Face layout)");
  ex->add_option("--checkpoint", x->first, "packbert checkpoint (or HF directory)")->required();
  ex->add_option("--out", x->second, "Directory to write")->required();
  ex->add_option("--vocab", *xv, "vocab.txt to include")->capture_default_str();
  ex->callback([x, xv] {
    auto m = train::load_model(x->first, model::Heads{});
    train::export_model(*m, x->second, *xv);
    std::cout << "wrote " << x->second << "/{config.json, model.safetensors, vocab.txt}\n";
  });
}

}  // namespace packbert::cli

namespace packbert::cli {

void register_finetune(CLI::App& app) {
  auto o = std::make_shared<train::FinetuneOptions>();
  auto task = std::make_shared<std::string>("classify");
  auto no_pack = std::make_shared<bool>(false);
  o->vocab = PACKBERT_DEFAULT_VOCAB;
  CLI::App* cmd = app.add_subcommand(
      "finetune",
      "Fine-tune a classifier on TSV data or a span extractor on SQuAD v1.1 JSON (packed), "
      "report dev accuracy or exact match / F1");
  cmd->add_option("--task", *task,
                  "classify (sequence or pair classification, TSV) | squad (SQuAD v1.1 JSON)")
      ->capture_default_str()
      ->check(CLI::IsMember({"classify", "squad"}));
  cmd->add_option("--train", o->train,
                  "classify: TSV with a header (label, sentence[, sentence2]); squad: JSON")
      ->required();
  cmd->add_option("--dev", o->dev, "The same format; squad writes its answers to predictions.json")
      ->required();
  cmd->add_option("--init", o->init, "Pre-trained model: HF directory or packbert checkpoint")
      ->required();
  cmd->add_option("--out", o->out_dir, "Directory for the fine-tuned model (HF layout) and metrics")
      ->required();
  cmd->add_option("--vocab", o->vocab)->capture_default_str();
  CLI::Option* len = cmd->add_option("--max-seq-len", o->max_seq_len,
                                     "Tokens per sequence and per packed row (default 128; "
                                     "squad 384)");
  cmd->add_option("--batch-rows", o->rows_per_batch, "Packs (or rows) per step")
      ->capture_default_str();
  cmd->add_option("--epochs", o->epochs)->capture_default_str();
  cmd->add_option("--lr", o->lr)->capture_default_str();
  cmd->add_option("--warmup", o->warmup_steps)->capture_default_str();
  cmd->add_option("--seed", o->seed)->capture_default_str();
  cmd->add_option("--doc-stride", o->squad.doc_stride, "squad: step between context windows")
      ->capture_default_str();
  cmd->add_option("--max-query-length", o->squad.max_query_length, "squad: question tokens kept")
      ->capture_default_str();
  cmd->add_option("--max-answer-length", o->squad.max_answer_length,
                  "squad: longest predicted answer, tokens")
      ->capture_default_str();
  cmd->add_flag("--no-pack", *no_pack, "One example per row");
  cmd->callback([o, task, no_pack, len] {
    train::FinetuneOptions opt = *o;
    opt.packed = !*no_pack;
    opt.task = *task == "squad" ? train::FinetuneTask::squad : train::FinetuneTask::classify;
    if (opt.task == train::FinetuneTask::squad && len->count() == 0) opt.max_seq_len = 384;
    train::FinetuneResult r = train::finetune(opt);
    if (opt.task == train::FinetuneTask::squad) {
      Table t({"epoch", "dev exact match %", "dev F1 %"});
      for (size_t e = 0; e < r.dev_squad.size(); ++e)
        t.add_row({std::to_string(e + 1), fixed(r.dev_squad[e].exact_match, 2),
                   fixed(r.dev_squad[e].f1, 2)});
      t.print(std::cout);
      std::cout << r.train_sequences << " training windows in " << r.train_rows << " rows";
      if (r.skipped) std::cout << " (" << r.skipped << " questions skipped: answer not found)";
    } else {
      Table t({"epoch", "dev accuracy", "majority baseline"});
      for (size_t e = 0; e < r.dev_accuracy.size(); ++e)
        t.add_row(
            {std::to_string(e + 1), fixed(r.dev_accuracy[e], 4), fixed(r.majority_baseline, 4)});
      t.print(std::cout);
      std::cout << r.num_labels << " labels, " << r.train_sequences << " examples in "
                << r.train_rows << " rows";
    }
    std::cout << ", " << r.steps << " steps; model in " << opt.out_dir << '\n';
  });
}

}  // namespace packbert::cli
