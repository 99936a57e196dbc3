#include "engine/spec/draft_model.h"

#include <algorithm>
#include <utility>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"

namespace pd::engine::spec {

absl::StatusOr<std::unique_ptr<DraftModelDrafter>> DraftModelDrafter::Create(
    std::unique_ptr<Model> model, int target_vocab, const DraftModelOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("draft model: null");
  if (model->config().n_vocab != target_vocab) {
    return absl::InvalidArgumentError(
        pd::StrCat("draft model: its vocabulary has ", model->config().n_vocab,
                   " tokens, the target's ", target_vocab));
  }
  if (options.block_size < 1 || options.prefill_chunk < 1 || options.kv_bytes <= 0) {
    return absl::InvalidArgumentError(
        "draft model: block_size, prefill_chunk and kv_bytes must be positive");
  }
  KvCacheOptions kvo = model->KvOptions(1, options.kv_dtype, options.block_size);
  kvo.prefix_cache.enabled = options.prefix_cache;
  const int64_t per_block = static_cast<int64_t>(KvCache::BytesFor(kvo));
  kvo.n_blocks = static_cast<int>(std::min<int64_t>(options.kv_bytes / per_block, 1 << 30));
  if (kvo.n_blocks < 1) {
    return absl::InvalidArgumentError(pd::StrCat("draft model: kv_bytes (", options.kv_bytes,
                                                 ") is below one KV block (", per_block, ")"));
  }
  PD_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv, KvCache::Create(kvo, model->backend()));
  std::unique_ptr<DraftModelDrafter> d(
      new DraftModelDrafter(std::move(model), std::move(kv), options));
  if (options.cost.has_value()) {
    d->cost_ = *options.cost;
  } else {
    PD_ASSIGN_OR_RETURN(d->cost_, SpecCost::MeasureForward(*d->model_, *d->kv_, 16, &d->logits_));
  }
  return d;
}

bool DraftModelDrafter::Reserve(int64_t seq, int n_tokens,
                                const absl::flat_hash_set<int64_t>& busy) {
  while (!kv_->Reserve(seq, n_tokens).ok()) {
    int64_t victim = 0;
    int64_t oldest = INT64_MAX;
    for (const auto& [id, st] : states_) {
      if (id == seq || busy.contains(id)) continue;
      if (st->last_used < oldest) {
        oldest = st->last_used;
        victim = id;
      }
    }
    if (oldest == INT64_MAX) return false;
    Release(victim);
  }
  return true;
}

double DraftModelDrafter::CatchUpSeconds(int64_t seq, absl::Span<const int32_t> tokens) const {
  auto it = states_.find(seq);
  const std::vector<int32_t>* computed = it == states_.end() ? nullptr : &it->second->computed;
  const size_t n = tokens.empty() ? 0 : tokens.size() - 1;  // the last one is fed with the draft
  size_t keep = 0;
  if (computed != nullptr) {
    const size_t lim = std::min(computed->size(), n);
    while (keep < lim && (*computed)[keep] == tokens[keep]) ++keep;
  }
  // Rows beyond the one a draft step feeds anyway (a new sequence may hit the draft cache's
  // prefix cache: this is an upper bound then).
  const size_t rows = n - keep;
  return rows == 0 ? 0 : cost_.Seconds(static_cast<double>(rows) + 1) - cost_.Seconds(1);
}

void DraftModelDrafter::Release(int64_t seq) {
  kv_->Free(seq);
  states_.erase(seq);
}

