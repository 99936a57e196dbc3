#include "prefill_node/prefill_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/log.h"
#include "common/strings.h"
#include "engine/kv/block_hash.h"
#include "node/kv_push.h"
#include "node/queue_sink.h"
#include "proto/node_convert.h"

namespace pd::node {
namespace nv1 = ::pdserve::node::v1;

namespace {

const std::vector<double>& TransferBuckets() {
  static const std::vector<double> b = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
                                        0.2,    0.5,   1,     2,     5,    10,   30};
  return b;
}

}  // namespace

PrefillService::PrefillService(NodeState& state, KvReceiver* receiver)
    : state_(state), receiver_(receiver) {
  if (MetricsRegistry* m = state.metrics()) {
    transfer_s_ = &m->AddHistogram("pdserve_kv_transfer_seconds",
                                   "One request's KV transfer to a decode node: first layer "
                                   "pushed to every layer acknowledged.",
                                   {}, TransferBuckets())
                       .Get();
    tail_s_ = &m->AddHistogram("pdserve_kv_transfer_tail_seconds",
                               "Last layer pushed to every layer acknowledged: the part of a KV "
                               "transfer that adds to TTFT.",
                               {}, TransferBuckets())
                   .Get();
    bytes_ = &m->AddCounter("pdserve_kv_transfer_bytes_total",
                            "KV bytes sent to decode nodes (after INT8 compression when on).")
                  .Get();
    failures_ = &m->AddCounter("pdserve_kv_transfer_failures_total",
                               "KV transfers that failed, by status code.", {"code"});
    pulls_ = &m->AddCounter("pdserve_kv_prefix_pulls_total",
                            "Prompt prefixes fetched from a decode node instead of computed, by "
                            "result (ok, or the failure's status code).",
                            {"result"});
    pull_tokens_ = &m->AddCounter("pdserve_kv_prefix_pull_tokens_total",
                                  "Prompt tokens whose K/V were fetched from decode nodes.")
                        .Get();
  }
}

void PrefillService::CountPull(std::string_view result) {
  if (pulls_ != nullptr) pulls_->WithLabels({std::string(result)}).Increment();
}

nv1::Decode::Stub& PrefillService::DecodeClient(const std::string& address) {
  absl::MutexLock l(&mu_);
  std::unique_ptr<nv1::Decode::Stub>& stub = decode_[address];
  if (stub == nullptr) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
    stub = nv1::Decode::NewStub(state_.cluster_channels().Make(address, args));
  }
  return *stub;
}

int PrefillService::OwnCachedBlocks(absl::Span<const int32_t> prompt, int max_blocks) const {
  const engine::EngineLoad load = state_.scheduler()->Load();
  if (load.cached_block_hashes == nullptr || load.cached_block_hashes->empty()) return 0;
  const absl::flat_hash_set<uint64_t> have(load.cached_block_hashes->begin(),
                                           load.cached_block_hashes->end());
  return engine::LeadingHeldBlocks(prompt, state_.scheduler()->kv_options().block_size, max_blocks,
                                   [&](uint64_t h) { return have.contains(h); });
}

int PrefillService::PullPrefix(grpc::ServerContext* context, const nv1::PrefillRequest& request,
                               const kvtransfer::TransferDescriptor& d) {
  engine::Scheduler& sched = *state_.scheduler();
  const KvTransferOptions& opt = state_.kv_transfer_options();
  if (receiver_ == nullptr || !opt.prefix_pull || !sched.options().prefix_cache.enabled ||
      request.kv_source().address().empty() || d.geometry.first_block <= 0) {
    return 0;
  }
  const int block = sched.kv_options().block_size;
  const int n = d.geometry.first_block * block;  // what the decode node holds
  if (n >= request.prompt_size()) return 0;      // never: a reservation leaves the last block
  const absl::Span<const int32_t> prompt(request.prompt().data(), request.prompt_size());
  const int own = OwnCachedBlocks(prompt, d.geometry.first_block);
  if (n - own * block < opt.prefix_pull_min_tokens) return 0;

  // 1. Reserve the prefix's blocks here: those this node holds are taken from its cache, the
  // rest will be written by the transfer (and filed in the cache once it completed).
  engine::GenerationRequest g;
  g.id = StrCat(request.request_id(), "/pull-prefix");
  g.prompt.assign(prompt.begin(), prompt.begin() + n);
  g.max_tokens = 1;
  auto sink = std::make_shared<QueueSink>();
  absl::StatusOr<KvReceiver::Reserved> r =
      receiver_->Reserve(std::move(g), sink, sched.kv_options().dtype, d.deadline);
  if (!r.ok()) {
    CountPull(absl::StatusCodeToString(r.status().code()));
    PD_LOG(kInfo, "request ", request.request_id(), ": no prefix pull (", r.status().ToString(),
           "); computing it");
    return 0;
  }
  auto drop = [&](const absl::Status& why) {
    receiver_->Drop(r->reservation);
    CountPull(absl::StatusCodeToString(why.code()));
    PD_LOG(kWarning, "request ", request.request_id(), ": prefix pull from ",
           request.kv_source().address(), " failed (", why.ToString(), "); computing it");
    return 0;
  };
  if (r->descriptor.empty()) {
    return drop(absl::ResourceExhaustedError("no free KV blocks for the prefix here now"));
  }
  absl::StatusOr<kvtransfer::TransferDescriptor> mine =
      kvtransfer::TransferDescriptor::Parse(r->descriptor);
  if (!mine.ok()) return drop(mine.status());

  // 2. The decode node pushes what this node lacks; the call answers once it was acknowledged.
  nv1::SendPrefixRequest sreq;
  sreq.set_reservation(request.kv_source().reservation());
  sreq.mutable_kv()->set_transport(r->descriptor);
  sreq.mutable_kv()->set_model_fingerprint(state_.model_fingerprint());
  nv1::SendPrefixResponse sresp;
  std::unique_ptr<grpc::ClientContext> ctx = grpc::ClientContext::FromServerContext(*context);
  ctx->set_deadline(absl::ToChronoTime(std::min(d.deadline, mine->deadline)));
  const grpc::Status st =
      DecodeClient(request.kv_source().address()).SendPrefix(ctx.get(), sreq, &sresp);
  if (!st.ok()) return drop(FromGrpc(st));

  // 3. Complete the import with the prompt's next token: the reservation's request ends at once
  // (max_tokens 1) and its blocks go into this node's prefix cache.
  absl::StatusOr<KvReceiver::Attached> a = receiver_->Attach(r->reservation, prompt[n]);
  if (!a.ok()) return drop(a.status());
  std::vector<int32_t> tokens;
  std::optional<engine::FinishInfo> finish;
  while (!finish && absl::Now() < d.deadline) {
    sink->Wait(absl::Now() + absl::Milliseconds(20), &tokens, &finish);
  }
  receiver_->Release(r->reservation);
  if (!finish || !finish->timing.kv_imported) {
    CountPull(finish ? "not_imported" : "DEADLINE_EXCEEDED");
    return 0;
  }
  const int pulled = n - mine->geometry.first_block * block;
  CountPull("ok");
  if (pull_tokens_ != nullptr) pull_tokens_->Increment(pulled);
  return pulled;
}

