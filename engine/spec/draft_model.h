// The draft-model drafter: a smaller model with the target's vocabulary (another GGUF, or the
// target's own low-bit self-draft from `pdctl quantize --draft`) proposes tokens by running its
// own forward passes over its own paged KV cache, batched over every speculating sequence.
//
// Its KV follows the target's tokens without being told: each Propose compares the sequence's
// tokens with the ones its cache was computed for, keeps the common prefix (rejected drafts roll
// back there, blocks that empty are freed) and computes the rest (a new sequence's whole prompt:
// the draft's prefill happens at the sequence's first decode step, on the node that decodes).
// When its cache is full it evicts the least recently used sequences' draft KV; a sequence it
// cannot fit gets no draft that step. Full blocks of confirmed tokens (the sequence's tokens but
// its last) go into the draft cache's own prefix cache, so that a new sequence starts from the
// longest prefix any earlier one computed.
//
// Proposals are drawn with the request's sampling chain applied to the draft's logits (q), from
// a per-sequence RNG of the drafter's own, and q is returned with them for the acceptance rule.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "engine/kv/kv_cache.h"
#include "engine/runtime/model.h"
#include "engine/spec/drafter.h"
#include "engine/spec/policy.h"

namespace pd::engine::spec {

struct DraftModelOptions {
  int64_t kv_bytes = int64_t{256} << 20;  // the draft's own KV cache
  KvDType kv_dtype = KvDType::kF16;
  int block_size = 16;
  int prefill_chunk = 512;  // rows per draft forward when catching up on prompts
  // Sequences share the draft K/V of equal prompt prefixes (full blocks of tokens the target
  // has confirmed), as the target's own prefix cache does: a shared system prompt is computed
  // by the draft once.
  bool prefix_cache = true;
  // Draft step seconds by rows; empty: measured by Create (a few forwards of 1..16 rows).
  std::optional<SpecCost> cost;
};

class DraftModelDrafter final : public Drafter {
 public:
  // `model` (its backend must outlive the drafter) must have `target_vocab` tokens: the caller
  // checks the vocabularies match token by token (engine/model/vocab_match.h) before.
  // INVALID_ARGUMENT for bad options or a vocabulary size mismatch; RESOURCE_EXHAUSTED when the
  // backend cannot hold the cache.
  static absl::StatusOr<std::unique_ptr<DraftModelDrafter>> Create(
      std::unique_ptr<Model> model, int target_vocab, const DraftModelOptions& options);

  std::string_view name() const override { return "model"; }
  absl::Status Propose(absl::Span<DraftRequest* const> requests) override;
  void Release(int64_t seq) override;
  double StepSeconds(int rows) const override { return cost_.Seconds(rows); }
  // The rows its cache lacks for `tokens` (past the common prefix with what it computed), as a
  // forward of that many rows: a sequence that has not drafted for a while pays for them.
  double CatchUpSeconds(int64_t seq, absl::Span<const int32_t> tokens) const override;

  const Model& model() const { return *model_; }
  const SpecCost& cost() const { return cost_; }
  // Sequences whose draft KV the drafter holds.
  int held_sequences() const { return static_cast<int>(states_.size()); }
  const KvCache& kv() const { return *kv_; }

 private:
  struct State {
    explicit State(const SamplingParams& p) : sampler(p) {}
    std::vector<int32_t> computed;  // tokens whose K/V are in the draft cache, in order
    Sampler sampler;                // draws the proposals (the drafter's own RNG stream)
    int64_t last_used = 0;          // Propose call number, for LRU eviction
  };
  DraftModelDrafter(std::unique_ptr<Model> model, std::unique_ptr<KvCache> kv,
                    const DraftModelOptions& options)
      : model_(std::move(model)), kv_(std::move(kv)), options_(options) {}
  // Frees least recently used sequences not in `busy` until `seq` can hold n_tokens positions.
  bool Reserve(int64_t seq, int n_tokens, const absl::flat_hash_set<int64_t>& busy);

  std::unique_ptr<Model> model_;
  std::unique_ptr<KvCache> kv_;
  const DraftModelOptions options_;
  SpecCost cost_ = SpecCost::FromPoints({1}, {1e-3});
  absl::flat_hash_map<int64_t, std::unique_ptr<State>> states_;
  int64_t calls_ = 0;
  std::vector<float> logits_;
};

}  // namespace pd::engine::spec
