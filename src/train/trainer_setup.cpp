// The Trainer's set-up, in the order it happens: options, outputs, inputs, the checkpoint's run
// (resume), the model and its pipeline stage, the step plan, the held-out split, and the carried
// or restored state.
#include <omp.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dist/comm.h"
#include "error.h"
#include "io/atomic_file.h"
#include "io/fault.h"
#include "io/memory.h"
#include "io/paths.h"
#include "io/safetensors.h"
#include "model/hf_import.h"
#include "model/weights.h"
#include "stopwatch.h"
#include "text.h"
#include "train/memory_plan.h"
#include "train/model_files.h"
#include "train/trainer.h"

namespace packbert::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

Trainer::Trainer(const PretrainOptions& options, bool resume)
    : opt_(options), comm_(dist::Comm::world()) {
  // Every rank sets up from the same files; one that cannot makes them all stop with its reason.
  dist::fail_together(comm_, [&] { setup(resume); });
  if (!comm_.distributed()) return;
  // Every rank must train the same model on the same data with the same options as rank 0.
  const model::BertConfig& c = model_->config();
  const json mine = {{"sequences file (checksum)", seqs_checksum_},
                     {"packs file", packs_ ? packs_->packs() : 0},
                     {"vocabulary", vocab_ ? vocab_->size() : 0},
                     {"model config", model::config_to_json(c).dump()},
                     {"step", step_},
                     {"options", json{{"rows_per_batch", opt_.loop.rows_per_batch},
                                      {"accumulation", opt_.loop.accumulation},
                                      {"seed", opt_.loop.seed},
                                      {"lr", opt_.loop.lr},
                                      {"optimizer", optimizer_name(opt_.loop.optimizer.kind)},
                                      {"precision", model::precision_name(opt_.loop.precision)},
                                      {"backend", kernels::backend(opt_.loop.backend).name},
                                      {"master_weights", masters_name(opt_.loop.optimizer.masters)},
                                      {"loss_scaling", loss_scaling_name(opt_.loop.loss_scaling)},
                                      {"loss_scale_init", opt_.loop.loss_scaling.initial},
                                      {"loss_scale_window", opt_.loop.loss_scaling.window},
                                      {"zero", opt_.loop.zero},
                                      {"pipeline_stages", opt_.pipeline_stages},
                                      {"stage_layers", opt_.stage_layers},
                                      {"sparsity", sparsity_text(opt_.sparse.sparsity)},
                                      {"regrow", regrow_name(opt_.sparse.regrow)},
                                      {"max_steps", opt_.max_steps}}
                                     .dump()}};
  const std::vector<std::string> all = comm_.allgather(mine.dump());
  const json first = json::parse(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    const json other = json::parse(all[r]);
    for (auto it = first.begin(); it != first.end(); ++it) {
      if (other.at(it.key()) == it.value()) continue;
      // The options and the model config differ field by field: name the fields.
      std::string what = " (" + other.at(it.key()).dump() + " against " + it.value().dump() + ")";
      const json a = it.value().is_string()
                         ? json::parse(it.value().get<std::string>(), nullptr, false)
                         : json();
      const json b = other.at(it.key()).is_string()
                         ? json::parse(other.at(it.key()).get<std::string>(), nullptr, false)
                         : json();
      if (a.is_object() && b.is_object()) {
        what.clear();
        for (auto f = a.begin(); f != a.end(); ++f)
          if (b.value(f.key(), json()) != f.value())
            what += (what.empty() ? ": `" : ", `") + f.key() + "` " +
                    b.value(f.key(), json()).dump() + " against " + f.value().dump();
      }
      throw SharedError("rank " + std::to_string(r) + " and rank 0 were given different " +
                        it.key() + what + "; every process needs the same files and flags");
    }
  }
}

model::Stage Trainer::stage_of(const model::BertConfig& c) {
  if (!grid_->pipelined() && opt_.stage_layers.empty()) return {};
  std::vector<model::Stage> stages;
  if (!opt_.stage_layers.empty()) {
    stages = stages_of_layers(opt_.stage_layers, c.num_hidden_layers, "`stage_layers`");
  } else {  // balanced by the FLOPs of a micro-batch of full rows
    const int64_t rows = opt_.loop.rows_per_batch,
                  tokens = rows * (packs_ ? packs_->max_seq_len : seqs_.max_seq_len);
    PlanRequest plan;
    plan.config = c;
    plan.shape = uniform_shape(tokens, rows, 1, c.local_window());
    stages = balance_stages(plan, grid_->stages());
  }
  stages_ = stages;
  return stages[static_cast<size_t>(grid_->stage())];
}

