// The pre-training loop: MLM + NSP over a packs file (or the padded baseline), with gradient
// accumulation, clipping, warmup + decay, AdamW or LAMB, packing-aware hyperparameters,
// periodic held-out evaluation, JSONL metrics, atomic checkpoints that resume bit-exactly, and a
// clean stop on request (SIGINT/SIGTERM in the CLI).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "data/sequences.h"
#include "model/bert.h"
#include "train/loader.h"
#include "train/optimizer.h"

namespace packbert::train {

struct PretrainOptions {
  std::string sequences;        // .seqs file
  std::string packs;            // .packs file; empty = padded baseline (one sequence per row)
  std::string out_dir;          // checkpoint.safetensors and metrics.jsonl go here
  std::string vocab;            // needed for dynamic masking and the vocab check
  std::string init;             // optional: HF-layout dir or checkpoint to start from
  std::string preset = "mini";  // model shape when not initialised from a checkpoint
  int rows_per_batch = 16;      // packs (or padded rows) per micro-batch
  int accumulation = 1;         // micro-batches per optimizer step
  std::string packing_adjust = "none";  // none | ga | beta (Graphcore)
  int64_t max_steps = 100;
  double lr = 1e-3;
  int64_t warmup_steps = 10;
  double decay_power = 1.0;
  OptimizerConfig optimizer;
  double clip_norm = 1.0;
  uint64_t seed = 1;
  int64_t checkpoint_every = 0;  // 0 = only at the end (and on stop)
  int64_t eval_every = 0;        // 0 = only at the end
  double eval_fraction = 0.02;   // sequences held out for evaluation (the file's last ones)
  int nan_abort = 5;             // abort after this many non-finite steps in a row
  bool dynamic_masking = false;
  double max_minutes = 0;        // stop (with a checkpoint) after this long; 0 = no limit
  bool compute_padding = false;  // padded baseline that pays for padding like frameworks do
};

struct StepMetrics {
  int64_t step = 0;
  double loss = 0, mlm_loss = 0, nsp_loss = 0, mlm_acc = 0, nsp_acc = 0, lr = 0, grad_norm = 0;
  int64_t real_tokens = 0, sequences = 0;  // real tokens exclude computed padding
  double seconds = 0, elapsed = 0;         // this step; since the run began (excluding evaluation)
  bool skipped = false;                    // non-finite loss: no update
};

struct EvalMetrics {
  int64_t step = 0;
  double mlm_loss = 0, mlm_acc = 0, nsp_loss = 0, nsp_acc = 0;
  int64_t mlm_count = 0, sequences = 0;
  double elapsed = 0;
};

class Trainer {
 public:
  // resume: continue from out_dir/checkpoint.safetensors (must exist and match the options).
  Trainer(const PretrainOptions& options, bool resume);
  ~Trainer();

  // Runs until max_steps, a stop request, or the time limit. Calls the callbacks per step and
  // per evaluation (both also go to out_dir/metrics.jsonl). Returns the last step reached.
  int64_t run(const std::atomic<bool>& stop, const std::function<void(const StepMetrics&)>& on_step,
              const std::function<void(const EvalMetrics&)>& on_eval);
  EvalMetrics evaluate();
  void save_checkpoint() const;
  int64_t step() const { return step_; }
  model::BertModel<float>& model() { return *model_; }
  const model::BertConfig& config() const { return model_->config(); }
  std::string checkpoint_path() const;

 private:
  PretrainOptions opt_;
  data::SequencesFile seqs_;
  uint64_t seqs_checksum_ = 0;
  std::optional<data::PacksFile> packs_;
  std::optional<data::Vocab> vocab_;
  std::unique_ptr<model::BertModel<float>> model_;
  std::unique_ptr<Optimizer> optim_;
  std::unique_ptr<BatchLoader> loader_;
  LoaderOptions train_rows_, eval_rows_;
  int accumulation_ = 1;
  int64_t step_ = 0;
  Cursor cursor_;
  double elapsed_before_ = 0;  // training seconds of earlier runs (resumed)
};

// Loads model weights from an HF-layout directory (config.json + model.safetensors) or a
// packbert checkpoint file; throws InputError naming what is missing or mismatched.
std::unique_ptr<model::BertModel<float>> load_model(const std::string& path, model::Heads heads);

// Writes config.json + model.safetensors (+ vocab.txt when given) in the Hugging Face layout.
void export_model(const model::BertModel<float>& m, const std::string& dir,
                  const std::string& vocab_path);

}  // namespace packbert::train
