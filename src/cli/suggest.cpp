#include "cli/suggest.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace packbert::cli {

namespace {

// Flag names of Hugging Face's run_glue.py / run_qa.py / run_mlm.py (TrainingArguments) and of
// Google BERT's scripts, with the packbert flag that does the same.
constexpr std::pair<const char*, const char*> kForeignFlags[] = {
    {"learning-rate", "--lr"},
    {"per-device-train-batch-size", "--batch-rows"},
    {"train-batch-size", "--batch-rows"},
    {"per-device-eval-batch-size", "--batch-rows"},
    {"num-train-epochs", "--epochs"},
    {"max-seq-length", "--max-seq-len"},
    {"output-dir", "--out"},
    {"model-name-or-path", "--init"},
    {"init-checkpoint", "--init"},
    {"warmup-steps", "--warmup"},
    {"num-warmup-steps", "--warmup"},
    {"gradient-accumulation-steps", "--accumulation"},
    {"max-steps", "--steps"},
    {"num-train-steps", "--steps"},
    {"train-file", "--train"},
    {"validation-file", "--dev"},
    {"do-lower-case", "--uncased"},
    {"save-steps", "--checkpoint-every"},
    {"save-checkpoints-steps", "--checkpoint-every"},
    {"eval-steps", "--eval-every"},
    {"max-grad-norm", "--clip"},
    {"fp16", "--precision fp16"},
    {"bf16", "--precision bf16"},
    {"overwrite-output-dir", "--overwrite"},
    {"resume-from-checkpoint", "--resume"},
    {"metric-for-best-model", "--save-best"},
    {"load-best-model-at-end", "--save-best METRIC"},
    {"vocab-file", "--vocab"},
    {"input-file", "--data"},
    {"max-predictions-per-seq", "--max-predictions"},
    {"save-total-limit", "--keep-checkpoints"},
    {"eval-strategy", "--eval-steps N (default: each epoch)"},
    {"evaluation-strategy", "--eval-steps N (default: each epoch)"},
    {"eval-strategy", "--eval-every"},
    {"evaluation-strategy", "--eval-every"},
    {"save-strategy", "--checkpoint-every"},
    {"logging-dir", "--report-to tensorboard (event files in <out>/runs/)"},
    {"lr-scheduler-type", "--decay-power (1: linear decay, Hugging Face's default)"},
    {"warmup-proportion", "--warmup-ratio"},
    {"output-file", "--out"},
    {"test-file", "--data"},
};

// "--Learning_Rate" -> "learning-rate": how the tables above and packbert's names compare.
std::string normal(std::string s) {
  s.erase(0, s.find_first_not_of('-'));
  for (char& c : s)
    c = c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The candidate nearest `word`, if near enough to be a slip (a third of its length, at least 2).
std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(normal(word), normal(c));
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment: Levenshtein plus the swap of two adjacent letters.
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string suggestion(CLI::App& app, int argc, char** argv) {
  // The subcommand: the first word that is not a flag.
  CLI::App* sub = nullptr;
  int at = 1;
  for (; at < argc; ++at)
    if (argv[at][0] != '-') break;
  if (at < argc) {
    std::vector<std::string> names;
    for (CLI::App* s : app.get_subcommands({})) names.push_back(s->get_name());
    const std::string word = argv[at];
    if (std::find(names.begin(), names.end(), word) == names.end()) {
      const std::string near = nearest(word, names);
      return "unknown subcommand '" + word + "'" +
             (near.empty() ? "" : "; did you mean '" + near + "'?");
    }
    sub = app.get_subcommand(word);
  }
  if (!sub) return "";
  std::vector<std::string> flags;
  for (const CLI::Option* o : sub->get_options())
    for (const std::string& n : o->get_lnames()) flags.push_back("--" + n);
  for (int i = at + 1; i < argc; ++i) {
    std::string word = argv[i];
    if (!word.starts_with("--") || word == "--") continue;
    word = word.substr(0, word.find('='));
    if (std::find(flags.begin(), flags.end(), word) != flags.end()) continue;
    for (const auto& [foreign, ours] : kForeignFlags) {
      const std::string flag = std::string(ours).substr(0, std::string(ours).find(' '));
      if (normal(word) == foreign && std::find(flags.begin(), flags.end(), flag) != flags.end())
        return "unknown flag '" + word + "' for " + sub->get_name() + "; packbert's is " + ours;
    }
    const std::string near = nearest(word, flags);
    return "unknown flag '" + word + "' for " + sub->get_name() +
           (near.empty() ? "" : "; did you mean '" + near + "'?") + " (" + sub->get_name() +
           " --help lists them)";
  }
  return "";
}

}  // namespace packbert::cli