std::string Trainer::stage_layers_text() const {
  if (stages_.empty()) return std::to_string(model_->config().num_hidden_layers);
  std::string s;
  for (const model::Stage& st : stages_) {
    if (!s.empty()) s += ',';
    s += std::to_string(st.end - st.first);
  }
  return s;
}

model::ParamLayout Trainer::whole_layout() const {
  return model::ParamLayout(model_->config(), model_->layout().heads(),
                            model_->layout().sparsity());
}

void Trainer::setup(bool resume) {
  check_options(resume);
  grid_ = std::make_unique<dist::Grid>(comm_, opt_.pipeline_stages);
  // A new model's shape is checked before the data is read or --out is made, so a bad
  // --config or size fails at once, even on a large corpus.
  std::optional<model::BertConfig> new_shape;
  if (!resume && opt_.init.empty()) new_shape = model::resolve_shape(opt_.shape);
  check_outputs(resume);
  new_log_ = !resume;  // a new run starts a new metrics.jsonl when it starts training
  step_rows_ = static_cast<int64_t>(grid_->replicas()) * opt_.loop.rows_per_batch;
  read_inputs();

  std::optional<TrainingState> state;
  std::unique_ptr<io::SafetensorsFile> ckpt;
  if (resume) {
    if (!fs::exists(checkpoint_path()))
      throw InputError(checkpoint_path() + ": no checkpoint to resume from");
    ckpt = std::make_unique<io::SafetensorsFile>(io::SafetensorsFile::read(checkpoint_path()));
    state = TrainingState::read(*ckpt);
    state->check_resumable({.loop = opt_.loop,
                            .init = opt_.init,
                            .sequences = opt_.sequences,
                            .sequences_checksum = seqs_checksum_,
                            .packed = !opt_.packs.empty(),
                            .one_per_row = opt_.one_per_row,
                            .sparsity = opt_.sparse.sparsity,
                            .max_steps = opt_.max_steps,
                            .rows_per_batch = step_rows_,
                            .processes = grid_->replicas()},
                           checkpoint_path());
    check_resumed_model(*state, *ckpt);
  }
  make_model(ckpt.get(), state ? &*state : nullptr, new_shape);
  const OptimizerConfig oc = plan_steps();
  // Sparse training's learning rate: scaled as the sparsity needs (Graphcore's eta(s)).
  LoopOptions stepped = opt_.loop;
  if (opt_.sparse.sparsity.on()) stepped.lr *= opt_.sparse.lr_factor();
  stepper_ = std::make_unique<Stepper>(*model_, stepped, oc, accumulation_, recompute_, *grid_);
  split_rows();
  if (!resume && opt_.carry_optimizer) carry_optimizer(oc);
  if (resume) restore(*ckpt, *state);
  loader_ = std::make_unique<BatchLoader>(seqs_, seqs_checksum_, packs_ ? &*packs_ : nullptr,
                                          vocab_ ? &*vocab_ : nullptr, train_rows_, cursor_);
  // Every input has been checked: only now is out_dir made (a bad input leaves nothing behind).
  if (comm_.root()) {  // rank 0 alone writes into out_dir
    check_disk_space();
    io::make_output_dir(opt_.out_dir, "`out_dir`");
    io::remove_stale_temporaries(opt_.out_dir,
                                 {"checkpoint.safetensors", "metrics.jsonl", "best.safetensors"});
  }
  earlier_run_cleared_ = resume;
}

