#include "prefill_node/prefill_service.h"

#include <memory>
#include <optional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/strings.h"
#include "kvtransfer/kv_transport.h"
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

// When the export hook pushed the first and the last layer (engine thread -> RPC thread).
struct PushTimes {
  absl::Mutex mu;
  absl::Time first = absl::InfinitePast();
  absl::Time last = absl::InfinitePast();
  int64_t kv_seq = -1;  // the exported sequence, whose blocks the scheduler holds for the send
};

}  // namespace

PrefillService::PrefillService(NodeState& state) : state_(state) {
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
  }
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
  auto fail = [&](const grpc::Status& why) {
    if (stream != nullptr) {
      stream->Abort(absl::AbortedError(StrCat("the prefill failed: ", why.error_message())));
      if (failures_ != nullptr) {
        failures_->WithLabels({absl::StatusCodeToString(FromGrpc(why).code())}).Increment();
      }
    }
    return why;
  };

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
  const std::string id = g.id;
  auto sink = std::make_shared<QueueSink>();
  const absl::Time start = absl::Now();
  auto times = std::make_shared<PushTimes>();
  // The transport reads the prompt's blocks in place until the stream ended: the scheduler holds
  // them (hold_kv) until this function returns, on every path (the stream has ended or been
  // aborted by then, and the request has finished).
  struct ReleaseHeld {
    engine::Scheduler& sched;
    const std::shared_ptr<PushTimes>& times;
    ~ReleaseHeld() {
      int64_t seq;
      {
        absl::MutexLock l(&times->mu);
        seq = times->kv_seq;
      }
      if (seq >= 0) sched.ReleaseExportedKv(seq);
    }
  } release_held{sched, times};
  absl::Status submitted;
  if (stream != nullptr) {
    const int n_layer = sched.kv_options().n_layer;
    submitted = sched.SubmitExport(
        std::move(g), sink,
        [stream, times, n_layer](const engine::KvCache& kv, int64_t seq, int layer) {
          absl::StatusOr<std::vector<engine::KvSpan>> spans = kv.ExportSpans(seq, layer);
          const absl::Time now = absl::Now();
          {
            absl::MutexLock l(&times->mu);
            times->kv_seq = seq;
            if (layer == 0) times->first = now;
            if (layer == n_layer - 1) times->last = now;
          }
          if (!spans.ok()) {
            stream->Abort(spans.status());
            return;
          }
          // A failed push ends the stream; its final status reaches the RPC thread.
          (void)stream->Push(layer, *spans);
        },
        /*hold_kv=*/true);
  } else {
    submitted = sched.Submit(std::move(g), sink);
  }
  if (!submitted.ok()) return fail(ToGrpc(submitted));
  std::vector<int32_t> tokens;
  std::optional<engine::FinishInfo> finish;
  bool cancelled = false;
  while (!finish) {
    sink->Wait(absl::Now() + absl::Milliseconds(20), &tokens, &finish);
    if (!cancelled && context->IsCancelled()) {
      sched.Cancel(id, engine::FinishReason::kCancelled);
      cancelled = true;
    }
  }
  if (cancelled) return fail(grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled"));
  if (finish->reason == engine::FinishReason::kError) return fail(ToGrpc(finish->status));
  if (finish->reason == engine::FinishReason::kDeadline) {
    return fail(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline passed during prefill"));
  }
  if (tokens.empty()) {
    return fail(grpc::Status(grpc::StatusCode::INTERNAL, "the prefill produced no token"));
  }
  const absl::Time computed = absl::Now();
  const int32_t first = tokens[0];
  bool stopped = false;
  for (int32_t t : request->stop_token_ids()) stopped |= t == first;
  response->set_first_token(first);
  response->set_stopped(stopped);
  response->set_prefill_s(absl::ToDoubleSeconds(computed - start));
  response->set_cached_tokens(finish->cached_tokens);
  if (finish->timing.first_scheduled != absl::InfinitePast()) {
    response->set_queue_s(absl::ToDoubleSeconds(finish->timing.first_scheduled -
                                                finish->timing.arrival));
  }
  if (stream != nullptr) {
    if (absl::Status c = stream->Complete(); !c.ok()) return fail(ToGrpc(c));
    const absl::Duration wait = std::max(d.deadline - absl::Now(), absl::ZeroDuration());
    const absl::Status st = stream->Wait(wait + absl::Seconds(1));
    if (!st.ok()) {
      stream->Abort(st);
      if (failures_ != nullptr) {
        failures_->WithLabels({absl::StatusCodeToString(st.code())}).Increment();
      }
      return ToGrpc(absl::Status(st.code(), StrCat("KV transfer: ", st.message())));
    }
    const absl::Time acked = absl::Now();
    absl::Time first_push, last_push;
    {
      absl::MutexLock l(&times->mu);
      first_push = times->first;
      last_push = times->last;
    }
    if (last_push == absl::InfinitePast()) last_push = computed;
    if (first_push == absl::InfinitePast()) first_push = last_push;
    response->set_transfer_tail_s(absl::ToDoubleSeconds(acked - last_push));
    response->set_kv_bytes(static_cast<int64_t>(d.geometry.TotalBytes()));
    if (transfer_s_ != nullptr) {
      transfer_s_->Observe(absl::ToDoubleSeconds(acked - first_push));
      tail_s_->Observe(absl::ToDoubleSeconds(acked - last_push));
      bytes_->Increment(static_cast<double>(d.geometry.TotalBytes()));
    }
  }
  return grpc::Status::OK;
}

}  // namespace pd::node