absl::Status DraftModelDrafter::Propose(absl::Span<DraftRequest* const> requests) {
  ++calls_;
  const int n_vocab = model_->config().n_vocab;
  // Sequences taking part in this call: their draft KV is never evicted for another's.
  absl::flat_hash_set<int64_t> busy;
  struct Live {
    DraftRequest* r;
    State* st;
    int next = 0;       // next token of r->tokens to compute (catch-up), then the draft's
    int want = 0;       // draft tokens still to propose
    std::vector<int32_t> history;  // tokens + drafts so far (the penalty's history)
  };
  std::vector<Live> live;
  for (DraftRequest* r : requests) {
    r->draft.clear();
    r->q.clear();
    if (r->tokens.empty() || r->max_draft <= 0 || r->sampling == nullptr) continue;
    busy.insert(r->seq);
  }
  for (DraftRequest* r : requests) {
    if (!busy.contains(r->seq)) continue;
    auto& slot = states_[r->seq];
    const int n = static_cast<int>(r->tokens.size());
    if (slot == nullptr) {
      slot = std::make_unique<State>(DraftSampling(*r->sampling));
      // A new sequence starts from the longest prefix the draft cache holds.
      const int hit = kv_->MatchPrefix(r->seq, r->tokens, n - 1);
      slot->computed.assign(r->tokens.begin(), r->tokens.begin() + hit);
    }
    State* st = slot.get();
    st->last_used = calls_;
    // The cache holds K/V for st->computed; the request needs them for tokens[0, n - 1] and then
    // feeds tokens[n - 1]. Keep the common prefix (everything after it was rejected or is new).
    size_t keep = 0;
    const size_t lim = std::min<size_t>(st->computed.size(), n - 1);
    while (keep < lim && st->computed[keep] == r->tokens[keep]) ++keep;
    st->computed.resize(keep);
    kv_->Truncate(r->seq, static_cast<int>(keep));
    // Room for the catch-up and the draft's own rows (its last proposal is never fed).
    if (!Reserve(r->seq, n + r->max_draft - 1, busy)) {
      Release(r->seq);
      busy.erase(r->seq);
      continue;
    }
    Live l{r, st, static_cast<int>(keep), r->max_draft, {}};
    l.history.assign(r->tokens.begin(), r->tokens.end());
    live.push_back(std::move(l));
  }
  // Rounds of one forward each: catch-up rows (prompt chunks) while any remain, one draft row per
  // sequence after; a sequence whose last row is in the batch gets logits and draws a proposal.
  TokenDist q;
  while (true) {
    Batch batch;
    std::vector<std::pair<Live*, size_t>> outs;  // sequence, logits row
    int room = options_.prefill_chunk;
    for (Live& l : live) {
      if (l.want == 0) continue;
      const int n = static_cast<int>(l.history.size());
      if (l.next >= n) continue;
      if (room <= 0 && !batch.tokens.empty()) break;
      const int take = std::max(1, std::min(n - l.next, room));
      for (int i = 0; i < take; ++i) {
        const int pos = l.next + i;
        const bool last = pos + 1 == n;
        if (last) outs.emplace_back(&l, batch.logits_rows.size());
        batch.Add(l.history[pos], pos, l.r->seq, last);
      }
      room -= take;
      l.next += take;
    }
    if (batch.tokens.empty()) break;
    const absl::Status st = model_->Forward(batch, *kv_, &logits_);
    if (!st.ok()) {
      // Its cache contents are unknown now: drop every sequence of the batch.
      for (Live& l : live) {
        Release(l.r->seq);
        l.r->draft.clear();
        l.r->q.clear();
      }
      return st;
    }
    for (auto& [l, row] : outs) {
      // Everything fed so far has K/V now; the blocks of tokens the target confirmed (all but
      // the sequence's last) are final, and shared from now on.
      l->st->computed.assign(l->history.begin(), l->history.end());
      if (l->r->draft.empty()) {
        kv_->Publish(l->r->seq, l->r->tokens, static_cast<int>(l->r->tokens.size()) - 1);
      }
      l->st->sampler.Distribution(
          absl::MakeConstSpan(logits_.data() + row * static_cast<size_t>(n_vocab), n_vocab),
          l->history, &q);
      const int32_t x = l->st->sampler.Draw(q);
      l->r->draft.push_back(x);
      l->r->q.push_back(std::move(q));
      q = TokenDist{};
      l->history.push_back(x);
      --l->want;
    }
  }
  return absl::OkStatus();
}

}  // namespace pd::engine::spec
