#include "train/trainer.h"

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

namespace packbert::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

model::BertConfig config_of(const io::SafetensorsFile& f) {
  auto it = f.metadata().find("config");
  if (it == f.metadata().end()) throw InputError(f.source() + ": no 'config' in the metadata");
  try {
    return model::config_from_json(json::parse(it->second), f.source() + " (config)");
  } catch (const json::exception&) {
    throw InputError(f.source() + ": metadata 'config' is not valid JSON");
  }
}

}  // namespace

std::unique_ptr<model::BertModel> load_model(const std::string& path, model::Heads heads,
                                             model::Sparsity sparsity, FreshTensors* fresh) {
  model::BertConfig config;
  io::SafetensorsFile f;
  if (!model::is_packbert_checkpoint(path)) {  // a Hugging Face model, in any of its forms
    model::ImportedModel hf = model::import_model(path);
    config = hf.config;
    f = std::move(hf.weights);
  } else {
    f = io::SafetensorsFile::read(path);
    config = config_of(f);
    const model::Sparsity was = sparsity_of(f);
    if (was.on() && !sparsity.on()) {  // a sparse checkpoint, wanted dense: its dense equivalent
      model::BertModel sparse(config, model::heads_present(f), was);
      model::load_model_weights(sparse, f);
      const model::OwnedTensors dense = model::dense_weight_tensors(sparse, sparse.params().data());
      f = io::SafetensorsFile::parse(io::serialize_safetensors(dense.tensors, f.metadata()), path);
    } else if (was.on() && !(was == sparsity)) {
      throw InputError(path + ": was trained with " + sparsity_text(was) + ", not " +
                       sparsity_text(sparsity) + " (a dense model can be pruned to any pattern)");
    }
  }
  if (fresh && fresh->num_labels > 0) config.num_labels = fresh->num_labels;
  const model::Stage stage = fresh && fresh->stage ? fresh->stage(config) : model::Stage{};
  auto m = std::make_unique<model::BertModel>(config, heads, sparsity, kernels::DType::f32, stage);
  if (fresh) model::init_params(m->layout(), m->params().data(), fresh->seed);
  model::load_model_weights(*m, f, fresh ? &fresh->initialized : nullptr,
                            fresh && fresh->new_heads);
  return m;
}

std::vector<io::TensorToWrite> weight_and_moment_tensors(const model::ParamLayout& layout,
                                                         const float* weights, const float* m,
                                                         const float* v) {
  std::vector<io::TensorToWrite> tensors = model::weight_tensors(layout, weights);
  auto mt = model::weight_tensors(layout, m, "optimizer.m.");
  auto vt = model::weight_tensors(layout, v, "optimizer.v.");
  tensors.insert(tensors.end(), mt.begin(), mt.end());
  tensors.insert(tensors.end(), vt.begin(), vt.end());
  return tensors;
}

void save_stepper_state(Stepper& stepper, json& state) {
  state["optimizer_steps"] = stepper.optimizer().steps();
  state["recent_grad_norms"] = stepper.guard().recent;
  state["accepted_steps"] = stepper.guard().accepted;
  state["outlier_skips"] = stepper.outlier_skips();
  state["loss_scale"] = stepper.scaler().scale;
  state["loss_scale_clean"] = stepper.scaler().clean;
  state["loss_scale_overflows"] = stepper.scaler().overflows;
}

void load_stepper_state(Stepper& stepper, const model::ParamLayout& layout,
                        const io::SafetensorsFile& file, const json& state) {
  for (const model::TensorSpec& t : layout.tensors()) {  // (this rank's shard of each)
    const std::vector<int64_t> shape = t.stored_shape();
    stepper.optimizer().set_moments(t, file.floats("optimizer.m." + t.name, &shape).data(),
                                    file.floats("optimizer.v." + t.name, &shape).data());
  }
  stepper.optimizer().set_steps(state.at("optimizer_steps").get<int64_t>());
  if (!state.contains("recent_grad_norms")) return;
  GradNormGuard& guard = stepper.guard();
  guard.recent = state.at("recent_grad_norms").get<std::vector<double>>();
  guard.accepted = state.at("accepted_steps").get<int64_t>();
  stepper.set_outlier_skips(state.at("outlier_skips").get<int64_t>());
  LossScaler& scaler = stepper.scaler();
  scaler.scale = state.value("loss_scale", scaler.scale);
  scaler.clean = state.value("loss_scale_clean", int64_t{0});
  scaler.overflows = state.value("loss_scale_overflows", int64_t{0});
  if (guard.recent.size() != static_cast<size_t>(GradNormGuard::kWindow))
    throw InputError(file.source() + ": recent_grad_norms has " +
                     std::to_string(guard.recent.size()) + " entries, expected " +
                     std::to_string(GradNormGuard::kWindow));
}

