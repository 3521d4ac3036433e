// Text corpora for `packbert prepare`.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "data/pretraining.h"
#include "data/tokenizer.h"

namespace packbert::data {

// Reads text files into tokenized documents. Default convention (Google BERT's): one sentence
// per line, a blank line between documents. With split_sentences, the text is raw: blank lines
// still separate documents, and each document's text is cut into sentences by
// split_sentences(). Lines that tokenize to nothing are dropped, and so are documents left
// empty. Tokenization runs in parallel; the result does not depend on the thread count.
// A line that is not valid UTF-8 is an InputError naming the file, line and byte offset, unless
// skip_invalid_utf8, which drops such lines and counts them in *skipped_lines.
struct CorpusOptions {
  bool split_sentences = false;
  bool skip_invalid_utf8 = false;
};
std::vector<Document> read_corpus(const std::vector<std::string>& paths, const Tokenizer& tok,
                                  const CorpusOptions& options, size_t* skipped_lines = nullptr);

// Rule-based sentence splitter: ends a sentence after '.', '!' or '?' (and any closing quotes or
// brackets) followed by white space and an upper-case letter, digit, quote or bracket; not after
// common abbreviations (Mr. Dr. e.g. i.e. etc. vs. ...), single-letter initials (J. Smith) or
// inside numbers (3.14 has no space after its dot).
std::vector<std::string> split_sentences(std::string_view text);

}  // namespace packbert::data
