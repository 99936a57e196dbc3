#include "engine/spec/self_head.h"

#include <algorithm>
#include <utility>

#include "common/status.h"
#include "common/strings.h"
#include "engine/kv/kv_cache.h"

namespace pd::engine::spec {

absl::StatusOr<std::unique_ptr<SelfHeadDrafter>> SelfHeadDrafter::Create(
    std::unique_ptr<Model> view, std::optional<SpecCost> cost) {
  if (view == nullptr) return absl::InvalidArgumentError("self-head drafter: null model");
  if (view->config().head_tokens.empty()) {
    return absl::InvalidArgumentError(
        "self-head drafter: the model's head is not restricted (Model::WithHead makes one)");
  }
  if (!cost.has_value()) {
    // Timed on a scratch cache of 16 rows: the drafter's real forwards write the target's.
    constexpr int kRows = 16;
    const KvCacheOptions o = view->KvOptions(1, KvDType::kF16, kRows);
    PD_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv,
                        KvCache::Create(o, absl::MakeConstSpan(view->LayerBackends())));
    std::vector<float> logits;
    PD_ASSIGN_OR_RETURN(cost, SpecCost::MeasureForward(*view, *kv, kRows, &logits));
  }
  return std::unique_ptr<SelfHeadDrafter>(new SelfHeadDrafter(std::move(view), std::move(*cost)));
}

absl::Status SelfHeadDrafter::Propose(absl::Span<DraftRequest* const> requests) {
  const int n_vocab = model_->config().n_vocab;
  const size_t n_embd = static_cast<size_t>(model_->config().n_embd);
  struct Live {
    DraftRequest* r;
    Sampler* sampler;
    std::vector<int32_t> history;  // tokens + proposals so far (the penalties' history)
  };
  std::vector<Live> live;
  KvCache* kv = nullptr;
  for (DraftRequest* r : requests) {
    r->draft.clear();
    r->q.clear();
    r->hidden.clear();
    if (r->tokens.empty() || r->max_draft <= 0 || r->sampling == nullptr ||
        r->target_kv == nullptr) {
      continue;
    }
    if (kv != nullptr && r->target_kv != kv) {
      return absl::InvalidArgumentError("self-head drafter: requests name different caches");
    }
    kv = r->target_kv;
    auto& slot = samplers_[r->seq];
    if (slot == nullptr) slot = std::make_unique<Sampler>(DraftSampling(*r->sampling));
    live.push_back(Live{r, slot.get(), std::vector<int32_t>(r->tokens.begin(), r->tokens.end())});
  }
  // Round i feeds every sequence that still wants a proposal its token at position n - 1 + i:
  // the last token first, then its own proposals.
  TokenDist q;
  for (int round = 0;; ++round) {
    Batch batch;
    std::vector<Live*> rows;
    for (Live& l : live) {
      if (static_cast<int>(l.r->draft.size()) >= l.r->max_draft) continue;
      const int32_t pos = static_cast<int32_t>(l.r->tokens.size()) - 1 + round;
      batch.AddOrdered(l.history.back(), pos, l.r->seq, true, l.r->prompt_len);
      rows.push_back(&l);
    }
    if (rows.empty()) break;
    const absl::Status st = model_->ForwardHidden(batch, *kv, &logits_, &hidden_);
    if (!st.ok()) {
      // What it wrote lies past each sequence's computed tokens: the step rewrites or drops it.
      for (Live& l : live) {
        l.r->draft.clear();
        l.r->q.clear();
        l.r->hidden.clear();
      }
      return st;
    }
    for (size_t j = 0; j < rows.size(); ++j) {
      Live& l = *rows[j];
      l.r->hidden.insert(l.r->hidden.end(), hidden_.begin() + j * n_embd,
                         hidden_.begin() + (j + 1) * n_embd);
      l.sampler->Distribution(
          absl::MakeConstSpan(logits_.data() + j * static_cast<size_t>(n_vocab), n_vocab),
          l.history, &q);
      const int32_t x = l.sampler->Draw(q);
      l.r->draft.push_back(x);
      l.r->q.push_back(std::move(q));
      q = TokenDist{};
      l.history.push_back(x);
    }
  }
  return absl::OkStatus();
}

}  // namespace pd::engine::spec