// The options on their own and against each other (OptionError naming the field).
void Trainer::check_options(bool resume) const {
  const LoopOptions& lo = opt_.loop;
  check_loop_options(lo);
  if (opt_.max_steps < 1) throw OptionError("max_steps", "must be at least 1");
  if (opt_.eval_fraction && !(*opt_.eval_fraction >= 0 && *opt_.eval_fraction < 0.5))
    throw OptionError("eval_fraction", "must be in [0, 0.5)");
  if (!(opt_.target_accuracy >= 0 && opt_.target_accuracy <= 1))
    throw OptionError("target_accuracy", "must be in [0, 1] (0 = off)");
  if (opt_.packing_adjust != "none" && opt_.packing_adjust != "ga" && opt_.packing_adjust != "beta")
    throw OptionError("packing_adjust", "expected none|ga|beta, got '" + opt_.packing_adjust + "'");
  if (opt_.one_per_row && opt_.packs.empty())
    throw OptionError("one_per_row", "lays out the packs of `packs`: give `packs`");
  if (opt_.compute_padding && !opt_.packs.empty() && !opt_.one_per_row)
    throw OptionError("compute_padding",
                      "applies to padded rows: drop `packs` or add `one_per_row`");
  if (opt_.compute_padding && comm_.distributed())
    throw OptionError("compute_padding",
                      "is a one-process baseline (its padding is laid out after every real token "
                      "of the batch, which cannot be split across processes): run it without "
                      "mpirun");
  if (opt_.sparse.sparsity.on()) {
    if (lo.optimizer.masters != Masters::fp32)
      throw OptionError("sparsity",
                        "needs fp32 master weights (the block-sparse kernels read their "
                        "values in fp32): drop `masters`");
    if (!(opt_.sparse.prune_ratio >= 0 && opt_.sparse.prune_ratio <= 1))
      throw OptionError("prune_ratio", "must be in [0, 1]");
    if (opt_.sparse.regrow == Regrow::gradient && comm_.distributed())
      throw OptionError("regrow",
                        "gradient ranks blocks by the whole step's dense gradient, which one "
                        "process of several does not have: use random under mpirun");
    if (opt_.sparse.init == model::SparseInit::fan_in && !opt_.init.empty())
      throw OptionError("sparse_init",
                        "fan-in sets how new sparse weights start, and `init` takes them from "
                        "its model: drop one of them");
  }
  if (opt_.pipeline_stages < 1) throw OptionError("pipeline_stages", "must be at least 1");
  if (opt_.pipeline_stages > 1 || !opt_.stage_layers.empty()) {
    if (opt_.sparse.sparsity.on())
      throw OptionError("pipeline_stages",
                        "block-sparse stages are not built: drop `sparsity` or run one stage");
    if (!opt_.stage_layers.empty() &&
        static_cast<int>(opt_.stage_layers.size()) != opt_.pipeline_stages)
      throw OptionError("stage_layers", "names " + std::to_string(opt_.stage_layers.size()) +
                                            " stages, `pipeline_stages` " +
                                            std::to_string(opt_.pipeline_stages));
  }
  if (opt_.shape.custom() && (resume || !opt_.init.empty()))
    throw OptionError("shape", std::string("describes a new model, and ") +
                                   (resume ? "`resume` continues" : "`init` starts from") +
                                   " one with a shape of its own: drop one of them");
  if (opt_.out_dir.empty()) throw OptionError("out_dir", "is required");
  if (opt_.keep_checkpoints < 1) throw OptionError("keep_checkpoints", "must be at least 1");
  if (!(opt_.divergence_factor == 0 || opt_.divergence_factor > 1))
    throw OptionError("divergence_factor", "must be above 1 (or 0 = off)");
  if (resume && opt_.overwrite)
    throw OptionError("overwrite", "starts the run over, and `resume` continues it: drop one");
}

// out_dir: a directory (or nothing yet), holding no input, and no earlier run's checkpoint
// unless resuming or overwriting.
void Trainer::check_outputs(bool resume) const {
  if (fs::exists(opt_.out_dir) && !fs::is_directory(opt_.out_dir))
    throw OptionError("out_dir", opt_.out_dir + ": exists and is not a directory");
  // No input may be a file this run writes (or rotates away) in out_dir.
  for (const auto& [path, field] : {std::pair{opt_.sequences, "sequences"},
                                    {opt_.packs, "packs"},
                                    {opt_.vocab, "vocab"},
                                    {opt_.init, "init"}})
    if (!path.empty() && fs::exists(path) &&
        io::same_file(fs::absolute(path).parent_path().string(), opt_.out_dir) &&
        is_run_output(fs::path(path).filename().string()))
      throw OptionError(field, path + " is a file this run writes in `out_dir` (" + opt_.out_dir +
                                   "); an output never replaces an input: copy it elsewhere "
                                   "first");
  if (!resume && fs::exists(checkpoint_path()) && !opt_.overwrite)
    throw InputError(checkpoint_path() +
                     ": an earlier run's checkpoint is there; continue it with `resume`, or "
                     "start over with another `out_dir` (or `overwrite` to replace it)");
}

