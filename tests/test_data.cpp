// Data: tokenizer parity with Hugging Face BertTokenizer, robustness, vocabulary errors.
#include <gtest/gtest.h>
#include <omp.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "cli_runner.h"
#include "data/casing.h"
#include "data/classify_tsv.h"
#include "data/corpus.h"
#include "data/gcide.h"
#include "data/pretraining.h"
#include "data/sequences.h"
#include "data/squad.h"
#include "data/tokenizer.h"
#include "data/tokenizer_json.h"
#include "error.h"
#include "train/loader.h"

namespace packbert::data {
namespace {

const Vocab& base_vocab() {
  static const Vocab v = Vocab::load(PACKBERT_SOURCE_VOCAB);
  return v;
}

TEST(Vocab, DefaultIsBertBaseUncased) {
  const Vocab& v = base_vocab();
  EXPECT_EQ(v.size(), 30522);
  EXPECT_EQ(v.pad(), 0);
  EXPECT_EQ(v.unk(), 100);
  EXPECT_EQ(v.cls(), 101);
  EXPECT_EQ(v.sep(), 102);
  EXPECT_EQ(v.mask(), 103);
  EXPECT_EQ(v.token(1), "[unused0]");
  EXPECT_EQ(v.token(1996), "the");
}

TEST(Tokenizer, IssueAnchors) {
  Tokenizer t(base_vocab(), true);
  EXPECT_EQ(t.encode("Hello, world!"), (std::vector<int32_t>{7592, 1010, 2088, 999}));
  EXPECT_EQ(t.encode("unaffable"), (std::vector<int32_t>{14477, 20961, 3468}));
  EXPECT_EQ(t.encode("Héllo naïve café"), (std::vector<int32_t>{7592, 15743, 7668}));
  EXPECT_EQ(t.encode("The quick brown fox jumps over the lazy dog."),
            (std::vector<int32_t>{1996, 4248, 2829, 4419, 14523, 2058, 1996, 13971, 3899, 1012}));
}

// tests/golden/tokenizer.jsonl: CJK, accents, control characters, punctuation runs, long
// words, special tokens inside text, scripts, ligatures (tools/bert_tokenizer_reference.py).
TEST(Tokenizer, MatchesReferenceGoldens) {
  Tokenizer t(base_vocab(), true);
  std::ifstream in(std::string(PACKBERT_SOURCE_DIR) + "/tests/golden/tokenizer.jsonl");
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    std::string text = j["text"];
    EXPECT_EQ(t.encode(text), j["ids"].get<std::vector<int32_t>>()) << text;
    EXPECT_EQ(t.pieces(text), j["pieces"].get<std::vector<std::string>>()) << text;
    ++cases;
  }
  EXPECT_GE(cases, 30);
}

TEST(Tokenizer, InvalidUtf8IsDroppedNeverACrash) {
  Tokenizer t(base_vocab(), true);
  EXPECT_EQ(t.encode("caf\xc3"), t.encode("caf"));
  EXPECT_EQ(t.encode("a\xff\xfe b"), t.encode("a b"));
  std::mt19937 rng(1);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    for (int32_t id : t.encode(s)) ASSERT_TRUE(id >= 0 && id < base_vocab().size());
  }
}

