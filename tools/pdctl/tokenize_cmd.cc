#include "tools/pdctl/tokenize_cmd.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"

#include "common/status.h"
#include "common/strings.h"
#include "engine/model/gguf.h"
#include "engine/quant/quantize/gguf_vocab.h"
#include "engine/quant/quantize/gguf_writer.h"
#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "tools/pdctl/cli_util.h"

namespace pd::tools {
namespace {

// The GGUF whose tokenizer to use: PATH itself, or for a folder (a Hugging Face checkpoint) the
// vocabulary-only GGUF of its tokenizer.json, written to a temporary file in $TMPDIR that is
// removed as soon as it is mapped.
absl::StatusOr<std::unique_ptr<engine::GgufFile>> OpenVocab(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return engine::GgufFile::Open(path);
  PD_ASSIGN_OR_RETURN(engine::GgufVocab vocab, engine::ReadHfTokenizer(path));
  engine::quantize::GgufWriter writer;
  engine::quantize::SetVocabKeys(vocab, &writer);
  const char* tmpdir = std::getenv("TMPDIR");
  std::string tmp =
      pd::StrCat(tmpdir != nullptr && *tmpdir ? tmpdir : "/tmp", "/pdctl-vocab-XXXXXX");
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    return absl::InternalError(
        pd::StrCat("cannot create a temporary file ", tmp, ": ", std::strerror(errno)));
  }
  ::close(fd);
  absl::Status s = writer.Open(tmp);
  if (s.ok()) s = writer.Commit();
  absl::StatusOr<std::unique_ptr<engine::GgufFile>> gguf = s.ok() ? engine::GgufFile::Open(tmp) : s;
  ::unlink(tmp.c_str());  // the map outlives the name
  return gguf;
}

}  // namespace

CLI::App* AddTokenizeCommand(CLI::App& app, TokenizeFlags* flags) {
  CLI::App* tk = app.add_subcommand("tokenize", "print the token ids of a text on one line");
  tk->add_option("-m,--model", flags->model,
                 "GGUF model or vocabulary file, or a Hugging Face folder (its tokenizer.json, "
                 "read as llama.cpp's converter reads it; docs/models.md)")
      ->required();
  auto* ns = tk->add_flag("--no-special", flags->no_special,
                          "add no BOS/EOS and parse no special-token text");
  tk->add_flag("--no-parse", flags->no_parse,
               "add BOS/EOS as the model does, but read special-token text as plain text")
      ->excludes(ns);
  auto* tf = tk->add_option("--file", flags->file, "read the text from a file");
  auto* th = tk->add_option("--hex-lines", flags->hex_lines,
                            "read many texts from a file, one per line in hex (any bytes, invalid "
                            "UTF-8 included); print one line of ids per text, in order");
  th->excludes(tf);
  auto* tt = tk->add_option("--text", flags->text, "the text");
  tf->excludes(tt);
  th->excludes(tt);
  flags->text_option = tt;
  return tk;
}

int RunTokenize(const TokenizeFlags& flags) {
  if (flags.file.empty() && flags.hex_lines.empty() && flags.text_option->count() == 0) {
    std::fprintf(stderr, "pdctl tokenize: give --text, --file or --hex-lines\n");
    return 2;
  }
  const std::string& model = flags.model;
  const bool no_special = flags.no_special;
  const std::string& file = flags.file;
  const std::string& text = flags.text;
  auto gguf = OpenVocab(model);
  if (!gguf.ok()) return Fail(gguf.status());
  auto tok = engine::Tokenizer::FromGguf(**gguf);
  if (!tok.ok()) return Fail(tok.status());
  const bool add_special = !no_special;
  const bool parse_special = !no_special && !flags.no_parse;
  const auto print = [&](std::string_view input) {
    const std::vector<int32_t> ids = (*tok)->Encode(input, add_special, parse_special);
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) line += pd::StrCat(i ? " " : "", ids[i]);
    std::printf("%s\n", line.c_str());
  };
  if (!flags.hex_lines.empty()) {
    auto t = ReadFile(flags.hex_lines);
    if (!t.ok()) return Fail(t.status());
    std::string_view all = *t;
    if (!all.empty() && all.back() == '\n') all.remove_suffix(1);  // the last line's newline
    int line_no = 0;
    for (size_t begin = 0; begin <= all.size();) {
      const size_t end = std::min(all.find('\n', begin), all.size());
      const std::string_view line = all.substr(begin, end - begin);
      begin = end + 1;
      ++line_no;
      const bool hex = line.size() % 2 == 0 &&
                       std::all_of(line.begin(), line.end(), [](char c) {
                         return absl::ascii_isxdigit(static_cast<unsigned char>(c));
                       });
      if (!hex) {
        std::fprintf(stderr, "pdctl tokenize: %s line %d is not hex\n", flags.hex_lines.c_str(),
                     line_no);
        return 2;
      }
      print(absl::HexStringToBytes(absl::string_view(line.data(), line.size())));
    }
    return 0;
  }
  std::string input = text;
  if (!file.empty()) {
    auto t = ReadFile(file);
    if (!t.ok()) return Fail(t.status());
    input = *t;
  }
  print(input);
  return 0;
}

}  // namespace pd::tools
