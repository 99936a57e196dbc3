// Flag parsing with one exit code for every flag error, shared by pdctl and the daemons.
#pragma once

#include <CLI/CLI.hpp>

namespace pd {

// Parses argv into `app`. Returns -1 when the program should go on, else the code it should exit
// with after CLI11 has printed its message: 0 after --help or --version, 2 for every flag error
// (an unknown flag, a missing or malformed value, exclusive flags together), the code the
// programs document for bad flags and bad configs alike, where CLI11's own codes run from 105 to
// 114 by kind of error.
inline int ParseFlags(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return -1;
}

}  // namespace pd
