#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <new>
#include <system_error>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/suggest.h"
#include "dist/comm.h"
#include "error.h"
#include "io/json_error.h"
#include "io/memory.h"
#include "kernels/cpu_features.h"

namespace packbert::cli {

namespace {

bool failed_together = false;

int run_command(int argc, char** argv) {
  CLI::App app{"packbert: fast, memory-lean BERT training with sequence packing", "packbert"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "packbert 0.1.0");
  register_pack(app);
  register_demo(app);
  register_tokenize(app);
  register_prepare(app);
  register_inspect(app);
  register_gcide(app);
  int exit_code = 0;
  register_pretrain(app, exit_code);
  register_eval(app);
  register_predict(app);
  register_export(app);
  register_convert(app);
  register_finetune(app, exit_code);
  register_plan(app);
  register_plot(app);
  register_check_golden(app, exit_code);
  try {
    (void)kernels::max_isa();  // a bad PACKBERT_MAX_ISA is refused before any work
  } catch (const std::invalid_argument& e) {
    std::cerr << "packbert: error: " << e.what() << '\n';
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const std::string better = suggestion(app, argc, argv);
    std::cerr << "packbert: error: "
              << (better.empty() ? e.what() + std::string(" (see --help)") : better) << '\n';
    return 2;
  } catch (const SharedError& e) {  // every process has it: rank 0 says it
    if (dist::Comm::world().root())
      std::cerr << "packbert: error: " << with_flags(e.what()) << '\n';
    failed_together = true;
    return 2;
  } catch (const OptionError& e) {
    std::cerr << "packbert: error: " << flag_of_field(e.field()) << " " << with_flags(e.rest())
              << '\n';
    return 2;
  } catch (const InputError& e) {
    std::cerr << "packbert: error: " << with_flags(e.what()) << '\n';
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "packbert: error: out of memory: " << with_flags(io::describe_failed_allocation())
              << '\n';
    return 2;
  } catch (const nlohmann::json::exception& e) {
    // A JSON input read without its own handler (every reader names its file; this is the net).
    std::cerr << "packbert: error: malformed JSON input: " << io::json_error_text(e) << '\n';
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    // Paths the user named that cannot be created, read or written.
    std::cerr << "packbert: error: " << e.path1().string() << ": " << e.code().message() << '\n';
    return 2;
  } catch (const std::system_error& e) {
    // A thread or other resource the system would not give (ulimit -v, -u): not a bug here.
    std::cerr << "packbert: error: the system refused a resource: " << e.what()
              << " (raise the process's memory or thread limit)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "packbert: internal error: " << e.what() << '\n';
    return 1;
  }
  return exit_code;
}

}  // namespace

int run(int argc, char** argv) {
  // A reader that goes away (`packbert finetune ... | head`) or a file-size limit (`ulimit -f`)
  // must not kill a run mid-write with nothing said and its staging directory left behind: the
  // write fails instead (EPIPE: the output is lost, the run goes on and publishes; EFBIG: the
  // file's writer names it, exit 2, its temporary file removed).
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGXFSZ, SIG_IGN);
  const int code = run_command(argc, argv);
  dist::Comm& comm = dist::Comm::world();
  // A process that failed alone (bad input only it saw, an error mid-step) takes the run down
  // with it rather than leave the others waiting in a collective.
  if (comm.distributed() && code != 0 && code < 128 && !failed_together) {
    std::cerr.flush();
    comm.abort(code);
  }
  dist::Comm::finalize();
  return code;
}

}  // namespace packbert::cli