bool ModelLabels::generic() const {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] != "LABEL_" + std::to_string(i)) return false;
  return true;
}

namespace {

// id2label of a config.json object, in id order: empty when it has none; InputError naming
// `source` when it is not a map of the ids 0..n-1 to names.
std::vector<std::string> id2label_of(const json& config, const std::string& source) {
  if (!config.is_object() || !config.contains("id2label") || !config["id2label"].is_object())
    return {};
  const json& m = config["id2label"];
  std::vector<std::string> names(m.size());
  std::vector<bool> seen(m.size(), false);
  for (const auto& [key, value] : m.items()) {
    size_t id = 0;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id >= names.size() || seen[id] ||
        !value.is_string())
      throw InputError(source + ": id2label is not a map of the ids 0.." +
                       std::to_string(names.size() - 1) + " to names (at \"" + key + "\")");
    names[id] = value.get<std::string>(), seen[id] = true;
  }
  return names;
}

}  // namespace

ModelLabels model_labels(const std::string& path) {
  ModelLabels out;
  if (model::is_packbert_checkpoint(path)) {
    const io::SafetensorsFile f = io::SafetensorsFile::read(path);
    out.heads = model::heads_present(f);
    out.source = path + " (its config)";
    const json config = json::parse(f.metadata().at("config"), nullptr, false);
    out.names = id2label_of(config, out.source);
    if (config.is_object()) out.num_labels = model::config_from_json(config, out.source).num_labels;
    return out;
  }
  const model::ImportedModel hf = model::import_model(path);
  out.heads = model::heads_present(hf.weights);
  out.masked_lm = out.heads.pretraining && !hf.weights.has("cls.seq_relationship.weight") &&
                  !hf.weights.has("bert.pooler.dense.weight");
  out.pooler = hf.weights.has("bert.pooler.dense.weight");
  out.source = hf.config_from;
  out.num_labels = hf.config.num_labels;
  if (!hf.config_json.empty())
    out.names = id2label_of(json::parse(hf.config_json, nullptr, false), out.source);
  return out;
}

void write_tokenizer_files(const std::string& dir, const ModelFiles& f, int model_max_length) {
  io::write_file_atomic(dir + "/vocab.txt", io::read_file(f.vocab));
  const json special = {{"unk_token", "[UNK]"},
                        {"sep_token", "[SEP]"},
                        {"pad_token", "[PAD]"},
                        {"cls_token", "[CLS]"},
                        {"mask_token", "[MASK]"}};
  json config = special;
  config["do_lower_case"] = f.lower_case;
  config["do_basic_tokenize"] = true;
  config["tokenize_chinese_chars"] = true;
  config["strip_accents"] = nullptr;  // (follows do_lower_case, as BertTokenizer's default)
  config["model_max_length"] = model_max_length;
  config["tokenizer_class"] = "BertTokenizer";
  io::write_file_atomic(dir + "/tokenizer_config.json", config.dump(2) + "\n");
  io::write_file_atomic(dir + "/special_tokens_map.json", special.dump(2) + "\n");
}

