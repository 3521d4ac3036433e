// Subcommand registration. Each subcommand lives in its own cmd_*.cpp and registers itself on
// the root CLI11 app; its callback throws InputError for bad input (exit 2).
#pragma once

#include <CLI/CLI.hpp>

namespace packbert::cli {

void register_pack(CLI::App& app);
void register_demo(CLI::App& app);

// Runs the CLI on argv; returns the process exit code (0 ok, 2 bad input, 1 internal error).
int run(int argc, char** argv);

}  // namespace packbert::cli