void Trainer::read_inputs() {
  seqs_ = data::read_sequences(opt_.sequences);
  seqs_checksum_ = data::sequences_checksum(opt_.sequences);
  if (!opt_.packs.empty()) packs_ = data::read_packs(opt_.packs);
  if (!opt_.vocab.empty()) {
    vocab_ = data::Vocab::load(opt_.vocab);
    if (!seqs_.made_with(*vocab_))
      throw InputError(opt_.vocab + ": not the vocabulary " + opt_.sequences + " was made with");
  }
}

// The checkpoint's model, which a resume continues: its sparse weights started as the run that
// wrote it said, and a --preset must name its shape.
void Trainer::check_resumed_model(const TrainingState& state, const io::SafetensorsFile& ckpt) {
  if (state.block_sparsity().on())
    opt_.sparse.init = model::parse_sparse_init(state.sparsity.value("init", std::string("dense")),
                                                checkpoint_path() + ": init");
  if (!opt_.preset_given) return;
  const model::BertConfig trained = checkpoint_config(ckpt);
  const model::BertConfig asked = model::resolve_shape(opt_.shape);
  if (asked.num_hidden_layers != trained.num_hidden_layers ||
      asked.hidden_size != trained.hidden_size ||
      asked.intermediate_size != trained.intermediate_size ||
      asked.num_attention_heads != trained.num_attention_heads)
    throw InputError(checkpoint_path() + ": holds a model of " +
                     std::to_string(trained.num_hidden_layers) + " layers, hidden " +
                     std::to_string(trained.hidden_size) + ", not `preset` " + opt_.shape.preset +
                     "'s; resume continues the checkpoint's model: drop `preset`");
}

// The model: the checkpoint's (resume), --init's, or a new one of new_shape.
void Trainer::make_model(const io::SafetensorsFile* ckpt, const TrainingState* state,
                         const std::optional<model::BertConfig>& new_shape) {
  const LoopOptions& lo = opt_.loop;
  model::Heads heads;
  if (ckpt) {
    const model::BertConfig c = checkpoint_config(*ckpt);
    model_ = std::make_unique<model::BertModel>(c, heads, state->block_sparsity(),
                                                kernels::DType::f32, stage_of(c));
    model::load_model_weights(*model_, *ckpt);
    train_flops_ = state->train_flops;
  } else if (!opt_.init.empty()) {
    io::AllocationScope scope("the model loaded from " + opt_.init);
    FreshTensors fresh{lo.seed, 0, {}};
    fresh.stage = [this](const model::BertConfig& c) { return stage_of(c); };
    model_ = load_model(opt_.init, heads, opt_.sparse.sparsity, &fresh);
    initialized_ = std::move(fresh.initialized);
    // Refused before a step: every step from such weights computes NaN.
    if (const std::string bad = non_finite_weights(*model_); !bad.empty())
      throw InputError(opt_.init + ": " + bad + "; pre-training from it would compute NaN");
  } else {
    model::BertConfig c = *new_shape;
    if (opt_.shape.config.empty()) {  // a preset fits the data; a config file says its own
      c.vocab_size = seqs_.vocab_size;
      if (c.family == model::Family::bert)  // (ModernBERT's rotary positions have no table)
        c.max_position_embeddings = std::max(512, packs_ ? packs_->max_seq_len : seqs_.max_seq_len);
      if (c.family == model::Family::modernbert && vocab_) {  // the special tokens' ids: the data's
        model::ModernBertFields& m = c.modern;
        m.pad_token_id = vocab_->pad();
        m.cls_token_id = m.bos_token_id = vocab_->cls();
        m.sep_token_id = m.eos_token_id = vocab_->sep();
      }
    }
    io::AllocationScope scope("the parameters and gradients of " + opt_.shape.name());
    model_ = std::make_unique<model::BertModel>(c, heads, opt_.sparse.sparsity, kernels::DType::f32,
                                                stage_of(c));
    model::init_params(model_->layout(), model_->params().data(), lo.seed, opt_.sparse.init);
    model_->init_patterns(lo.seed);
  }
  const model::BertConfig& c = model_->config();
  if (c.vocab_size != seqs_.vocab_size)
    throw InputError("model vocab_size " + std::to_string(c.vocab_size) +
                     " does not match the sequences file's vocabulary of " +
                     std::to_string(seqs_.vocab_size));
  const int row_len = packs_ ? packs_->max_seq_len : seqs_.max_seq_len;
  if (c.max_position_embeddings < row_len)
    throw InputError("model max_position_embeddings " + std::to_string(c.max_position_embeddings) +
                     " is below the data's max length " + std::to_string(row_len));
}

