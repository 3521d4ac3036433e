// packbert convert and the readers behind it (io/zip, io/torch_file, model/hf_import), against
// fixtures torch.save wrote (tools/make_torch_fixtures.py): tensors must come out bit-identical
// to what PyTorch held, and nothing in a hostile file may run or crash the reader.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_runner.h"
#include "error.h"
#include "io/safetensors.h"
#include "io/torch_file.h"
#include "io/zip.h"
#include "model/bert.h"
#include "model/config.h"
#include "model/hf_import.h"
#include "model/params.h"
#include "train/model_files.h"
#include "train/trainer.h"

namespace packbert {
namespace {

using testing::CliTest;
using testing::Result;
namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kTorch = std::string(PACKBERT_SOURCE_DIR) + "/tests/data/torch";

// A zip archive of stored entries with correct CRCs; `zip64` writes every size and offset
// through zip64 records, as an archive past 4 GiB has them.
std::string make_zip(const std::vector<std::pair<std::string, std::string>>& entries, bool zip64) {
  auto put = [](std::string& s, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) s += static_cast<char>(v >> (8 * i) & 0xff);
  };
  std::string out, dir;
  for (const auto& [name, data] : entries) {
    const uint64_t header = out.size();
    const uint32_t crc = io::crc32(data);
    put(out, 0x04034b50, 4), put(out, 45, 2), put(out, 0, 2), put(out, 0, 2), put(out, 0, 4);
    put(out, crc, 4), put(out, data.size(), 4), put(out, data.size(), 4);
    put(out, name.size(), 2), put(out, 0, 2);
    out += name + data;
    put(dir, 0x02014b50, 4), put(dir, 45, 2), put(dir, 45, 2), put(dir, 0, 2), put(dir, 0, 2);
    put(dir, 0, 4), put(dir, crc, 4);
    put(dir, zip64 ? 0xffffffff : data.size(), 4), put(dir, zip64 ? 0xffffffff : data.size(), 4);
    put(dir, name.size(), 2), put(dir, zip64 ? 28 : 0, 2), put(dir, 0, 2), put(dir, 0, 2);
    put(dir, 0, 2), put(dir, 0, 4), put(dir, zip64 ? 0xffffffff : header, 4);
    dir += name;
    if (zip64)
      put(dir, 1, 2), put(dir, 24, 2), put(dir, data.size(), 8), put(dir, data.size(), 8),
          put(dir, header, 8);
  }
  const uint64_t dir_at = out.size();
  out += dir;
  if (zip64) {
    const uint64_t end64 = out.size();
    put(out, 0x06064b50, 4), put(out, 44, 8), put(out, 45, 2), put(out, 45, 2), put(out, 0, 4);
    put(out, 0, 4), put(out, entries.size(), 8), put(out, entries.size(), 8);
    put(out, dir.size(), 8), put(out, dir_at, 8);
    put(out, 0x07064b50, 4), put(out, 0, 4), put(out, end64, 8), put(out, 1, 4);
  }
  put(out, 0x06054b50, 4), put(out, 0, 4);
  put(out, zip64 ? 0xffff : entries.size(), 2), put(out, zip64 ? 0xffff : entries.size(), 2);
  put(out, zip64 ? 0xffffffff : dir.size(), 4), put(out, zip64 ? 0xffffffff : dir_at, 4);
  put(out, 0, 2);
  return out;
}

std::vector<std::pair<std::string, std::string>> zip_entries(const std::string& path) {
  const io::ZipArchive z = io::ZipArchive::read(path);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, e] : z.entries()) out.push_back({name, std::string(z.bytes(name))});
  return out;
}

// Every tensor of `expected` is in `got` with the same dtype, shape and bytes, and nothing else.
void expect_identical(const io::SafetensorsFile& got, const io::SafetensorsFile& expected) {
  EXPECT_EQ(got.tensors().size(), expected.tensors().size());
  for (const auto& [name, e] : expected.tensors()) {
    ASSERT_TRUE(got.has(name)) << name;
    EXPECT_EQ(got.entry(name).dtype, e.dtype) << name;
    EXPECT_EQ(got.entry(name).shape, e.shape) << name;
    EXPECT_TRUE(got.raw(name) == expected.raw(name)) << name << ": bytes differ";
  }
}

io::SafetensorsFile expected(const std::string& suffix = "") {
  return io::SafetensorsFile::read(kTorch + "/expected" + suffix + ".safetensors");
}