TEST(Tokenizer, CasedKeepsCaseAndAccents) {
  Vocab v = Vocab::from_tokens(
      {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Héllo", "hello", "World", "##s", "!"},
      "mini");
  Tokenizer cased(v, false), uncased(v, true);
  EXPECT_EQ(cased.pieces("Héllo Worlds!"),
            (std::vector<std::string>{"Héllo", "World", "##s", "!"}));
  EXPECT_EQ(uncased.pieces("Héllo Worlds!"), (std::vector<std::string>{"hello", "[UNK]", "!"}));
}

TEST(Vocab, BadVocabulariesAreOneLineErrors) {
  auto expect_error = [](std::vector<std::string> tokens, const std::string& fragment) {
    try {
      Vocab::from_tokens(std::move(tokens), "v.txt");
      ADD_FAILURE() << fragment;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error({}, "v.txt: vocabulary is empty");
  expect_error({"[PAD]", "[UNK]", "[CLS]", "[SEP]"}, "v.txt: vocabulary has no [MASK] token");
  expect_error({"[PAD]", "a", "[UNK]", "a"}, "v.txt:4: token 'a' repeats line 2");
  EXPECT_THROW(Vocab::load("/nonexistent/vocab.txt"), InputError);
}

// A synthetic corpus over the real vocabulary: documents of random length, sentences of random
// words (ids of whole words and some ## continuations).
std::vector<Document> synthetic_corpus(size_t docs, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Document> out(docs);
  for (Document& d : out) {
    int sentences = 1 + static_cast<int>(rng() % 12);
    for (int s = 0; s < sentences; ++s) {
      Sentence sent;
      int words = 3 + static_cast<int>(rng() % 25);
      for (int w = 0; w < words; ++w) sent.push_back(1996 + static_cast<int32_t>(rng() % 27000));
      d.push_back(std::move(sent));
    }
  }
  return out;
}

TEST(Pretraining, MaskingAndNspStatistics) {
  const Vocab& v = base_vocab();
  PretrainingOptions o;
  o.max_seq_len = 128;
  o.dupe_factor = 2;
  o.split_single_sentence = true;  // NSP exactly 50/50 (Google's rule skews it on short docs)
  SequencesFile f = create_pretraining_data(synthetic_corpus(6000, 1), v, o);
  ASSERT_GT(f.size(), 10000u);
  int64_t eligible = 0, masked = 0, as_mask = 0, kept = 0, random = 0, nsp = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    ASSERT_LE(f.length(i), 128);
    const int32_t* t = f.tokens.data() + f.token_offsets[i];
    EXPECT_EQ(t[0], v.cls());
    EXPECT_EQ(t[f.length(i) - 1], v.sep());
    EXPECT_EQ(t[f.b_start[i] - 1], v.sep());
    eligible += f.length(i) - 3;
    nsp += f.nsp_label[i];
    for (uint64_t k = f.mlm_offsets[i]; k < f.mlm_offsets[i + 1]; ++k) {
      int32_t original = t[f.mlm_positions[k]], input = f.mlm_inputs[k];
      ASSERT_NE(original, v.cls());
      ASSERT_NE(original, v.sep());
      ++masked;
      if (input == v.mask())
        ++as_mask;
      else if (input == original)
        ++kept;
      else
        ++random;
    }
  }
  EXPECT_NEAR(static_cast<double>(masked) / eligible, 0.15, 0.005);
  EXPECT_NEAR(static_cast<double>(as_mask) / masked, 0.8, 0.01);
  EXPECT_NEAR(static_cast<double>(kept) / masked, 0.1, 0.01);
  EXPECT_NEAR(static_cast<double>(random) / masked, 0.1, 0.01);
  EXPECT_NEAR(static_cast<double>(nsp) / f.size(), 0.5, 0.01);
}

TEST(Pretraining, DeterministicWhateverTheThreadCount) {
  PretrainingOptions o;
  o.whole_word_mask = true;
  std::vector<Document> docs = synthetic_corpus(500, 2);
  omp_set_num_threads(1);
  SequencesFile a = create_pretraining_data(docs, base_vocab(), o);
  omp_set_num_threads(2);
  SequencesFile b = create_pretraining_data(docs, base_vocab(), o);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.mlm_positions, b.mlm_positions);
  EXPECT_EQ(a.mlm_inputs, b.mlm_inputs);
  EXPECT_EQ(a.nsp_label, b.nsp_label);
  o.seed = 99;
  SequencesFile c = create_pretraining_data(docs, base_vocab(), o);
  EXPECT_NE(a.tokens, c.tokens);
}

TEST(Pretraining, EdgeCorpora) {
  EXPECT_THROW(create_pretraining_data({}, base_vocab(), PretrainingOptions{}), InputError);
  Document one = {{2023, 2003, 1037, 6251, 1012}};  // a document of one sentence
  SequencesFile f = create_pretraining_data({one}, base_vocab(), PretrainingOptions{});
  EXPECT_EQ(f.size(), 1u);
  EXPECT_LE(f.length(0), 128);
}

TEST(Corpus, SentenceSplitter) {
  EXPECT_EQ(split_sentences("Dr. Smith went home. He slept! Did he? Yes."),
            (std::vector<std::string>{"Dr. Smith went home.", "He slept!", "Did he?", "Yes."}));
  EXPECT_EQ(
      split_sentences("It costs 3.14 dollars, e.g. cheap. J. R. Tolkien wrote it."),
      (std::vector<std::string>{"It costs 3.14 dollars, e.g. cheap.", "J. R. Tolkien wrote it."}));
  EXPECT_EQ(split_sentences("He said \"stop.\" Then he left. the end"),
            (std::vector<std::string>{"He said \"stop.\"", "Then he left. the end"}));
}

std::filesystem::path temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           ("packbert_data_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::create_directories(d);
  return d;
}

TEST(Corpus, ReadsGoogleConventionAndRawText) {
  auto d = temp_dir("corpus");
  std::ofstream(d / "a.txt") << "First sentence here.\nSecond one.\n\n\nOther document.\n";
  Tokenizer t(base_vocab(), true);
  auto docs = read_corpus({(d / "a.txt").string()}, t, {});
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].size(), 2u);
  std::ofstream(d / "b.txt") << "Raw text. It has two sentences.\n\nAnd a second doc.\n";
  auto raw = read_corpus({(d / "b.txt").string()}, t, {.split_sentences = true});
  ASSERT_EQ(raw.size(), 2u);
  EXPECT_EQ(raw[0].size(), 2u);
  EXPECT_THROW(read_corpus({(d / "missing.txt").string()}, t, {}), InputError);
  std::filesystem::remove_all(d);
}

