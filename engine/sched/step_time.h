// Step-time budget for chunked prefill: how many prompt tokens a step may take next to decode
// tokens so that it takes no longer than `stretch` times its time without them (docs/scheduler.md,
// "Step-time budget").
//
// A prompt chunk added to a step delays every decoding stream by the chunk's compute time, so
// the step that carries a 512-token chunk is an inter-token latency spike for every stream (on
// 2 cores, ~0.5 s next to ~40 ms decode steps). The scheduler sizes chunks by time instead:
// StepTimeModel learns what a step costs from the steps that ran (a least-squares fit over a
// sliding window: it adapts to the model, the machine, the thread count and the other load on
// it), and MaxPrefill turns "this step may take T seconds" into a number of prompt tokens.
//
// Ownership and threads: a plain value type, used on the engine thread only.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace pd::engine {

// What a step computes, as far as its time goes.
struct StepShape {
  int decode_tokens = 0;         // decoding sequences (one token each)
  double decode_context = 0;     // sum over them of the positions they attend
  int prefill_tokens = 0;        // prompt (or recompute) tokens
  double prefill_context = 0;    // sum over them of the positions they attend

  // Adds a chunk of `tokens` prompt tokens starting at position `start`.
  void AddChunk(int start, int tokens);
};

class StepTimeModel {
 public:
  // Fits over the last `window` steps with prompt tokens and the last `window` steps without
  // (>= 8 each: long runs of decode-only steps must not push the prompt steps out of the fit),
  // and takes the typical step as the median of the last `median_window` steps that carried
  // decode tokens.
  explicit StepTimeModel(int window = 64, int median_window = 64);

  // A step of `shape` took `seconds` (wall time, > 0). Steps of no tokens are ignored.
  void Observe(const StepShape& shape, double seconds);

  // Whether the fit can price prompt tokens: it has seen enough steps with them and either steps
  // without them or prompt counts that vary, and found a positive cost per token (and then stays ready: a later fit that cannot be made keeps
  // the last good one). Until then MaxPrefill answers "no limit".
  bool ready() const { return ready_; }

  // Predicted seconds of a step of `shape` (the fit; meaningful when ready()).
  double Predict(const StepShape& shape) const;

  // Median wall time of the recent steps that carried decode tokens; 0 before any. (The
  // scheduler caps the loaded-step part of its step-time budget at stretch x this, the typical
  // ITL; docs/scheduler.md.)
  double TypicalDecodeStep() const;

  // The most prompt tokens in [0, want] for a chunk starting at `start` that keep the predicted
  // time of `base` plus the chunk at or below `budget_s`. `want` when !ready().
  int MaxPrefill(const StepShape& base, int start, int want, double budget_s) const;

 private:
  static constexpr int kFeatures = 5;  // 1, decode tokens, decode context, prefill, prefill context
  using Row = std::array<double, kFeatures>;
  static Row Features(const StepShape& s);
  // Enough steps with prompt tokens, and either steps without or prompt counts that vary.
  bool Identifiable() const;
  void Fit();

  // The last `window` steps of one kind (with or without prompt tokens), oldest overwritten.
  struct Ring {
    std::vector<Row> rows;
    std::vector<double> times;
    int next = 0;
    void Add(const Row& row, double t, int window);
  };

  int window_;
  int median_window_;
  Ring with_prefill_, without_prefill_;
  std::vector<double> decode_times_;  // ring buffer of decode-carrying steps' times
  int next_decode_ = 0;
  Row coef_{};
  bool ready_ = false;
};

}  // namespace pd::engine