grpc::Status PrefillService::Prefill(grpc::ServerContext* context,
                                     const nv1::PrefillRequest* request,
                                     nv1::PrefillResponse* response) {
  state_.active().fetch_add(1);
  struct Done {
    NodeState& s;
    ~Done() { s.active().fetch_sub(1); }
  } done{state_};
  if (state_.draining()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill node is draining (shutting down)");
  }
  engine::Scheduler& sched = *state_.scheduler();
  const bool push = request->has_kv() && !request->kv().transport().empty();
  std::shared_ptr<kvtransfer::KvSendStream> stream;
  kvtransfer::TransferDescriptor d;
  if (push) {
    if (state_.transport() == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "kv: this prefill node sends no KV (kv_transfer.enabled is off, or its "
                          "UCX transport failed to start: see its log)");
    }
    if (grpc::Status s = CheckFingerprint(request->kv(), state_, "the decode node"); !s.ok()) {
      return s;
    }
    absl::StatusOr<kvtransfer::TransferDescriptor> parsed =
        kvtransfer::TransferDescriptor::Parse(request->kv().transport());
    if (!parsed.ok()) return ToGrpc(parsed.status());
    d = *std::move(parsed);
    if (d.geometry.n_tokens != request->prompt_size()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          StrCat("kv: the descriptor is for ", d.geometry.n_tokens,
                                 " prompt tokens, the prompt has ", request->prompt_size()));
    }
    if (absl::Status s = d.geometry.CheckCache(sched.kv_options()); !s.ok()) return ToGrpc(s);
    absl::StatusOr<std::unique_ptr<kvtransfer::KvSendStream>> s =
        state_.transport()->Connect(d, sched.kv_options().dtype);
    if (!s.ok()) return ToGrpc(s.status());
    stream = *std::move(s);
  }
  const absl::Time start = absl::Now();
  const int pulled = push ? PullPrefix(context, *request, d) : 0;
  const absl::Time pulled_at = absl::Now();

  engine::GenerationRequest g;
  g.id = request->request_id();
  g.prompt.assign(request->prompt().begin(), request->prompt().end());
  g.sampling = FromProto(request->sampling());
  g.max_tokens = 1;
  // No stop tokens here: the first token is always emitted, so that a stop token can be handed
  // to the decode node (which then ends the request as stopped and frees its blocks).
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    g.deadline = absl::FromChrono(context->deadline());
  }
  absl::StatusOr<PushedPrompt> run = RunAndPush(sched, std::move(g), stream, d.deadline,
                                                [context] { return context->IsCancelled(); });
  if (!run.ok()) {
    if (stream != nullptr && failures_ != nullptr) {
      failures_->WithLabels({absl::StatusCodeToString(run.status().code())}).Increment();
    }
    return ToGrpc(run.status());
  }
  const int32_t first = run->first_token;
  bool stopped = false;
  for (int32_t t : request->stop_token_ids()) stopped |= t == first;
  response->set_first_token(first);
  response->set_stopped(stopped);
  response->set_prefill_s(absl::ToDoubleSeconds(run->computed - start));
  response->set_cached_tokens(run->finish.cached_tokens);
  response->set_pulled_tokens(std::min(pulled, run->finish.cached_tokens));
  response->set_pull_s(absl::ToDoubleSeconds(pulled_at - start));
  if (run->finish.timing.first_scheduled != absl::InfinitePast()) {
    response->set_queue_s(
        absl::ToDoubleSeconds(run->finish.timing.first_scheduled - run->finish.timing.arrival));
  }
  if (stream != nullptr) {
    response->set_transfer_tail_s(absl::ToDoubleSeconds(run->acked - run->last_push));
    response->set_kv_bytes(static_cast<int64_t>(d.geometry.TotalBytes()));
    if (transfer_s_ != nullptr) {
      transfer_s_->Observe(absl::ToDoubleSeconds(run->acked - run->first_push));
      tail_s_->Observe(absl::ToDoubleSeconds(run->acked - run->last_push));
      bytes_->Increment(static_cast<double>(d.geometry.TotalBytes()));
    }
  }
  return grpc::Status::OK;
}

}  // namespace pd::node
