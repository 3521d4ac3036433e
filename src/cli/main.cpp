#include "cli/commands.h"

int main(int argc, char** argv) {
  return packbert::cli::run(argc, argv);
}