// The optimizer after any packing adjustment, the accumulation, and the recompute policy the
// largest micro-batch the data can make fits with.
OptimizerConfig Trainer::plan_steps() {
  const LoopOptions& lo = opt_.loop;
  const model::BertConfig& c = model_->config();
  const int row_len = packs_ ? packs_->max_seq_len : seqs_.max_seq_len;
  // Packing-aware hyperparameters (Graphcore): a pack holds `pf` sequences on average.
  const double pf =
      packs_ ? static_cast<double>(packs_->ids.size()) / static_cast<double>(packs_->packs()) : 1.0;
  accumulation_ = lo.accumulation;
  OptimizerConfig oc = lo.optimizer;
  if (opt_.packing_adjust == "ga")
    accumulation_ = std::max(1, static_cast<int>(std::lround(lo.accumulation / pf)));
  if (opt_.packing_adjust == "beta")
    oc.beta1 = std::pow(oc.beta1, pf), oc.beta2 = std::pow(oc.beta2, pf);
  {
    // The largest micro-batch the data can make: every row full, one sequence per row (the most
    // attention), a fifth of the tokens masked.
    PlanRequest plan{c,
                     model::Heads{},
                     oc.kind,
                     {},
                     lo.precision,
                     lo.optimizer.masters,
                     opt_.sparse.sparsity,
                     {},
                     1};
    int64_t rows = lo.rows_per_batch;
    if (opt_.one_per_row) {  // a pack's sequences become rows of their own
      uint64_t most = 1;
      for (uint64_t p = 0; p < packs_->packs(); ++p)
        most = std::max(most, packs_->offsets[p + 1] - packs_->offsets[p]);
      rows *= static_cast<int64_t>(most);
    }
    const int64_t tokens = rows * (opt_.one_per_row ? seqs_.max_seq_len : row_len);
    plan.shape = uniform_shape(tokens, rows, omp_get_max_threads(), c.local_window());
    plan.shape.masked = (tokens + 4) / 5;
    plan.stage = model_->layout().stage();
    plan.in_flight = forwards_in_flight(grid_->stages(), grid_->stage(), accumulation_);
    plan.backend = lo.backend;
    recompute_ = check_step_fits(plan, lo.recompute, lo.memory_limit);
  }
  return oc;
}

// Held out: the documents the file records as held out, else the file's last sequences;
// evaluated one per row without dropout, the same sequences whether training is packed or
// padded. Packed training leaves out the packs that hold any of them.
void Trainer::split_rows() {
  const LoopOptions& lo = opt_.loop;
  const uint64_t n_seq = seqs_.size();
  uint64_t held = 0;
  if (seqs_.has_heldout_split()) {
    if (opt_.eval_fraction)
      throw InputError(opt_.sequences + " records its own held-out split (" +
                       std::to_string(n_seq - seqs_.heldout_begin) +
                       " sequences of held-out documents, from prepare `eval_fraction`): drop "
                       "`eval_fraction`");
    held = n_seq - seqs_.heldout_begin;
  } else {
    const double fraction = opt_.eval_fraction.value_or(0.02);
    if (fraction > 0 && n_seq > 1)
      held = std::max<uint64_t>(
          1, static_cast<uint64_t>(std::llround(fraction * static_cast<double>(n_seq))));
  }
  train_rows_.rows_per_batch = static_cast<int>(step_rows_);  // every rank reads the whole step
  train_rows_.seed = lo.seed;
  train_rows_.dynamic_masking = opt_.dynamic_masking;
  if (model_->config().family == model::Family::modernbert) {
    // ModernBERT's recipe masks 30% of the tokens (its dynamic masks; a prepared file's are its
    // own: prepare --masked-lm-prob 0.3), with no cap below that share of a row.
    train_rows_.masking.masked_lm_prob = 0.3;
    train_rows_.masking.max_predictions_per_seq = packs_ ? packs_->max_seq_len : seqs_.max_seq_len;
  }
  train_rows_.compute_padding = opt_.compute_padding;
  train_rows_.one_per_row = opt_.one_per_row;
  if (packs_) {
    for (uint64_t p = 0; p < packs_->packs(); ++p) {
      bool holds_eval = false;
      for (uint64_t k = packs_->offsets[p]; k < packs_->offsets[p + 1]; ++k)
        holds_eval |= packs_->ids[k] >= n_seq - held;
      if (!holds_eval) train_rows_.row_list.push_back(p);
    }
    if (train_rows_.row_list.empty()) throw InputError("no pack is left for training");
  } else {
    train_rows_.row_end = n_seq - held;
  }
  eval_rows_.rows_per_batch = std::max(lo.rows_per_batch, 8);
  eval_rows_.seed = lo.seed;
  eval_rows_.shuffle = false;
  eval_rows_.row_begin = n_seq - held;
  eval_rows_.row_end = held ? n_seq : 0;
}

