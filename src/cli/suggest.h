// "Did you mean": for an unknown subcommand or flag, the nearest name packbert has (edit
// distance), and for Hugging Face's and PyTorch scripts' flag names the packbert flag that does
// the same (`--learning_rate` → `--lr`).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace packbert::cli {

// One line saying what in argv is unknown and what to use instead, or "" when every subcommand
// and flag in argv is known (the parse error is about something else).
std::string suggestion(CLI::App& app, int argc, char** argv);

// Levenshtein distance (insertions, deletions, substitutions; an adjacent swap counts 1).
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace packbert::cli
