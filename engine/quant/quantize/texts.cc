#include "engine/quant/quantize/texts.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/strings.h"
#include "engine/quant/quantize/embedded.h"
#include "engine/quant/quantize/sha256.h"
#include "nlohmann/json.hpp"

namespace pd::engine::quantize {
namespace {

std::string_view Strip(std::string_view s) {
  constexpr std::string_view kWs = " \t\r\n";
  const size_t b = s.find_first_not_of(kWs);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kWs) - b + 1);
}

}  // namespace

std::string JoinFortuneEntries(std::string_view data) {
  // Entries are the runs of lines between lines that are exactly "%".
  std::vector<std::string_view> entries;
  size_t entry_start = 0, line_start = 0;
  for (;;) {
    const size_t nl = data.find('\n', line_start);
    const size_t line_end = nl == std::string_view::npos ? data.size() : nl;
    if (data.substr(line_start, line_end - line_start) == "%") {
      entries.push_back(data.substr(entry_start, line_start - entry_start));
      entry_start = nl == std::string_view::npos ? data.size() : nl + 1;
    }
    if (nl == std::string_view::npos) break;
    line_start = nl + 1;
  }
  entries.push_back(data.substr(entry_start));
  std::string out;
  for (std::string_view e : entries) {
    e = Strip(e);
    if (e.empty()) continue;
    if (!out.empty()) out += "\n\n";
    out += e;
  }
  return out;
}

absl::StatusOr<std::string> BuiltinText(TextKind kind, std::string_view dir) {
  const char* key = kind == TextKind::kCalibration ? "calibration" : "evaluation";
  nlohmann::json manifest;
  std::string package, folder;
  std::vector<std::pair<std::string, std::string>> files;  // name, sha256
  std::string want_text_sha;
  try {
    manifest = nlohmann::json::parse(EmbeddedTextsManifest());
    package = pd::StrCat(manifest.at("package").get<std::string>(), " ",
                         manifest.at("package_version").get<std::string>());
    folder = manifest.at("dir").get<std::string>();
    for (const auto& e : manifest.at("texts").at(key)) {
      files.emplace_back(e.at("file").get<std::string>(), e.at("sha256").get<std::string>());
    }
    want_text_sha = manifest.at("texts_sha256").at(key).get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InternalError(pd::StrCat("compiled-in texts manifest: ", e.what()));
  }
  if (!dir.empty()) {
    folder = std::string(dir);
  } else if (const char* env = std::getenv("PD_FORTUNES_DIR"); env != nullptr && *env) {
    folder = env;
  }
  std::string text;
  for (const auto& [name, sha] : files) {
    const std::string path = pd::StrCat(folder, "/", name);
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::FailedPreconditionError(
          pd::StrCat("the built-in ", key, " text needs ", path, ": install Debian's ", package,
                     " package (scripts/setup.sh), set PD_FORTUNES_DIR, or pass --calib FILE"));
    }
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string data = ss.str();
    if (const std::string got = Sha256Hex(data); got != sha) {
      return absl::FailedPreconditionError(pd::StrCat(
          path, ": SHA-256 ", got, " differs from ", sha,
          " pinned in testdata/texts/manifest.json (the texts come from ", package, ")"));
    }
    const std::string joined = JoinFortuneEntries(data);
    if (joined.empty()) continue;
    if (!text.empty()) text += "\n\n";
    text += joined;
  }
  text += "\n";
  if (const std::string got = Sha256Hex(text); got != want_text_sha) {
    return absl::FailedPreconditionError(pd::StrCat("the built-in ", key, " text's SHA-256 ", got,
                                                    " differs from the manifest's ",
                                                    want_text_sha));
  }
  return text;
}

}  // namespace pd::engine::quantize
