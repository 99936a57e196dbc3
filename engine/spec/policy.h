// How far each sequence speculates (docs/speculative.md, "Adaptive K"). A draft of K tokens that
// the target accepts with rate a yields (1 - a^(K+1)) / (1 - a) tokens per target step, and costs
// the K extra rows in that step plus the draft's own work. The step's cost per row comes from a
// table of target step times by row count, measured when the engine starts (SpecCost): on a
// memory-bound step an extra row is nearly free, on a compute-bound one (a large batch, or long
// prompt chunks in the step) it costs its full share, and speculation then turns itself off.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/kv_cache.h"
#include "engine/runtime/model.h"

namespace pd::engine::spec {

// Target step seconds by the number of rows in the step, measured at start-up.
class SpecCost {
 public:
  // `seconds(rows)` times one step of that many decode rows, for rows = 1, 2, 4, ..., max_rows
  // (and max_rows itself): `rounds` rounds over all of them in that order, each row count's
  // fastest time kept. Round-robin, so that a stretch of a busy host slows every row count alike
  // instead of bending the table's shape (which sets K); the fastest, because other load only
  // adds time. Non-positive or failed times are errors.
  static absl::StatusOr<SpecCost> Measure(int max_rows,
                                          const std::function<absl::StatusOr<double>(int)>& seconds,
                                          int rounds = 1);
  static constexpr int kMeasureRounds = 5;  // MeasureForward / MeasureHead
  // Measure() over `model`'s forward (kMeasureRounds rounds after one warm-up round): a scratch
  // sequence (id -2) of `rows` rows in the one-row order, each wanting logits (as a step's
  // verified rows do), its blocks in `kv` freed after. `logits` is the caller's scratch.
  // RESOURCE_EXHAUSTED when `kv` has no free block; the forward's errors.
  static absl::StatusOr<SpecCost> MeasureForward(Model& model, KvCache& kv, int max_rows,
                                                 std::vector<float>* logits);
  // The same for a verifying step of a drafter on the target's own cache: one ordinary row and
  // `rows - 1` head-only rows (Batch::head_x).
  static absl::StatusOr<SpecCost> MeasureHead(Model& model, KvCache& kv, int max_rows,
                                              std::vector<float>* logits);
  // From known points (rows ascending, >= 1; seconds > 0): tests, and costs given by the caller.
  static SpecCost FromPoints(std::vector<int> rows, std::vector<double> seconds);

  // Step seconds for `rows` rows: linear between measured points, beyond the last one linear in
  // the last segment's slope.
  double Seconds(double rows) const;
  const std::vector<int>& rows() const { return rows_; }
  const std::vector<double>& seconds() const { return seconds_; }

 private:
  std::vector<int> rows_;
  std::vector<double> seconds_;
};

// A sequence's recent acceptance: accepted / drafted with exponential forgetting, pulled toward a
// prior while it has little evidence.
class AcceptanceEstimate {
 public:
  // After a verification: `drafted` proposals were tried in order, the first `accepted` taken.
  // (Positions after the first rejection were never tried: they do not count.)
  void Observe(int drafted, int accepted);
  // A step without a draft: the evidence fades a little, so that a sequence that stopped
  // drafting after bad luck tries again once the prior outweighs it.
  void Idle();
  // In [0.01, 0.99]; with little evidence, near `prior` (the drafter's recent acceptance over
  // all sequences, say; kPrior without one).
  double rate(double prior = kPrior) const;
  static constexpr double kPrior = 0.5;

