// The n-gram (prompt lookup) drafter: no model. For a sequence ending in the n tokens s, it finds
// the latest earlier place where s occurred in the sequence (prompt or output) and proposes the
// tokens that followed it there (continuing periodically where that runs into the sequence's
// end). The longest n in [min_n, max_n] with a match wins. Repetitive
// work (rewriting, summarising or quoting a text given in the prompt, code edits) is where it
// pays; elsewhere it finds nothing and costs nothing.
#pragma once

#include <string_view>

#include "engine/spec/drafter.h"

namespace pd::engine::spec {

struct NgramOptions {
  int min_n = 2;  // shortest suffix matched (>= 1)
  int max_n = 4;  // longest (>= min_n)
  absl::Status Validate() const;
};

class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(NgramOptions options = {}) : options_(options) {}
  std::string_view name() const override { return "ngram"; }
  absl::Status Propose(absl::Span<DraftRequest* const> requests) override;

  // The proposal for one sequence: up to max_draft tokens (empty when no suffix recurs).
  static std::vector<int32_t> Lookup(absl::Span<const int32_t> tokens, int max_draft,
                                     const NgramOptions& options);

 private:
  NgramOptions options_;
};

}  // namespace pd::engine::spec
