// Self-draft models for speculative decoding (`pdctl quantize --draft`): a cheap copy of a target
// model that proposes tokens the target then verifies. The draft keeps the target's tokenizer
// metadata (the same vocabulary, so ids pass between them unchanged) and its full token_embd as
// the input table; its layers are quantized to a low bit width (QuantizeModel with
// importance-weighted rounding on calibration text); and its output.weight holds only the rows of
// the most likely tokens, listed in `pdserve.draft.head_tokens` (ModelConfig::head_tokens). Model
// then scores those rows only and gives every other id -infinity: the draft's probability there
// is exactly 0, which the speculative acceptance rule handles exactly.
//
// The head's tokens: every control token that is not an unused placeholder, every user-defined
// token, the special ids and the end-of-generation ids; then the most frequent tokens of the
// calibration text; then, up to the requested count, the tokenizer's own prior (SPM: score,
// highest first, byte tokens last; BPE: id order, i.e. merge order).
//
// After writing, the draft and the target run a held-out tail of the calibration text: the
// fraction of positions where their argmax agree estimates greedy acceptance.
//
// Thread safety: pure functions; a job uses `threads` cores.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/gguf.h"
#include "engine/quant/quantize/progress.h"
#include "engine/quant/quantize/quantize_model.h"
#include "engine/tokenizer/tokenizer.h"

namespace pd::engine::quantize {

struct HeadSelection {
  std::vector<int32_t> ids;  // ascending
  int special = 0;           // kept whatever their frequency (control, user-defined, EOG)
  int from_text = 0;         // seen in the text, by count
  int from_prior = 0;        // filled by the tokenizer's prior
};

// The head tokens for a draft of `tokenizer`'s vocabulary: at most max(n, special count) ids
// (the special ones always), ranked as the header says. `text_ids`: the calibration text's ids.
HeadSelection SelectHeadTokens(const Tokenizer& tokenizer, absl::Span<const int32_t> text_ids,
                               int n);

// QuantizeDraft's head for a draft of the model in `target`, at most max(n, special count) ids:
// the calibration text (`calib_file`, or the built-in text when empty) less its held-out tail of
// `heldout_fraction`, tokenized and ranked by SelectHeadTokens. The self-head drafter restricts
// the target's own head to these (docs/speculative.md). INVALID_ARGUMENT for n < 1 or an empty
// text; NOT_FOUND for an unreadable file; FAILED_PRECONDITION when the tokenizer cannot be loaded.
absl::StatusOr<HeadSelection> DraftHeadTokens(const GgufFile& target, int n,
                                              const std::string& calib_file = "",
                                              double heldout_fraction = 0.1);

struct DraftOptions {
  // input, output, type, method, policy, overrides, calib_file, calib_tokens, chunk_tokens,
  // threads as for any quantization (head_tokens and calib_text are filled by the job). Defaults
  // chosen for drafts by pdctl: q3_K, importance, policy S.
  QuantizeOptions quant;
  int head_rows = 32768;          // output head rows (tokens the draft can propose)
  double heldout_fraction = 0.1;  // tail of the text kept out of calibration and head ranking
  int64_t eval_tokens = 2048;     // at most this many held-out positions are compared
  int decode_steps = 32;          // single-token steps timed per model (0: no timing)
};

struct DraftReport {
  QuantizeReport quant;
  uint64_t target_bytes = 0, draft_bytes = 0;  // files
  // Weight bytes one decode step reads: every tensor but an untied token_embd (a lookup reads
  // one row of it). What a memory-bound device pays per token.
  uint64_t target_step_bytes = 0, draft_step_bytes = 0;
  int n_vocab = 0;
  HeadSelection head;          // head.ids.size() rows
  int64_t text_tokens = 0;     // tokens of the calibration part that ranked the head
  int64_t eval_positions = 0;  // held-out positions compared (0: the text had no held-out part)
  double agreement = 0;        // draft argmax == target argmax: the greedy acceptance estimate
  double head_coverage = 0;    // target argmax inside the draft's head (agreement's ceiling)
  // Milliseconds per single-token decode step on the CPU backend (0 when not timed).
  double target_ms_per_token = 0, draft_ms_per_token = 0;
  double seconds = 0;
};

// Writes the draft at options.quant.output and measures it. Errors: QuantizeModel's;
// FAILED_PRECONDITION when the target's tokenizer cannot be loaded or the model cannot be run;
// INVALID_ARGUMENT for head_rows < 1, heldout_fraction outside [0, 0.5], an input that already is
// a draft.
absl::StatusOr<DraftReport> QuantizeDraft(const DraftOptions& options, Progress& progress);

// QuantizeModel's table, then the draft summary: size against the target, head rows, agreement.
std::string FormatDraftReport(const DraftReport& report);

}  // namespace pd::engine::quantize