using Convert = CliTest;

TEST_F(Convert, TorchSaveWithATiedDecoderComesOutBitIdentical) {
  const Result r = run("convert " + kTorch + "/tied --out " + (dir_ / "m").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("49 (48 F32, 1 I64"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("heads:   pre-training"), std::string::npos) << r.out;
  const io::SafetensorsFile got =
      io::SafetensorsFile::read((dir_ / "m/model.safetensors").string());
  expect_identical(got, expected());
  // The decoder shared the embeddings' storage; each comes out whole.
  EXPECT_TRUE(got.raw("cls.predictions.decoder.weight") ==
              got.raw("bert.embeddings.word_embeddings.weight"));
  EXPECT_EQ(testing::slurp(dir_ / "m/config.json"), testing::slurp(kTorch + "/tied/config.json"));
  EXPECT_EQ(testing::slurp(dir_ / "m/vocab.txt"), testing::slurp(kTorch + "/tied/vocab.txt"));
}

TEST_F(Convert, ShardsEqualTheUnshardedFile) {
  const Result r = run("convert " + kTorch + "/sharded --out " + (dir_ / "m").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("2 shards"), std::string::npos) << r.out;
  expect_identical(io::SafetensorsFile::read((dir_ / "m/model.safetensors").string()), expected());
  // A shard the index names but that lacks the tensor is refused, naming both.
  fs::copy(kTorch + "/sharded", dir_ / "bad");
  fs::copy_file(kTorch + "/sharded/pytorch_model-00002-of-00002.bin",
                dir_ / "bad/pytorch_model-00001-of-00002.bin",
                fs::copy_options::overwrite_existing);
  const Result bad = run("convert " + (dir_ / "bad").string() + " --out " + (dir_ / "n").string());
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("pytorch_model-00001-of-00002.bin: has no tensor"), std::string::npos)
      << bad.err;
  EXPECT_FALSE(fs::exists(dir_ / "n"));
}

TEST_F(Convert, HalfAndBfloat16StoragesConvertExactly) {
  for (const std::string kind : {"half", "bfloat16"}) {
    const fs::path out = dir_ / kind;
    const Result r =
        run("convert " + kTorch + "/" + kind + "/pytorch_model.bin --out " + out.string());
    ASSERT_EQ(r.code, 0) << r.err;
    expect_identical(io::SafetensorsFile::read((out / "model.safetensors").string()),
                     expected("_" + kind));
  }
}

TEST_F(Convert, OldNamesAreBroughtToBertForPreTrainingsAndAConfigIsNeeded) {
  const Result none = run("convert " + kTorch + "/old_names.bin --out " + (dir_ / "m").string());
  EXPECT_EQ(none.code, 2);
  EXPECT_NE(none.err.find("hidden size 16 is not a multiple of 64"), std::string::npos) << none.err;
  EXPECT_NE(none.err.find("give --config"), std::string::npos) << none.err;
  const Result r = run("convert " + kTorch + "/old_names.bin --config " + kTorch +
                       "/tied/config.json --out " + (dir_ / "m").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("40 renamed"), std::string::npos) << r.out;
  const io::SafetensorsFile got =
      io::SafetensorsFile::read((dir_ / "m/model.safetensors").string());
  const io::SafetensorsFile want = expected();
  EXPECT_EQ(got.tensors().size(), 40u);
  for (const auto& [name, e] : got.tensors()) {
    ASSERT_TRUE(want.has(name)) << name;
    EXPECT_TRUE(got.raw(name) == want.raw(name)) << name;
  }
}

