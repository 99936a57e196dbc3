// `pdctl tokenize`: the token ids of a text (--text or --file) under a model's tokenizer, printed
// on one line. Exit codes: 0 success; 2 no text given; 1 any other failure.
#pragma once

#include <string>

#include "CLI/CLI.hpp"

namespace pd::tools {

struct TokenizeFlags {
  std::string model;  // GGUF model or vocabulary file
  std::string file;   // read the text from this file, when set
  std::string text;
  bool no_special = false;
  bool no_parse = false;   // add BOS/EOS but parse no special-token text
  std::string hex_lines;   // a file of texts, one per line as hex: one line of ids per text
  // Set by AddTokenizeCommand: --text, whose count() tells whether it was given (even as "").
  const CLI::Option* text_option = nullptr;
};

CLI::App* AddTokenizeCommand(CLI::App& app, TokenizeFlags* flags);
int RunTokenize(const TokenizeFlags& flags);

}  // namespace pd::tools