void write_model_files(const model::BertModel& m, const std::string& dir, const ModelFiles& f) {
  const model::Heads& h = m.layout().heads();
  const bool bare = !h.classifier && !h.span && !h.pretraining;
  const char* architecture = h.classifier    ? "BertForSequenceClassification"
                             : h.span        ? "BertForQuestionAnswering"
                             : f.masked_lm   ? "BertForMaskedLM"
                             : h.pretraining ? "BertForPreTraining"
                                             : "BertModel";
  const bool pooler = h.classifier || (h.pretraining && !f.masked_lm) || (bare && f.pooler);
  const kernels::DTypeTraits& stored = kernels::traits(model::storage_dtype(f.dtype));
  json config = model::config_to_json(m.config(), architecture, f.label_names);
  config["torch_dtype"] = stored.torch;
  std::vector<float> widened;  // (under 16-bit master weights)
  const float* w = m.weights_fp32(widened);
  // Block-sparse weights go out dense, zeros outside their pattern: loadable anywhere.
  model::OwnedTensors out = model::dense_weight_tensors(m, w);
  std::vector<io::TensorToWrite>& tensors = out.tensors;
  std::erase_if(tensors, [&](const io::TensorToWrite& t) {
    return (!pooler && t.name.starts_with("bert.pooler.")) ||
           (f.masked_lm && t.name.starts_with("cls.seq_relationship."));
  });
  std::vector<std::string> names;  // a base model's names, without "bert."
  if (bare) {
    names.reserve(tensors.size());
    for (io::TensorToWrite& t : tensors)
      if (t.name.starts_with("bert.")) names.push_back(t.name.substr(5)), t.name = names.back();
  }
  std::vector<std::vector<uint16_t>> narrow;
  if (stored.is_16bit) {
    narrow.reserve(tensors.size());
    for (io::TensorToWrite& t : tensors) {
      const size_t n = t.bytes / sizeof(float);
      narrow.emplace_back(n);
      const float* x = static_cast<const float*>(t.data);
      stored.narrow(narrow.back().data(), x, static_cast<int64_t>(n));
      // A finite weight the type cannot hold (fp16's largest is 65,504) would load as inf.
      std::vector<float> back(n);
      stored.widen(back.data(), narrow.back().data(), static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i)
        if (std::isinf(back[i]) && std::isfinite(x[i]))
          throw InputError(dir + ": not written: " + t.name + "[" + std::to_string(i) +
                           "] = " + std::to_string(x[i]) + " does not fit " + stored.torch +
                           " (it would become inf); export it as fp32 or bf16");
      t.dtype = stored.safetensors, t.data = narrow.back().data(), t.bytes = n * stored.bytes;
    }
  }
  io::write_file_atomic(dir + "/config.json", config.dump(2) + "\n");
  io::write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  if (!f.vocab.empty()) write_tokenizer_files(dir, f, m.config().max_position_embeddings);
}

std::string non_finite_weights(const model::BertModel& m) {
  std::vector<float> widened;
  const float* w = m.weights_fp32(widened);
  size_t bad = 0;
  std::string first;
  for (const model::TensorSpec& t : m.layout().tensors()) {
    size_t here = 0;
    for (size_t i = 0; i < t.numel; ++i) here += !std::isfinite(w[t.offset + i]);
    if (here && first.empty()) first = t.name;
    bad += here;
  }
  return bad ? std::to_string(bad) + " weights are not finite (the first in " + first + ")" : "";
}

void export_model(const model::BertModel& m, const std::string& dir, const ModelFiles& f,
                  bool overwrite) {
  const std::string bad = non_finite_weights(m);
  if (!bad.empty())
    throw InputError(dir + ": not written: " + bad + "; a model that computes NaN is not exported");
  if (!f.vocab.empty()) {
    const data::Vocab v = data::Vocab::load(f.vocab);
    if (static_cast<int>(v.size()) != m.config().vocab_size)
      throw InputError(f.vocab + ": " + std::to_string(v.size()) +
                       " tokens, but the model's vocab_size is " +
                       std::to_string(m.config().vocab_size));
  }
  io::StagedDirectory out(dir, "`out_dir`", overwrite);
  write_model_files(m, out.path(), f);
  out.publish();
}

namespace {

// Keeps the metrics records of steps up to `step` (a resumed run writes the later ones again).
void truncate_metrics(const std::string& path, int64_t step) {
  if (!fs::exists(path)) return;
  std::string kept, line;
  std::ifstream in(path);
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    json r = json::parse(line, nullptr, false);
    if (r.is_discarded() || !r.contains("step") || !r["step"].is_number_integer()) {
      if (in.eof()) break;  // a last line cut short by a kill: drop it
      throw InputError(path + ":" + std::to_string(line_no) + ": not a metrics record");
    }
    if (r["step"].get<int64_t>() <= step) kept += line + "\n";
  }
  io::write_file_atomic(path, kept);
}

}  // namespace

