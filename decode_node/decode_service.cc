#include "decode_node/decode_service.h"

#include <utility>

#include "common/strings.h"
#include "node/kv_push.h"
#include "node/kv_receiver.h"
#include "proto/node_convert.h"

namespace pd::node {
namespace nv1 = ::pdserve::node::v1;

namespace {

double Since(absl::Time from, absl::Time to) {
  if (from == absl::InfinitePast() || to == absl::InfinitePast()) return -1;
  return absl::ToDoubleSeconds(to - from);
}

// Counts the call in NodeState::active() for the drain.
class ActiveCall {
 public:
  explicit ActiveCall(NodeState& s) : s_(s) { s_.active().fetch_add(1); }
  ~ActiveCall() { s_.active().fetch_sub(1); }

 private:
  NodeState& s_;
};

}  // namespace

grpc::Status DecodeService::Reserve(grpc::ServerContext* context,
                                    const nv1::ReserveRequest* request,
                                    nv1::ReserveResponse* response) {
  ActiveCall active(state_);
  if (state_.draining()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode node is draining (shutting down)");
  }
  KvReceiver* receiver = receiver_;
  if (receiver == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this decode node receives no KV (kv_transfer.enabled is off); send "
                        "Decode.Generate without a reservation");
  }
  if (request->request().reservation() != 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "request.reservation: must be unset in Decode.Reserve");
  }
  if (!(request->deadline_s() > 0) || request->deadline_s() > 3600) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        StrCat("deadline_s: must be in (0, 3600], got ", request->deadline_s()));
  }
  engine::GenerationRequest g = ToEngine(*request);
  auto sink = std::make_shared<QueueSink>();
  const engine::KvDType wire =
      request->int8_wire() ? engine::KvDType::kI8 : state_.scheduler()->kv_options().dtype;
  absl::StatusOr<KvReceiver::Reserved> r = receiver->Reserve(
      std::move(g), sink, wire, absl::Now() + absl::Seconds(request->deadline_s()));
  if (!r.ok()) return ToGrpc(r.status());
  if (context->IsCancelled()) {
    // The router gave up while this call waited (a client that went away): nobody would attach
    // or release this reservation, so it must not outlive the call.
    receiver->Drop(r->reservation);
    return grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away");
  }
  response->set_reservation(r->reservation);
  if (!r->descriptor.empty()) {
    response->mutable_kv()->set_transport(r->descriptor);
    response->mutable_kv()->set_model_fingerprint(state_.model_fingerprint());
  }
  return grpc::Status::OK;
}

grpc::Status DecodeService::Release(grpc::ServerContext*, const nv1::ReleaseRequest* request,
                                    nv1::ReleaseResponse*) {
  KvReceiver* receiver = receiver_;
  if (receiver == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this decode node receives no KV (kv_transfer.enabled is off)");
  }
  if (request->reservation() != 0) receiver->Drop(request->reservation());
  if (!request->request_id().empty()) receiver->DropRequest(request->request_id());
  return grpc::Status::OK;
}

grpc::Status DecodeService::SendPrefix(grpc::ServerContext* context,
                                       const nv1::SendPrefixRequest* request,
                                       nv1::SendPrefixResponse* response) {
  ActiveCall active(state_);
  KvReceiver* receiver = receiver_;
  if (receiver == nullptr || state_.transport() == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this decode node has no KV transport (kv_transfer.enabled is off)");
  }
  if (grpc::Status s = CheckFingerprint(request->kv(), state_, "the prefill node"); !s.ok()) {
    return s;
  }
  absl::StatusOr<KvReceiver::Held> held = receiver->Prefix(request->reservation());
  if (!held.ok()) return ToGrpc(held.status());
  absl::StatusOr<kvtransfer::TransferDescriptor> d =
      kvtransfer::TransferDescriptor::Parse(request->kv().transport());
  if (!d.ok()) return ToGrpc(d.status());
  engine::Scheduler& sched = *state_.scheduler();
  const engine::KvCacheOptions& kv = sched.kv_options();
  const int n = d->geometry.n_tokens;
  if (n % kv.block_size != 0 || n > held->cached_tokens) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        StrCat("kv: a prefix of ", n, " tokens was asked for; reservation ", request->reservation(),
               " took ", held->cached_tokens, " tokens (whole blocks of ", kv.block_size,
               ") from this node's prefix cache"));
  }
  // Only bit-exact copies are worth filing in the receiver's prefix cache.
  if (d->geometry.wire_dtype != kv.dtype || d->geometry.receiver_dtype != kv.dtype) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        StrCat("kv: a prefix is sent only as it is cached here (", engine::KvDTypeName(kv.dtype),
               "); the receiver asked for ", engine::KvDTypeName(d->geometry.wire_dtype), " into ",
               engine::KvDTypeName(d->geometry.receiver_dtype)));
  }
  if (absl::Status s = d->geometry.CheckCache(kv); !s.ok()) return ToGrpc(s);
  absl::StatusOr<std::unique_ptr<kvtransfer::KvSendStream>> stream =
      state_.transport()->Connect(*d, kv.dtype);
  if (!stream.ok()) return ToGrpc(stream.status());
  // The prefix and its next prompt token: the prefix's rows come from the cache (the reservation
  // holds them), the one row after it is computed, and the step that computes it exports every
  // layer. n < prompt size: a reservation never takes the prompt's last token from the cache.
  engine::GenerationRequest g;
  g.id = StrCat(held->request_id, "/send-prefix");
  g.prompt.assign(held->prompt.begin(), held->prompt.begin() + n + 1);
  g.max_tokens = 1;
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    g.deadline = absl::FromChrono(context->deadline());
  }
  absl::StatusOr<PushedPrompt> pushed =
      RunAndPush(sched, std::move(g), *std::move(stream), d->deadline,
                 [context] { return context->IsCancelled(); });
  if (!pushed.ok()) return ToGrpc(pushed.status());
  response->set_kv_bytes(static_cast<int64_t>(d->geometry.TotalBytes()));
  return grpc::Status::OK;
}

