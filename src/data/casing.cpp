#include "data/casing.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/tokenizer_json.h"
#include "error.h"
#include "io/input_file.h"

namespace packbert::data {

namespace fs = std::filesystem;

namespace {

// A vocabulary with this many capitalised entries is a cased one (bert-base-cased has thousands,
// the uncased ones none).
constexpr int kCasedEntries = 50;

// The directory holding a model's tokenizer files: the model itself when a directory, else the
// directory of the model file.
fs::path model_dir(const std::string& model) {
  const fs::path dir = fs::is_directory(model) ? fs::path(model) : fs::path(model).parent_path();
  return dir.empty() ? fs::path(".") : dir;
}

// do_lower_case from tokenizer_config.json beside `model`, when it says one.
std::optional<bool> model_lower_case(const std::string& model, std::string& where) {
  if (model.empty()) return std::nullopt;
  const fs::path path = model_dir(model) / "tokenizer_config.json";
  if (!fs::is_regular_file(path)) return std::nullopt;
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object() || !j.contains("do_lower_case") || !j["do_lower_case"].is_boolean())
    return std::nullopt;
  where = path.string();
  return j["do_lower_case"].get<bool>();
}

std::string describe(const Vocab& v) {
  const int capitals = capitalised_entries(v);
  return std::to_string(v.size()) + " entries, " +
         (capitals >= kCasedEntries ? "cased"
          : capitals == 0           ? "uncased"
                                    : "mostly uncased");
}

}  // namespace

VocabChoice choose_vocab(const std::string& given, const std::string& model,
                         const std::string& fallback) {
  VocabChoice c;
  std::string own;
  if (!model.empty()) {
    // (its vocab.txt, else its tokenizer.json: a ModernBERT from the Hub has only that)
    std::error_code ec;
    for (const char* name : {"vocab.txt", "tokenizer.json"})
      if (const fs::path p = model_dir(model) / name; own.empty() && fs::is_regular_file(p, ec))
        own = p.string();
  }
  if (given.empty()) {
    c.path = own.empty() ? fallback : own;
    return c;
  }
  c.path = given;
  if (own.empty()) return c;
  std::error_code ec;
  if (fs::equivalent(own, given, ec)) return c;
  const Vocab mine = Vocab::load(own), theirs = Vocab::load(given);
  bool same = mine.size() == theirs.size();
  for (int32_t i = 0; same && i < mine.size(); ++i) same = mine.token(i) == theirs.token(i);
  if (!same)
    c.warning = "`vocab` " + given + " (" + describe(theirs) + ") overrides the model's own " +
                own + " (" + describe(mine) + "): tokenising with " + given;
  return c;
}

int capitalised_entries(const Vocab& v) {
  int n = 0;
  for (int32_t i = 0; i < v.size(); ++i) {
    const std::string& t = v.token(i);
    if (t.size() > 2 && t.front() == '[' && t.back() == ']') continue;
    for (char c : t)
      if (c >= 'A' && c <= 'Z') {
        ++n;
        break;
      }
  }
  return n;
}

Casing decide_casing(std::optional<bool> flag, const std::string& model, const Vocab& vocab,
                     const std::string& vocab_name) {
  if (const JsonTokenizer* json = vocab.json()) {
    if (flag)
      throw InputError(std::string(*flag ? "`uncased`" : "`cased`") + ": " + vocab_name +
                       " is a tokenizer.json, whose own normalizer decides the casing");
    Casing c;
    c.lower_case = json->lower_case().value_or(false);
    c.note = std::string(c.lower_case ? "uncased" : "cased") + " (" + vocab_name + "'s normalizer)";
    return c;
  }
  std::string config;
  const std::optional<bool> said = model_lower_case(model, config);
  const int capitals = capitalised_entries(vocab);
  const bool cased_vocab = capitals >= kCasedEntries;
  Casing c;
  if (flag) {
    c.lower_case = *flag;
    if (said && *said != *flag)
      c.warning = std::string(*flag ? "`uncased`" : "`cased`") + " contradicts " + config +
                  " (do_lower_case " + (*said ? "true" : "false") + ")";
  } else if (said) {
    c.lower_case = *said;
    c.note = std::string(*said ? "uncased" : "cased") + " (do_lower_case " +
             (*said ? "true" : "false") + " in " + config + ")";
  } else {
    c.lower_case = !cased_vocab;
    c.note = cased_vocab ? "cased (" + vocab_name + " has " + std::to_string(capitals) +
                               " entries with capitals; `uncased` to lowercase)"
                         : "uncased (" + vocab_name +
                               " has no entries with capitals; `cased` to "
                               "keep case)";
  }
  if (c.warning.empty() && c.lower_case && cased_vocab)
    c.warning = "lowercasing for a cased vocabulary (" + vocab_name + " has " +
                std::to_string(capitals) +
                " entries with capitals, which lowercased text never "
                "uses)";
  if (c.warning.empty() && !c.lower_case && capitals == 0)
    c.warning = "keeping case with an uncased vocabulary (" + vocab_name +
                " has no capitals: every capitalised word becomes [UNK] or is split oddly)";
  return c;
}

}  // namespace packbert::data