TEST_F(Convert, APickleWithAForeignGlobalIsRefusedAndNothingRuns) {
  const Result r = run("convert " + kTorch + "/evil.bin --out " + (dir_ / "m").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("refused global 'posix.system'"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("must never run"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "m"));
}

// #45 item 9: the legacy (pre-1.6) format converts to the same tensors, bit for bit, as the same
// state_dict saved in the zip format; cut short or lying about a storage's size, it is refused.
TEST_F(Convert, TheLegacyFormatConvertsBitExactly) {
  const std::string config = kTorch + "/tied/config.json";
  Result r = run("convert " + kTorch + "/legacy.bin --config " + config + " --out " +
                 (dir_ / "legacy").string());
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("convert " + kTorch + "/tied/pytorch_model.bin --out " + (dir_ / "zip").string());
  ASSERT_EQ(r.code, 0) << r.err;
  io::SafetensorsFile a = io::SafetensorsFile::read((dir_ / "legacy/model.safetensors").string()),
                      b = io::SafetensorsFile::read((dir_ / "zip/model.safetensors").string());
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (const auto& [name, e] : b.tensors()) EXPECT_EQ(a.raw(name), b.raw(name)) << name;
  const std::string bytes = testing::slurp(kTorch + "/legacy.bin");
  for (const size_t cut : {bytes.size() / 4, bytes.size() / 2, bytes.size() - 3}) {
    try {
      io::parse_torch_file(bytes.substr(0, cut), "f");
      ADD_FAILURE() << "a legacy file cut at " << cut << " was read";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).find("internal"), std::string::npos) << e.what();
    }
  }
  // Random damage (a few bytes flipped anywhere): tensors or one InputError, never a crash or a
  // read out of bounds (ASan in CI), as the zip reader's fuzz test.
  std::mt19937 rng(45);
  for (int trial = 0; trial < 300; ++trial) {
    std::string damaged = bytes;
    for (int k = 0; k < 1 + trial % 4; ++k)
      damaged[rng() % damaged.size()] ^= static_cast<char>(1 + rng() % 255);
    try {
      (void)io::parse_torch_file(damaged, "f");
    } catch (const InputError&) {
    }
  }
  // One more byte than the storages: trailing bytes are refused, not ignored.
  try {
    io::parse_torch_file(bytes + "x", "f");
    ADD_FAILURE() << "trailing bytes were ignored";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("1 unexpected trailing bytes"), std::string::npos)
        << e.what();
  }
}

TEST_F(Convert, AWrongVocabularyIsRefused) {
  const Result r =
      run("convert " + kTorch + "/sharded --vocab " + kTorch +
          "/../../../assets/bert-base-uncased-vocab.txt --out " + (dir_ / "m").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("30522 tokens, the model's vocab_size is 40"), std::string::npos) << r.err;
}

// A file packbert wrote (a checkpoint, here the PyTorch golden, which carries its config the same
// way) is exported: its weights as F32 under the same names, and its config as config.json.
TEST_F(Convert, APackbertCheckpointIsExported) {
  const std::string golden =
      std::string(PACKBERT_SOURCE_DIR) + "/tests/golden/bert_h40.safetensors";
  const Result r = run("convert " + golden + " --out " + (dir_ / "m").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("converted packbert checkpoint"), std::string::npos) << r.out;
  const io::SafetensorsFile got =
      io::SafetensorsFile::read((dir_ / "m/model.safetensors").string());
  const io::SafetensorsFile want = io::SafetensorsFile::read(golden);
  int weights = 0;
  for (const auto& [name, e] : got.tensors()) {
    if (name.starts_with("cls.predictions.decoder.")) continue;  // tied, written for transformers
    ASSERT_TRUE(want.has(name)) << name;
    EXPECT_TRUE(got.raw(name) == want.raw(name)) << name;
    ++weights;
  }
  EXPECT_GT(weights, 30);
  EXPECT_TRUE(fs::exists(dir_ / "m/config.json"));
  EXPECT_FALSE(fs::exists(dir_ / "m/vocab.txt"));  // none known for a checkpoint without --vocab
}

// --init (train::load_model) reads every form convert does, with the same values.
// ModernBERT directories as transformers' save_pretrained writes them (tools/make_modernbert_
// fixture.py, torch modules written from modeling_modernbert.py; the tied decoder weight left
// out): a masked-LM model, a sequence classifier with every bias and mean pooling, a QA model.
// convert keeps every tensor, the config and the tokenizer.json; export of the converted
// directory, which loads it into packbert's ModernBERT layout, writes every tensor bit-identical
// under the same names and shapes (no more, no fewer), the architecture and every config field.
const std::string kModernBert = std::string(PACKBERT_SOURCE_DIR) + "/tests/data/modernbert";
const char* kTokenizerJson =
    R"({"version":"1.0","model":{"type":"BPE","vocab":{"a":0},"merges":[]}})"
    "\n";

