// Numeric flags with their valid range: stated in --help and checked in this one place, before
// any work starts. A value outside the range, NaN, infinity, a fraction for an integer flag or a
// negative number for an unsigned one is a parse error naming the flag (exit 2).
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "data/classify_tsv.h"
#include "data/squad.h"
#include "model/config.h"
#include "model/workspace.h"
#include "train/loop.h"
#include "train/metrics_log.h"
#include "train/sparsity.h"

namespace packbert::cli {

// The validator behind number(): [lo, hi] for T. Shown in --help as "in [lo, hi]".
CLI::Validator in_range(double lo, double hi, bool integral);

// Adds `--name` bound to `value` with its range (and the default shown in --help).
template <typename T>
CLI::Option* number(CLI::App* cmd, const std::string& name, T& value, const std::string& help,
                    double lo, double hi) {
  static_assert(std::is_arithmetic_v<T>);
  return cmd->add_option(name, value, help)
      ->check(in_range(lo, hi, std::is_integral_v<T>))
      ->capture_default_str();
}

// The same for an optional value (no default shown).
template <typename T>
CLI::Option* number(CLI::App* cmd, const std::string& name, std::optional<T>& value,
                    const std::string& help, double lo, double hi) {
  static_assert(std::is_arithmetic_v<T>);
  return cmd->add_option(name, value, help)->check(in_range(lo, hi, std::is_integral_v<T>));
}

// --recompute POLICY (into `policy`) and, when `limit` is given, --memory-limit SIZE: both
// checked at parse time (a bad value is a one-line error, exit 2).
void recompute_flags(CLI::App* cmd, model::Recompute& policy, std::optional<double>* limit);

// --precision fp32|bf16|fp16 (into `precision`), checked at parse time: with check_cpu, bf16 on a
// CPU without AVX512-BF16 or AMX-BF16 is a one-line error naming the missing feature, exit 2 (plan,
// which runs nothing, does not check).
void precision_flag(CLI::App* cmd, model::Precision& precision, bool check_cpu = true);
// --backend cpu|ref: where every op of a step runs (kernels/ops.h).
void backend_flag(CLI::App* cmd, kernels::BackendKind& backend);
// --master-weights fp32|bf16|bf16-rn (into `masters`).
void master_weights_flag(CLI::App* cmd, train::Masters& masters);

// --preset, --config, --layers, --hidden, --heads, --intermediate: the shape of a new model
// (model::ShapeRequest, resolved by model::resolve_shape). --preset and --config exclude each
// other; `preset_help` says what the preset is for.
void shape_flags(CLI::App* cmd, model::ShapeRequest& s, const std::string& preset_help);

// --sparsity, --block and, with `training`, --prune-ratio, --sparse-updates, --regrow and
// --sparse-lr-scale: block-sparse encoder weights (train/sparsity.h). Sparse when --sparsity > 0;
// `o.sparsity` is set by the callback once parsed.
void sparse_flags(CLI::App* cmd, train::SparseOptions& o, bool training);

// --doc-stride, --max-query-length, --max-answer-length: SQuAD's windowing and answer limits
// (finetune and eval --task squad).
void squad_flags(CLI::App* cmd, data::SquadOptions& squad);

// The bundled vocabulary (bert-base-uncased) and where it was found: next to the executable
// (<bin>/../share/packbert/, as `cmake --install` lays it out), else $PACKBERT_VOCAB, else the
// source tree of a build. Never an absolute path baked into an installed binary's only choice.
struct DefaultVocab {
  std::string path;
  std::string found;  // "installed with the executable", "PACKBERT_VOCAB", "source tree", or
                      // "not found"
};
const DefaultVocab& default_vocab();

// --vocab bound to `value` (set to the default vocabulary); --help says where that was found.
CLI::Option* vocab_option(CLI::App* cmd, std::string& value, const std::string& help);

// --vocab for a command that reads a model (finetune, eval, export): `value` stays empty unless
// given, and model_vocab() then picks the model directory's own vocab.txt, else the default.
CLI::Option* model_vocab_option(CLI::App* cmd, std::string& value, const std::string& help);
// The vocabulary for `model`: `given` (--vocab) when set, warning on stderr where the model's own
// vocab.txt differs from it; else the model's vocab.txt; else the default (data::choose_vocab).
std::string model_vocab(const std::string& given, const std::string& model);
// Whether `model`'s text is lowercased for `vocab`, as its tokenizer_config.json or else the
// vocabulary says (data::decide_casing without a flag): what export and convert write into
// tokenizer_config.json.
bool model_lower_case(const std::string& model, const std::string& vocab);

// --text-columns A[,B] and --label-column L of a classification TSV.
void column_flags(CLI::App* cmd, data::TsvColumns& columns);

// --cased / --uncased (one or neither): `lower_case` is set only when one is given.
void casing_flags(CLI::App* cmd, std::optional<bool>& lower_case);

// The flag that sets an options field (train::LoopOptions and the like), for the field names
// library errors carry (OptionError); the field itself when no flag sets it.
std::string flag_of_field(const std::string& field);
// A library message with each `field` it names turned into that field's flag; other `quoted`
// text stays as it is. Every error, warning and note the library writes goes through it.
std::string with_flags(const std::string& text);
// A library's note or warning line on stderr, its fields as flags (fine-tuning's and task
// evaluation's `Say`).
void say_on_stderr(const std::string& line);

// The flags of train::LoopOptions, which pretrain and finetune share: --optimizer, --lr,
// --warmup, --decay-power, --weight-decay, --clip, --batch-rows, --accumulation, --seed,
// --nan-abort, --skip-outliers, --recompute, --memory-limit, --precision, --master-weights,
// --loss-scale, --loss-scale-init, --loss-scale-window and --zero. --lr's default follows the
// optimizer (lr_lamb, lr_adamw); finish() applies both once parsed, --loss-scale-init (which
// needs --loss-scale dynamic), and --loss-scale's default: dynamic under --precision fp16, off
// otherwise.
struct LoopFlags {
  std::shared_ptr<std::string> optimizer;
  CLI::Option* lr = nullptr;
  std::shared_ptr<double> loss_scale_init;
  CLI::Option* loss_scale_init_flag = nullptr;
  CLI::Option* loss_scale_flag = nullptr;
  double lr_lamb = 0, lr_adamw = 0;
  void finish(train::LoopOptions& o) const;
};
LoopFlags loop_flags(CLI::App* cmd, train::LoopOptions& o, const std::string& optimizer,
                     double lr_lamb, double lr_adamw, const std::string& lr_help);

// --report-to jsonl|tensorboard|none (or a list): where metrics are reported besides
// metrics.jsonl.
void report_to_flag(CLI::App* cmd, train::ReportTo& report);

constexpr double kMaxCount = 1e12;  // upper bound for counts that have no natural one
constexpr double kMaxSeed = 18446744073709551615.0;  // seeds are unsigned 64-bit

}  // namespace packbert::cli
