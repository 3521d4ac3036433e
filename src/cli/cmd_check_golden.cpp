// `packbert check-golden FILE`: run packbert's forward and backward on a golden file made by a
// PyTorch model (docs/FORMATS.md) and report the largest relative error per quantity.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/table.h"
#include "model/golden.h"

namespace packbert::cli {

namespace {

struct GoldenArgs {
  std::string file;
  double rtol_loss = 1e-5, rtol_grad = 1e-4;
  bool all = false;
  model::Recompute recompute;
  model::Precision precision = model::Precision::fp32;
  kernels::BackendKind backend = kernels::BackendKind::cpu;
  double loss_scale = 1;
};

int run_check_golden(const GoldenArgs& a) {
  model::GoldenReport report = model::check_golden(a.file, a.rtol_loss, a.rtol_grad, a.recompute,
                                                   a.precision, a.loss_scale, a.backend);
  Table t({"quantity", "rel. error", "tolerance", "ok"});
  auto add = [&](const model::GoldenRow& r) {
    char err[32], tol[32];
    if (std::isfinite(r.error))
      std::snprintf(err, sizeof err, "%.2e", r.error);
    else
      std::snprintf(err, sizeof err, "non-finite");
    std::snprintf(tol, sizeof tol, "%.0e", r.tolerance);
    t.add_row({r.quantity, err, tol, r.ok() ? "yes" : "NO"});
  };
  size_t grads = 0, failing_grads = 0, losses = 0, failing_losses = 0;
  for (const model::GoldenRow& r : report.rows) {
    const bool is_grad = r.quantity.rfind("grad.", 0) == 0;
    (is_grad ? grads : losses) += 1;
    (is_grad ? failing_grads : failing_losses) += !r.ok();
    if (!is_grad || a.all || !r.ok()) add(r);
  }
  if (!a.all) add(report.worst_grad());
  t.print(std::cout);
  const size_t non_finite = static_cast<size_t>(
      std::count_if(report.rows.begin(), report.rows.end(),
                    [](const model::GoldenRow& r) { return !std::isfinite(r.error); }));
  if (non_finite > 0)
    std::cout << non_finite << " quantities with non-finite gradients"
              << (a.precision == model::Precision::fp16
                      ? ": the scaled gradients overflowed fp16 (largest finite 65504); lower "
                        "--loss-scale"
                      : "")
              << '\n';
  std::cout << a.file << ": " << losses << " losses (" << failing_losses << " outside tolerance), "
            << grads << " gradient tensors (" << failing_grads << " outside tolerance)"
            << (a.all ? "" : "; worst gradient shown, --all lists every tensor") << '\n'
            << "backend " << kernels::backend(a.backend).name
            << (a.backend == kernels::BackendKind::cpu ? " (kernels " + kernels::kernel_isa() + ")"
                                                       : std::string())
            << '\n';
  return report.ok() ? 0 : 1;
}

}  // namespace

void register_check_golden(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<GoldenArgs>();
  CLI::App* cmd = app.add_subcommand(
      "check-golden", "Compare packbert's losses and gradients with a PyTorch golden file");
  cmd->add_option("file", args->file, "Golden safetensors file (tools/make_model_golden.py)")
      ->required();
  number(cmd, "--rtol-loss", args->rtol_loss,
         "Relative tolerance on losses (default 1e-5; 1e-2 under --precision bf16, 2e-3 under "
         "fp16)",
         0, 1);
  number(cmd, "--rtol-grad", args->rtol_grad,
         "Tolerance on gradients per tensor: max |ours - theirs| / max |theirs| (default 1e-4); "
         "under --precision bf16 and fp16 ||ours - theirs|| / ||theirs|| (default 5e-2 and 1e-2)",
         0, 1);
  number(cmd, "--loss-scale", args->loss_scale,
         "Backward starts from the losses times this, and the gradients are divided by it "
         "(default 65536 under --precision fp16, as GradScaler starts: fp16 gradients underflow "
         "without it; 1 otherwise)",
         1e-30, 1e30);
  cmd->add_flag("--all", args->all, "List every gradient tensor, not only the worst");
  recompute_flags(cmd, args->recompute, nullptr);
  precision_flag(cmd, args->precision);
  backend_flag(cmd, args->backend);
  cmd->callback([args, cmd, &exit_code] {
    if (args->precision == model::Precision::bf16) {  // bf16's documented tolerances
      if (cmd->count("--rtol-loss") == 0) args->rtol_loss = 1e-2;
      if (cmd->count("--rtol-grad") == 0) args->rtol_grad = 5e-2;
    }
    if (args->precision == model::Precision::fp16) {  // fp16's: 8x finer rounding than bf16
      if (cmd->count("--rtol-loss") == 0) args->rtol_loss = 2e-3;
      if (cmd->count("--rtol-grad") == 0) args->rtol_grad = 1e-2;
      if (cmd->count("--loss-scale") == 0) args->loss_scale = 65536;
    }
    exit_code = run_check_golden(*args);
  });
}

}  // namespace packbert::cli
