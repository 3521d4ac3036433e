// Fine-tuning: classification and SQuAD end to end, the official scoring, label and metric
// handling.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "data/squad.h"
#include "error.h"
#include "kernels/cpu_features.h"
#include "train/finetune.h"
#include "train/model_files.h"
#include "train/trainer.h"
#include "train_world.h"

namespace packbert::train {
namespace {

// Fine-tuning of World's model on these training and dev files (written as train.tsv and
// dev.tsv), 32 tokens a sequence, 4 rows a step, into ft/.
FinetuneOptions classify_options(const World& w, const std::string& train, const std::string& dev) {
  std::ofstream(w.dir / "train.tsv") << train;
  std::ofstream(w.dir / "dev.tsv") << dev;
  FinetuneOptions o;
  o.train = (w.dir / "train.tsv").string();
  o.dev = (w.dir / "dev.tsv").string();
  o.init = w.init;
  o.vocab = w.vocab;
  o.out_dir = (w.dir / "ft").string();
  o.max_seq_len = 32;
  o.loop.rows_per_batch = 4;
  return o;
}

TEST(Finetune, ClassifierLearnsAKeywordRuleAboveMajority) {
  World w;
  std::mt19937 rng(9);
  auto tsv = [&](int n) {
    std::string s = "label\tsentence\n";
    for (int i = 0; i < n; ++i) {
      std::string text;
      bool yes = rng() % 3 == 0;  // 1/3 "yes": majority baseline 2/3
      int len = 4 + static_cast<int>(rng() % 6), at = static_cast<int>(rng() % len);
      for (int k = 0; k < len; ++k) {
        int word = 5 + static_cast<int>(rng() % 30);  // w5..w34
        if (k == at && yes) word = 3;
        if (k) text += ' ';
        text += std::to_string(word).insert(0, 1, 'w');
      }
      s += std::string(yes ? "yes" : "no") + "\t" + text + "\n";
    }
    return s;
  };
  const std::string train = tsv(400), dev = tsv(100);  // (in this order: one random stream)
  FinetuneOptions o = classify_options(w, train, dev);
  o.epochs = 4;
  o.loop.lr = 1e-2;
  FinetuneResult r = finetune(o);
  ASSERT_EQ(r.dev_accuracy.size(), 4u);
  EXPECT_EQ(r.num_labels, 2);
  EXPECT_GT(r.dev_accuracy.back(), r.majority_baseline + 0.15)
      << r.dev_accuracy.back() << " vs majority " << r.majority_baseline;
  EXPECT_TRUE(fs::exists(o.out_dir + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(o.out_dir + "/labels.json"));
  // The export is what transformers expects for a classifier: its architecture, and the label
  // names (not LABEL_i) in id2label / label2id.
  {
    std::ifstream cf(o.out_dir + "/config.json"), lf(o.out_dir + "/labels.json");
    nlohmann::json config = nlohmann::json::parse(cf), labels = nlohmann::json::parse(lf);
    EXPECT_EQ(config["architectures"][0], "BertForSequenceClassification");
    EXPECT_EQ(config["num_labels"], 2);
    ASSERT_EQ(labels.size(), 2u);
    for (auto& [name, id] : labels.items()) {
      EXPECT_EQ(config["id2label"][std::to_string(id.get<int>())], name);
      EXPECT_EQ(config["label2id"][name], id);
    }
    io::SafetensorsFile st = io::SafetensorsFile::read(o.out_dir + "/model.safetensors");
    EXPECT_TRUE(st.has("classifier.weight"));
    EXPECT_FALSE(st.has("cls.predictions.bias"));
  }
  // `packbert eval --task classify` on the exported model agrees with the last epoch.
  TaskEvalOptions eo;
  eo.task = FinetuneTask::classify;
  eo.model = o.out_dir;
  eo.data = o.dev;
  eo.vocab = w.vocab;
  eo.max_seq_len = 32;
  TaskEvalResult ev = evaluate_task(eo);
  EXPECT_EQ(ev.examples, 100);
  EXPECT_NEAR(ev.accuracy, r.dev_accuracy.back(), 0.011);
  // With bf16 master weights (and bf16 compute) it learns the rule too, and exports its masters:
  // every weight a bf16 value.
  if (kernels::bf16_unavailable_reason().empty()) {
    FinetuneOptions b = o;
    b.out_dir = (w.dir / "ft16").string();
    b.loop.precision = model::Precision::bf16;
    b.loop.optimizer.masters = Masters::bf16;
    FinetuneResult r16 = finetune(b);
    EXPECT_GT(r16.dev_accuracy.back(), r16.majority_baseline + 0.15)
        << r16.dev_accuracy.back() << " vs majority " << r16.majority_baseline;
    io::SafetensorsFile st = io::SafetensorsFile::read(b.out_dir + "/model.safetensors");
    for (const char* name : {"bert.encoder.layer.0.attention.self.query.weight", "classifier.bias"})
      for (float x : st.floats(name)) ASSERT_EQ(x, kernels::to_float(kernels::to_bf16(x))) << name;
  }
  // Dev labels must be known from training; columns must exist.
  std::ofstream(w.dir / "bad.tsv") << "label\tsentence\nmaybe\tw5 w6\n";
  o.dev = (w.dir / "bad.tsv").string();
  EXPECT_THROW(finetune(o), InputError);
  std::ofstream(w.dir / "nohead.tsv") << "yes\tw5\n";
  o.dev = (w.dir / "nohead.tsv").string();
  EXPECT_THROW(finetune(o), InputError);
}

}  // namespace
}  // namespace packbert::train

namespace packbert::train {
namespace {

const std::string kSquadTiny = std::string(PACKBERT_SOURCE_DIR) + "/tests/data/squad_tiny.json";

TEST(Squad, OfficialNormalisationExactMatchAndF1) {
  EXPECT_EQ(data::squad_normalize("The  Denver Broncos!"), "denver broncos");
  EXPECT_EQ(data::squad_normalize("an (apple), a pear"), "apple pear");
  EXPECT_EQ(data::squad_exact_match("the Broncos", "Broncos."), 1.0);
  EXPECT_EQ(data::squad_exact_match("Denver", "Broncos"), 0.0);
  EXPECT_NEAR(data::squad_f1("Denver Broncos", "Broncos of Denver"), 0.8, 1e-12);  // p 1, r 2/3
  EXPECT_NEAR(data::squad_f1("a b b", "b c"), 0.5, 1e-12);  // "a" is an article; one b in common
  EXPECT_EQ(data::squad_f1("", "Denver"), 0.0);
  std::vector<data::SquadExample> ex(2);
  ex[0].answers = {{"2026", 0}, {"in 2026", 0}};
  ex[1].answers = {{"three", 0}};
  data::SquadScore s = data::squad_score(ex, {"In 2026", "four"});
  EXPECT_DOUBLE_EQ(s.exact_match, 50.0);  // max over references, then mean, in %
  EXPECT_DOUBLE_EQ(s.f1, 50.0);
}

TEST(Squad, WindowsCoverTheContextAndLocateAnswers) {
  data::Vocab vocab = data::Vocab::load(PACKBERT_SOURCE_VOCAB);
  data::Tokenizer tok(vocab, true);
  std::vector<data::SquadExample> ex = data::read_squad(kSquadTiny);
  ASSERT_EQ(ex.size(), 6u);
  EXPECT_EQ(ex[1].id, "q2");
  EXPECT_EQ(ex[1].answers.size(), 2u);
  data::SquadOptions o;
  o.max_seq_len = 40;
  o.doc_stride = 8;
  o.max_query_length = 6;
  data::SquadFeatures f = data::squad_features(ex, tok, o, true);
  EXPECT_EQ(f.unanswerable, 0);
  std::vector<int> windows(ex.size(), 0), with_answer(ex.size(), 0);
  for (const data::SquadFeature& ft : f.features) {
    const data::SquadExample& e = ex[ft.example];
    ++windows[ft.example];
    ASSERT_LE(ft.tokens.size(), 40u);
    EXPECT_EQ(ft.tokens.front(), vocab.cls());
    EXPECT_EQ(ft.tokens.back(), vocab.sep());
    EXPECT_EQ(ft.tokens[ft.doc_offset - 1], vocab.sep());
    EXPECT_LE(ft.doc_offset, 6 + 2);  // the question was cut to max_query_length
    if (ft.start == 0) {
      EXPECT_EQ(ft.end, 0);  // answer not in this window: [CLS]
      continue;
    }
    ++with_answer[ft.example];
    // The located span is exactly the tokenised first answer ("2026", not "2026)").
    std::vector<int32_t> span(ft.tokens.begin() + ft.start, ft.tokens.begin() + ft.end + 1);
    EXPECT_EQ(span, tok.encode(e.answers[0].text)) << e.id;
  }
  for (size_t i = 0; i < ex.size(); ++i) {
    EXPECT_GE(windows[i], 2) << ex[i].id;  // long contexts, short windows
    EXPECT_GE(with_answer[i], 1) << ex[i].id;
    // Every context piece is "max context" in exactly one window.
    std::vector<int> owners(ex[i].pieces.size(), 0);
    for (const data::SquadFeature& ft : f.features)
      if (ft.example == static_cast<int64_t>(i))
        for (size_t k = 0; k < ft.max_context.size(); ++k)
          owners[ft.doc_first + k] += ft.max_context[k];
    for (int n : owners) EXPECT_EQ(n, 1);
  }
}

TEST(Squad, PredictionsMapBackToTheOriginalText) {
  data::Vocab vocab = data::Vocab::load(PACKBERT_SOURCE_VOCAB);
  data::Tokenizer tok(vocab, true);
  std::vector<data::SquadExample> ex = data::read_squad(kSquadTiny);
  data::SquadOptions o;
  o.max_seq_len = 48;
  o.doc_stride = 16;
  data::SquadFeatures train = data::squad_features(ex, tok, o, true);
  data::SquadFeatures dev = data::squad_features(ex, tok, o, false);
  ASSERT_EQ(train.features.size(), dev.features.size());
  // Logits that peak on the located span of each window holding the answer.
  std::vector<std::vector<float>> logits(dev.features.size());
  for (size_t f = 0; f < dev.features.size(); ++f) {
    EXPECT_EQ(dev.features[f].start, 0);  // no labels at evaluation
    logits[f].assign(2 * dev.features[f].tokens.size(), 0.0f);
    if (train.features[f].start > 0) {
      logits[f][2 * train.features[f].start] = 5.0f;
      logits[f][2 * train.features[f].end + 1] = 5.0f;
    }
  }
  std::vector<std::string> pred = data::squad_predictions(ex, dev.features, logits, tok, o);
  EXPECT_EQ(pred[0], "2026");  // not "(in 2026)" nor "2026)"
  EXPECT_EQ(pred[2], "BERT encoders");
  EXPECT_EQ(pred[3], "attend to each other");
  data::SquadScore s = data::squad_score(ex, pred);
  EXPECT_DOUBLE_EQ(s.exact_match, 100.0);
  EXPECT_DOUBLE_EQ(s.f1, 100.0);
  // Spans longer than max_answer_length are never predicted.
  o.max_answer_length = 1;
  pred = data::squad_predictions(ex, dev.features, logits, tok, o);
  EXPECT_NE(pred[3], "attend to each other");
}

// An independent reading of the official SQuAD v2.0 evaluation script (evaluate-v2.0.py), written
// from its published rules for the test: normalize_answer (lower case, punctuation and the
// articles a/an/the removed, whitespace collapsed), compute_exact, compute_f1 (empty only
// matches empty), gold answers those that normalise to something else [""], totals in percent
// with HasAns and NoAns splits.
namespace squad_v2_reference {
std::vector<std::string> tokens(const std::string& text) {
  std::string lowered;
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x80 && std::ispunct(u)) continue;
    lowered += u < 0x80 ? static_cast<char>(std::tolower(u)) : c;
  }
  std::vector<std::string> out;
  std::istringstream in(lowered);
  for (std::string w; in >> w;)
    if (w != "a" && w != "an" && w != "the") out.push_back(w);
  return out;
}
double exact(const std::string& gold, const std::string& pred) {
  return tokens(gold) == tokens(pred) ? 1 : 0;
}
double f1(const std::string& gold, const std::string& pred) {
  const auto g = tokens(gold), p = tokens(pred);
  if (g.empty() || p.empty()) return g == p ? 1 : 0;
  std::multiset<std::string> left(g.begin(), g.end());
  double common = 0;
  for (const auto& w : p) {
    auto it = left.find(w);
    if (it != left.end()) left.erase(it), ++common;
  }
  if (common == 0) return 0;
  const double precision = common / static_cast<double>(p.size()),
               recall = common / static_cast<double>(g.size());
  return 2 * precision * recall / (precision + recall);
}
}  // namespace squad_v2_reference

// #45 item 6: SQuAD v2.0 scores as the official v2 script does, overall and split by HasAns and
// NoAns, against the independent reading above; v1.1 files keep v1.1's scoring.
TEST(Squad, V2ScoresAsTheOfficialScriptDoes) {
  std::vector<data::SquadExample> ex(7);
  auto answers = [](std::initializer_list<const char*> texts) {
    std::vector<data::SquadAnswer> out;
    for (const char* t : texts) out.push_back({t, 0});
    return out;
  };
  ex[0].answers = answers({"the Eiffel Tower", "Eiffel Tower"});
  ex[1].answers = answers({"1889"});
  ex[2].answers = answers({"Gustave Eiffel's company"});
  ex[3].impossible = true;
  ex[4].impossible = true;
  ex[5].answers = answers({"a", "the"});  // normalises to nothing: counted as unanswerable
  ex[6].answers = answers({"Paris, France"});
  const std::vector<std::string> pred = {
      "Eiffel tower!", "", "the company of Gustave Eiffel", "", "in 1889", "", "Paris"};
  const data::SquadScore s = data::squad_score(ex, pred);
  ASSERT_TRUE(s.v2);
  double em = 0, f = 0, has_em = 0, has_f = 0, no_em = 0, no_f = 0;
  int has = 0, no = 0;
  for (size_t i = 0; i < ex.size(); ++i) {
    std::vector<std::string> gold;
    for (const auto& a : ex[i].answers)
      if (!squad_v2_reference::tokens(a.text).empty()) gold.push_back(a.text);
    const bool answerable = !gold.empty();
    if (!answerable) gold = {""};
    double e = 0, g = 0;
    for (const auto& a : gold)
      e = std::max(e, squad_v2_reference::exact(a, pred[i])),
      g = std::max(g, squad_v2_reference::f1(a, pred[i]));
    em += e, f += g;
    (answerable ? has_em : no_em) += e;
    (answerable ? has_f : no_f) += g;
    ++(answerable ? has : no);
  }
  EXPECT_EQ(s.total, 7);
  EXPECT_EQ(s.has_total, has);
  EXPECT_EQ(s.no_total, no);
  EXPECT_EQ(has, 4);
  EXPECT_EQ(no, 3);
  EXPECT_NEAR(s.exact_match, 100 * em / 7, 1e-9);
  EXPECT_NEAR(s.f1, 100 * f / 7, 1e-9);
  EXPECT_NEAR(s.has_exact, 100 * has_em / has, 1e-9);
  EXPECT_NEAR(s.has_f1, 100 * has_f / has, 1e-9);
  EXPECT_NEAR(s.no_exact, 100 * no_em / no, 1e-9);
  EXPECT_NEAR(s.no_f1, 100 * no_f / no, 1e-9);
  // Worked by hand: EM 1,0,0,1,0,1,0 = 3/7; NoAns EM 2/3 (the "in 1889" answer to an
  // unanswerable question scores 0).
  EXPECT_NEAR(s.exact_match, 300.0 / 7, 1e-9);
  EXPECT_NEAR(s.no_exact, 200.0 / 3, 1e-9);
  // A v1.1 set (every question answerable) keeps v1.1's scoring.
  std::vector<data::SquadExample> v1(ex.begin(), ex.begin() + 3);
  EXPECT_FALSE(data::squad_score(v1, pred).v2);
}

// Span logits for the windows of `dev`: 5 at the start and 5 at the end of the answer `located`
// (the same windows built for training) finds in the window, 0 elsewhere, and [CLS]'s start and
// end logits each half_null(example): a null score of twice that.
std::vector<std::vector<float>> peaked_logits(const data::SquadFeatures& located,
                                              const data::SquadFeatures& dev,
                                              const std::function<float(int64_t)>& half_null) {
  std::vector<std::vector<float>> logits(dev.features.size());
  for (size_t f = 0; f < dev.features.size(); ++f) {
    logits[f].assign(2 * dev.features[f].tokens.size(), 0.0f);
    if (located.features[f].start > 0) {
      logits[f][2 * located.features[f].start] = 5.0f;
      logits[f][2 * located.features[f].end + 1] = 5.0f;
    }
    logits[f][0] = logits[f][1] = half_null(dev.features[f].example);
  }
  return logits;
}

// SQuAD v2.0 predictions: "" when the null span's score beats the best span's by more than the
// threshold (run_qa's rule); a training example without an answer is trained towards [CLS].
TEST(Squad, V2PredictsNoAnswerByTheNullScore) {
  data::Vocab vocab = data::Vocab::load(PACKBERT_SOURCE_VOCAB);
  data::Tokenizer tok(vocab, true);
  std::vector<data::SquadExample> ex = data::read_squad(kSquadTiny);
  ex[1].impossible = true, ex[1].answers.clear();
  data::SquadOptions o;
  o.max_seq_len = 48;
  o.doc_stride = 16;
  data::SquadFeatures train = data::squad_features(ex, tok, o, true);
  data::SquadFeatures dev = data::squad_features(ex, tok, o, false);
  ASSERT_EQ(train.features.size(), dev.features.size());
  EXPECT_EQ(train.unanswerable, 0);
  for (const auto& ft : train.features)
    if (ft.example == 1) {
      EXPECT_EQ(ft.start + ft.end, 0);  // every window at [CLS]
    }
  // null 6 against the answer's 10, and 0 elsewhere
  const std::vector<std::vector<float>> logits =
      peaked_logits(train, dev, [](int64_t) { return 3.0f; });
  o.v2 = true;
  std::vector<std::string> pred = data::squad_predictions(ex, dev.features, logits, tok, o);
  EXPECT_EQ(pred[0], "2026");
  EXPECT_EQ(pred[1], "");  // its best span scores 0 < null 6
  o.null_score_diff_threshold = 10;
  pred = data::squad_predictions(ex, dev.features, logits, tok, o);
  EXPECT_NE(pred[1], "");  // the threshold lets the span through
  o.null_score_diff_threshold = -5;
  pred = data::squad_predictions(ex, dev.features, logits, tok, o);
  EXPECT_EQ(pred[0], "");  // null 6 > 10 - 5
}

// SQuAD v2.0's null rule with contexts that fit one window (most real ones) and with several
// windows each: the answer is "" exactly when the null score beats the best span's by more than
// the threshold. The expected answers are worked out here from the logits the test writes (span
// 5 + 5 = 10 on the gold answer, 0 elsewhere, null 2c with c set per question), not by the code
// under test: at +1e6 every question is answered, at -1e6 none, at 0 those whose null is below 10.
TEST(Squad, V2NullRuleHoldsForSingleAndMultiWindowContexts) {
  data::Vocab vocab = data::Vocab::load(PACKBERT_SOURCE_VOCAB);
  data::Tokenizer tok(vocab, true);
  for (const int max_seq_len : {384, 48}) {
    SCOPED_TRACE("max_seq_len " + std::to_string(max_seq_len));
    std::vector<data::SquadExample> ex = data::read_squad(kSquadTiny);
    data::SquadOptions o;
    o.max_seq_len = max_seq_len;
    o.doc_stride = 16;
    data::SquadFeatures train = data::squad_features(ex, tok, o, true);
    data::SquadFeatures dev = data::squad_features(ex, tok, o, false);
    ASSERT_EQ(train.features.size(), dev.features.size());
    if (max_seq_len == 384) {
      ASSERT_EQ(dev.features.size(), ex.size());  // one window a question
    } else {
      ASSERT_GT(dev.features.size(), 2 * ex.size());
    }
    // Null halves per question: 2c below the span's 10 for even questions, above it for odd ones.
    auto half_null = [](int64_t example) { return example % 2 == 0 ? 2.0f : 7.0f; };
    const std::vector<std::vector<float>> logits = peaked_logits(train, dev, half_null);
    o.v2 = true;
    const std::vector<std::string> gold = {"2026", "Zürich", "BERT encoders",
                                           "attend to each other"};
    for (const double threshold : {1e6, 0.0, -1e6}) {
      SCOPED_TRACE("threshold " + std::to_string(threshold));
      o.null_score_diff_threshold = threshold;
      const std::vector<std::string> pred =
          data::squad_predictions(ex, dev.features, logits, tok, o);
      ASSERT_EQ(pred.size(), ex.size());
      int empty = 0;
      for (size_t i = 0; i < ex.size(); ++i) {
        const double null = 2.0 * half_null(static_cast<int64_t>(i));
        const bool expect_empty = null > 10.0 + threshold;
        EXPECT_EQ(pred[i].empty(), expect_empty) << ex[i].id;
        if (!expect_empty && i < gold.size()) {
          EXPECT_EQ(pred[i], gold[i]) << ex[i].id;
        }
        empty += pred[i].empty();
      }
      const int want = threshold > 0   ? 0
                       : threshold < 0 ? static_cast<int>(ex.size())
                                       : static_cast<int>(ex.size()) / 2;
      EXPECT_EQ(empty, want);
    }
  }
}

TEST(Squad, BadFilesNameTheProblem) {
  World w;
  auto expect_error = [&](const std::string& text, const std::string& needle) {
    const std::string path = (w.dir / "bad.json").string();
    std::ofstream(path) << text;
    try {
      data::read_squad(path);
      ADD_FAILURE() << "no error for " << text;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("{\"data\": [", "not valid JSON");
  expect_error(
      "{\"data\": [{\"paragraphs\": [{\"context\": \"abc\", \"qas\": [{\"id\": \"x\"}]}]}]}",
      "data[0].paragraphs[0].qas[0]: missing 'question'");
  expect_error(
      "{\"data\": [{\"paragraphs\": [{\"context\": \"abc\", \"qas\": [{\"id\": \"x\", "
      "\"question\": \"q\", \"answers\": [{\"text\": \"bcd\", \"answer_start\": 1}]}]}]}]}",
      "answers[0]: answer_start 1 + 3 characters is outside the context");
  expect_error("{\"data\": [{\"paragraphs\": [{\"context\": 5}]}]}", "context: wrong type");
}

// The span head learns to point at a marker word, packed, through the public entry point.
TEST(Finetune, SquadSpanHeadLearnsAMarkerWord) {
  World w;
  std::mt19937 rng(5);
  auto squad = [&](int n, const std::string& prefix) {
    nlohmann::json paragraphs = nlohmann::json::array();
    for (int i = 0; i < n; ++i) {
      std::string context;
      int len = 8 + static_cast<int>(rng() % 30), at = static_cast<int>(rng() % len);
      int64_t start = 0;
      for (int k = 0; k < len; ++k) {
        if (k) context += ' ';
        if (k == at) start = static_cast<int64_t>(context.size());
        context += k == at ? std::string("w3") : std::to_string(5 + rng() % 30).insert(0, 1, 'w');
      }
      paragraphs.push_back({{"context", context},
                            {"qas",
                             {{{"id", prefix + std::to_string(i)},
                               {"question", "w1 w2"},
                               {"answers", {{{"text", "w3"}, {"answer_start", start}}}}}}}});
    }
    return nlohmann::json{{"version", "1.1"}, {"data", {{{"paragraphs", paragraphs}}}}}.dump();
  };
  std::ofstream(w.dir / "train.json") << squad(300, "t");
  std::ofstream(w.dir / "dev.json") << squad(60, "d");
  FinetuneOptions o;
  o.task = FinetuneTask::squad;
  o.train = (w.dir / "train.json").string();
  o.dev = (w.dir / "dev.json").string();
  o.init = w.init;
  o.vocab = w.vocab;
  o.out_dir = (w.dir / "qa").string();
  o.max_seq_len = 32;
  o.squad.doc_stride = 8;
  o.squad.max_query_length = 4;
  o.loop.rows_per_batch = 4;
  o.epochs = 3;
  o.loop.lr = 1e-2;
  o.save_best = "f1";
  FinetuneResult r = finetune(o);
  ASSERT_EQ(r.dev_squad.size(), 3u);
  EXPECT_GT(r.dev_sequences, 60);              // some contexts need two windows
  EXPECT_LT(r.train_rows, r.train_sequences);  // packed
  // Chance is about one word in twenty.
  EXPECT_GT(r.dev_squad.back().exact_match, 60.0) << r.dev_squad.back().f1;
  EXPECT_TRUE(fs::exists(o.out_dir + "/model.safetensors"));
  std::ifstream pj(o.out_dir + "/predictions.json");
  nlohmann::json p = nlohmann::json::parse(pj);
  EXPECT_EQ(p.size(), 60u);
  EXPECT_TRUE(p.contains("d0"));
  {
    std::ifstream cf(o.out_dir + "/config.json");
    EXPECT_EQ(nlohmann::json::parse(cf)["architectures"][0], "BertForQuestionAnswering");
    io::SafetensorsFile st = io::SafetensorsFile::read(o.out_dir + "/model.safetensors");
    EXPECT_TRUE(st.has("qa_outputs.weight"));
    EXPECT_TRUE(st.has("qa_outputs.bias"));
  }
  // `packbert eval --task squad` on the exported model (the best dev F1 epoch's, by --save-best
  // f1) agrees with that epoch; a model without the span head is refused.
  TaskEvalOptions eo;
  eo.model = o.out_dir;
  eo.data = o.dev;
  eo.vocab = w.vocab;
  eo.max_seq_len = 32;
  eo.squad = o.squad;
  eo.predictions = (w.dir / "answers.json").string();
  TaskEvalResult ev = evaluate_task(eo);
  EXPECT_EQ(ev.examples, 60);
  EXPECT_EQ(ev.sequences, r.dev_sequences);
  const data::SquadScore* best = &r.dev_squad[0];
  for (const data::SquadScore& e : r.dev_squad)
    if (e.f1 > best->f1) best = &e;
  EXPECT_NEAR(ev.squad.f1, best->f1, 100.0 / 60 + 1e-9);
  EXPECT_NEAR(ev.squad.exact_match, best->exact_match, 100.0 / 60 + 1e-9);
  EXPECT_TRUE(fs::exists(eo.predictions));
  eo.model = w.init;
  EXPECT_THROW(evaluate_task(eo), InputError);
  // The fine-tuned model (with its qa_outputs head) is a valid --init for another run.
  o.init = o.out_dir;
  o.out_dir = (w.dir / "qa2").string();
  o.epochs = 1;
  o.save_best = "accuracy";  // not a squad metric
  EXPECT_THROW(finetune(o), OptionError);
  o.save_best.clear();
  EXPECT_NO_THROW(finetune(o));
}

// GLUE's metrics (#45): accuracy, F1 of label 1 and Matthews correlation, against values worked
// by hand from the textbook formulas and sklearn's documented multi-class examples.
TEST(ClassifyScore, AccuracyF1AndMccAsGlueScoresThem) {
  // Binary: tp 3, fn 1, fp 1, tn 3.
  ClassifyScore b = classify_score({0, 1, 1, 0, 1, 1, 0, 0}, {0, 1, 0, 0, 1, 1, 1, 0}, 2);
  EXPECT_DOUBLE_EQ(b.accuracy, 0.75);
  ASSERT_TRUE(b.f1.has_value());
  EXPECT_DOUBLE_EQ(*b.f1, 0.75);                // 2*3 / (2*3 + 1 + 1)
  EXPECT_DOUBLE_EQ(b.mcc, (9.0 - 1.0) / 16.0);  // (tp tn - fp fn) / sqrt(4 * 4 * 4 * 4)
  // sklearn's matthews_corrcoef docstring: y_true [1, 1, 1, -1], y_pred [1, -1, 1, 1] -> -1/3.
  EXPECT_NEAR(classify_score({1, 1, 1, 0}, {1, 0, 1, 1}, 2).mcc, -1.0 / 3.0, 1e-12);
  // Three classes (sklearn's tests): all wrong in a rotation -> -0.5; all right -> 1.
  ClassifyScore m = classify_score({0, 0, 1, 1, 2, 2}, {2, 2, 0, 0, 1, 1}, 3);
  EXPECT_NEAR(m.mcc, -0.5, 1e-12);
  EXPECT_FALSE(m.f1.has_value());
  EXPECT_DOUBLE_EQ(classify_score({0, 0, 1, 1, 2, 2}, {0, 0, 1, 1, 2, 2}, 3).mcc, 1.0);
  // One class predicted for everything: MCC 0 (sklearn's convention), not NaN.
  EXPECT_EQ(classify_score({0, 1, 0, 1}, {1, 1, 1, 1}, 2).mcc, 0.0);
}

// STS-B's metrics (#45): Pearson and Spearman as scipy computes them. scipy's spearmanr
// docstring: [1, 2, 3, 4, 5] against [5, 6, 7, 8, 7] is 0.8207826816681233 (the 7s tie at rank
// 3.5); the others worked from the definitions in double.
TEST(RegressionScore, PearsonAndSpearmanAsScipyComputesThem) {
  const RegressionScore a = regression_score({1, 2, 3, 4, 5}, {5, 6, 7, 8, 7});
  EXPECT_NEAR(a.pearson, 0.8320502943378437, 1e-12);
  EXPECT_NEAR(a.spearman, 0.8207826816681233, 1e-12);
  // Ties on both sides; MSE the mean of the squared differences.
  const RegressionScore b =
      regression_score({0.5, 2.0, 3.8, 1.2, 4.9, 2.0}, {0.7, 1.5, 3.1, 1.0, 4.0, 2.5});
  EXPECT_NEAR(b.pearson, 0.9620802435994019, 1e-12);
  EXPECT_NEAR(b.spearman, 0.9856107606091623, 1e-12);
  EXPECT_NEAR(b.mse, 0.3133333333333334, 1e-12);
  // A monotone but not linear relation: Spearman 1, Pearson below it; reversed: -1.
  const RegressionScore c = regression_score({1, 2, 3, 4}, {1, 8, 27, 64});
  EXPECT_NEAR(c.spearman, 1.0, 1e-12);
  EXPECT_LT(c.pearson, 0.99);
  EXPECT_NEAR(regression_score({1, 2, 3, 4}, {4, 3, 2, 1}).pearson, -1.0, 1e-12);
  // A constant prediction has no correlation: NaN, as scipy's, never a made-up 0.
  const RegressionScore d = regression_score({1, 2, 3}, {2, 2, 2});
  EXPECT_TRUE(std::isnan(d.pearson));
  EXPECT_TRUE(std::isnan(d.spearman));
  EXPECT_NEAR(d.mse, 2.0 / 3.0, 1e-12);
}

// #45: an STS-B-style file (sentence pairs, a decimal `score`) trains a regression head: one
// output, mean squared error, Pearson and Spearman on dev; the model exports as transformers'
// regression BertForSequenceClassification (num_labels 1, problem_type "regression") and `eval`
// on it scores the same correlation and writes run_glue's value predictions.
TEST(Finetune, RegressionHeadLearnsAScoreAndExportsAsARegressionModel) {
  World w;
  std::mt19937 rng(5);
  // The score is 4 when the first sentence holds the marker word w3, 1 when not, plus a little
  // noise, written with three decimals (STS-B's 3.800).
  auto tsv = [&](int n) {
    std::string s = "index\tgenre\tsentence1\tsentence2\tscore\n";
    for (int i = 0; i < n; ++i) {
      const bool marked = rng() % 2 == 0;
      std::string texts[2];
      for (std::string& text : texts) {
        const int len = 3 + static_cast<int>(rng() % 5), at = static_cast<int>(rng() % len);
        for (int k = 0; k < len; ++k) {
          const int word =
              marked && k == at && &text == &texts[0] ? 3 : 5 + static_cast<int>(rng() % 30);
          text += (k ? " w" : "w") + std::to_string(word);
        }
      }
      char value[16];
      std::snprintf(value, sizeof value, "%.3f",
                    (marked ? 4.0 : 1.0) + 0.25 * (static_cast<int>(rng() % 5) - 2));
      s += std::to_string(i) + "\tmain\t" + texts[0] + "\t" + texts[1] + "\t" + value + "\n";
    }
    return s;
  };
  const std::string train = tsv(400), dev = tsv(100);  // (in this order: one random stream)
  FinetuneOptions o = classify_options(w, train, dev);
  o.epochs = 3;
  o.loop.lr = 1e-2;
  o.save_best = "pearson";
  const FinetuneResult r = finetune(o);
  ASSERT_TRUE(r.regression());
  EXPECT_EQ(r.num_labels, 1);
  ASSERT_EQ(r.dev_regression.size(), 3u);
  double best = -1;
  for (const RegressionScore& s : r.dev_regression) best = std::max(best, s.pearson);
  EXPECT_GT(best, 0.9) << "dev Pearson never above 0.9";
  std::ifstream cf(o.out_dir + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(cf);
  EXPECT_EQ(config["architectures"][0], "BertForSequenceClassification");
  EXPECT_EQ(config["num_labels"], 1);
  EXPECT_EQ(config["problem_type"], "regression");
  EXPECT_EQ(
      io::SafetensorsFile::read(o.out_dir + "/model.safetensors").floats("classifier.bias").size(),
      1u);
  // Step records carry the head's loss and no accuracy; eval records the correlations.
  std::ifstream mf(o.out_dir + "/metrics.jsonl");
  int steps = 0, evals = 0;
  for (std::string line; std::getline(mf, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["type"] == "step") {
      ++steps;
      EXPECT_TRUE(j.contains("cls_loss"));
      EXPECT_FALSE(j.contains("acc")) << line;
    }
    if (j["type"] == "eval") {
      ++evals;
      EXPECT_TRUE(j.contains("dev_spearman")) << line;
    }
  }
  EXPECT_GT(steps, 0);
  EXPECT_EQ(evals, 3);
  // eval on the export (the best epoch's model, by --save-best pearson) scores what that epoch
  // scored, and writes one value per example.
  TaskEvalOptions eo;
  eo.task = FinetuneTask::classify;
  eo.model = o.out_dir;
  eo.data = o.dev;
  eo.vocab = w.vocab;
  eo.max_seq_len = 32;
  eo.predictions = (w.dir / "pred.tsv").string();
  const TaskEvalResult ev = evaluate_task(eo);
  ASSERT_TRUE(ev.regression.has_value());
  EXPECT_NEAR(ev.regression->pearson, best, 1e-4);
  std::ifstream pf(eo.predictions);
  std::string line;
  std::getline(pf, line);
  EXPECT_EQ(line, "index\tprediction");
  int values = 0;
  while (std::getline(pf, line)) {
    ++values;
    EXPECT_NE(line.find('.'), std::string::npos) << line;
  }
  EXPECT_EQ(values, 100);
  // A classification metric for a regression task, and classes forced on it, are refused or
  // honoured by name.
  FinetuneOptions bad = o;
  bad.out_dir = (w.dir / "ft2").string();
  bad.save_best = "accuracy";
  EXPECT_THROW(finetune(bad), OptionError);
  // Fine-tuning the regression model again keeps its head (a new run from it: regression).
  FinetuneOptions again = o;
  again.init = o.out_dir;
  again.out_dir = (w.dir / "ft3").string();
  again.epochs = 1;
  again.save_best.clear();
  const FinetuneResult r2 = finetune(again);
  EXPECT_TRUE(r2.regression());
  EXPECT_TRUE(r2.initialized.empty());  // the head came from the model
}

}  // namespace
}  // namespace packbert::train