engine::GenerationRequest DecodeService::ToEngine(const nv1::ReserveRequest& reserve) {
  const nv1::GenerateRequest& request = reserve.request();
  engine::GenerationRequest g;
  g.id = request.request_id();
  g.prompt.assign(request.prompt().begin(), request.prompt().end());
  g.sampling = node::FromProto(request.sampling());
  g.max_tokens = request.max_tokens();
  g.stop_token_ids.insert(request.stop_token_ids().begin(), request.stop_token_ids().end());
  g.priority = request.priority();
  g.speculative = !request.no_speculation();
  g.resumed_tokens = request.resumed_tokens();
  return g;
}

grpc::Status DecodeService::Generate(grpc::ServerContext* context,
                                     const nv1::GenerateRequest* request,
                                     grpc::ServerWriter<nv1::GenerateResponse>* writer) {
  ActiveCall active(state_);
  if (request->reservation() != 0) {
    // Attaching to a request accepted by Reserve: allowed while draining (it is live here).
    KvReceiver* receiver = receiver_;
    if (receiver == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "reservation: this decode node receives no KV (kv_transfer.enabled is "
                          "off)");
    }
    std::optional<int32_t> first;
    if (request->has_first_token()) first = request->first_token();
    absl::StatusOr<KvReceiver::Attached> a = receiver->Attach(request->reservation(), first);
    if (!a.ok()) return ToGrpc(a.status());
    const grpc::Status st =
        Stream(context, a->request_id, std::static_pointer_cast<QueueSink>(a->sink), writer);
    receiver->Release(request->reservation());
    return st;
  }
  if (state_.draining()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode node is draining (shutting down)");
  }
  nv1::ReserveRequest as_reserve;
  *as_reserve.mutable_request() = *request;
  engine::GenerationRequest g = ToEngine(as_reserve);
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    g.deadline = absl::FromChrono(context->deadline());
  }
  const std::string id = g.id;
  auto sink = std::make_shared<QueueSink>();
  if (absl::Status s = state_.engine().Submit(std::move(g), sink); !s.ok()) return ToGrpc(s);
  return Stream(context, id, sink, writer);
}

grpc::Status DecodeService::Stream(grpc::ServerContext* context, const std::string& id,
                                   const std::shared_ptr<QueueSink>& sink,
                                   grpc::ServerWriter<nv1::GenerateResponse>* writer) {
  engine::GenerationEngine& engine = state_.engine();
  bool cancelled = false;
  while (true) {
    std::vector<int32_t> tokens;
    std::optional<engine::FinishInfo> finish;
    sink->Wait(absl::Now() + absl::Milliseconds(20), &tokens, &finish);
    if (!cancelled && context->IsCancelled()) {
      // The router went away (or gave up on this node): free the KV now.
      engine.Cancel(id, engine::FinishReason::kCancelled);
      cancelled = true;
    }
    if (tokens.empty() && !finish) continue;
    if (finish && finish->reason == engine::FinishReason::kError) {
      if (!tokens.empty() && !cancelled) {
        nv1::GenerateResponse r;
        r.mutable_tokens()->Add(tokens.begin(), tokens.end());
        writer->Write(r);
      }
      return ToGrpc(finish->status);
    }
    if (cancelled) {
      if (finish) return grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled");
      continue;
    }
    nv1::GenerateResponse r;
    r.mutable_tokens()->Add(tokens.begin(), tokens.end());
    if (finish) {
      nv1::Finish* f = r.mutable_finish();
      f->set_reason(engine::FinishReasonName(finish->reason));
      f->set_prompt_tokens(finish->prompt_tokens);
      f->set_completion_tokens(finish->completion_tokens);
      f->set_time_to_first_token_s(Since(finish->timing.arrival, finish->timing.first_token));
      f->set_queue_s(Since(finish->timing.arrival, finish->timing.first_scheduled));
      f->set_preemptions(finish->timing.preemptions);
      f->set_kv_imported(finish->timing.kv_imported);
      f->set_cached_tokens(finish->cached_tokens);
      f->set_draft_tokens(finish->draft_tokens);
      f->set_accepted_tokens(finish->accepted_tokens);
    }
    if (!writer->Write(r)) {
      if (!finish) {
        engine.Cancel(id, engine::FinishReason::kCancelled);
        cancelled = true;
        continue;
      }
      return grpc::Status(grpc::StatusCode::CANCELLED, "the router went away");
    }
    if (finish) return grpc::Status::OK;
  }
}

}  // namespace pd::node
