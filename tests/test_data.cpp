// Data: tokenizer parity with Hugging Face BertTokenizer, robustness, vocabulary errors.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "data/tokenizer.h"
#include "error.h"

namespace packbert::data {
namespace {

const Vocab& base_vocab() {
  static const Vocab v = Vocab::load(PACKBERT_DEFAULT_VOCAB);
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
  Vocab v = Vocab::from_tokens({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Héllo", "hello",
                                "World", "##s", "!"},
                               "mini");
  Tokenizer cased(v, false), uncased(v, true);
  EXPECT_EQ(cased.pieces("Héllo Worlds!"), (std::vector<std::string>{"Héllo", "World", "##s", "!"}));
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

}  // namespace
}  // namespace packbert::data
