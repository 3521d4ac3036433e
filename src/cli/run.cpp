#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <new>

#include "cli/commands.h"
#include "error.h"
#include "io/memory.h"

namespace packbert::cli {

int run(int argc, char** argv) {
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
  register_export(app);
  register_finetune(app);
  register_plan(app);
  register_check_golden(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "packbert: error: " << e.what() << " (see --help)\n";
    return 2;
  } catch (const InputError& e) {
    std::cerr << "packbert: error: " << e.what() << '\n';
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "packbert: error: out of memory: " << io::describe_failed_allocation() << '\n';
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    // Paths the user named that cannot be created, read or written.
    std::cerr << "packbert: error: " << e.path1().string() << ": " << e.code().message() << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "packbert: internal error: " << e.what() << '\n';
    return 1;
  }
  return exit_code;
}

}  // namespace packbert::cli
