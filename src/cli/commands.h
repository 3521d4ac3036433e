// Subcommand registration. Each subcommand lives in its own cmd_*.cpp and registers itself on
// the root CLI11 app; its callback throws InputError for bad input (exit 2).
#pragma once

#include <CLI/CLI.hpp>

namespace packbert::cli {

void register_pack(CLI::App& app);
void register_demo(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_prepare(CLI::App& app);
void register_inspect(CLI::App& app);
void register_gcide(CLI::App& app);
// finetune: 128 + signal when stopped by SIGINT/SIGTERM (its state kept for --resume).
void register_finetune(CLI::App& app, int& exit_code);
void register_plan(CLI::App& app);
void register_plot(CLI::App& app);
// Commands whose success is not just "no exception" set exit_code (check-golden: 1 = checked
// and failed; pretrain: 128 + signal when stopped by SIGINT/SIGTERM).
void register_pretrain(CLI::App& app, int& exit_code);
void register_eval(CLI::App& app);
void register_export(CLI::App& app);
// predict: a fine-tuned model run on new text (train/predict.h).
void register_predict(CLI::App& app);
void register_convert(CLI::App& app);
void register_check_golden(CLI::App& app, int& exit_code);

// Runs the CLI on argv; returns the process exit code (0 ok, 2 bad input, 1 internal error).
int run(int argc, char** argv);

}  // namespace packbert::cli