TEST(Files, SequencesAndPacksRoundTripAndRejectDamage) {
  auto d = temp_dir("files");
  SequencesFile f =
      create_pretraining_data(synthetic_corpus(200, 3), base_vocab(), PretrainingOptions{});
  std::string seqs = (d / "x.seqs").string(), packs = (d / "x.packs").string();
  write_sequences(seqs, f);
  SequencesFile g = read_sequences(seqs);
  EXPECT_EQ(g.tokens, f.tokens);
  EXPECT_EQ(g.mlm_inputs, f.mlm_inputs);
  EXPECT_EQ(g.vocab_fingerprint, base_vocab().fingerprint());
  pack::PackOptions po;
  po.max_len = 128;
  PacksFile p = make_packs(f, sequences_checksum(seqs), pack::Algo::lpfhp, po, 5, nullptr);
  write_packs(packs, p);
  PacksFile q = read_packs(packs);
  EXPECT_EQ(q.ids, p.ids);
  EXPECT_EQ(q.algo, "lpfhp");
  EXPECT_EQ(file_kind(seqs), "sequences");
  EXPECT_EQ(file_kind(packs), "packs");

  std::string bytes;
  {
    std::ifstream in(seqs, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto expect_error = [&](const std::string& content, const std::string& fragment, bool is_packs) {
    std::string path = (d / "bad").string();
    std::ofstream(path, std::ios::binary) << content;
    try {
      if (is_packs)
        read_packs(path);
      else
        read_sequences(path);
      ADD_FAILURE() << fragment;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error(bytes.substr(0, bytes.size() - 100), "truncated", false);
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x10;
  expect_error(flipped, "checksum mismatch", false);
  expect_error("hello", "not a packbert sequences file", false);
  std::string future = bytes;
  future[8] = 9;
  expect_error(future, "version 9", false);
  std::string pbytes;
  {
    std::ifstream in(packs, std::ios::binary);
    pbytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  expect_error(pbytes.substr(0, pbytes.size() - 8), "truncated", true);
  std::filesystem::remove_all(d);
}

// The synthetic corpus as sequences of up to 128 tokens and their optimal packs (checksum 42).
std::pair<SequencesFile, PacksFile> packed_synthetic_corpus() {
  SequencesFile f =
      create_pretraining_data(synthetic_corpus(300, 4), base_vocab(), PretrainingOptions{});
  pack::PackOptions po;
  po.max_len = 128;
  PacksFile p = make_packs(f, 42, pack::Algo::optimal, po, 1, nullptr);
  return {std::move(f), std::move(p)};
}

TEST(Loader, EpochCoversEverySequenceOnceAndResumesExactly) {
  const auto [f, p] = packed_synthetic_corpus();
  train::LoaderOptions lo;
  lo.rows_per_batch = 7;
  model::BertConfig cfg;
  cfg.max_position_embeddings = 128;
  std::vector<model::PackedBatch> first;
  train::Cursor mid;
  {
    train::BatchLoader loader(f, 42, &p, &base_vocab(), lo, {});
    // Every served sequence, as its original token ids (a masked slot's label is its original
    // token), must be one of the file's, and each of the file's served exactly once.
    std::multiset<std::vector<int32_t>> expected, served;
    for (size_t i = 0; i < f.size(); ++i)
      expected.insert(std::vector<int32_t>(f.tokens.begin() + f.token_offsets[i],
                                           f.tokens.begin() + f.token_offsets[i + 1]));
    while (loader.cursor().epoch == 0) {
      model::PackedBatch b = loader.next();
      model::TokenLayout t = model::token_layout(b, cfg);  // valid for the engine
      for (int q = 0; q < t.sequences(); ++q) {
        std::vector<int32_t> ids;
        for (int k = t.cu_seqlens[q]; k < t.cu_seqlens[q + 1]; ++k) {
          const int32_t slot = t.slot[k];
          ids.push_back(b.mlm_labels[slot] != -100 ? b.mlm_labels[slot] : b.input_ids[slot]);
        }
        served.insert(std::move(ids));
      }
      first.push_back(b);
      if (first.size() == 3) mid = loader.cursor();
    }
    EXPECT_EQ(served.size(), f.size());
    EXPECT_TRUE(served == expected) << "an epoch must serve each sequence of the file once";
  }
  train::BatchLoader resumed(f, 42, &p, &base_vocab(), lo, mid);
  for (size_t i = 3; i < 6; ++i) {
    model::PackedBatch b = resumed.next();
    EXPECT_EQ(b.input_ids, first[i].input_ids);
    EXPECT_EQ(b.mlm_labels, first[i].mlm_labels);
  }
  EXPECT_THROW(train::BatchLoader(f, 43, &p, &base_vocab(), lo, {}), InputError);  // other file
}

TEST(Loader, PaddedBaselineAndDynamicMasking) {
  SequencesFile f =
      create_pretraining_data(synthetic_corpus(100, 5), base_vocab(), PretrainingOptions{});
  train::LoaderOptions lo;
  lo.rows_per_batch = 4;
  lo.dynamic_masking = true;
  train::BatchLoader loader(f, 0, nullptr, &base_vocab(), lo, {});
  model::PackedBatch b = loader.next();
  EXPECT_EQ(b.B, 4);
  EXPECT_EQ(b.K, 1);
  train::Cursor after;
  model::PackedBatch e0 = loader.build({0, 0}, &after), e1 = loader.build({1, 0}, &after);
  EXPECT_EQ(loader.build({0, 0}, &after).mlm_labels, e0.mlm_labels);  // deterministic
  EXPECT_NE(e0.mlm_labels, e1.mlm_labels);  // new masks (and order) next epoch
}

// The padded side of a paired comparison: the same packs, each sequence in a row of its own with
// computed padding, serve the packed loader's sequences in the same order, step for step.
TEST(Loader, OnePerRowServesThePackedSequencesInOrder) {
  const auto [f, p] = packed_synthetic_corpus();
  model::BertConfig cfg;
  cfg.max_position_embeddings = 128;
  train::LoaderOptions lo;
  lo.rows_per_batch = 5;
  lo.seed = 3;
  train::LoaderOptions lr = lo;
  lr.one_per_row = lr.compute_padding = true;
  train::BatchLoader packed(f, 42, &p, &base_vocab(), lo, {}),
      rows(f, 42, &p, &base_vocab(), lr, {});
  // A real sequence's tokens, NSP label and MLM labels, in layout order.
  auto sequences = [&](const model::PackedBatch& b) {
    model::TokenLayout t = model::token_layout(b, cfg);
    std::vector<std::vector<int32_t>> out;
    for (int q = 0; q < t.sequences(); ++q) {
      if (t.nsp_label[q] == -100) continue;  // computed padding
      std::vector<int32_t> seq = {t.nsp_label[q]};
      for (int k = t.cu_seqlens[q]; k < t.cu_seqlens[q + 1]; ++k)
        seq.insert(seq.end(), {b.input_ids[t.slot[k]], b.mlm_labels[t.slot[k]]});
      out.push_back(std::move(seq));
    }
    return std::pair{out, t};
  };
  for (int step = 0; step < 8; ++step) {
    model::PackedBatch a = packed.next(), b = rows.next();
    EXPECT_EQ(b.S, 128);
    EXPECT_EQ(b.K, 1);
    auto [sa, ta] = sequences(a);
    auto [sb, tb] = sequences(b);
    EXPECT_EQ(b.B, static_cast<int>(sa.size())) << "one row per sequence";
    EXPECT_EQ(sa, sb) << "step " << step;
    // Every slot of the padded rows is computed, real tokens first, at the packed indices.
    EXPECT_EQ(tb.tokens(), b.B * b.S);
    EXPECT_EQ(tb.cu_seqlens[sa.size()], ta.tokens());
  }
  EXPECT_EQ(packed.cursor(), rows.cursor());
  lr.compute_padding = true;
  lr.one_per_row = false;
  EXPECT_THROW(train::BatchLoader(f, 42, &p, &base_vocab(), lr, {}), InputError);
}

TEST(Gcide, ConvertsDictdIndexAndDictzip) {
  auto d = temp_dir("gcide");
  std::string text =
      "Apple \\Ap\"ple\\, n. The fleshy [a^]pple of a tree {Pyrus malus}.\n   [1913 Webster]\n";
  std::string other = "Pear, n. A fruit. It is sweet.\n";
  std::string data = text + other;
  gzFile g = gzopen((d / "x.dict.dz").string().c_str(), "wb");
  gzwrite(g, data.data(), static_cast<unsigned>(data.size()));
  gzclose(g);
  // dictd base64: offset 0 = "A"; lengths written in the same alphabet.
  auto b64 = [](size_t v) {
    const std::string digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string s;
    do s.insert(s.begin(), digits[v % 64]), v /= 64;
    while (v);
    return s;
  };
  std::ofstream(d / "x.index") << "00-database-info\tA\tB\napple\tA\t" << b64(text.size())
                               << "\nApple\tA\t" << b64(text.size()) << "\npear\t"
                               << b64(text.size()) << "\t" << b64(other.size()) << "\n";
  size_t entries = 0;
  std::string out = gcide_to_text((d / "x.index").string(), (d / "x.dict.dz").string(), &entries);
  EXPECT_EQ(entries, 2u);
  EXPECT_EQ(
      out,
      "Apple , n. The fleshy apple of a tree Pyrus malus.\n\nPear, n. A fruit.\nIt is sweet.\n\n");
  std::ofstream(d / "bad.index") << "apple\t!!\tB\n";
  EXPECT_THROW(gcide_to_text((d / "bad.index").string(), (d / "x.dict.dz").string()), InputError);
  std::filesystem::remove_all(d);
}

// #45: the GLUE tasks' TSV layouts are recognised by header (QNLI's question and sentence are a
// pair, not a sentence with a column dropped); a column that is neither text, label nor known to
// be ignorable is refused; --text-columns/--label-column name them for anything else.
TEST(ClassifyTsv, GlueLayoutsAreRecognisedAndAnUnknownColumnIsRefused) {
  const Tokenizer tok(base_vocab(), true);
  const std::string dir = ::testing::TempDir();
  auto read = [&](const std::string& header, const std::string& row, const TsvColumns& c = {}) {
    const std::string path = dir + "/glue.tsv";
    std::ofstream(path) << header << "\n" << row << "\n";
    std::map<std::string, int32_t> labels;
    return read_classification_tsv(path, tok, 64, labels, true, c);
  };
  const std::vector<int32_t> king = tok.encode("the king"), war = tok.encode("the war");
  // Each layout with "the king" as its first text, "the war" as its second (when it has one).
  // glue: the task the header shows (its metric leads the scores); "" where layouts are shared.
  struct Layout {
    const char* task;
    std::string header, row;
    bool pair;
    const char* glue;
  };
  for (const Layout& l : std::vector<Layout>{
           {"SST-2", "sentence\tlabel", "the king\t1", false, ""},
           {"CoLA", "sentence\tlabel\tidx", "the king\t1\t0", false, ""},
           {"MRPC", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "1\t7\t8\tthe king\tthe war",
            true, "mrpc"},
           {"QQP", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
            "0\t1\t2\tthe king\tthe war\t0", true, "qqp"},
           {"MNLI",
            "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
            "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label",
            "0\t1\t2\tfiction\t( x )\t( y )\t(ROOT x)\t(ROOT y)\tthe king\tthe war\tneutral\t"
            "neutral",
            true, "mnli"},
           {"QNLI", "index\tquestion\tsentence\tlabel", "0\tthe king\tthe war\tentailment", true,
            "qnli"},
           {"RTE", "index\tsentence1\tsentence2\tlabel", "0\tthe king\tthe war\tentailment", true,
            ""},
           {"WNLI", "index\tsentence1\tsentence2\tlabel", "0\tthe king\tthe war\t1", true, ""},
           {"STS-B",
            "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\t"
            "score",
            "0\tmain-captions\tMSRvid\t2012test\t1\tnone\tnone\tthe king\tthe war\t3.800", true,
            "stsb"}}) {
    const std::vector<ClassifyExample> ex = read(l.header, l.row);
    ASSERT_EQ(ex.size(), 1u) << l.task;
    EXPECT_EQ(glue_task(dir + "/glue.tsv", {}), l.glue) << l.task;
    std::vector<int32_t> want = {base_vocab().cls()};
    want.insert(want.end(), king.begin(), king.end());
    want.push_back(base_vocab().sep());
    if (l.pair) {
      want.insert(want.end(), war.begin(), war.end());
      want.push_back(base_vocab().sep());
    }
    EXPECT_EQ(ex[0].tokens, want) << l.task;
    EXPECT_EQ(ex[0].b_start, static_cast<int32_t>(king.size() + 2)) << l.task;
  }
  auto error_of = [&](const std::string& header, const std::string& row, const TsvColumns& c) {
    try {
      read(header, row, c);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("label\tsentence\tnotes", "1\tthe king\tthe war", {})
                .find("column 'notes' is neither the text (sentence), the label (label)"),
            std::string::npos);
  // Named by the user: any layout, other columns unused.
  const std::vector<ClassifyExample> named = read(
      "notes\tverdict\tsentence", "the war\t1\tthe king", {{"sentence", "notes"}, "verdict", ""});
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].b_start, static_cast<int32_t>(king.size() + 2));
  EXPECT_NE(error_of("a\tb", "x\ty", {{"c"}, "a", ""}).find("no column 'c' (`text_columns`)"),
            std::string::npos);
  // #59 item 8: GLUE's own CoLA files have no header (source, label, judgment, sentence): the
  // first line is a row, every row read, and the task is CoLA (MCC leads).
  {
    const std::string path = dir + "/cola.tsv";
    std::ofstream(path) << "gj04\t1\t\tthe king\n"
                        << "gj04\t0\t*\tthe war\n"
                        << "cj99\t1\t\tthe king\n";
    std::map<std::string, int32_t> labels;
    const std::vector<ClassifyExample> cola = read_classification_tsv(path, tok, 64, labels, true);
    ASSERT_EQ(cola.size(), 3u);
    std::vector<int32_t> want = {base_vocab().cls()};
    want.insert(want.end(), war.begin(), war.end());
    want.push_back(base_vocab().sep());
    EXPECT_EQ(cola[1].tokens, want);
    EXPECT_EQ(labels.size(), 2u);
    EXPECT_EQ(cola[0].label, cola[2].label);
    EXPECT_NE(cola[0].label, cola[1].label);
    EXPECT_EQ(glue_task(path, {}), "cola");
  }
  // A task named (run_glue's --task_name) wins over the header; its GLUE metric leads.
  EXPECT_EQ(glue_task(dir + "/glue.tsv", {{}, "", "cola"}), "cola");
  EXPECT_THROW(glue_task(dir + "/glue.tsv", {{}, "", "colaa"}), InputError);
  EXPECT_EQ(glue_metric("cola"), "mcc");
  EXPECT_EQ(glue_metric("mrpc"), "f1");
  EXPECT_EQ(glue_metric("qqp"), "f1");
  EXPECT_EQ(glue_metric("stsb"), "pearson");
  for (const char* t : {"sst2", "mnli", "qnli", "rte", "wnli", ""})
    EXPECT_EQ(glue_metric(t), "accuracy");
}

// #45: a label column is a regression target when Hugging Face's datasets would read it as
// floats (every label a number, one with a decimal point or exponent); the targets are the
// numbers the labels are written as, whatever ids the labels were read under.
TEST(ClassifyTsv, DecimalLabelsAreRegressionTargets) {
  auto seen = [](std::vector<std::string> names) {
    std::map<std::string, int32_t> m;
    for (const std::string& n : names) m.emplace(n, static_cast<int32_t>(m.size()));
    return m;
  };
  EXPECT_TRUE(decimal_labels(seen({"3.800", "0", "5.000"})));
  EXPECT_TRUE(decimal_labels(seen({"1e-2", "2"})));
  EXPECT_FALSE(decimal_labels(seen({"0", "1", "2"})));        // classes
  EXPECT_FALSE(decimal_labels(seen({"3.8", "entailment"})));  // not all numbers
  EXPECT_FALSE(decimal_labels(seen({"nan", "1.5"})));         // not finite
  const std::map<std::string, int32_t> labels = seen({"3.800", "0.5", "-1e1"});
  std::vector<ClassifyExample> ex(4);
  ex[0].label = 2, ex[1].label = 0, ex[2].label = 1, ex[3].label = 0;
  set_targets(ex, labels, "t.tsv");
  EXPECT_EQ(ex[0].target, -10.0f);
  EXPECT_EQ(ex[1].target, 3.8f);
  EXPECT_EQ(ex[2].target, 0.5f);
  EXPECT_EQ(ex[3].target, 3.8f);
  try {
    set_targets(ex, seen({"3.8", "high"}), "t.tsv");
    ADD_FAILURE() << "a non-number label was taken as a target";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("t.tsv: label 'high' is not a number"), std::string::npos);
  }
}

// #45: CSV (quoted fields with commas, doubled quotes and newlines) and JSONL read as TSV does,
// the same columns recognised.
TEST(ClassifyTsv, CsvAndJsonlAreReadLikeTsv) {
  const Tokenizer tok(base_vocab(), true);
  const std::string dir = ::testing::TempDir();
  auto read = [&](const std::string& name, const std::string& text) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    std::map<std::string, int32_t> labels;
    return read_classification_tsv(path, tok, 64, labels, true);
  };
  const std::vector<ClassifyExample> csv =
      read("p.csv",
           "sentence1,sentence2,label,idx\n\"the king, \"\"first\"\"\",the war,1,0\n"
           "\"a city\nof kings\",\"the, war\",0,1\n");
  ASSERT_EQ(csv.size(), 2u);
  std::vector<int32_t> want = {base_vocab().cls()};
  for (int32_t t : tok.encode("the king, \"first\"")) want.push_back(t);
  want.push_back(base_vocab().sep());
  for (int32_t t : tok.encode("the war")) want.push_back(t);
  want.push_back(base_vocab().sep());
  EXPECT_EQ(csv[0].tokens, want);
  std::vector<int32_t> second = {base_vocab().cls()};
  for (int32_t t : tok.encode("a city\nof kings")) second.push_back(t);
  second.push_back(base_vocab().sep());
  for (int32_t t : tok.encode("the, war")) second.push_back(t);
  second.push_back(base_vocab().sep());
  EXPECT_EQ(csv[1].tokens, second);
  const std::vector<ClassifyExample> jsonl = read(
      "p.jsonl",
      "{\"sentence1\": \"the king, \\\"first\\\"\", \"sentence2\": \"the war\", \"label\": 1}\n\n"
      "{\"sentence1\": \"a city\\nof kings\", \"sentence2\": \"the, war\", \"label\": 0}\n");
  ASSERT_EQ(jsonl.size(), 2u);
  EXPECT_EQ(jsonl[0].tokens, csv[0].tokens);
  EXPECT_EQ(jsonl[1].tokens, csv[1].tokens);
  EXPECT_EQ(jsonl[0].label, csv[0].label);
  try {
    read("bad.csv", "sentence,label\n\"never closed,1\n");
    ADD_FAILURE() << "an unterminated quote was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.csv:2: a quoted field never ends"), std::string::npos)
        << e.what();
  }
  try {
    read("bad.jsonl", "{\"sentence\": \"a\", \"label\": 1}\n{\"sentence\": \"b\"}\n");
    ADD_FAILURE() << "a row without the label was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2: no \"label\""), std::string::npos)
        << e.what();
  }
}

