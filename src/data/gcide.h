// The demo corpus: the Collaborative International Dictionary of English (Debian dict-gcide),
// one entry a document, converted to the input convention (one sentence per line, blank line
// between documents).
#pragma once

#include <string>

namespace packbert::data {

// Reads the dictd index (headword TAB offset TAB length, offsets in dictd's base64) and the
// dictzip (gzip-compatible) data file; entries sharing a text are emitted once, the database's
// own 00-* entries are skipped. Markup is removed: {braces}, \pronunciations\, source tags such
// as [1913 Webster], and accent escapes like [a^] (kept as the bare letter). Throws InputError
// naming the file for a missing or malformed input.
std::string gcide_to_text(const std::string& index_path, const std::string& dict_path,
                          size_t* entries = nullptr);

// A classification task built from the converted corpus (gcide_to_text's output): the part of
// speech of an entry (n, v, adj, adv) from its first definition, as TSV with header
// "label<TAB>sentence". Every tenth entry goes to `dev`, the rest to `train`.
void gcide_pos_tsv(const std::string& corpus_text, std::string& train, std::string& dev);

}  // namespace packbert::data
