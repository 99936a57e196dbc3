// The quantizer's built-in calibration and evaluation texts: English fortune-cookie entries from
// Debian's `fortunes` package (/usr/share/games/fortunes), from two disjoint fixed lists of files
// pinned by SHA-256 in testdata/texts/manifest.json (compiled in; see embedded.h). The same bytes
// as scripts/texts.py builds; the format is described there and in docs/quantization.md.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pd::engine::quantize {

enum class TextKind { kCalibration, kEvaluation };

// Builds the text. Source folder: `dir` when not empty, else $PD_FORTUNES_DIR, else the
// manifest's (/usr/share/games/fortunes). FAILED_PRECONDITION when a source file is missing (the
// message says to install the package) or its SHA-256 differs from the manifest, or the built
// text's SHA-256 differs; INTERNAL for a malformed compiled-in manifest.
absl::StatusOr<std::string> BuiltinText(TextKind kind, std::string_view dir = {});

// The stripped, non-empty entries of one fortune file, joined by blank lines (no final newline).
std::string JoinFortuneEntries(std::string_view file_bytes);

}  // namespace pd::engine::quantize
