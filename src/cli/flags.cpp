#include "cli/flags.h"

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "data/casing.h"
#include "dist/comm.h"
#include "error.h"
#include "kernels/cpu_features.h"
#include "train/memory_plan.h"

namespace packbert::cli {

namespace {

std::string number_text(double v) {
  if (v == kMaxSeed) return "2^64-1";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  std::ostringstream s;
  s << v;
  return s.str();
}

}  // namespace

CLI::Validator in_range(double lo, double hi, bool integral) {
  const std::string range = "[" + number_text(lo) + ", " + number_text(hi) + "]";
  return CLI::Validator(
      [lo, hi, integral, range](std::string& text) -> std::string {
        const char* s = text.c_str();
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(s, &end);
        if (end == s || *end != '\0')
          return "'" + text + "' is not a number (expected one in " + range + ")";
        if (!std::isfinite(v) || errno == ERANGE)
          return "'" + text + "' is not a finite number (expected one in " + range + ")";
        if (integral && v != std::floor(v))
          return "'" + text + "' is not a whole number (expected one in " + range + ")";
        if (v < lo || v > hi) return text + " is outside the valid range " + range;
        return "";
      },
      "in " + range);
}

void squad_flags(CLI::App* cmd, data::SquadOptions& squad) {
  number(cmd, "--doc-stride", squad.doc_stride, "squad: step between context windows", 1, 65536);
  number(cmd, "--max-query-length", squad.max_query_length, "squad: question tokens kept", 1,
         65536);
  number(cmd, "--max-answer-length", squad.max_answer_length,
         "squad: longest predicted answer, tokens", 1, 65536);
  number(cmd, "--null-score-diff-threshold", squad.null_score_diff_threshold,
         "squad v2.0 (a file with unanswerable questions): answer \"\" when the null span's "
         "score beats the best span's by more than this (run_qa's flag)",
         -1e6, 1e6);
}

void recompute_flags(CLI::App* cmd, model::Recompute& policy, std::optional<double>* limit) {
  cmd->add_option_function<std::string>(
         "--recompute",
         [&policy](const std::string& text) { policy = model::parse_recompute(text); },
         "What backward rebuilds instead of keeping: none, or a comma list of gelu, ln, "
         "residual, attention and layer or every:K; or auto (the cheapest that fits "
         "--memory-limit). Gradients are bit-identical under every policy")
      ->default_str("none");
  if (!limit) return;
  cmd->add_option_function<std::string>(
      "--memory-limit",
      [limit](const std::string& text) { *limit = train::parse_bytes(text, "--memory-limit"); },
      "Memory a step may use (20G, 512M, ...); default: what the system has available. A step "
      "predicted to need more is refused before training starts");
}

void precision_flag(CLI::App* cmd, model::Precision& precision, bool check_cpu) {
  cmd->add_option_function<std::string>(
         "--precision",
         [&precision, check_cpu](const std::string& text) {
           precision = model::parse_precision(text);
           if (check_cpu && precision == model::Precision::bf16) {
             const std::string why = kernels::bf16_unavailable_reason();
             if (!why.empty()) throw InputError(why);
           }
         },
         "fp32; bf16: GEMMs with bf16 operands and fp32 accumulation, activations kept in bf16 "
         "(needs AVX512-BF16 or AMX-BF16); fp16: activations and GEMM operands in IEEE fp16, "
         "widened to fp32 for the GEMMs (GPU fp16 numbers and half the activation memory, not "
         "speed; --loss-scale dynamic by default). Master weights, optimizer moments, LayerNorm "
         "statistics, softmax, losses and gradients stay fp32")
      ->default_str("fp32");
}

void backend_flag(CLI::App* cmd, kernels::BackendKind& backend) {
  cmd->add_option_function<std::string>(
         "--backend",
         [&backend](const std::string& text) {
           try {
             backend = kernels::parse_backend(text);
           } catch (const std::invalid_argument& e) {
             throw InputError(std::string("--backend: ") + e.what());
           }
         },
         "cpu: the engine's kernels; ref: the reference backend, every op as plain loops in "
         "double (kernels/ref/): the specification the cpu backend is tested against, for "
         "checking a result on a small model (orders of magnitude slower)")
      ->default_str("cpu");
}

void column_flags(CLI::App* cmd, data::TsvColumns& columns) {
  cmd->add_option("--text-columns", columns.text,
                  "classify: the text column, or two for a pair (A,B); default: recognised from "
                  "the header (sentence; sentence1,sentence2; question,sentence; question1,"
                  "question2; ...: the GLUE tasks' layouts)")
      ->delimiter(',')
      ->expected(1, 2);
  cmd->add_option("--label-column", columns.label,
                  "classify: the label column (default: label, gold_label, Quality, is_duplicate "
                  "or score); with the two flags other columns are ignored");
  cmd->add_option(
         "--task-name", columns.task_name,
         "classify: the GLUE task (run_glue's --task_name), whose metric leads the scores: "
         "cola (MCC), mrpc and qqp (F1), stsb (Pearson; a regression), sst2, mnli, qnli, "
         "rte, wnli (accuracy). Default: what the header shows (MRPC's, QQP's, STS-B's, "
         "MNLI's and QNLI's layouts), else accuracy")
      ->check(
          CLI::IsMember({"cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"}));
}

void casing_flags(CLI::App* cmd, std::optional<bool>& lower_case) {
  auto set = [&lower_case](bool lower) {
    if (lower_case && *lower_case != lower)
      throw CLI::ValidationError("--cased and --uncased contradict each other: give one");
    lower_case = lower;
  };
  cmd->add_flag_callback(
      "--cased", [set] { set(false); },
      "Keep case and accents (default: the model's tokenizer_config.json do_lower_case, else "
      "cased when the vocabulary has entries with capitals; a tokenizer.json decides its own)");
  cmd->add_flag_callback(
      "--uncased", [set] { set(true); }, "Lowercase and strip accents");
}

void report_to_flag(CLI::App* cmd, train::ReportTo& report) {
  cmd->add_option_function<std::string>(
         "--report-to", [&report](const std::string& v) { report = train::ReportTo::parse(v); },
         "Where metrics go besides <out>/metrics.jsonl (always written: resume, `packbert plot` "
         "and trainer_state.json read it): tensorboard adds TensorBoard event files under "
         "<out>/runs/ (`tensorboard --logdir <out>/runs`); jsonl (the default) and none add "
         "nothing; a list such as jsonl,tensorboard is taken (Hugging Face's report_to)")
      ->option_text("WHERE")
      ->check([](const std::string& v) {
        try {
          train::ReportTo::parse(v);
          return std::string();
        } catch (const InputError& e) {
          return with_flags(e.what());
        }
      });
}

namespace {

// Option fields (what library code names in its errors) and the flags that set them.
constexpr std::pair<const char*, const char*> kFlagOfField[] = {
    {"rows_per_batch", "--batch-rows"},
    {"accumulation", "--accumulation"},
    {"lr", "--lr"},
    {"warmup_steps", "--warmup"},
    {"clip_norm", "--clip"},
    {"weight_decay", "--weight-decay"},
    {"vocab_checksum", "--vocab"},
    {"train_checksum", "--train"},
    {"dev_checksum", "--dev"},
    {"outlier_z", "--skip-outliers"},
    {"nan_abort", "--nan-abort"},
    {"loss_scale_init", "--loss-scale-init"},
    {"loss_scale_window", "--loss-scale-window"},
    {"zero", "--zero"},
    {"max_steps", "--steps"},
    {"epochs", "--epochs"},
    {"eval_steps", "--eval-steps"},
    {"warmup_ratio", "--warmup-ratio"},
    {"early_stopping_patience", "--early-stopping-patience"},
    {"early_stopping_threshold", "--early-stopping-threshold"},
    {"report_to", "--report-to"},
    {"out_dir", "--out"},
    {"decay_power", "--decay-power"},
    {"packing_adjust", "--packing-adjust"},
    {"eval_fraction", "--eval-fraction"},
    {"target_accuracy", "--target-accuracy"},
    {"max_seq_len", "--max-seq-len"},
    {"one_per_row", "--one-per-row"},
    {"compute_padding", "--compute-padding"},
    {"packs", "--packs"},
    {"masters", "--master-weights"},
    {"precision", "--precision"},
    {"sparsity", "--sparsity"},
    {"prune_ratio", "--prune-ratio"},
    {"regrow", "--regrow"},
    {"sparse_init", "--sparse-init"},
    {"shape", "--config/--layers/--hidden/--heads/--intermediate"},
    {"init", "--init"},
    {"overwrite", "--overwrite"},
    {"keep_checkpoints", "--keep-checkpoints"},
    {"checkpoint_every", "--checkpoint-every"},
    {"divergence_factor", "--divergence-factor"},
    {"sequences", "--data"},
    {"vocab", "--vocab"},
    {"resume", "--resume"},
    {"algo", "--algo"},
    {"block", "--block"},
    {"cased", "--cased"},
    {"uncased", "--uncased"},
    {"config", "--config"},
    {"preset", "--preset"},
    {"data", "--data"},
    {"train", "--train"},
    {"dev", "--dev"},
    {"model", "--model"},
    {"predictions", "--predictions"},
    {"doc_stride", "--doc-stride"},
    {"init_optimizer", "--init-optimizer"},
    {"label_column", "--label-column"},
    {"text_columns", "--text-columns"},
    {"loss_scale", "--loss-scale"},
    {"loss_scaling", "--loss-scale"},
    {"max_answer_length", "--max-answer-length"},
    {"max_query_length", "--max-query-length"},
    {"max_per_pack", "--max-per-pack"},
    {"memory_limit", "--memory-limit"},
    {"new_head", "--new-head"},
    {"optimizer", "--optimizer"},
    {"recompute", "--recompute"},
    {"seed", "--seed"},
    {"save_best", "--save-best"},
    {"task_name", "--task-name"},
    {"regression", "--regression"},
    {"classification", "--classification"},
    {"pipeline_stages", "--pipeline-stages"},
    {"stage_layers", "--stage-layers"}};

}  // namespace

std::string flag_of_field(const std::string& field) {
  for (auto [f, flag] : kFlagOfField)
    if (field == f) return flag;
  return field;
}

// An error's text with each `field` it names turned into that field's flag (library code names
// option fields, never flags); other `quoted` text stays as it is.
std::string with_flags(const std::string& text) {
  std::string out;
  size_t at = 0;
  for (size_t open; (open = text.find('`', at)) != std::string::npos;) {
    const size_t close = text.find('`', open + 1);
    if (close == std::string::npos) break;
    const std::string name = text.substr(open + 1, close - open - 1), flag = flag_of_field(name);
    out += text.substr(at, open - at) + (flag == name ? "`" + name + "`" : flag);
    at = close + 1;
  }
  return out + text.substr(at);
}

void say_on_stderr(const std::string& line) {
  std::cerr << with_flags(line) << '\n';
}

void master_weights_flag(CLI::App* cmd, train::Masters& masters) {
  cmd->add_option_function<std::string>(
         "--master-weights",
         [&masters](const std::string& text) {
           masters = train::parse_masters(text, "--master-weights");
         },
         "fp32 | bf16 | bf16-rn: where the weights and Adam/LAMB moments live. bf16 (with "
         "--precision bf16) keeps them in bf16 only, 6 bytes per parameter instead of 14, the "
         "optimizer writing them with stochastic rounding; bf16-rn rounds to nearest instead (for "
         "comparison: small updates then vanish)")
      ->default_str("fp32");
}

void shape_flags(CLI::App* cmd, model::ShapeRequest& s, const std::string& preset_help) {
  CLI::Option* family =
      cmd->add_option("--family", s.family,
                      "The preset's model family: bert (post-LN, learned positions) or modernbert "
                      "(pre-LN, rotary, GeGLU, alternating global and 128-token local attention, "
                      "no biases; masked-LM only)")
          ->check(CLI::IsMember({"bert", "modernbert"}))
          ->capture_default_str();
  CLI::Option* preset = cmd->add_option("--preset", s.preset, preset_help);
  if (!s.preset.empty()) preset->capture_default_str();
  cmd->add_option("--config", s.config,
                  "A Hugging Face config.json (BertConfig: sizes, dropout, eps) instead of a "
                  "preset; the vocabulary must be the data's")
      ->excludes(preset)
      ->excludes(family);
  // 0 keeps the preset's or file's size, as each help says, so no "=0" is shown.
  number(cmd, "--layers", s.layers, "Encoder layers (0 = the preset's or config's)", 0, 1000)
      ->default_str("");
  number(cmd, "--hidden", s.hidden,
         "Hidden size (0 = as given; a preset's heads and intermediate size then follow it: "
         "head size 64, intermediate 4 x hidden)",
         0, 65536)
      ->default_str("");
  number(cmd, "--heads", s.heads, "Attention heads (0 = as given)", 0, 1024)->default_str("");
  number(cmd, "--intermediate", s.intermediate, "FFN intermediate size (0 = as given)", 0, 1 << 20)
      ->default_str("");
}

void sparse_flags(CLI::App* cmd, train::SparseOptions& o, bool training) {
  // The block size waits for --sparsity: the pattern is on only when the sparsity is above 0.
  auto block = std::make_shared<int>(16);
  CLI::Option* sparsity =
      cmd->add_option_function<double>(
             "--sparsity",
             [&o, block](double s) {
               o.sparsity.sparsity = s;
               o.sparsity.block = s > 0 ? *block : 0;
             },
             "Fraction of each encoder linear weight's blocks that are zero (block-sparse query, "
             "key, value, attention output and FFN weights; 0 = dense)")
          ->check(in_range(0, 0.999, false))
          ->default_str("0");
  cmd->add_option_function<int>(
         "--block",
         [&o, block](int b) {
           *block = b;
           if (o.sparsity.on()) o.sparsity.block = b;
         },
         "Block size of the sparse weights: 1, 4, 8 or 16 (with --sparsity)")
      ->check(CLI::IsMember({1, 4, 8, 16}))
      ->default_str("16")
      ->trigger_on_parse()
      ->needs(sparsity);
  if (!training) return;
  number(cmd, "--prune-ratio", o.prune_ratio,
         "Fraction of each weight's blocks pruned (smallest L1) and regrown at the first pattern "
         "update, cosine-decayed towards 0 at the last step",
         0, 1);
  number(cmd, "--sparse-updates", o.updates,
         "Pattern updates over the run, one every steps/N (0 = Graphcore's: 160 for --block 1, "
         "80 otherwise)",
         0, 1e6);
  cmd->add_option_function<std::string>(
         "--regrow",
         [&o](const std::string& text) { o.regrow = train::parse_regrow(text, "--regrow"); },
         "random | gradient: where pruned blocks regrow, among blocks not active before the "
         "update (gradient: largest L1 norm of the dense weight gradient, one process only)")
      ->default_str("random");
  cmd->add_option_function<std::string>(
         "--sparse-lr-scale",
         [&o](const std::string& text) {
           if (text == "auto") {
             o.lr_scale = 0;
             return;
           }
           char* end = nullptr;
           const double x = std::strtod(text.c_str(), &end);
           if (end == text.c_str() || *end || !(x > 0 && x < 1e3))
             throw CLI::ValidationError("--sparse-lr-scale",
                                        text + ": expected auto or a number in (0, 1000)");
           o.lr_scale = x;
         },
         "Learning-rate factor of sparse training: auto = exp(1.969 s^2 + 0.2905 s) (Graphcore; "
         "6.4 at s = 0.9), or a number")
      ->type_name("X")
      ->default_str("auto");
  o.lr_scale = 0;  // auto unless given
  cmd->add_option_function<std::string>(
         "--sparse-init",
         [&o](const std::string& text) {
           o.init = model::parse_sparse_init(text, "--sparse-init");
         },
         "dense | fan-in: the sparse weights start N(0, initializer_range) as the dense model's "
         "(Graphcore's), or that times 1/sqrt(kept fraction, about 1 - s) so each output starts "
         "with the dense layer's variance")
      ->default_str("dense");
}

LoopFlags loop_flags(CLI::App* cmd, train::LoopOptions& o, const std::string& optimizer,
                     double lr_lamb, double lr_adamw, const std::string& lr_help) {
  LoopFlags f;
  f.optimizer = std::make_shared<std::string>(optimizer);
  f.lr_lamb = lr_lamb, f.lr_adamw = lr_adamw;
  number(cmd, "--batch-rows", o.rows_per_batch,
         "Packs (or padded rows) per micro-batch, per process: a step of N processes uses N x "
         "this many",
         1, 1e6);
  number(cmd, "--accumulation", o.accumulation, "Micro-batches per optimizer step", 1, 1e6);
  cmd->add_option("--optimizer", *f.optimizer, "lamb | adamw")
      ->check(CLI::IsMember({"lamb", "adamw"}))
      ->capture_default_str();
  f.lr = cmd->add_option("--lr", o.lr, lr_help)->check(in_range(1e-12, 10, false));
  number(cmd, "--warmup", o.warmup_steps, "Linear warmup steps", 0, kMaxCount);
  number(cmd, "--decay-power", o.decay_power,
         "1 = linear decay to 0 at the last step, 0 = constant", 0, 100);
  number(cmd, "--weight-decay", o.optimizer.weight_decay,
         "Decoupled weight decay (not on biases and LayerNorm)", 0, 10);
  number(cmd, "--clip", o.clip_norm, "Global gradient-norm clip (0 = off)", 0, 1e9);
  number(cmd, "--seed", o.seed, "Seed for initialisation, order, dropout and masks", 0, kMaxSeed);
  number(cmd, "--nan-abort", o.nan_abort,
         "Give up (nothing written) after this many non-finite steps in a row", 1, 1e6);
  number(cmd, "--skip-outliers", o.outlier_z,
         "Skip an update whose gradient norm is more than Z standard deviations above the mean "
         "of the last 64 accepted ones (0 = off; 6 is a cautious choice)",
         0, 1000);
  recompute_flags(cmd, o.recompute, &o.memory_limit);
  precision_flag(cmd, o.precision);
  backend_flag(cmd, o.backend);
  master_weights_flag(cmd, o.optimizer.masters);
  f.loss_scale_flag =
      cmd->add_option_function<std::string>(
             "--loss-scale",
             [&o](const std::string& text) {
               const train::LossScaling parsed = train::parse_loss_scaling(text, "--loss-scale");
               o.loss_scaling.mode = parsed.mode, o.loss_scaling.initial = parsed.initial;
             },
             "off | dynamic | a fixed scale: backward starts from the loss times the scale and the "
             "optimizer divides it out. dynamic is PyTorch's GradScaler: the scale halves and the "
             "step is skipped when a gradient overflows, and doubles after --loss-scale-window "
             "clean steps (default: dynamic under --precision fp16, off otherwise)")
          ->default_str("off");
  f.loss_scale_init = std::make_shared<double>(65536);
  f.loss_scale_init_flag =
      number(cmd, "--loss-scale-init", *f.loss_scale_init,
             "The first scale of --loss-scale dynamic", 1e-30, train::kMaxLossScale);
  number(cmd, "--loss-scale-window", o.loss_scaling.window,
         "Clean steps in a row after which --loss-scale dynamic doubles the scale", 1, kMaxCount);
  number(cmd, "--zero", o.zero,
         "Under mpirun: 1 shards the optimizer state (moments) across the processes, each "
         "holding 1/N of it (ZeRO stage 1); 0 = every process holds all of it",
         0, 1);
  return f;
}

void LoopFlags::finish(train::LoopOptions& o) const {
  o.optimizer.kind = train::parse_optimizer(*optimizer, "--optimizer");
  if (lr->count() == 0) o.lr = o.optimizer.kind == train::OptimizerKind::lamb ? lr_lamb : lr_adamw;
  if (loss_scale_flag->count() == 0 && o.precision == model::Precision::fp16)
    o.loss_scaling.mode = train::LossScaling::Mode::dynamic;  // (initial: 2^16, as GradScaler)
  if (loss_scale_init_flag->count() > 0) {
    if (o.loss_scaling.mode != train::LossScaling::Mode::dynamic)
      throw InputError(
          "--loss-scale-init needs --loss-scale dynamic (a fixed scale is the value "
          "given to --loss-scale)");
    o.loss_scaling.initial = *loss_scale_init;
  }
}

const DefaultVocab& default_vocab() {
  static const DefaultVocab v = [] {
    namespace fs = std::filesystem;
    const std::string name = "bert-base-uncased-vocab.txt";
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
      const fs::path installed = exe.parent_path().parent_path() / "share" / "packbert" / name;
      if (fs::exists(installed))
        return DefaultVocab{installed.string(), "installed with the executable"};
    }
    if (const char* env = std::getenv("PACKBERT_VOCAB"); env && *env)
      return DefaultVocab{env, "PACKBERT_VOCAB"};
    if (fs::exists(PACKBERT_SOURCE_VOCAB))
      return DefaultVocab{PACKBERT_SOURCE_VOCAB, "source tree"};
    return DefaultVocab{(exe.parent_path().parent_path() / "share" / "packbert" / name).string(),
                        "not found"};
  }();
  return v;
}

CLI::Option* vocab_option(CLI::App* cmd, std::string& value, const std::string& help) {
  const DefaultVocab& d = default_vocab();
  value = d.path;
  return cmd->add_option("--vocab", value,
                         help + " (default: bert-base-uncased, " + d.found + ": " + d.path + ")");
}

CLI::Option* model_vocab_option(CLI::App* cmd, std::string& value, const std::string& help) {
  const DefaultVocab& d = default_vocab();
  value.clear();
  return cmd->add_option(
      "--vocab", value,
      help +
          " (default: the model directory's vocab.txt, else its tokenizer.json, else "
          "bert-base-uncased, " +
          d.found + ": " + d.path + ")");
}

std::string model_vocab(const std::string& given, const std::string& model) {
  const data::VocabChoice c = data::choose_vocab(given, model, default_vocab().path);
  if (!c.warning.empty() && dist::Comm::world().root()) say_on_stderr("warning: " + c.warning);
  return c.path;
}

bool model_lower_case(const std::string& model, const std::string& vocab) {
  return data::decide_casing(std::nullopt, model, data::Vocab::load(vocab), vocab).lower_case;
}

}  // namespace packbert::cli