std::string Trainer::checkpoint_path() const {
  return opt_.out_dir + "/checkpoint.safetensors";
}

std::string Trainer::earlier_checkpoint_path(int64_t step) const {
  return opt_.out_dir + "/checkpoint-" + std::to_string(step) + ".safetensors";
}

std::string Trainer::best_path() const {
  return opt_.out_dir + "/best.safetensors";
}

namespace {

// The name of a file pretrain writes into its run directory (an input must not be one).
bool is_run_output(const std::string& name) {
  if (name == "checkpoint.safetensors" || name == "best.safetensors" || name == "metrics.jsonl")
    return true;
  return name.starts_with("checkpoint-") && name.ends_with(".safetensors");
}

}  // namespace

std::vector<std::pair<int64_t, std::string>> Trainer::earlier_checkpoints() const {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(opt_.out_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("checkpoint-") || !name.ends_with(".safetensors")) continue;
    const std::string digits = name.substr(11, name.size() - 11 - 12);
    if (digits.empty() || digits.size() > 18 ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      continue;
    out.push_back({std::stoll(digits), e.path().string()});
  }
  std::sort(out.begin(), out.end());
  return out;
}

void Trainer::clear_earlier_run() {
  if (earlier_run_cleared_) return;
  earlier_run_cleared_ = true;
  for (const auto& [step, path] : earlier_checkpoints()) fs::remove(path);
  fs::remove(best_path());
}

// Refuses to start a run whose checkpoints cannot be written: the file system must hold one
// more checkpoint (the temporary file of a write); warns when the kept ones may not fit.
void Trainer::check_disk_space() const {
  fs::path where = fs::absolute(opt_.out_dir);  // (out_dir, or the directory it will be made in)
  while (!fs::exists(where) && where.has_parent_path() && where != where.parent_path())
    where = where.parent_path();
  struct statvfs vfs {};
  if (::statvfs(where.c_str(), &vfs) != 0) return;
  const double free_bytes = static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize);
  // Weights and two moments in fp32, plus the header and patterns (a few per cent).
  const double one = 3.0 * 4.0 * static_cast<double>(model_->layout().total()) * 1.05;
  auto gib = [](double b) { return fixed(b / (1 << 30), 2) + " GiB"; };
  if (free_bytes < one)
    throw InputError(opt_.out_dir + ": " + gib(free_bytes) + " free, but one checkpoint of this " +
                     "model needs " + gib(one) + "; free space or choose another `out_dir`");
  const double kept = one * (opt_.keep_checkpoints + 2);  // (+ best.safetensors, as whole)
  if (free_bytes < kept)
    std::cerr << "pretrain: warning: " << opt_.out_dir << " has " << gib(free_bytes)
              << " free; the " << opt_.keep_checkpoints << " kept checkpoints and best.safetensors "
              << "need up to " << gib(kept) << "\n";
}

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
    for (auto it = first.begin(); it != first.end(); ++it)
      if (other.at(it.key()) != it.value())
        throw SharedError("rank " + std::to_string(r) + " and rank 0 were given different " +
                          it.key() + " (" + other.at(it.key()).dump() + " against " +
                          it.value().dump() + "); every process needs the same files and flags");
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
    plan.shape = uniform_shape(tokens, rows, 1);
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

