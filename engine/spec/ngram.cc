#include "engine/spec/ngram.h"

#include <algorithm>

#include "common/strings.h"

namespace pd::engine::spec {

absl::Status NgramOptions::Validate() const {
  if (min_n < 1) return absl::InvalidArgumentError(pd::StrCat("ngram min_n must be >= 1, got ", min_n));
  if (max_n < min_n) {
    return absl::InvalidArgumentError(
        pd::StrCat("ngram max_n must be >= min_n (", min_n, "), got ", max_n));
  }
  return absl::OkStatus();
}

std::vector<int32_t> NgramDrafter::Lookup(absl::Span<const int32_t> tokens, int max_draft,
                                          const NgramOptions& options) {
  const int len = static_cast<int>(tokens.size());
  if (max_draft <= 0) return {};
  for (int n = std::min(options.max_n, len - 1); n >= options.min_n; --n) {
    const int32_t* suffix = tokens.data() + len - n;
    // Latest start j < len - n with tokens[j, j + n) == suffix: its continuation starts at j + n,
    // which is < len (an occurrence overlapping the suffix itself still has one).
    for (int j = len - n - 1; j >= 0; --j) {
      if (tokens[j + n - 1] != suffix[n - 1] || !std::equal(suffix, suffix + n, tokens.data() + j)) {
        continue;
      }
      // The continuation from j + n on; past the end of the sequence it reads the proposal
      // itself (the text is periodic there: the suffix repeats with period len - n - j).
      const int from = j + n;
      std::vector<int32_t> out;
      out.reserve(max_draft);
      for (int i = 0; i < max_draft; ++i) {
        const int src = from + i;
        out.push_back(src < len ? tokens[src] : out[src - len]);
      }
      return out;
    }
  }
  return {};
}

absl::Status NgramDrafter::Propose(absl::Span<DraftRequest* const> requests) {
  for (DraftRequest* r : requests) {
    r->draft = Lookup(r->tokens, r->max_draft, options_);
    r->q.clear();
  }
  return absl::OkStatus();
}

}  // namespace pd::engine::spec
