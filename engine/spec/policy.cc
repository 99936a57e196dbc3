#include "engine/spec/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "common/strings.h"

namespace pd::engine::spec {

absl::StatusOr<SpecCost> SpecCost::Measure(
    int max_rows, const std::function<absl::StatusOr<double>(int)>& seconds, int rounds) {
  if (max_rows < 1) return absl::InvalidArgumentError("SpecCost: max_rows must be >= 1");
  if (rounds < 1) return absl::InvalidArgumentError("SpecCost: rounds must be >= 1");
  std::vector<int> rows;
  for (int r = 1; r < max_rows; r *= 2) rows.push_back(r);
  rows.push_back(max_rows);
  std::vector<double> secs(rows.size(), std::numeric_limits<double>::infinity());
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < rows.size(); ++i) {
      PD_ASSIGN_OR_RETURN(double s, seconds(rows[i]));
      if (!(s > 0)) {
        return absl::InternalError(
            pd::StrCat("SpecCost: a step of ", rows[i], " rows timed ", s, " s"));
      }
      secs[i] = std::min(secs[i], s);
    }
  }
  // A larger step never costs less than a smaller one (timing noise): keep the table monotone.
  for (size_t i = 1; i < secs.size(); ++i) secs[i] = std::max(secs[i], secs[i - 1]);
  return FromPoints(std::move(rows), std::move(secs));
}

namespace {

constexpr int64_t kScratchSeq = -2;

// Step seconds by rows over `model`'s forward of the batch make_batch(rows) builds for sequence
// kScratchSeq (kv_rows(cap) positions reserved, freed after): one warm-up round over every row
// count, then SpecCost::Measure's rounds. (Timed one by one, in order, a busy moment bent the
// table: on a 2-vCPU host one start-up read 15.9 ms for one row and head-only 4 rows 19.4 ms,
// another 13.9 and 28.8, and ChooseK's K followed, 2.8 against 6.9 tokens on the same text.)
absl::StatusOr<SpecCost> MeasureBatches(Model& model, KvCache& kv, int max_rows,
                                        std::vector<float>* logits,
                                        const std::function<int(int)>& kv_rows,
                                        const std::function<Batch(int)>& make_batch) {
  const int64_t seq = kScratchSeq;
  const int cap = std::min(max_rows, kv.free_blocks() * kv.options().block_size);
  if (cap < 1) return absl::ResourceExhaustedError("no KV room to measure the step cost");
  PD_RETURN_IF_ERROR(kv.Reserve(seq, kv_rows(cap)));
  std::map<int, Batch> batches;
  auto run = [&](int rows) -> absl::StatusOr<double> {
    auto it = batches.find(rows);
    if (it == batches.end()) it = batches.emplace(rows, make_batch(rows)).first;
    const absl::Time start = absl::Now();
    PD_RETURN_IF_ERROR(model.Forward(it->second, kv, logits));
    return absl::ToDoubleSeconds(absl::Now() - start);
  };
  absl::StatusOr<SpecCost> cost = SpecCost::Measure(cap, run, 1);  // the warm-up round
  if (cost.ok()) cost = SpecCost::Measure(cap, run, SpecCost::kMeasureRounds);
  kv.Free(seq);
  return cost;
}

}  // namespace

absl::StatusOr<SpecCost> SpecCost::MeasureForward(Model& model, KvCache& kv, int max_rows,
                                                  std::vector<float>* logits) {
  const int n_vocab = model.config().n_vocab;
  return MeasureBatches(
      model, kv, max_rows, logits, [](int rows) { return rows; },
      [n_vocab](int rows) {
        Batch batch;
        for (int i = 0; i < rows; ++i) batch.AddOrdered(i % n_vocab, i, kScratchSeq, true, 0);
        return batch;
      });
}

absl::StatusOr<SpecCost> SpecCost::MeasureHead(Model& model, KvCache& kv, int max_rows,
                                               std::vector<float>* logits) {
  const int64_t n_embd = model.config().n_embd;
  return MeasureBatches(
      model, kv, max_rows, logits, [](int) { return 1; },
      [n_embd](int rows) {
        Batch batch;
        batch.AddOrdered(0, 0, kScratchSeq, true, 0);
        // Hidden states of a plausible size (the output norm rescales them anyway).
        batch.head_x.resize(static_cast<size_t>(rows - 1) * n_embd);
        for (size_t i = 0; i < batch.head_x.size(); ++i) {
          batch.head_x[i] = static_cast<float>(static_cast<int64_t>(i % 17) - 8) * 0.125f;
        }
        return batch;
      });
}

SpecCost SpecCost::FromPoints(std::vector<int> rows, std::vector<double> seconds) {
  PD_CHECK(!rows.empty() && rows.size() == seconds.size());
  SpecCost c;
  c.rows_ = std::move(rows);
  c.seconds_ = std::move(seconds);
  return c;
}

double SpecCost::Seconds(double rows) const {
  const size_t n = rows_.size();
  if (n == 1) return seconds_[0] * std::max(1.0, rows / rows_[0]);
  if (rows <= rows_[0]) return seconds_[0];
  size_t i = 1;
  while (i + 1 < n && rows > rows_[i]) ++i;
  const double x0 = rows_[i - 1], x1 = rows_[i];
  const double slope = (seconds_[i] - seconds_[i - 1]) / (x1 - x0);
  return seconds_[i - 1] + slope * (rows - x0);
}

