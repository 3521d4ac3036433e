// The small training world the trainer and fine-tuning tests share: a 40-token vocabulary, a
// synthetic corpus with learnable structure and a tiny model exported as an --init directory.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "data/pretraining.h"
#include "error.h"
#include "train/trainer.h"

namespace packbert::train {

namespace fs = std::filesystem;

// A small world: a 40-token vocabulary, a synthetic corpus with learnable structure (Zipf word
// frequencies, and sentences that count upwards half of the time), a tiny model exported as
// the --init directory.
struct World {
  fs::path dir;
  std::string vocab, seqs, packs, init;
  std::string seqs64;  // the same corpus in sequences of up to 64 tokens (a second phase)
  World() {
    dir = fs::temp_directory_path() /
          ("packbert_train_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir);
    std::vector<std::string> tokens = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    for (int i = 0; i < 35; ++i) tokens.push_back(std::to_string(i).insert(0, 1, 'w'));
    vocab = (dir / "vocab.txt").string();
    {
      std::ofstream v(vocab);
      for (auto& t : tokens) v << t << "\n";
    }
    data::Vocab vb = data::Vocab::load(vocab);
    std::mt19937 rng(3);
    std::vector<double> weights;
    for (int r = 1; r <= 35; ++r) weights.push_back(1.0 / std::pow(r, 1.5));
    std::vector<data::Document> docs(120);
    for (auto& d : docs)
      for (int s = 0; s < 4; ++s) {
        data::Sentence sent;
        int start = static_cast<int>(rng() % 20), len = 3 + static_cast<int>(rng() % 6);
        std::discrete_distribution<int> zipf(weights.begin(), weights.end());
        bool counting = rng() % 2;
        for (int i = 0; i < len; ++i) sent.push_back(5 + (counting ? (start + i) % 35 : zipf(rng)));
        d.push_back(sent);
      }
    data::PretrainingOptions o;
    o.max_seq_len = 32;
    data::SequencesFile f = data::create_pretraining_data(docs, vb, o);
    seqs = (dir / "d.seqs").string();
    packs = (dir / "d.packs").string();
    data::write_sequences(seqs, f);
    o.max_seq_len = 64;
    seqs64 = (dir / "d64.seqs").string();
    data::write_sequences(seqs64, data::create_pretraining_data(docs, vb, o));
    pack::PackOptions po;
    po.max_len = 32;
    data::write_packs(packs, data::make_packs(f, data::sequences_checksum(seqs),
                                              pack::Algo::optimal, po, 1, nullptr));
    model::BertConfig c;
    c.vocab_size = 40;
    c.hidden_size = 16;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 2;
    c.intermediate_size = 32;
    c.max_position_embeddings = 32;
    model::BertModel m(c, model::Heads{});
    model::init_params(m.layout(), m.params().data(), 7);
    init = (dir / "init").string();
    ModelFiles files;
    files.vocab = vocab;
    export_model(m, init, files);
  }
  ~World() { fs::remove_all(dir); }
  PretrainOptions options(const std::string& run) const {
    PretrainOptions o;
    o.sequences = seqs;
    o.packs = packs;
    o.vocab = vocab;
    o.init = init;
    o.out_dir = (dir / run).string();
    o.loop.rows_per_batch = 4;
    o.max_steps = 8;
    o.loop.lr = 5e-3;
    o.loop.warmup_steps = 2;
    o.eval_fraction = 0.1;
    o.checkpoint_every = 3;
    return o;
  }
  // A run long and fast enough to learn the corpus: 120 AdamW steps at 1e-2, no checkpoints.
  PretrainOptions learning_options(const std::string& run) const {
    PretrainOptions o = options(run);
    o.max_steps = 120;
    o.loop.lr = 1e-2;
    o.loop.optimizer.kind = OptimizerKind::adamw;
    o.loop.warmup_steps = 10;
    o.checkpoint_every = 0;
    return o;
  }
};

}  // namespace packbert::train