// tokenizer.json. The BPE reference is the npm package gpt-3-encoder (OpenAI's encoder in
// JavaScript, fetched by scripts/setup.sh), run by Node.js on the same lines; the WordPiece
// reference is packbert's vocab.txt tokenizer (itself held to Hugging Face's BertTokenizer by the
// tests above). The tokenizer.json files are written by tests/tools/make_tokenizer_json.js from
// the packages' vocabularies in Hugging Face's layout. The lines: GCIDE's last 58,531 (never looked
// at while writing the reader, which was written against its first 2,000) and 20,000 made here
// from pieces of many scripts, digits, punctuation, contractions and kinds of whitespace.
namespace fs = std::filesystem;

class TokenizerJson : public testing::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    gpt_ = std::string(PACKBERT_SOURCE_DIR) + "/assets/gpt-3-encoder";
    if (std::system("command -v node >/dev/null 2>&1") != 0)
      GTEST_SKIP() << "Node.js is not installed (scripts/setup.sh installs it)";
    if (!fs::exists(gpt_ + "/.sha256-ok"))
      GTEST_SKIP() << "assets/gpt-3-encoder is missing (scripts/setup.sh fetches it)";
  }
  void sh(const std::string& cmd) { ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd; }
  std::string make(const std::string& kind) {
    const std::string out = (dir_ / (kind + ".json")).string();
    const std::string tool =
        std::string(PACKBERT_SOURCE_DIR) + "/tests/tools/make_tokenizer_json.js";
    if (kind == "bert")
      sh("node " + tool + " bert " + PACKBERT_SOURCE_VOCAB + " " + out);
    else
      sh("node " + tool + " " + kind + " " + gpt_ + "/encoder.json " + gpt_ + "/vocab.bpe " + out);
    return out;
  }
  // Held-out lines: GCIDE's last ones and made ones.
  std::vector<std::string> lines() {
    std::vector<std::string> out;
    const std::vector<std::string> entries = [] {  // (the demo corpus's text, non-empty lines)
      std::vector<std::string> all;
      std::istringstream text(
          gcide_to_text("/usr/share/dictd/gcide.index", "/usr/share/dictd/gcide.dict.dz"));
      for (std::string line; std::getline(text, line);)
        if (!line.empty()) all.push_back(line);
      return all;
    }();
    for (size_t i = entries.size() > 58531 ? entries.size() - 58531 : 0; i < entries.size(); ++i)
      out.push_back(entries[i]);
    const char* atoms[] = {
        "The",      "naïve",    "café",    "Ünïcödé",    "straße",    "ÆØÅ",        "żółć",
        "Ελληνικά", "русский",  "日本語",  "中文字",     "한국어",    "עברית",      "العربية",
        "हिन्दी",    "ไทย",      "😀",       "👍🏽",   "🚀",         "e\u0301",    "n\u0303o",
        "123",      "4,567.89", "٣٤٥",     "¼",          "Ⅻ",         "x²",         "it's",
        "we're",    "THEY'LL",  "I'd",     "'m",         "'ve",       "can't",      "$100",
        "#tag",     "@user",    "a.b.c",   "--",         "...",       "¿Qué?",      "«quoted»",
        "“curly”",  "—",        "™",       "\t",         "  ",        "\u00a0",     "\u3000",
        "\u2009",   "\u200b",   "_under_", "snake_case", "CamelCase", "http://x.io"};
    std::mt19937 rng(2026);
    for (int n = 0; n < 20000; ++n) {
      std::string line;
      const int k = 1 + static_cast<int>(rng() % 12);
      for (int w = 0; w < k; ++w) {
        line.append(atoms[rng() % (sizeof atoms / sizeof *atoms)]);
        const unsigned gap = rng() % 8;
        line.append(gap < 5 ? " " : gap == 5 ? "" : gap == 6 ? "  " : "\t ");
      }
      out.push_back(line);
    }
    return out;
  }
  std::string gpt_;
};

