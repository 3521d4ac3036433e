// SQuAD v1.1 span extraction, as Google's BERT (run_squad.py) does it: contexts split on
// whitespace into words, words into WordPieces (a byte-level BPE, ModernBERT's: each word with
// the whitespace before it, so the pieces are the whole context's, and answers located and cut
// by the pieces' byte offsets, as Hugging Face's run_qa does with offset mappings); each question +
// context becomes one or more windows ("features") of at most max_seq_len tokens, [CLS] question
// [SEP] context window [SEP], windows overlapping by stepping doc_stride tokens; the answer's token
// span is tightened to the tokenised answer text; a window not holding the answer points at [CLS].
// Predictions take the best valid (start, end) over all windows of an example, counting each token
// only in the window where it has the most context, and map it back to the original text. Scores
// follow the official v1.1 evaluation script (normalised exact match and token F1, max over
// references). SQuAD v2.0 (questions without an answer): those are trained towards the null span at
// [CLS], predicted "" by the null score (run_qa's rule), and scored by the official v2.0 script's
// rules with HasAns / NoAns splits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace packbert::data {

struct SquadAnswer {
  std::string text;
  int64_t start = -1;  // offset of its first character in the context, in code points
};

struct SquadExample {
  std::string id, question, context;
  std::vector<SquadAnswer> answers;  // training uses the first; evaluation all of them
  // SQuAD v2.0: no answer in the context (is_impossible, or no answers): trained towards the
  // null span at [CLS], scored correct only when the prediction is "".
  bool impossible = false;
  // Filled by squad_features: the context's whitespace-separated words, its WordPieces and the
  // word each piece came from; for a byte-level BPE (a tokenizer.json), each piece's bytes of the
  // context [piece_begin, piece_end) (whitespace trimmed), from which answers are cut.
  std::vector<std::string> words;
  std::vector<int32_t> pieces, piece_word, piece_begin, piece_end;
};

// Reads SQuAD v1.1 or v2.0 JSON ({"data": [{"paragraphs": [{"context", "qas": [{"id",
// "question", "answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}; a question with no
// answers, or is_impossible true, is unanswerable). Throws InputError naming the file and the JSON
// path of the first problem (missing field, wrong type, answer_start outside the context).
// Without `need_answers` (predict) a question may have no "answers" field: it has none, and is
// unanswerable only where is_impossible says so.
std::vector<SquadExample> read_squad(const std::string& path, bool need_answers = true);

struct SquadOptions {
  int max_seq_len = 384, doc_stride = 128, max_query_length = 64, max_answer_length = 30;
  int n_best = 20;  // start and end candidates considered per window
  // SQuAD v2.0 (a file with unanswerable questions): predict "" when the null span's score (the
  // lowest [CLS] start + end logit over the example's windows) exceeds the best span's by more
  // than this, as Hugging Face's run_qa does.
  bool v2 = false;
  double null_score_diff_threshold = 0;
};

// Whether any question of `examples` has no answer (a SQuAD v2.0 file).
bool squad_has_unanswerable(const std::vector<SquadExample>& examples);

struct SquadFeature {
  int64_t example = 0;
  std::vector<int32_t> tokens;       // [CLS] question [SEP] window [SEP]
  int32_t doc_offset = 0;            // position of the window's first piece in tokens
  int32_t doc_first = 0;             // index of that piece in the example's pieces
  std::vector<uint8_t> max_context;  // per window piece: this window gives it most context
  int32_t start = 0, end = 0;        // answer span in tokens; 0, 0 = not in this window
};

struct SquadFeatures {
  std::vector<SquadFeature> features;
  int64_t unanswerable = 0;  // training examples skipped: answer text not found in the context
};

// Builds the windows of every example (and tokenises its context into examples[i].words /
// pieces / piece_word). With `training`, answer spans are located (the first answer) and
// examples whose answer cannot be found in the context are skipped and counted.
SquadFeatures squad_features(std::vector<SquadExample>& examples, const Tokenizer& tok,
                             const SquadOptions& options, bool training);

// The best answer text of each example from span logits: logits[f] holds feature f's
// (start, end) logit pairs, 2 per token of features[f].tokens. Examples without any valid span
// get "".
// With `null_odds`, each example's null score minus its best span's (0 where it has none), as
// Hugging Face's run_qa writes null_odds.json for SQuAD v2.0.
std::vector<std::string> squad_predictions(const std::vector<SquadExample>& examples,
                                           const std::vector<SquadFeature>& features,
                                           const std::vector<std::vector<float>>& logits,
                                           const Tokenizer& tok, const SquadOptions& options,
                                           std::vector<double>* null_odds = nullptr);

// The official v1.1 normalisation: lower case, drop ASCII punctuation, drop the articles
// a/an/the, collapse whitespace.
std::string squad_normalize(const std::string& text);
double squad_exact_match(const std::string& prediction, const std::string& truth);
double squad_f1(const std::string& prediction, const std::string& truth);

struct SquadScore {
  double exact_match = 0, f1 = 0;  // percentages over examples, max over reference answers
  // v2.0 (the official v2 script's rules): the same over questions with an answer (HasAns) and
  // without (NoAns), and the counts.
  bool v2 = false;
  double has_exact = 0, has_f1 = 0, no_exact = 0, no_f1 = 0;
  int64_t total = 0, has_total = 0, no_total = 0;
};
SquadScore squad_score(const std::vector<SquadExample>& examples,
                       const std::vector<std::string>& predictions);

}  // namespace packbert::data