TEST_F(Convert, ModernBertDirectoriesConvertAndExportBitIdentical) {
  const std::pair<const char*, const char*> cases[] = {
      {"mlm", "pre-training"}, {"classifier", "classifier"}, {"qa", "span (SQuAD)"}};
  for (const auto& [name, head] : cases) {
    SCOPED_TRACE(name);
    const fs::path src = dir_ / (std::string("src_") + name);
    fs::copy(kModernBert + "/" + name, src);
    std::ofstream(src / "tokenizer.json") << kTokenizerJson;
    const fs::path converted = dir_ / (std::string("c_") + name);
    const Result c = run("convert " + src.string() + " --out " + converted.string());
    ASSERT_EQ(c.code, 0) << c.err;
    EXPECT_NE(c.out.find(std::string("heads:   ") + head), std::string::npos) << c.out;
    EXPECT_EQ(c.out.find("absent:"), std::string::npos) << c.out;
    const io::SafetensorsFile source =
        io::SafetensorsFile::read((src / "model.safetensors").string());
    expect_identical(io::SafetensorsFile::read((converted / "model.safetensors").string()), source);
    EXPECT_EQ(testing::slurp(converted / "config.json"), testing::slurp(src / "config.json"));
    EXPECT_EQ(testing::slurp(converted / "tokenizer.json"), kTokenizerJson);
    EXPECT_FALSE(fs::exists(converted / "vocab.txt"));

    const fs::path exported = dir_ / (std::string("e_") + name);
    const Result e = run("export --model " + converted.string() + " --out " + exported.string());
    ASSERT_EQ(e.code, 0) << e.err;
    expect_identical(io::SafetensorsFile::read((exported / "model.safetensors").string()), source);
    const json want = json::parse(testing::slurp(src / "config.json"));
    const json got = json::parse(testing::slurp(exported / "config.json"));
    for (const auto& [key, value] : want.items())
      if (key != "transformers_version") {
        ASSERT_TRUE(got.contains(key)) << key;
        EXPECT_EQ(got[key], value) << key;
      }
    EXPECT_EQ(testing::slurp(exported / "tokenizer.json"), kTokenizerJson);
    EXPECT_FALSE(fs::exists(exported / "vocab.txt"));
  }
}

