// `packbert pretrain`: progress line, metrics, SIGINT/SIGTERM handling, exit codes.
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <iostream>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/signals.h"
#include "cli/table.h"
#include "dist/comm.h"
#include "error.h"
#include "train/progress.h"
#include "train/sparsity.h"
#include "train/trainer.h"

namespace packbert::cli {

namespace {

// What the run is (rank 0 alone reports): model, batches, processes, sparsity, --init's gaps.
void print_run_header(const train::PretrainOptions& opt, const train::Trainer& trainer,
                      bool resume) {
  const bool root = dist::Comm::world().root();
  const model::BertConfig& c = trainer.config();
  if (root)
    std::cerr << "pretrain: " << c.num_hidden_layers << " layers, hidden " << c.hidden_size << ", "
              << (opt.packs.empty() ? "padded rows"
                  : opt.one_per_row ? "the packs' sequences one per row"
                                    : "packs")
              << ", from step " << trainer.step() << " to " << opt.max_steps;
  if (root && opt.pipeline_stages > 1)
    std::cerr << ", " << opt.pipeline_stages << " pipeline stages of "
              << trainer.stage_layers_text() << " layers x "
              << dist::Comm::world().size() / opt.pipeline_stages << " replicas x "
              << opt.loop.rows_per_batch << " rows, " << opt.loop.accumulation
              << " micro-batches a step (1F1B)";
  else if (root && dist::Comm::world().distributed())
    std::cerr << ", " << dist::Comm::world().size() << " processes x " << opt.loop.rows_per_batch
              << " rows" << (opt.loop.zero ? ", optimizer state sharded (ZeRO-1)" : "");
  if (root) std::cerr << "; metrics in " << opt.out_dir << "/metrics.jsonl\n";
  if (root && opt.sparse.sparsity.on()) {
    std::cerr << "pretrain: block-sparse encoder weights, "
              << with_flags(train::schedule_summary(opt.sparse, opt.max_steps));
    if (!resume)
      std::cerr
          << "; kept blocks "
          << (!opt.init.empty() ? "taken from --init (of a dense weight, those of largest L1 norm)"
              : opt.sparse.init == model::SparseInit::fan_in
                  ? "start N(0, initializer_range / sqrt(kept fraction)) (--sparse-init fan-in)"
                  : "start N(0, initializer_range) (--sparse-init dense)");
    std::cerr << '\n';
  }
  if (root && !trainer.initialized().empty())
    std::cerr << "pretrain: --init has no " << trainer.initialized().size()
              << " tensor(s) of the pre-training heads (" << trainer.initialized().front()
              << (trainer.initialized().size() > 1 ? ", ..." : "")
              << "); they start from --seed's initialisation\n";
}

// How the run ended (rank 0): why it stopped, where its checkpoint is, what it skipped.
void print_run_end(const train::PretrainOptions& opt, const train::Trainer& trainer,
                   train::StopReason reason, int sig) {
  std::cerr << "pretrain: ";
  if (reason == train::StopReason::requested)
    std::cerr << "stopped by " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << " before --steps; ";
  if (reason == train::StopReason::time_limit) std::cerr << "stopped at --max-minutes; ";
  if (reason == train::StopReason::target_reached)
    std::cerr << "stopped at step " << trainer.step() << ": held-out accuracy reached "
              << "--target-accuracy " << opt.target_accuracy << "; ";
  std::cerr << "checkpoint at step " << trainer.step() << " in " << trainer.checkpoint_path();
  if (trainer.outlier_skips())
    std::cerr << " (" << trainer.outlier_skips() << " updates skipped as outliers)";
  if (trainer.overflow_skips())
    std::cerr << " (" << trainer.overflow_skips()
              << " steps skipped for loss-scale overflow; scale " << trainer.loss_scale() << ")";
  std::cerr << '\n';
}

// Returns the exit code: 0, or 128 + the signal that stopped the run (130 SIGINT, 143 SIGTERM).
int run_pretrain(const train::PretrainOptions& opt, bool resume, int logging_steps) {
  StopOnSignals signals;  // before the trainer starts any thread
  train::Trainer trainer(opt, resume);
  const bool tty = ::isatty(2);
  const bool root = dist::Comm::world().root();  // rank 0 alone reports
  print_run_header(opt, trainer, resume);
  double tokens = 0, seconds = 0;
  const int64_t first = trainer.step();
  const bool nsp_head = trainer.model().config().family == model::Family::bert;
  const train::StopReason reason = trainer.run(
      signals.stop(),
      [&](const train::StepMetrics& s) {
        tokens += static_cast<double>(s.real_tokens);
        seconds += s.seconds;
        double rate = tokens / std::max(seconds, 1e-9);
        double eta = seconds / static_cast<double>(s.step - first) *
                     static_cast<double>(opt.max_steps - s.step);
        char nsp[32] = "";  // (a family without NSP, ModernBERT, shows none)
        if (nsp_head) std::snprintf(nsp, sizeof nsp, "  nsp acc %.3f", s.nsp_acc);
        char line[256];
        std::snprintf(line, sizeof line,
                      "step %lld/%lld  loss %.4f  mlm acc %.3f%s  lr %.2e  %.0f tok/s  ETA %s%s",
                      static_cast<long long>(s.step), static_cast<long long>(opt.max_steps), s.loss,
                      s.mlm_acc, nsp, s.lr, rate, train::clock_text(eta).c_str(),
                      s.skipped ? ("  (update skipped: " + s.skip_reason + ")").c_str() : "");
        if (tty)
          std::cerr << '\r' << line << "\033[K" << std::flush;
        else if (s.skipped || s.step % logging_steps == 0 || s.step == opt.max_steps)
          std::cerr << line << '\n';
      },
      [&](const train::EvalMetrics& e) {
        std::cerr << (tty ? "\n" : "") << "eval @ step " << e.step << ": mlm acc "
                  << fixed(e.mlm_acc, 4) << ", mlm loss " << fixed(e.mlm_loss, 4)
                  << (nsp_head ? ", nsp acc " + fixed(e.nsp_acc, 4) : std::string()) << " ("
                  << with_commas(e.mlm_count) << " masked tokens)\n";
      });
  const int sig = signals.signal() ? signals.signal() : SIGTERM;  // (a stop another rank got)
  if (!root) return reason == train::StopReason::requested ? 128 + sig : 0;
  if (tty) std::cerr << '\n';
  print_run_end(opt, trainer, reason, sig);
  return reason == train::StopReason::requested ? 128 + sig : 0;
}

// Where the run reads and writes, and what it starts from.
void input_flags(CLI::App* cmd, train::PretrainOptions& o, std::string& carry) {
  cmd->add_option("--data", o.sequences, "Sequences file (packbert prepare)")->required();
  cmd->add_option("--packs", o.packs,
                  "Packs file for it (omit: padded baseline, one sequence per row)");
  cmd->add_option("--out", o.out_dir, "Run directory: checkpoint.safetensors, metrics.jsonl")
      ->required();
  cmd->add_flag("--overwrite", o.overwrite,
                "Start over in an --out that holds an earlier run (its checkpoint and metrics "
                "are replaced)");
  vocab_option(cmd, o.vocab, "vocab.txt the data was made with");
  cmd->add_option("--init", o.init, "Start from a Hugging Face-layout directory or a checkpoint");
  cmd->add_option("--init-optimizer", carry,
                  "With --init a training checkpoint (phase 2 of two-phase pre-training): reset "
                  "the optimizer moments, or carry them (and its step count) over")
      ->check(CLI::IsMember({"reset", "carry"}))
      ->capture_default_str();
  shape_flags(cmd, o.shape, "Model shape of a new model: tiny|mini|small|medium|base|large");
}

// Checkpoints, evaluation and the ways a run stops.
void checkpoint_flags(CLI::App* cmd, train::PretrainOptions& o) {
  number(cmd, "--checkpoint-every", o.checkpoint_every,
         "Steps between checkpoints (0 = at the end)", 0, kMaxCount);
  number(cmd, "--keep-checkpoints", o.keep_checkpoints,
         "Checkpoints kept in --out: checkpoint.safetensors (the latest) and the ones before it "
         "as checkpoint-STEP.safetensors; best.safetensors (lowest held-out loss) is kept too; "
         "trainer_state.json beside them is Hugging Face's for the latest",
         1, 1000);
  number(cmd, "--divergence-factor", o.divergence_factor,
         "Stop with exit 2, writing nothing, when the held-out MLM loss exceeds this multiple of "
         "its best or the training loss's moving average this multiple of its lowest (0 = off)",
         0, 1e9);
  number(cmd, "--eval-every", o.eval_every, "Steps between held-out evaluations (0 = at the end)",
         0, kMaxCount);
  number(cmd, "--eval-fraction", o.eval_fraction,
         "Only for a sequences file without its own held-out split (prepare --eval-fraction, "
         "which splits by document): the share of its last sequences held out (default 0.02)",
         0, 0.49);
  number(cmd, "--max-minutes", o.max_minutes,
         "Stop (with a checkpoint) after this much training time (0 = no limit)", 0, 1e9);
  number(cmd, "--target-accuracy", o.target_accuracy,
         "Stop (with a checkpoint) at the first evaluation (--eval-every) whose held-out MLM "
         "accuracy reaches this: time to train, as MLPerf measures it (0 = off)",
         0, 1);
}

// Pipeline stages and how batches are laid out.
void layout_flags(CLI::App* cmd, train::PretrainOptions& o) {
  number(cmd, "--pipeline-stages", o.pipeline_stages,
         "Under mpirun: split the model's layers into this many pipeline stages (the embeddings "
         "on the first, the heads on the last), the processes into stages x replicas; a step's "
         "--accumulation micro-batches run on the 1F1B schedule",
         1, 1024)
      ->capture_default_str();
  cmd->add_option("--stage-layers", o.stage_layers,
                  "Encoder layers of each pipeline stage, first to last (e.g. 5,7; default: "
                  "balanced by FLOPs, as `packbert plan --pipeline-stages` proposes)")
      ->delimiter(',');
  cmd->add_flag("--compute-padding", o.compute_padding,
                "Padded baseline only: compute the padding slots as frameworks do (same results, "
                "framework cost)");
  cmd->add_flag("--one-per-row", o.one_per_row,
                "With --packs: put each pack's sequences in rows of their own (padded): the same "
                "sequences per step, in the same order, as the packed run; --batch-rows still "
                "counts packs");
}

}  // namespace

void register_pretrain(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<train::PretrainOptions>();
  auto resume = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "pretrain",
      "Pre-train BERT (MLM + NSP) on a sequences file, packed or padded. Exit status: 0 when "
      "--steps (or --max-minutes, or --target-accuracy) is reached, 2 for bad input or a run that "
      "cannot go on (the "
      "last good checkpoint is kept as it was), 130/143 when stopped by SIGINT/SIGTERM (a "
      "checkpoint of the step reached is written first; continue with --resume).");
  auto carry = std::make_shared<std::string>("reset");
  input_flags(cmd, *o, *carry);
  cmd->add_option("--packing-adjust", o->packing_adjust,
                  "none | ga (divide accumulation by the packing factor) | beta (LAMB betas ^ "
                  "packing factor)")
      ->capture_default_str();
  number(cmd, "--steps", o->max_steps, "Optimizer steps", 1, kMaxCount);
  // LAMB scales each tensor's step by its trust ratio, so each tensor moves by lr × its own norm
  // per step, and the rate that suits AdamW is too small for it. Measured (docs/BENCHMARKS.md,
  // "LAMB learning rate"): bert-mini on GCIDE, ~24 sequences a step, held-out MLM loss after
  // 200 steps: LAMB 1e-3 8.44, 5e-3 6.57, 1e-2 6.73; AdamW 1e-3 6.68.
  const LoopFlags loop = loop_flags(
      cmd, o->loop, "lamb", 5e-3, 1e-3,
      "Peak learning rate (default 5e-3 with LAMB, 1e-3 with AdamW: LAMB moves each weight "
      "tensor by about lr x its own norm per step). Measured on bert-mini, ~24 sequences a step: "
      "LAMB 5e-3 beat 1e-3 and 1e-2; for larger batches LAMB's authors scale lr with the square "
      "root of the batch");
  checkpoint_flags(cmd, *o);
  cmd->add_flag("--dynamic-masking", o->dynamic_masking, "New masks every epoch (RoBERTa style)");
  sparse_flags(cmd, o->sparse, true);
  layout_flags(cmd, *o);
  cmd->add_flag("--resume", *resume, "Continue from --out/checkpoint.safetensors, bit-exactly");
  auto logging = std::make_shared<int>(10);
  number(cmd, "--logging-steps", *logging,
         "Without a terminal, a progress line every this many steps (on one, a line rewritten "
         "in place)",
         1, 1e9);
  report_to_flag(cmd, o->report);
  cmd->callback([cmd, o, resume, loop, carry, logging, &exit_code] {
    train::PretrainOptions opt = *o;
    opt.carry_optimizer = *carry == "carry";
    opt.preset_given = cmd->get_option("--preset")->count() > 0;
    loop.finish(opt.loop);
    opt.logging_steps = *logging;
    exit_code = run_pretrain(opt, *resume, *logging);
  });
}

}  // namespace packbert::cli