TEST_F(TokenizerJson, ByteLevelBpeEqualsTheReferenceOnHeldOutLines) {
  const std::vector<std::string> text = lines();
  std::ofstream(dir_ / "lines.txt") << [&] {
    std::string all;
    for (const std::string& l : text) all.append(l).push_back('\n');
    return all;
  }();
  sh("node " + std::string(PACKBERT_SOURCE_DIR) + "/tests/tools/gpt2_reference.js " + gpt_ + " < " +
     (dir_ / "lines.txt").string() + " > " + (dir_ / "ref.txt").string());
  const JsonTokenizer tok = JsonTokenizer::load(make("gpt2"));
  EXPECT_EQ(tok.model_type(), "BPE");
  EXPECT_EQ(tok.vocab_size(), 50257);
  std::istringstream ref(testing::slurp(dir_ / "ref.txt"));
  size_t same = 0, lines_seen = 0, ids = 0;
  for (const std::string& l : text) {
    std::string want;
    std::getline(ref, want);
    ++lines_seen;
    std::string got;
    for (int32_t id : tok.encode(l, false)) {
      if (!got.empty()) got.push_back(' ');
      got.append(std::to_string(id));
    }
    ids += static_cast<size_t>(std::count(got.begin(), got.end(), ' ')) + !got.empty();
    if (got == want)
      ++same;
    else
      ADD_FAILURE() << "line " << lines_seen << " '" << l << "': " << got << " against " << want;
    if (lines_seen - same > 5) break;
  }
  EXPECT_EQ(same, text.size());
  std::cout << "  " << same << " of " << text.size() << " lines (" << ids
            << " ids) equal to gpt-3-encoder's\n";
}

