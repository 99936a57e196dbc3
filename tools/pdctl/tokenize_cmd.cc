#include "tools/pdctl/tokenize_cmd.h"

#include <cstdio>
#include <string>
#include <vector>

#include "common/strings.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/tokenizer.h"
#include "tools/pdctl/cli_util.h"

namespace pd::tools {

CLI::App* AddTokenizeCommand(CLI::App& app, TokenizeFlags* flags) {
  CLI::App* tk = app.add_subcommand("tokenize", "print the token ids of a text on one line");
  tk->add_option("-m,--model", flags->model, "GGUF model or vocabulary file")->required();
  tk->add_flag("--no-special", flags->no_special, "add no BOS/EOS and parse no special-token text");
  auto* tf = tk->add_option("--file", flags->file, "read the text from a file");
  auto* tt = tk->add_option("--text", flags->text, "the text");
  tf->excludes(tt);
  flags->text_option = tt;
  return tk;
}

int RunTokenize(const TokenizeFlags& flags) {
  if (flags.file.empty() && flags.text_option->count() == 0) {
    std::fprintf(stderr, "pdctl tokenize: give --text or --file\n");
    return 2;
  }
  const std::string& model = flags.model;
  const bool no_special = flags.no_special;
  const std::string& file = flags.file;
  const std::string& text = flags.text;
  auto gguf = engine::GgufFile::Open(model);
  if (!gguf.ok()) return Fail(gguf.status());
  auto tok = engine::Tokenizer::FromGguf(**gguf);
  if (!tok.ok()) return Fail(tok.status());
  std::string input = text;
  if (!file.empty()) {
    auto t = ReadFile(file);
    if (!t.ok()) return Fail(t.status());
    input = *t;
  }
  std::vector<int32_t> ids = (*tok)->Encode(input, !no_special, !no_special);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += pd::StrCat(i ? " " : "", ids[i]);
  std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace pd::tools