// What ModernBERT's tensors and config come to in packbert: the layout's names are transformers'
// (layer 0 without an attention norm, a bias only where the config asks for one), the older and
// newer config keys read the same, and what packbert cannot run is refused by its key.
TEST(ModernBertConfig, ReadsBothFormsAndRefusesWhatItCannotRun) {
  const json mlm = json::parse(testing::slurp(kModernBert + "/mlm/config.json"));
  const model::BertConfig c = model::config_from_json(mlm, "mlm");
  EXPECT_EQ(c.family, model::Family::modernbert);
  EXPECT_EQ(c.modern.local_attention, 8);
  EXPECT_EQ(c.modern.window(0), 0);  // global every 3rd layer from layer 0
  EXPECT_EQ(c.modern.window(1), 8);
  EXPECT_EQ(c.modern.window(3), 0);
  EXPECT_EQ(c.modern.rope_theta(0), 160000.0);
  EXPECT_EQ(c.modern.rope_theta(2), 10000.0);
  EXPECT_EQ(c.layer_norm_eps, 1e-5);
  const model::ParamLayout layout(c, model::Heads{true, false, false});
  EXPECT_EQ(layout.find("model.layers.0.attn_norm.weight"), nullptr);
  EXPECT_NE(layout.find("model.layers.1.attn_norm.weight"), nullptr);
  EXPECT_EQ(layout.find("model.layers.1.attn.Wqkv.bias"), nullptr);
  ASSERT_NE(layout.find("model.layers.1.mlp.Wi.weight"), nullptr);
  EXPECT_EQ(layout.find("model.layers.1.mlp.Wi.weight")->shape, (std::vector<int64_t>{2 * 24, 16}));
  EXPECT_TRUE(layout.find("model.final_norm.weight")->no_decay);
  EXPECT_TRUE(layout.find("decoder.bias")->no_decay);
  EXPECT_FALSE(layout.find("head.dense.weight")->no_decay);

  // transformers 5's keys: layer_types and rope_parameters.
  json modern = mlm;
  for (const char* key : {"global_attn_every_n_layers", "global_rope_theta", "local_rope_theta"})
    modern.erase(key);
  modern["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention",
                           "full_attention"};
  modern["rope_parameters"] = {
      {"full_attention", {{"rope_type", "default"}, {"rope_theta", 160000.0}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
  EXPECT_EQ(model::config_from_json(modern, "new").modern, c.modern);
  // And back: what packbert writes reads as it was read.
  EXPECT_EQ(model::config_from_json(model::config_to_json(c, "ModernBertForMaskedLM"), "w").modern,
            c.modern);

  const std::pair<json, const char*> refused[] = {
      {{{"hidden_activation", "silu"}}, "hidden_activation \"silu\" is not supported"},
      {{{"classifier_activation", "tanh"}}, "classifier_activation \"tanh\" is not supported"},
      {{{"tie_word_embeddings", false}}, "tie_word_embeddings false is not supported"},
      {{{"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}}}, "rope_scaling"},
      {{{"rope_parameters", {{"full_attention", {{"rope_type", "yarn"}}}}}}, "rope_type \"yarn\""},
      {{{"layer_types",
         {"full_attention", "full_attention", "sliding_attention", "sliding_attention"}}},
       "layer_types is not periodic"},
      {{{"layer_types",
         {"sliding_attention", "full_attention", "full_attention", "full_attention"}}},
       "layer_types starts with a sliding layer"},
      {{{"classifier_pooling", "max"}}, "classifier_pooling \"max\""},
      {{{"local_attention", 7}}, "local_attention 7 must be positive and even"},
      {{{"model_type", "roberta"}}, "model_type \"roberta\" is not BERT or ModernBERT"},
  };
  for (const auto& [change, message] : refused) {
    json j = mlm;
    j.update(change);
    try {
      (void)model::config_from_json(j, "cfg");
      ADD_FAILURE() << change.dump() << " was read";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
}

// Until ModernBERT's layers are built, running the model (every step, evaluation and prediction
// goes through forward) is refused in one line naming what is missing, before it reads anything.
TEST(Import, LoadModelReadsEveryForm) {
  const io::SafetensorsFile want = expected();
  for (const std::string src : {"/tied", "/sharded", "/sharded/pytorch_model.bin.index.json",
                                "/tied/pytorch_model.bin", "/half", "/bfloat16"}) {
    SCOPED_TRACE(src);
    auto m = train::load_model(kTorch + src, model::Heads{});
    const float* p = m->params().data();
    const io::SafetensorsFile low = src == "/half"       ? expected("_half")
                                    : src == "/bfloat16" ? expected("_bfloat16")
                                                         : want;
    for (const model::TensorSpec& t : m->layout().tensors()) {
      const std::vector<float> v = low.floats(t.name);
      ASSERT_EQ(v.size(), t.numel) << t.name;
      EXPECT_EQ(0, std::memcmp(v.data(), p + t.offset, v.size() * sizeof(float))) << t.name;
    }
  }
}

// Fine-tuning (and pre-training from an encoder) start from a model without their head: the
// missing tensors outside the encoder keep the seed's initialisation and are named; the encoder
// comes from the file. Without `fresh` (eval, export) a missing tensor is an error; a source
// with no config.json is refused rather than guessed.
TEST(Import, MissingHeadsAreInitialisedFreshOnlyWhenAsked) {
  train::FreshTensors fresh{5, 3, {}};
  model::Heads cls;
  cls.pretraining = false, cls.classifier = true;
  auto m = train::load_model(kTorch + "/tied", cls, {}, &fresh);
  EXPECT_EQ(fresh.initialized, (std::vector<std::string>{"classifier.weight", "classifier.bias"}));
  EXPECT_EQ(m->config().num_labels, 3);
  const io::SafetensorsFile want = expected();
  const model::TensorSpec* q = m->layout().find("bert.encoder.layer.1.attention.self.value.weight");
  const std::vector<float> v = want.floats(q->name);
  EXPECT_EQ(0, std::memcmp(v.data(), m->params().data() + q->offset, v.size() * sizeof(float)));
  const model::TensorSpec* c = m->layout().find("classifier.weight");
  float norm = 0;
  for (size_t i = 0; i < c->numel; ++i) norm += std::abs(m->params()[c->offset + i]);
  EXPECT_GT(norm, 0);  // initialised, not left zero

  const fs::path dir = fs::temp_directory_path() / ("packbert_import_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kTorch + "/old_names.bin", dir / "pytorch_model.bin");
  try {
    (void)train::load_model((dir / "pytorch_model.bin").string(), model::Heads{});
    ADD_FAILURE() << "no config.json: expected an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: cannot open"), std::string::npos)
        << e.what();
  }
  fs::copy_file(kTorch + "/tied/config.json", dir / "config.json");
  try {
    (void)train::load_model(dir.string(), model::Heads{});
    ADD_FAILURE() << "a BertModel without pre-training heads: expected an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor 'cls."), std::string::npos) << e.what();
  }
  train::FreshTensors heads{5, 0, {}};
  (void)train::load_model(dir.string(), model::Heads{}, {}, &heads);
  EXPECT_EQ(heads.initialized.size(), 7u);  // the MLM transform, its LayerNorm, bias, NSP
  fs::remove_all(dir);
}

TEST(TorchFile, Zip64RecordsReadTheSame) {
  const std::string path = kTorch + "/tied/pytorch_model.bin";
  const std::vector<io::TorchTensor> plain = io::read_torch_file(path);
  const std::vector<io::TorchTensor> z64 =
      io::parse_torch_file(make_zip(zip_entries(path), true), "zip64");
  ASSERT_EQ(plain.size(), z64.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(plain[i].name, z64[i].name);
    EXPECT_EQ(plain[i].data, z64[i].data) << plain[i].name;
  }
}

TEST(TorchFile, CorruptionIsNamed) {
  const std::string path = kTorch + "/tied/pytorch_model.bin";
  auto entries = zip_entries(path);
  auto error_of = [](const std::string& bytes) {
    try {
      io::parse_torch_file(bytes, "f");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string bytes = testing::slurp(path);
  EXPECT_NE(error_of(bytes.substr(0, bytes.size() / 2)).find("no end-of-central-directory"),
            std::string::npos);
  // A flipped data byte fails its entry's CRC-32.
  const io::ZipArchive z = io::ZipArchive::parse(bytes, "f");
  const std::string pkl(z.bytes("pytorch_model/data.pkl").substr(0, 16));
  std::string flipped = testing::slurp(path);
  const size_t at = flipped.find(pkl);
  ASSERT_NE(at, std::string::npos);
  flipped[at + 5] ^= 0x40;
  EXPECT_NE(error_of(flipped).find("data.pkl: corrupted (CRC-32 mismatch)"), std::string::npos);
  // A storage shorter than the tensors that view it.
  for (auto& [name, data] : entries)
    if (name == "pytorch_model/data/0") data.resize(data.size() - 4);
  EXPECT_NE(error_of(make_zip(entries, false)).find("expected"), std::string::npos);
  // An unknown opcode, placed where the pickle starts.
  for (auto& [name, data] : zip_entries(path))
    if (name == "pytorch_model/data.pkl") {
      auto e = zip_entries(path);
      for (auto& [n, d] : e)
        if (n == name) d[2] = static_cast<char>(0xff);
      EXPECT_NE(error_of(make_zip(e, false)).find("unsupported pickle opcode 0xff"),
                std::string::npos);
    }
}

// Random damage to the container and, with CRCs made right again, to the pickle itself: the
// reader returns tensors or one InputError, never crashes or reads out of bounds (ASan in CI).
TEST(TorchFile, FuzzedFilesNeverCrash) {
  const std::string path = kTorch + "/tied/pytorch_model.bin";
  const std::string good = testing::slurp(path);
  const auto entries = zip_entries(path);
  std::mt19937 rng(7);
  int errors = 0, parsed = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bad;
    if (trial % 2) {  // the pickle, re-zipped with its CRC fixed
      auto e = entries;
      for (auto& [name, d] : e) {
        if (!name.ends_with("data.pkl")) continue;
        switch (trial % 6) {
          case 1:
            d.resize(rng() % d.size());
            break;
          case 3:
            for (int k = 0; k < 3; ++k) d[rng() % d.size()] = static_cast<char>(rng());
            break;
          default:
            d.insert(rng() % d.size(), 1, static_cast<char>(rng()));
        }
      }
      bad = make_zip(e, trial % 4 == 1);
    } else {  // the container
      bad = good;
      if (trial % 4 == 0) {
        bad.resize(rng() % bad.size());
      } else {
        for (int k = 0; k < 4; ++k) bad[bad.size() - 1 - rng() % 4000] = static_cast<char>(rng());
      }
    }
    try {
      (void)io::parse_torch_file(bad, "fuzz");
      ++parsed;
    } catch (const InputError&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 1000);
  EXPECT_GT(parsed, 0);  // some damage (in names or padding) leaves a readable file
}

}  // namespace
}  // namespace packbert
