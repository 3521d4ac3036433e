// `packbert pretrain`, `packbert eval`, `packbert export`.
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <iostream>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/table.h"
#include "error.h"
#include "train/finetune.h"
#include "train/trainer.h"

namespace packbert::cli {

namespace {

// SIGINT/SIGTERM ask training to stop after the current step. No asynchronous handler runs: the
// signals are blocked in every thread (the mask is set before any thread exists, and threads
// inherit it) and one watcher thread takes them with sigwait. So a signal never interrupts a
// compute thread (no EINTR inside a kernel, no handler on a thread in the middle of a GEMM),
// and the only shared state is one atomic flag.
class StopOnSignals {
 public:
  StopOnSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGUSR1);  // the destructor's wake-up call
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
    watcher_ = std::thread([this] {
      int sig = 0;
      while (sigwait(&set_, &sig) == 0) {
        if (sig == SIGUSR1 && done_) return;
        if (sig == SIGINT || sig == SIGTERM) {
          signal_ = sig;
          stop_ = true;
        }
      }
    });
  }
  ~StopOnSignals() {
    done_ = true;
    pthread_kill(watcher_.native_handle(), SIGUSR1);
    watcher_.join();
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  const std::atomic<bool>& stop() const { return stop_; }
  int signal() const { return signal_; }

 private:
  sigset_t set_, old_;
  std::atomic<bool> stop_{false}, done_{false};
  std::atomic<int> signal_{0};
  std::thread watcher_;
};

std::string eta_text(double seconds) {
  int s = static_cast<int>(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

// Returns the exit code: 0, or 128 + the signal that stopped the run (130 SIGINT, 143 SIGTERM).
int run_pretrain(const train::PretrainOptions& o, bool resume, const std::string& optimizer) {
  train::PretrainOptions opt = o;
  if (optimizer == "adamw")
    opt.optimizer.kind = train::OptimizerKind::adamw;
  else if (optimizer == "lamb")
    opt.optimizer.kind = train::OptimizerKind::lamb;
  else
    throw InputError("--optimizer: expected adamw|lamb, got '" + optimizer + "'");
  StopOnSignals signals;  // before the trainer starts any thread
  train::Trainer trainer(opt, resume);
  const bool tty = ::isatty(2);
  const model::BertConfig& c = trainer.config();
  std::cerr << "pretrain: " << c.num_hidden_layers << " layers, hidden " << c.hidden_size << ", "
            << (opt.packs.empty() ? "padded rows" : "packs") << ", from step " << trainer.step()
            << " to " << opt.max_steps << "; metrics in " << opt.out_dir << "/metrics.jsonl\n";
  double tokens = 0, seconds = 0;
  const int64_t first = trainer.step();
  const train::StopReason reason = trainer.run(
      signals.stop(),
      [&](const train::StepMetrics& s) {
        tokens += static_cast<double>(s.real_tokens);
        seconds += s.seconds;
        double rate = tokens / std::max(seconds, 1e-9);
        double eta = seconds / static_cast<double>(s.step - first) *
                     static_cast<double>(opt.max_steps - s.step);
        char line[256];
        std::snprintf(
            line, sizeof line,
            "step %lld/%lld  loss %.4f  mlm acc %.3f  nsp acc %.3f  lr %.2e  %.0f tok/s  ETA %s%s",
            static_cast<long long>(s.step), static_cast<long long>(opt.max_steps), s.loss,
            s.mlm_acc, s.nsp_acc, s.lr, rate, eta_text(eta).c_str(),
            s.skipped ? ("  (update skipped: " + s.skip_reason + ")").c_str() : "");
        if (tty)
          std::cerr << '\r' << line << "\033[K" << std::flush;
        else if (s.skipped || s.step % 10 == 0 || s.step == opt.max_steps)
          std::cerr << line << '\n';
      },
      [&](const train::EvalMetrics& e) {
        std::cerr << (tty ? "\n" : "") << "eval @ step " << e.step << ": mlm acc "
                  << fixed(e.mlm_acc, 4) << ", mlm loss " << fixed(e.mlm_loss, 4) << ", nsp acc "
                  << fixed(e.nsp_acc, 4) << " (" << with_commas(e.mlm_count) << " masked tokens)\n";
      });
  if (tty) std::cerr << '\n';
  const int sig = signals.signal();
  std::cerr << "pretrain: ";
  if (reason == train::StopReason::requested)
    std::cerr << "stopped by " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << " before --steps; ";
  if (reason == train::StopReason::time_limit) std::cerr << "stopped at --max-minutes; ";
  std::cerr << "checkpoint at step " << trainer.step() << " in " << trainer.checkpoint_path();
  if (trainer.outlier_skips())
    std::cerr << " (" << trainer.outlier_skips() << " updates skipped as outliers)";
  std::cerr << '\n';
  return reason == train::StopReason::requested ? 128 + sig : 0;
}

struct EvalArgs {
  std::string task = "mlm", model, data, packs, vocab, predictions;
  int rows = 16;
  std::optional<int> max_seq_len;  // unset: the task's default
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
  o.max_seq_len = a.max_seq_len.value_or(a.task == "squad" ? 384 : 128);
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

void register_pretrain(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<train::PretrainOptions>();
  auto resume = std::make_shared<bool>(false);
  auto optimizer = std::make_shared<std::string>("lamb");
  CLI::App* cmd = app.add_subcommand(
      "pretrain",
      "Pre-train BERT (MLM + NSP) on a sequences file, packed or padded. Exit status: 0 when "
      "--steps (or --max-minutes) is reached, 2 for bad input or a run that cannot go on (the "
      "last good checkpoint is kept as it was), 130/143 when stopped by SIGINT/SIGTERM (a "
      "checkpoint of the step reached is written first; continue with --resume).");
  cmd->add_option("--data", o->sequences, "Sequences file (packbert prepare)")->required();
  cmd->add_option("--packs", o->packs,
                  "Packs file for it (omit: padded baseline, one sequence per row)");
  cmd->add_option("--out", o->out_dir, "Run directory: checkpoint.safetensors, metrics.jsonl")
      ->required();
  cmd->add_flag("--overwrite", o->overwrite,
                "Start over in an --out that holds an earlier run (its checkpoint and metrics "
                "are replaced)");
  vocab_option(cmd, o->vocab, "vocab.txt the data was made with");
  cmd->add_option("--init", o->init, "Start from a Hugging Face-layout directory or a checkpoint");
  cmd->add_option("--preset", o->preset, "Model shape: tiny|mini|small|medium|base|large")
      ->capture_default_str();
  number(cmd, "--batch-rows", o->rows_per_batch, "Packs (or padded rows) per micro-batch", 1, 1e6);
  number(cmd, "--accumulation", o->accumulation, "Micro-batches per optimizer step", 1, 1e6);
  cmd->add_option("--packing-adjust", o->packing_adjust,
                  "none | ga (divide accumulation by the packing factor) | beta (LAMB betas ^ "
                  "packing factor)")
      ->capture_default_str();
  number(cmd, "--steps", o->max_steps, "Optimizer steps", 1, kMaxCount);
  // LAMB scales each tensor's step by its trust ratio, so each tensor moves by lr × its own norm
  // per step, and the rate that suits AdamW is too small for it. Measured (docs/BENCHMARKS.md,
  // "LAMB learning rate"): bert-mini on GCIDE, ~24 sequences a step, held-out MLM loss after
  // 200 steps: LAMB 1e-3 8.44, 5e-3 6.57, 1e-2 6.73; AdamW 1e-3 6.68.
  auto lr_given = std::make_shared<CLI::Option*>(nullptr);
  *lr_given = cmd->add_option("--lr", o->lr,
                              "Peak learning rate (default 5e-3 with LAMB, 1e-3 with AdamW: LAMB "
                              "moves each weight tensor by about lr x its own norm per step). "
                              "Measured on bert-mini, ~24 sequences a step: LAMB 5e-3 beat 1e-3 "
                              "and 1e-2; for larger batches LAMB's authors scale lr with the "
                              "square root of the batch")
                  ->check(in_range(1e-12, 10, false));
  number(cmd, "--warmup", o->warmup_steps, "Linear warmup steps", 0, kMaxCount);
  number(cmd, "--decay-power", o->decay_power, "1 = linear decay to 0 at --steps, 0 = constant", 0,
         100);
  cmd->add_option("--optimizer", *optimizer, "lamb | adamw")->capture_default_str();
  number(cmd, "--weight-decay", o->optimizer.weight_decay,
         "Decoupled weight decay (not on biases and LayerNorm)", 0, 10);
  number(cmd, "--clip", o->clip_norm, "Global gradient-norm clip (0 = off)", 0, 1e9);
  number(cmd, "--seed", o->seed, "Seed for initialisation, order, dropout and masks", 0, kMaxSeed);
  number(cmd, "--checkpoint-every", o->checkpoint_every,
         "Steps between checkpoints (0 = at the end)", 0, kMaxCount);
  number(cmd, "--eval-every", o->eval_every, "Steps between held-out evaluations (0 = at the end)",
         0, kMaxCount);
  number(cmd, "--eval-fraction", o->eval_fraction,
         "Only for a sequences file without its own held-out split (prepare --eval-fraction, "
         "which splits by document): the share of its last sequences held out (default 0.02)",
         0, 0.49);
  number(cmd, "--nan-abort", o->nan_abort,
         "Abort (no checkpoint written) after this many non-finite steps in a row", 1, 1e6);
  number(cmd, "--skip-outliers", o->outlier_z,
         "Skip an update whose gradient norm is more than Z standard deviations above the mean "
         "of the last 64 accepted ones (0 = off; 6 is a cautious choice)",
         0, 1000);
  cmd->add_flag("--dynamic-masking", o->dynamic_masking, "New masks every epoch (RoBERTa style)");
  number(cmd, "--max-minutes", o->max_minutes,
         "Stop (with a checkpoint) after this much training time (0 = no limit)", 0, 1e9);
  cmd->add_flag("--resume", *resume, "Continue from --out/checkpoint.safetensors, bit-exactly");
  recompute_flags(cmd, o->recompute, &o->memory_limit);
  cmd->add_flag("--compute-padding", o->compute_padding,
                "Padded baseline only: compute the padding slots as frameworks do (same results, "
                "framework cost)");
  cmd->callback([o, resume, optimizer, lr_given, &exit_code] {
    train::PretrainOptions opt = *o;
    if ((*lr_given)->count() == 0) opt.lr = *optimizer == "lamb" ? 5e-3 : 1e-3;
    exit_code = run_pretrain(opt, *resume, *optimizer);
  });

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
  number(ev, "--batch-rows", e->rows, "Rows per forward pass", 1, 1e6);
  vocab_option(ev, e->vocab, "classify/squad: vocab.txt for tokenising");
  number(ev, "--max-seq-len", e->max_seq_len,
         "classify/squad: tokens per sequence (default 128 / 384)", 8, 65536);
  ev->add_option("--predictions", e->predictions, "squad: write {question id: answer} here");
  number(ev, "--doc-stride", e->squad.doc_stride, "squad: step between context windows", 1, 65536);
  number(ev, "--max-query-length", e->squad.max_query_length, "squad: question tokens kept", 1,
         65536);
  number(ev, "--max-answer-length", e->squad.max_answer_length,
         "squad: longest predicted answer, tokens", 1, 65536);
  ev->callback([e] { run_eval(*e); });

  auto x = std::make_shared<std::pair<std::string, std::string>>();
  auto xv = std::make_shared<std::string>();
  CLI::App* ex = app.add_subcommand(
      "export", "Write config.json + model.safetensors + vocab.txt (Hugging Face layout)");
  ex->add_option("--checkpoint", x->first, "packbert checkpoint (or HF directory)")->required();
  ex->add_option("--out", x->second, "Directory to write")->required();
  vocab_option(ex, *xv, "vocab.txt to include");
  auto xo = std::make_shared<bool>(false);
  ex->add_flag("--overwrite", *xo, "Replace a model directory already at --out");
  ex->callback([x, xv, xo] {
    auto m = train::load_model(x->first, model::Heads{});
    train::export_model(*m, x->second, *xv, *xo);
    std::cout << "wrote " << x->second << "/{config.json, model.safetensors, vocab.txt}\n";
  });
}

}  // namespace packbert::cli

namespace packbert::cli {

void register_finetune(CLI::App& app) {
  auto o = std::make_shared<train::FinetuneOptions>();
  auto task = std::make_shared<std::string>("classify");
  auto no_pack = std::make_shared<bool>(false);
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
  cmd->add_option("--out", o->out_dir,
                  "Directory for the fine-tuned model (HF layout) and metrics; it appears when "
                  "fine-tuning has finished, whole (written as <out>.partial.PID until then)")
      ->required();
  cmd->add_flag("--overwrite", o->overwrite, "Replace an --out that already holds a model");
  vocab_option(cmd, o->vocab, "vocab.txt to tokenise the examples with");
  CLI::Option* len =
      number(cmd, "--max-seq-len", o->max_seq_len,
             "Tokens per sequence and per packed row (default 128; squad 384)", 8, 65536);
  number(cmd, "--batch-rows", o->rows_per_batch, "Packs (or rows) per step", 1, 1e6);
  number(cmd, "--epochs", o->epochs, "Passes over the training data", 1, 1e6);
  number(cmd, "--lr", o->lr, "Peak learning rate (AdamW)", 1e-12, 10);
  number(cmd, "--warmup", o->warmup_steps, "Linear warmup steps", 0, kMaxCount);
  number(cmd, "--seed", o->seed, "Seed for the new head, order and dropout", 0, kMaxSeed);
  number(cmd, "--doc-stride", o->squad.doc_stride, "squad: step between context windows", 1, 65536);
  number(cmd, "--max-query-length", o->squad.max_query_length, "squad: question tokens kept", 1,
         65536);
  number(cmd, "--max-answer-length", o->squad.max_answer_length,
         "squad: longest predicted answer, tokens", 1, 65536);
  cmd->add_flag("--no-pack", *no_pack, "One example per row");
  recompute_flags(cmd, o->recompute, &o->memory_limit);
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