void AcceptanceEstimate::Observe(int drafted, int accepted) {
  tried_ = tried_ * kDecay + drafted;
  taken_ = taken_ * kDecay + accepted;
}

void AcceptanceEstimate::Idle() {
  tried_ *= kIdleDecay;
  taken_ *= kIdleDecay;
}

double AcceptanceEstimate::rate(double prior) const {
  const double a = (taken_ + prior * kPriorWeight) / (tried_ + kPriorWeight);
  return std::clamp(a, 0.01, 0.99);
}

double ExpectedTokens(double a, int k) {
  if (a >= 1) return k + 1;
  return (1 - std::pow(a, k + 1)) / (1 - a);
}

int ChooseK(StepEstimate& step, const SpecCost& cost, double a, int limit, double draft_row_seconds,
            double min_gain, double fixed_seconds, const SpecCost* head_only) {
  if (limit <= 0 || step.seconds <= 0) return 0;
  double best = step.tokens / step.seconds;  // the step's tokens per second without this draft
  // What a draft's own return must beat (by min_gain).
  const double base = step.base_rate > 0 ? step.base_rate : best;
  int k = 0;
  double best_extra = 0;
  for (int kk = 1; kk <= limit; ++kk) {
    const double rows_s = head_only != nullptr ? head_only->Seconds(1 + kk) - head_only->Seconds(1)
                                               : cost.Seconds(step.rows + kk) - step.seconds;
    const double extra_s =
        rows_s + kk * std::max(0.0, draft_row_seconds) + std::max(0.0, fixed_seconds);
    const double gained = ExpectedTokens(a, kk) - 1;  // tokens beyond the plain step's one
    // The draft's own return (its extra tokens per extra second) must beat the step's rate by
    // min_gain; among those, the k that makes the step's rate highest.
    if (extra_s > 0 && gained / extra_s < min_gain * base) continue;
    const double rate = (step.tokens + gained) / (step.seconds + std::max(0.0, extra_s));
    if (rate > best) {
      best = rate;
      k = kk;
      best_extra = std::max(0.0, extra_s);
    }
  }
  if (k > 0) {
    step.tokens += ExpectedTokens(a, k) - 1;
    step.seconds += best_extra;
    if (head_only == nullptr) step.rows += k;
  }
  return k;
}

int SpecGate::BucketOf(int sequences) {
  int b = 0;
  for (int n = std::max(1, sequences) - 1; n > 0; n >>= 1) ++b;
  return b;  // 1 -> 0, 2 -> 1, 3-4 -> 2, 5-8 -> 3, ...
}

SpecGate::Bucket& SpecGate::At(int sequences) {
  const size_t b = static_cast<size_t>(BucketOf(sequences));
  if (buckets_.size() <= b) buckets_.resize(b + 1);
  return buckets_[b];
}

SpecGate::Decision SpecGate::Decide(int sequences) {
  Bucket& k = At(sequences);
  const int64_t step = k.steps++;
  // Warm-up: alternate until both sides have their first observations (a probe may still draft
  // nothing, so "on" samples can lag: keep probing until they come).
  if (k.on.n < kWarmup || k.off.n < kWarmup) {
    return k.on.n <= k.off.n ? Decision::kProbe : Decision::kPlain;
  }
  const double on = k.on.rate(), off = k.off.rate();
  const bool on_wins = on >= off;
  if (on_wins != k.on_wins || !k.judged) {  // a new (or the first) verdict
    k.judged = true;
    k.on_wins = on_wins;
    k.interval = kExploreMin;
    k.next_explore = step + kExploreMin;
  }
  bool explore = false;
  if (step >= k.next_explore) {
    explore = true;
    const bool close = on < 1.1 * off && off < 1.1 * on;
    k.interval = std::min(2 * k.interval, close ? kExploreClose : kExploreMax);
    k.next_explore = step + k.interval;
  }
  if (on_wins) return explore ? Decision::kPlain : Decision::kSpeculate;
  return explore ? Decision::kProbe : Decision::kPlain;
}

void SpecGate::ProbeUnused(int sequences) {
  const size_t b = static_cast<size_t>(BucketOf(sequences));
  if (b < buckets_.size() && buckets_[b].judged) buckets_[b].next_explore = buckets_[b].steps;
}

bool SpecGate::Proven(int sequences) const {
  const size_t b = static_cast<size_t>(BucketOf(sequences));
  if (b >= buckets_.size()) return false;
  const Bucket& k = buckets_[b];
  return k.on.n >= kWarmup && k.off.n >= kWarmup && k.on.rate() > k.off.rate();
}

void SpecGate::Observe(int sequences, bool speculated, double tokens, double seconds) {
  if (sequences < 1 || seconds <= 0 || tokens < 0) return;
  Bucket& k = At(sequences);
  Side& s = speculated ? k.on : k.off;
  s.tokens = s.tokens * kDecay + tokens;
  s.seconds = s.seconds * kDecay + seconds;
  ++s.n;
}

void SpecGate::Charge(int sequences, double seconds) {
  if (!(seconds > 0)) return;
  At(sequences).on.seconds += seconds;
}

double SpecGate::Rate(int sequences, bool speculated) const {
  const size_t b = static_cast<size_t>(BucketOf(sequences));
  if (b >= buckets_.size()) return 0;
  return speculated ? buckets_[b].on.rate() : buckets_[b].off.rate();
}

}  // namespace pd::engine::spec