 private:
  static constexpr double kPriorWeight = 2.0, kDecay = 0.9, kIdleDecay = 0.97;
  double tried_ = 0, taken_ = 0;
};

// Expected tokens emitted by one target step verifying k draft tokens at acceptance rate a:
// (1 - a^(k+1)) / (1 - a).
double ExpectedTokens(double a, int k);

// The step being planned: its rows, predicted seconds and expected emitted tokens.
struct StepEstimate {
  double rows = 0;
  double seconds = 0;
  double tokens = 0;
  // The tokens per second a draft's own return must beat (by min_gain); 0: tokens / seconds.
  // A step that carries prompt rows sets its decode rows' rate alone: the prompt's time emits
  // no token, and counted in the step's rate it would make every draft row look worth it.
  double base_rate = 0;
};

// The draft length in [0, limit] for one more sequence of the step `step`, with acceptance rate
// a: k draft rows cost cost.Seconds(rows + k) - cost.Seconds(rows), plus k * draft_row_seconds
// of draft work, plus `fixed_seconds` once (a draft model catching up on the sequence), and
// yield ExpectedTokens(a, k) - 1 extra tokens. Only a k whose own return (extra tokens per extra
// second) beats the step's tokens per second (or its base_rate) by min_gain qualifies; of those,
// the one that makes the step's expected tokens per second highest. 0 when none. A chosen k is
// added to `step`. With `head_only` (a drafter on the target's own cache, whose drafted rows go
// through the output head only), k draft rows cost head_only->Seconds(1 + k) -
// head_only->Seconds(1) instead, and do not add to the step's rows.
int ChooseK(StepEstimate& step, const SpecCost& cost, double a, int limit, double draft_row_seconds,
            double min_gain, double fixed_seconds = 0, const SpecCost* head_only = nullptr);

// Speculation's measured worth, by batch size (docs/speculative.md, "Never slower"). ChooseK
// predicts from start-up timings; the gate checks the prediction against the steps that actually
// ran. For each bucket of decoding-sequence counts (1, 2, 3-4, 5-8, ...) it keeps the tokens per
// second of steps that verified drafts and of steps that did not (ratios of exponentially
// forgotten sums), and lets a step speculate only while speculating steps are the faster ones.
// The losing side is still tried now and then, so that a change in the workload is noticed:
// first kExploreMin steps after a verdict, the interval doubling while the verdict holds up to
// kExploreMax (kExploreClose while the two are within 10%), back to kExploreMin when the verdict
// flips. (A try is not free: a draft model that has sat out must first catch up on the tokens it
// missed.) The first kWarmup observations of each side come before any verdict. A step that tries
// speculation to learn (warm-up, exploration) is a probe: one of its sequences drafts even where
// ChooseK, still at its prior acceptance, would not, so that acceptance and speed get measured at
// all (the scheduler picks the sequence, docs/speculative.md). Not thread-safe: the engine thread
// owns it.
class SpecGate {
 public:
  static constexpr int kWarmup = 6, kExploreMin = 16, kExploreClose = 32, kExploreMax = 256;
  static constexpr int kProbeDraft = 2;  // a probe's least draft length
  // Per observation: a memory of about 20 steps per side, long enough that one step's draft
  // catch-up (a new request's prompt) does not flip a verdict by itself.
  static constexpr double kDecay = 0.95;

  enum class Decision {
    kPlain,      // no drafts
    kSpeculate,  // drafts as ChooseK sees fit
    kProbe,      // drafts, at least a short one, to measure
  };
  // For a step with `sequences` (>= 1) decoding sequences. Counts as a step of that bucket for
  // exploration.
  Decision Decide(int sequences);
  // A kProbe decision for `sequences` found nothing to draft (say every sequence's draft model
  // would first have to catch up on many tokens): the next step of that bucket probes instead.
  void ProbeUnused(int sequences);
  // Whether speculating steps have measured faster at that batch size (both sides warmed up).
  // Steps that also carry prompt rows speculate only on this evidence (the scheduler observes
  // them by their decode part: their time less the prompt rows' predicted share).
  bool Proven(int sequences) const;
  // A step ran: `sequences` decoding sequences, `speculated` whether any draft was verified,
  // `tokens` emitted, `seconds` of wall time of its decode part (drafting included).
  void Observe(int sequences, bool speculated, double tokens, double seconds);
  // Seconds that speculating cost beyond the steps observed (a draft model's catch-up spread
  // over its sequence's life): added to the speculating side of the bucket of `sequences`.
  void Charge(int sequences, double seconds);
  // Tokens per second of the bucket of `sequences` with and without speculation; 0 before any
  // observation.
  double Rate(int sequences, bool speculated) const;

 private:
  struct Side {
    double tokens = 0, seconds = 0;
    int n = 0;
    double rate() const { return seconds > 0 ? tokens / seconds : 0; }
  };
  struct Bucket {
    Side on, off;
    int64_t steps = 0;         // Decide() calls
    int64_t next_explore = 0;  // the step that tries the losing side
    int interval = kExploreMin;
    bool judged = false;       // warmed up and decided at least once
    bool on_wins = false;      // the verdict at the last decision
  };
  static int BucketOf(int sequences);
  Bucket& At(int sequences);  // grown on first use
  std::vector<Bucket> buckets_;
};

}  // namespace pd::engine::spec