// The moments and step count of the training checkpoint --init names, carried into a new phase.
void Trainer::carry_optimizer(const OptimizerConfig& oc) {
  if (opt_.init.empty() || fs::is_directory(opt_.init))
    throw InputError(
        "`init_optimizer` carry needs `init` to name a packbert training "
        "checkpoint (checkpoint.safetensors), which holds the optimizer state");
  io::SafetensorsFile f = io::SafetensorsFile::read(opt_.init);
  json st;
  try {
    st = json::parse(f.metadata().at("packbert"));
  } catch (const std::exception&) {
    throw InputError(opt_.init + ": not a packbert training checkpoint (no optimizer state)");
  }
  const std::string was = st.value("optimizer", std::string()), now = optimizer_name(oc.kind);
  if (!was.empty() && was != now)  // (checkpoints before this field was written: unchecked)
    throw InputError(opt_.init + ": its optimizer state is " + was + "'s, this run uses " + now);
  json moments_only = {{"optimizer_steps", st.at("optimizer_steps")}};
  load_stepper_state(*stepper_, model_->layout(), f, moments_only);
}

// This run's own state from its checkpoint: moments, counters, cursor, the divergence guard.
void Trainer::restore(const io::SafetensorsFile& ckpt, const TrainingState& state) {
  load_stepper_state(*stepper_, model_->layout(), ckpt, state.stepper);
  step_ = state.step;
  cursor_ = state.cursor;
  elapsed_ = state.elapsed;
  saved_step_ = step_;
  if (state.divergence) divergence_ = *state.divergence;
  if (comm_.root()) truncate_metrics(opt_.out_dir + "/metrics.jsonl", step_);
}

// What the checkpoint of this step records beside its tensors.
TrainingState Trainer::training_state() {
  TrainingState s;
  s.step = step_;
  s.optimizer = optimizer_name(opt_.loop.optimizer.kind);
  s.cursor = cursor_;
  s.sequences_checksum = seqs_checksum_;
  s.packed = packs_.has_value(), s.one_per_row = opt_.one_per_row;
  s.precision = model::precision_name(opt_.loop.precision);
  s.master_weights = masters_name(opt_.loop.optimizer.masters);
  s.loss_scaling = loss_scaling_name(opt_.loop.loss_scaling);
  s.backend = kernels::backend(opt_.loop.backend).name;
  s.rows_per_batch = step_rows_, s.processes = comm_.size();
  s.seed = opt_.loop.seed;
  s.elapsed = elapsed_, s.train_flops = train_flops_;
  s.divergence = divergence_;
  s.init = opt_.init;
  if (opt_.sparse.sparsity.on())
    s.sparsity = {{"block", opt_.sparse.sparsity.block},
                  {"sparsity", opt_.sparse.sparsity.sparsity},
                  {"prune_ratio", opt_.sparse.prune_ratio},
                  {"updates", opt_.sparse.updates_or_default()},
                  {"regrow", regrow_name(opt_.sparse.regrow)},
                  {"init", model::sparse_init_name(opt_.sparse.init)}};
  save_stepper_state(*stepper_, s.stepper);
  return s;
}

}  // namespace packbert::train
