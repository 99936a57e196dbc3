// The self-head drafter: the target model as its own draft (docs/speculative.md, "self-head").
//
// Its forwards are the target's own layers (a Model::WithHead view of the target, its output head
// cut to frequent tokens) over the *target's* KV cache: for each drafting sequence it feeds the
// sequence's last token and then its own proposals, one row per forward batched over the
// sequences, in the rows' own summation orders (Batch::AddOrdered). So the K/V it writes at
// positions n - 1 .. n + K - 2 (n = the sequence's tokens) and the final hidden states it returns
// are bit for bit what the target computes for those tokens, and the verifying step runs only the
// output head over those hidden states (Batch::head_x) plus one ordinary row for the last
// proposal: no layer runs twice, and no prompt is computed twice (there is no draft cache to
// catch up). Rejected proposals' K/V are rolled back by the scheduler like any verified row's.
//
// Proposals are drawn with the request's sampling chain applied to the cut head's logits (q; 0
// outside the head), from a per-sequence RNG of the drafter's own. For greedy decoding a proposal
// is the target's own choice whenever that is among the head's tokens.
//
// Runs on the engine thread only, like every Drafter.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/runtime/model.h"
#include "engine/sched/sampler.h"
#include "engine/spec/drafter.h"
#include "engine/spec/policy.h"

namespace pd::engine::spec {

class SelfHeadDrafter final : public Drafter {
 public:
  // `view`: Model::WithHead of the target (its restricted head required; INVALID_ARGUMENT
  // otherwise). `cost`: its step seconds by rows; empty: measured here on a scratch cache of the
  // view's own (a few forwards of 1..16 rows).
  static absl::StatusOr<std::unique_ptr<SelfHeadDrafter>> Create(
      std::unique_ptr<Model> view, std::optional<SpecCost> cost = std::nullopt);

  std::string_view name() const override { return "self-head"; }
  bool SharesTargetKv() const override { return true; }
  absl::Status Propose(absl::Span<DraftRequest* const> requests) override;
  void Release(int64_t seq) override { samplers_.erase(seq); }
  double StepSeconds(int rows) const override { return cost_.Seconds(rows); }

  const Model& model() const { return *model_; }

 private:
  SelfHeadDrafter(std::unique_ptr<Model> model, SpecCost cost)
      : model_(std::move(model)), cost_(std::move(cost)) {}

  std::unique_ptr<Model> model_;
  SpecCost cost_;
  absl::flat_hash_map<int64_t, std::unique_ptr<Sampler>> samplers_;
  std::vector<float> logits_, hidden_;
};

}  // namespace pd::engine::spec