TEST_F(TokenizerJson, WordPieceEqualsTheBertTokenizerOnHeldOutLines) {
  const JsonTokenizer tok = JsonTokenizer::load(make("bert"));
  EXPECT_EQ(tok.model_type(), "WordPiece");
  const Tokenizer bert(base_vocab(), true);
  size_t same = 0;
  const std::vector<std::string> text = lines();
  for (const std::string& l : text) {
    std::vector<int32_t> want = bert.encode(l);
    want.insert(want.begin(), base_vocab().cls());
    want.push_back(base_vocab().sep());
    if (tok.encode(l) == want) ++same;
  }
  EXPECT_EQ(same, text.size());
  std::cout << "  " << same << " of " << text.size() << " lines equal, [CLS] and [SEP] added\n";
}

// ModernBERT's arrangement: NFC first, added tokens split out before BPE ([MASK] taking the
// space before it), the [CLS] ... [SEP] template.
TEST_F(TokenizerJson, AddedTokensNormalizerAndTemplateWorkAsTransformersDoes) {
  const JsonTokenizer tok = JsonTokenizer::load(make("modern"));
  const JsonTokenizer gpt2 = JsonTokenizer::load(make("gpt2"));
  const int32_t cls = 50258, sep = 50259, mask = 50261;
  auto plain = [&](const std::string& s) { return gpt2.encode(s, false); };
  std::vector<int32_t> want = {cls};
  for (int32_t id : plain("Paris is the")) want.push_back(id);
  want.push_back(mask);  // (its lstrip took the space before it)
  for (int32_t id : plain(" of France.")) want.push_back(id);
  want.push_back(sep);
  EXPECT_EQ(tok.encode("Paris is the [MASK] of France."), want);
  EXPECT_EQ(tok.encode("caf\u0065\u0301", false), plain("caf\u00e9"));  // NFC: é composed
  EXPECT_EQ(tok.encode("[CLS][SEP]", false), (std::vector<int32_t>{cls, sep}));
  EXPECT_EQ(tok.pieces("hi", true).front(), "[CLS]");
  // The same through `packbert tokenize --tokenizer`, with and without the special tokens.
  const std::string text = write("t.txt", "Paris is the [MASK] of France.\n").string();
  testing::Result r =
      run("tokenize --tokenizer " + (dir_ / "modern.json").string() + " --special " + text);
  ASSERT_EQ(r.code, 0) << r.err;
  std::string line;
  for (int32_t id : want) line.append(line.empty() ? "" : " ").append(std::to_string(id));
  EXPECT_EQ(r.out, line + "\n");
  r = run("tokenize --tokenizer " + (dir_ / "modern.json").string() + " --tokens " + text);
  EXPECT_EQ(r.out.substr(0, 6), "Paris ") << r.out;
  r = run("tokenize --tokenizer " + (dir_ / "modern.json").string() + " --cased " + text);
  EXPECT_EQ(r.code, 2) << r.err;
  // What the reader does not do is refused in one line naming it.
  for (const auto& [edit, says] : std::vector<std::pair<std::string, std::string>>{
           {R"(.model.type = "Unigram")", "the model 'Unigram'"},
           {R"(.model.dropout = 0.1)", "BPE dropout"},
           {R"(.normalizer = {type: "Precompiled"})", "the normalizer 'Precompiled'"},
           {R"(.pre_tokenizer = {type: "Metaspace"})", "the pre_tokenizer 'Metaspace'"},
           // (a hostile id would ask for billions of entries)
           {R"(.model.vocab["zz"] = 2147483000)", "the vocab gives id 2147483000, outside 0 .. "},
           {R"(.added_tokens[0].id = 9999999999)", "an added token gives id 9999999999"}}) {
    const std::string bad = (dir_ / "bad.json").string();
    sh("node -e 'const fs=require(\"fs\");const j=JSON.parse(fs.readFileSync(\"" +
       (dir_ / "modern.json").string() + "\"));j" + edit + ";fs.writeFileSync(\"" + bad +
       "\",JSON.stringify(j))'");
    try {
      JsonTokenizer::load(bad);
      ADD_FAILURE() << edit << " was read";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
}

// SQuAD under a byte-level BPE (ModernBERT's tokenizer.json). Examples made here, none of them
// looked at while writing the offsets: contexts of plain, accented, non-Latin and bracketed words,
// numbers, contractions and emoji between runs of varied whitespace (double spaces, tabs, U+202F,
// newlines when `newlines`), each question asking for a run of 1-3 of its words or the number
// inside "(1895),"; every fifth unanswerable (SQuAD v2.0).
std::vector<SquadExample> made_squad(int n, int words, uint32_t seed, bool newlines) {
  const std::vector<std::string> atoms = {
      "Denver", "Broncos", "naïve",    "café",     "straße",     "Zürich", "1895",  "(1895),",
      "it's",   "THEY'LL", "$100",     "«quoted»", "“curly”",    "—",      "a.b.c", "東京",
      "😀",      "x²",      "Ελληνικά", "русский",  "10\u00a0km", "the",    "won",   "in"};
  const std::vector<std::string> gaps =
      newlines ? std::vector<std::string>{" ", "  ", "\t", "\n", "\n\n", " \n ", "\u202f"}
               : std::vector<std::string>{" ", " ", "  ", "\t", " \t ", "\u202f"};
  std::mt19937 rng(seed);
  std::vector<SquadExample> out;
  for (int i = 0; i < n; ++i) {
    SquadExample e;
    e.id = "m" + std::to_string(i);
    e.question = "Which words come at place " + std::to_string(i) + "?";
    std::vector<size_t> begin, end;
    std::vector<std::string> used;
    for (int w = 0; w < words; ++w) {
      used.push_back(atoms[rng() % atoms.size()]);
      begin.push_back(e.context.size());
      e.context += used.back();
      end.push_back(e.context.size());
      e.context += gaps[rng() % gaps.size()];
    }
    e.impossible = i % 5 == 4;
    if (!e.impossible) {
      const size_t k = 1 + rng() % 3, w = rng() % (static_cast<size_t>(words) - k);
      size_t a = begin[w], b = end[w + k - 1];
      if (k == 1 && used[w] == "(1895),") a += 1, b = a + 4;
      int64_t chars = 0;  // code points before the answer
      for (size_t c = 0; c < a; ++c)
        chars += (static_cast<unsigned char>(e.context[c]) & 0xC0) != 0x80;
      e.answers.push_back({e.context.substr(a, b - a), chars});
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::string trimmed(std::string s) {  // SQuAD's trailing whitespace off
  for (bool again = true; again;) {
    again = false;
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
      s.pop_back(), again = true;
    if (s.size() >= 3 && s.compare(s.size() - 3, 3, "\u202f") == 0)
      s.resize(s.size() - 3), again = true;
  }
  return s;
}

// Each word tokenised with the whitespace before it: the context's pieces are gpt-3-encoder's
// encoding of the whole context (the reference, on contexts without newlines), and the
// tokenizer's own whole-context encoding where contexts hold newlines.
TEST_F(TokenizerJson, SquadContextPiecesAreTheWholeContextsEncoding) {
  const Vocab vocab = Vocab::load(make("modern"));
  ASSERT_NE(vocab.json(), nullptr);
  const Tokenizer tok(vocab, true);
  ASSERT_TRUE(tok.byte_level());
  std::vector<SquadExample> flat = made_squad(300, 40, 7, false);
  SquadOptions o;
  squad_features(flat, tok, o, false);
  std::string lines;
  for (const SquadExample& e : flat) lines += trimmed(e.context) + "\n";
  std::ofstream(dir_ / "contexts.txt") << lines;
  sh("node " + std::string(PACKBERT_SOURCE_DIR) + "/tests/tools/gpt2_reference.js " + gpt_ + " < " +
     (dir_ / "contexts.txt").string() + " > " + (dir_ / "ref.txt").string());
  std::istringstream ref(testing::slurp(dir_ / "ref.txt"));
  size_t same = 0;
  for (const SquadExample& e : flat) {
    std::string want, got;
    std::getline(ref, want);
    for (int32_t id : e.pieces) got.append(got.empty() ? "" : " ").append(std::to_string(id));
    same += got == want;
    EXPECT_EQ(got, want) << e.context;
  }
  EXPECT_EQ(same, flat.size());
  std::vector<SquadExample> lined = made_squad(300, 40, 8, true);
  squad_features(lined, tok, o, false);
  for (const SquadExample& e : lined)
    EXPECT_EQ(e.pieces, vocab.json()->encode(trimmed(e.context), false)) << e.context;
}

// Answers located and cut by byte offsets: logits that peak on each window's located span give
// back exactly the answer's text from the context, in contexts held in one window and in many,
// and SQuAD v2.0's unanswerable questions (the null span peaking) give "".
TEST_F(TokenizerJson, SquadAnswersComeBackExactlyFromOneWindowAndFromMany) {
  const Vocab vocab = Vocab::load(make("modern"));
  const Tokenizer tok(vocab, false);
  for (const auto& [max_seq_len, stride] : {std::pair{512, 128}, std::pair{96, 24}}) {
    SCOPED_TRACE(max_seq_len);
    std::vector<SquadExample> ex = made_squad(200, 24, 11, true);
    SquadOptions o;
    o.max_seq_len = max_seq_len, o.doc_stride = stride, o.v2 = true, o.max_answer_length = 100;
    const SquadFeatures train = squad_features(ex, tok, o, true);
    const SquadFeatures dev = squad_features(ex, tok, o, false);
    EXPECT_EQ(train.unanswerable, 0);
    ASSERT_EQ(train.features.size(), dev.features.size());
    std::vector<int> windows(ex.size(), 0);
    std::vector<std::vector<float>> logits(dev.features.size());
    for (size_t f = 0; f < dev.features.size(); ++f) {
      const SquadFeature& t = train.features[f];
      ++windows[t.example];
      logits[f].assign(2 * t.tokens.size(), 0.0f);
      if (t.start > 0) {
        logits[f][2 * t.start] = 10.0f, logits[f][2 * t.end + 1] = 10.0f;
        // The located span is the answer's bytes, whitespace trimmed (nothing more, nothing less).
        std::string bytes;
        for (int32_t k = t.start; k <= t.end; ++k) bytes += tok.token_bytes(t.tokens[k]);
        EXPECT_NE(bytes.find(ex[t.example].answers[0].text), std::string::npos);
      } else if (ex[t.example].impossible) {
        logits[f][0] = logits[f][1] = 10.0f;
      }
    }
    const std::vector<std::string> pred = squad_predictions(ex, dev.features, logits, tok, o);
    size_t exact = 0, multi = 0;
    for (size_t i = 0; i < ex.size(); ++i) {
      const std::string want = ex[i].impossible ? "" : ex[i].answers[0].text;
      exact += pred[i] == want;
      EXPECT_EQ(pred[i], want) << ex[i].context;
      multi += windows[i] > 1;
    }
    EXPECT_EQ(exact, ex.size());
    if (max_seq_len == 512)
      EXPECT_EQ(multi, 0u);  // every context in one window
    else
      EXPECT_GE(multi, ex.size() * 4 / 5);  // (182 of the 200 in two windows or more)
  }
}

// A tokenizer.json is a vocabulary every command takes: its ids (ModernBERT's specials found),
// its own tokenisation (the casing flag has no say; contradicting it is an error), and a file
// without BERT's special tokens refused in one line.
TEST_F(TokenizerJson, ReadAsAVocabularyItTokenisesAsTheFileSays) {
  const Vocab vocab = Vocab::load(make("modern"));
  EXPECT_EQ(vocab.size(), 50262);
  EXPECT_EQ(vocab.cls(), 50258);
  EXPECT_EQ(vocab.sep(), 50259);
  EXPECT_EQ(vocab.mask(), 50261);
  const Tokenizer lower(vocab, true), keep(vocab, false);
  for (const std::string& l :
       {std::string("Paris is the [MASK] of France."), std::string("  Naïve CAFÉ\tdéjà vu 😀")}) {
    EXPECT_EQ(lower.encode(l), vocab.json()->encode(l, false));
    EXPECT_EQ(keep.encode(l), lower.encode(l));
  }
  EXPECT_EQ(decide_casing(std::nullopt, "", vocab, "t.json").lower_case, false);
  EXPECT_THROW(decide_casing(true, "", vocab, "t.json"), InputError);
  const Vocab wp = Vocab::load(make("bert"));
  EXPECT_EQ(wp.size(), base_vocab().size());
  EXPECT_EQ(wp.fingerprint(), base_vocab().fingerprint());  // the same ids, the same file to data
  EXPECT_EQ(Tokenizer(wp, false).encode("Héllo World"),
            Tokenizer(base_vocab(), true).encode("Héllo World"));
  try {
    Vocab::load(make("gpt2"));
    ADD_FAILURE() << "a tokenizer without [CLS] was read as a vocabulary";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("has no [PAD] token"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace packbert::data