std::vector<std::vector<float>> Trainer::gather_stages(const std::vector<const float*>& mine,
                                                       bool* tied_equal) const {
  dist::Comm& world = grid_->world();
  const size_t n = model_->layout().total();
  std::vector<std::vector<float>> whole;
  if (grid_->replica() != 0) return whole;
  if (!grid_->first_stage()) {
    for (size_t i = 0; i < mine.size(); ++i)
      world.start_send(mine[i], n * sizeof(float), 0, static_cast<int>(i));
    world.wait_sends();
    return whole;
  }
  const model::ParamLayout all = whole_layout();
  whole.assign(mine.size(), std::vector<float>(all.total()));
  std::vector<float> got;
  for (int s = 0; s < grid_->stages(); ++s) {
    const model::ParamLayout stage(model_->config(), all.heads(), all.sparsity(),
                                   stages_[static_cast<size_t>(s)]);
    got.resize(s > 0 ? stage.total() : 0);
    for (size_t i = 0; i < mine.size(); ++i) {
      if (s > 0)
        world.recv(got.data(), got.size() * sizeof(float), grid_->world_rank(s, 0),
                   static_cast<int>(i));
      const float* from = s > 0 ? got.data() : mine[i];
      for (const model::TensorSpec& t : stage.tensors()) {
        float* to = whole[i].data() + all.find(t.name)->offset;
        if (s > 0 && stage.word_table() == &t) {  // the last stage's copy: the first's, bit for bit
          if (tied_equal && std::memcmp(from + t.offset, to, t.numel * sizeof(float)) != 0)
            *tied_equal = false;
          continue;
        }
        std::copy(from + t.offset, from + t.offset + t.numel, to);
      }
    }
  }
  return whole;
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
    state->check_resumable(opt_, seqs_checksum_, step_rows_, grid_->replicas(), checkpoint_path());
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
  const model::BertConfig trained = config_of(ckpt);
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
    const model::BertConfig c = config_of(*ckpt);
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
      c.max_position_embeddings = std::max(512, packs_ ? packs_->max_seq_len : seqs_.max_seq_len);
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
    plan.shape = uniform_shape(tokens, rows, omp_get_max_threads());
    plan.shape.masked = (tokens + 4) / 5;
    plan.stage = model_->layout().stage();
    plan.in_flight = forwards_in_flight(grid_->stages(), grid_->stage(), accumulation_);
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

Trainer::~Trainer() = default;

void Trainer::write_state(const std::string& path, const json& best) {
  std::vector<float> m_all, v_all;  // the moments gathered on rank 0 under ZeRO-1
  auto [m, v] = stepper_->whole_moments(m_all, v_all);
  std::vector<float> widened;  // the weights in fp32 under 16-bit master weights
  const float* w = model_->weights_fp32(widened);
  // Pipeline stages: the whole model's, gathered on rank 0 by tensor name.
  bool tied_equal = true;
  const std::vector<std::vector<float>> whole = grid_->pipelined()
                                                    ? gather_stages({w, m, v}, &tied_equal)
                                                    : std::vector<std::vector<float>>();
  if (!whole.empty()) w = whole[0].data(), m = whole[1].data(), v = whole[2].data();
  const model::ParamLayout L = grid_->pipelined() ? whole_layout() : model_->layout();
  // (never a silent wrong result: the two stages' copies of the tied word table must agree)
  double split = tied_equal ? 0 : 1;
  comm_.allreduce_max(&split, 1);
  if (split)
    throw SharedError("step " + std::to_string(step_) +
                      ": the first and last pipeline stage's copies of the tied word table "
                      "differ; no checkpoint written (a bug: please report it)");
  double bad = comm_.root() && (!all_finite(w, L.total()) || !all_finite(m, L.total()) ||
                                !all_finite(v, L.total()));
  comm_.allreduce_max(&bad, 1);        // every rank learns rank 0's verdict
  if (bad && !best.is_null()) return;  // (a best state is only ever a finite one)
  if (bad)
    throw InputError("step " + std::to_string(step_) +
                     ": parameters or optimizer moments are not finite; no checkpoint written" +
                     (saved_step_ >= 0 ? " (the one of step " + std::to_string(saved_step_) +
                                             " in " + checkpoint_path() + " is unchanged)"
                                       : ""));
  if (!comm_.root()) return;
  std::vector<io::TensorToWrite> tensors = weight_and_moment_tensors(L, w, m, v);
  const model::OwnedTensors patterns = model::pattern_tensors(*model_);
  tensors.insert(tensors.end(), patterns.tensors.begin(), patterns.tensors.end());
  json state = training_state().to_json();
  if (!best.is_null()) state["best"] = best;
  clear_earlier_run();
  if (best.is_null() && opt_.keep_checkpoints > 1 && saved_step_ >= 0 && saved_step_ != step_ &&
      fs::exists(checkpoint_path())) {
    // The checkpoint on disk becomes checkpoint-<its step>.safetensors (a second name for the
    // same file, so it is never absent), then the new one replaces checkpoint.safetensors
    // atomically.
    const std::string earlier = earlier_checkpoint_path(saved_step_);
    std::error_code ec;
    fs::remove(earlier, ec);
    fs::create_hard_link(checkpoint_path(), earlier, ec);
    if (ec) fs::copy_file(checkpoint_path(), earlier, ec);  // (a file system without links)
    if (ec) throw InputError(earlier + ": cannot keep the earlier checkpoint: " + ec.message());
  }
  io::write_safetensors(
      path, tensors,
      {{"config", model::config_to_json(model_->config()).dump()}, {"packbert", state.dump()}});
}

void Trainer::save_checkpoint() {
  write_state(checkpoint_path(), json());
  saved_step_ = step_;
  if (!comm_.root()) return;
  std::vector<std::pair<int64_t, std::string>> earlier = earlier_checkpoints();
  while (earlier.size() > static_cast<size_t>(opt_.keep_checkpoints - 1) ||
         (!earlier.empty() && earlier.back().first >= step_)) {  // (steps past this one: stale)
    const size_t drop = earlier.back().first >= step_ ? earlier.size() - 1 : 0;
    fs::remove(earlier[drop].second);
    earlier.erase(earlier.begin() + static_cast<long>(drop));
  }
  kept_.clear();
  for (const auto& [s, path] : earlier) kept_.push_back(fs::path(path).filename().string());
}

// best.safetensors is the whole state at the best evaluation (weights, moments, counters), kept
// out of the rotation: a run that drifts off slowly, below the divergence factor, can still go
// on from its best point (`--init best.safetensors --init-optimizer carry`).
void Trainer::save_best(const EvalMetrics& e) {
  write_state(best_path(),
              json{{"step", e.step}, {"mlm_loss", e.mlm_loss}, {"mlm_acc", e.mlm_acc}});
}

EvalMetrics evaluate_mlm(model::BertModel& m, BatchLoader& loader, model::Precision precision,
                         const std::function<void(int64_t, double)>& progress, StageLinks* links) {
  EvalMetrics e;
  double mlm_sum = 0, nsp_sum = 0;
  int64_t nsp_n = 0, mlm_correct = 0, nsp_correct = 0;
  while (loader.cursor().epoch == 0) {
    const double t0 = now_seconds();
    const int64_t before = e.sequences;
    model::PackedBatch b = loader.next();
    model::StepOptions so;
    so.precision = precision;
    const bool below = links && !m.layout().has_embeddings(),
               above = links && !m.layout().has_heads();
    const kernels::View input =
        below ? links->receive_input(0, 0, model::token_layout(b, m.config()).tokens())
              : kernels::View();
    model::Outputs o = m.forward(b, so, input);
    if (above) links->send_output(0, m.stage_output());
    if (links) links->finish();
    io::crash_point("eval");  // (PACKBERT_CRASH_AT=eval:N: the N-th evaluation batch)
    mlm_sum += o.mlm_loss * static_cast<double>(o.mlm_count);
    nsp_sum += o.nsp_loss * static_cast<double>(o.nsp_count);
    e.mlm_count += o.mlm_count;
    nsp_n += o.nsp_count;
    mlm_correct += o.mlm_correct;
    nsp_correct += o.nsp_correct;
    for (int32_t y : m.tokens().nsp_label) e.sequences += y != -100;
    if (progress) progress(e.sequences - before, now_seconds() - t0);
  }
  e.mlm_loss = e.mlm_count ? mlm_sum / static_cast<double>(e.mlm_count) : 0;
  e.mlm_acc = e.mlm_count ? static_cast<double>(mlm_correct) / static_cast<double>(e.mlm_count) : 0;
  e.nsp_loss = nsp_n ? nsp_sum / static_cast<double>(nsp_n) : 0;
  e.nsp_acc = nsp_n ? static_cast<double>(nsp_correct) / static_cast<double>(nsp_n) : 0;
  return e;
}

EvalMetrics Trainer::evaluate() {
  if (eval_rows_.row_end == 0) return EvalMetrics{step_};
  BatchLoader loader(seqs_, seqs_checksum_, nullptr, vocab_ ? &*vocab_ : nullptr, eval_rows_, {});
  if (!grid_->pipelined()) {
    EvalMetrics e = evaluate_mlm(*model_, loader, opt_.loop.precision);
    e.step = step_;
    return e;
  }
  // Every replica runs the held-out batches through its stages; the last stage's first
  // replica's metrics are every rank's.
  StageLinks links(grid_->pipe(), model_->config().hidden_size,
                   model::storage_dtype(opt_.loop.precision));
  model_->use_pass(0);
  EvalMetrics e = evaluate_mlm(*model_, loader, opt_.loop.precision, {}, &links);
  const bool mine = grid_->last_stage() && grid_->replica() == 0;
  double v[6] = {e.mlm_loss,
                 e.mlm_acc,
                 e.nsp_loss,
                 e.nsp_acc,
                 static_cast<double>(e.mlm_count),
                 static_cast<double>(e.sequences)};
  if (!mine) std::fill(std::begin(v), std::end(v), 0.0);
  grid_->world().allreduce_sum(v, 6);
  e.mlm_loss = v[0], e.mlm_acc = v[1], e.nsp_loss = v[2], e.nsp_acc = v[3];
  e.mlm_count = std::llround(v[4]), e.sequences = std::llround(v[5]);
  e.step = step_;
  return e;
}

std::string Trainer::kept_text() const {
  std::string s = saved_step_ >= 0
                      ? "checkpoint.safetensors (step " + std::to_string(saved_step_) + ")"
                      : std::string("no checkpoint yet");
  for (const auto& [step, path] : earlier_checkpoints())
    s += ", " + fs::path(path).filename().string();
  if (divergence_.best_eval_step >= 0)
    s += ", best.safetensors (step " + std::to_string(divergence_.best_eval_step) + ")";
  return s;
}

void Trainer::diverged(const std::string& what) const {
  throw InputError("step " + std::to_string(step_) + ": the run diverged: " + what +
                   " (`divergence_factor` " + fixed(opt_.divergence_factor, 2) +
                   "); no checkpoint written; kept in " + opt_.out_dir + ": " + kept_text());
}

// An evaluation of the held-out split, recorded; a new best is saved, a diverged one ends the
// run; whether it reached target_accuracy is every rank's (rank 0's verdict).
void Trainer::evaluate_and_record(const std::function<void(const EvalMetrics&)>& on_eval) {
  evaluated_at_ = step_;
  const double e0 = now_seconds();
  EvalMetrics e = evaluate();
  e.elapsed = elapsed_;
  e.eval_seconds = now_seconds() - e0;
  if (eval_rows_.row_end == 0) return;
  const bool diverging = divergence_.eval_diverged(e.mlm_loss, opt_.divergence_factor);
  const bool best = !diverging && std::isfinite(e.mlm_loss) &&
                    (divergence_.best_eval_step < 0 || e.mlm_loss < divergence_.best_eval);
  if (best) save_best(e);
  if (comm_.root()) {
    log_ << e.to_json().dump() << std::endl;
    if (best)
      log_ << json{{"type", "best"},
                   {"step", e.step},
                   {"file", "best.safetensors"},
                   {"mlm_loss", e.mlm_loss},
                   {"elapsed", e.elapsed}}
                  .dump()
           << std::endl;
    if (on_eval) on_eval(e);
  }
  if (diverging)
    diverged("held-out MLM loss " + fixed(e.mlm_loss, 2) + " is above " +
             fixed(opt_.divergence_factor, 2) + " x its best, " + fixed(divergence_.best_eval, 2) +
             " at step " + std::to_string(divergence_.best_eval_step));
  if (best) {
    divergence_.best_eval = e.mlm_loss, divergence_.best_eval_step = step_;
    resave_ |= saved_step_ == step_;  // (the checkpoint of this step must record it)
  }
  double hit = comm_.root() && opt_.target_accuracy > 0 && e.mlm_acc >= opt_.target_accuracy;
  comm_.allreduce_max(&hit, 1);
  reached_ = hit > 0;
}

void Trainer::checkpoint_and_record() {
  save_checkpoint();
  if (!comm_.root()) return;
  log_ << json{{"type", "checkpoint"},
               {"step", step_},
               {"file", "checkpoint.safetensors"},
               {"earlier", kept_},
               {"elapsed", elapsed_}}
              .dump()
       << std::endl;
}

// One optimizer step (and, on its schedule, a sparse pattern update), its metrics.
StepMetrics Trainer::train_step(double flops_per_token) {
  const double t0 = now_seconds();
  // A step that ends with a pattern update under gradient regrow collects the dense gradient's
  // block norms on the way.
  const bool update = is_update_step(opt_.sparse, step_ + 1, opt_.max_steps);
  if (update && opt_.sparse.regrow == Regrow::gradient) model_->collect_block_grads(true);
  const std::string kept = saved_step_ >= 0 ? "no checkpoint written; the one of step " +
                                                  std::to_string(saved_step_) + " in " +
                                                  checkpoint_path() + " is unchanged"
                                            : std::string("no checkpoint written");
  const StepResult r = stepper_->step(
      step_, opt_.max_steps, [&] { return loader_->next(); }, kept);
  UpdateStats moved;
  if (update) {
    moved = update_patterns(*model_, stepper_->optimizer(), opt_.sparse, step_ + 1, opt_.max_steps,
                            opt_.loop.seed);
    model_->collect_block_grads(false);
  }
  train_flops_ += flops_per_token * static_cast<double>(r.real_tokens);
  StepMetrics s = StepMetrics::of(r, model_->layout().heads(), *stepper_, opt_.loop, comm_.size());
  s.step = step_ + 1;
  s.train_flops = train_flops_;
  s.pattern_update = update, s.blocks_moved = moved.moved, s.churn = moved.churn();
  cursor_ = loader_->cursor();
  ++step_;
  s.seconds = now_seconds() - t0;
  elapsed_ += s.seconds;
  s.elapsed = elapsed_;
  return s;
}

StopReason Trainer::run(const std::atomic<bool>& stop,
                        const std::function<void(const StepMetrics&)>& on_step,
                        const std::function<void(const EvalMetrics&)>& on_eval) {
  // Rank 0 alone writes metrics and calls back; every rank trains and evaluates.
  if (comm_.root()) {
    log_.open(opt_.out_dir + "/metrics.jsonl", new_log_ ? std::ios::trunc : std::ios::app);
    if (!log_) throw InputError(opt_.out_dir + "/metrics.jsonl: cannot open for writing");
  }
  new_log_ = false;
  const Schedule schedule{opt_.max_steps, opt_.eval_every, opt_.checkpoint_every, opt_.max_minutes};
  const double flops_per_token = nonembedding_flops_per_token(whole_layout());
  // A stop request (a signal to any rank) or the time limit (any rank's clock) stops every rank
  // after the same step.
  auto agreed = [&](bool local_stop, bool local_time) {
    double flags[2] = {local_stop ? 1.0 : 0.0, local_time ? 1.0 : 0.0};
    comm_.allreduce_max(flags, 2);
    return std::pair{flags[0] > 0, flags[1] > 0};
  };
  bool stop_now = agreed(stop.load(), false).first;
  StopReason reason = StopReason::finished;
  while (step_ < opt_.max_steps) {
    if (stop_now) {
      reason = StopReason::requested;
      break;
    }
    const StepMetrics s = train_step(flops_per_token);
    if (comm_.root()) {
      log_ << s.to_json().dump() << std::endl;
      if (on_step) on_step(s);
    }
    io::crash_point("step");
    if (!s.skipped && divergence_.train_diverged(s.loss, opt_.divergence_factor))
      diverged("the training loss's moving average " + fixed(divergence_.train_ema, 2) +
               " is above " + fixed(opt_.divergence_factor, 2) + " x its lowest, " +
               fixed(divergence_.lowest_train_ema, 2));
    if (schedule.evaluates_after(step_)) evaluate_and_record(on_eval);
    // (the last step's checkpoint is written after its evaluation, below)
    if (schedule.checkpoints_after(step_)) checkpoint_and_record();
    if (reached_) {
      reason = StopReason::target_reached;
      break;
    }
    const auto [stop_any, time_any] = agreed(stop.load(), schedule.out_of_time(elapsed_));
    if (time_any) {
      reason = StopReason::time_limit;
      break;
    }
    stop_now = stop_any;
  }
  if (evaluated_at_ != step_) evaluate_and_record(on_eval);  // (none twice after one step)
  if (reached_ && reason == StopReason::finished) reason = StopReason::target_reached;
  if (saved_step_ != step_ || resave_) checkpoint_and_record();
  return reason;
}

}  // namespace packbert::train
