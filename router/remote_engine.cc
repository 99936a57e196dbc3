#include "router/remote_engine.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <utility>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "pdserve/node/v1/node.grpc.pb.h"
#include "proto/node_convert.h"

namespace pd::router {
namespace nv1 = ::pdserve::node::v1;
using engine::FinishReason;

struct RemoteEngine::Call {
  engine::GenerationRequest request;
  std::shared_ptr<engine::GenerationSink> sink;
  absl::Time arrival;
  std::thread thread;

  absl::Mutex mu;
  grpc::ClientContext* context ABSL_GUARDED_BY(mu) = nullptr;  // the attempt in flight
  const NodeRegistry::Node* node ABSL_GUARDED_BY(mu) = nullptr;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  FinishReason cancel_reason ABSL_GUARDED_BY(mu) = FinishReason::kCancelled;
  bool node_failed ABSL_GUARDED_BY(mu) = false;  // the registry evicted the node mid-call
  // Decode.Release calls owed once the client was told the request ended (the call thread's):
  // a cancelled request's end must not wait on a slow node.
  std::vector<std::function<void()>> after_finish;
};

RemoteEngine::RemoteEngine(NodeRegistry& registry, const RemoteEngineOptions& options,
                           MetricsRegistry* metrics)
    : registry_(registry), options_(options) {
  if (metrics != nullptr) {
    placements_ =
        &metrics->AddCounter("pdserve_router_placements_total",
                             "Requests (and retries) placed on a node.", {"node", "role"});
    retries_ = &metrics->AddCounter(
        "pdserve_router_retries_total",
        "Requests re-run on another node (reason: node_failed, unavailable, exhausted).",
        {"reason"});
  }
  if (metrics != nullptr) {
    paths_ = &metrics->AddCounter(
        "pdserve_router_prefill_path_total",
        "Where requests were prefilled (path: kv_transfer = on a prefill node with the KV pushed "
        "to the decode node; decode_local = on the decode node, no prefill node used; "
        "transfer_fallback = a prefill or KV transfer failed and the decode node prefilled).",
        {"path"});
    phases_ = &metrics->AddHistogram(
        "pdserve_router_ttft_phase_seconds",
        "Time to first token by phase (prefill_queue, prefill, transfer: the KV transfer's "
        "un-overlapped tail, first_decode: attach to the first token streamed by the decode "
        "node; decode_prefill: a decode node's own prefill up to its first token).",
        {"phase"},
        {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30});
  }
  listener_ = registry_.OnUnhealthy([this](const NodeRegistry::Node* node) { NodeFailed(node); });
}

void RemoteEngine::Path(const char* path) {
  if (paths_ != nullptr) paths_->WithLabels({path}).Increment();
}

void RemoteEngine::Phase(const char* phase, double seconds) {
  if (phases_ != nullptr && seconds >= 0) phases_->WithLabels({phase}).Observe(seconds);
}

RemoteEngine::~RemoteEngine() {
  Shutdown();
  // A health thread may be telling this engine about an eviction right now: wait for it, and
  // stop it from calling again, before the engine goes.
  registry_.RemoveListener(listener_);
}

int RemoteEngine::max_context() const {
  const int ctx = registry_.DecodeContext();
  return ctx > 0 ? ctx : options_.default_context;
}

engine::EngineLoad RemoteEngine::Load() const { return registry_.DecodeLoad(); }

absl::Status RemoteEngine::Submit(engine::GenerationRequest request,
                                  std::shared_ptr<engine::GenerationSink> sink) {
  if (sink == nullptr) return absl::InvalidArgumentError("sink: must not be null");
  if (request.id.empty()) return absl::InvalidArgumentError("id: must not be empty");
  if (request.prompt.empty()) return absl::InvalidArgumentError("prompt: must not be empty");
  if (request.max_tokens < 1) {
    return absl::InvalidArgumentError(StrCat("max_tokens: must be >= 1, got ", request.max_tokens));
  }
  PD_RETURN_IF_ERROR(request.sampling.Validate());
  Reap();
  const int64_t tokens = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
  if (registry_.PickDecode(tokens, {}) == nullptr) {
    return absl::UnavailableError(
        StrCat("no healthy decode node can hold this request (", tokens, " tokens)"));
  }
  auto call = std::make_shared<Call>();
  call->request = std::move(request);
  call->sink = std::move(sink);
  call->arrival = absl::Now();
  absl::MutexLock lock(&mu_);
  if (!accepting_) return absl::UnavailableError("the router is shutting down");
  if (calls_.contains(call->request.id)) {
    return absl::InvalidArgumentError(
        StrCat("id: '", call->request.id, "' is already used by a live request"));
  }
  calls_[call->request.id] = call;
  call->thread = std::thread([this, call] { Run(call); });
  return absl::OkStatus();
}

void RemoteEngine::Cancel(const std::string& id, FinishReason reason) {
  std::shared_ptr<Call> call;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(id);
    if (it == calls_.end()) return;
    call = it->second;
  }
  absl::MutexLock lock(&call->mu);
  if (call->cancelled) return;
  call->cancelled = true;
  call->cancel_reason = reason;
  if (call->context != nullptr) call->context->TryCancel();
}

void RemoteEngine::NodeFailed(const NodeRegistry::Node* node) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, call] : calls_) {
    absl::MutexLock call_lock(&call->mu);
    if (call->node != node || call->context == nullptr) continue;
    call->node_failed = true;
    call->context->TryCancel();
  }
}

void RemoteEngine::Reap() {
  std::vector<std::thread> done;
  {
    absl::MutexLock lock(&mu_);
    done.swap(finished_);
  }
  for (std::thread& t : done) t.join();
}

void RemoteEngine::Shutdown() {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    accepting_ = false;
    for (auto& [id, call] : calls_) ids.push_back(id);
  }
  for (const std::string& id : ids) Cancel(id, FinishReason::kCancelled);
  while (true) {
    Reap();
    {
      absl::MutexLock lock(&mu_);
      if (calls_.empty() && finished_.empty()) break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

namespace {

// The retry rule: these codes say the node failed, not the request, so another node can serve
// it (a prefill is tried on a second prefill node, a decode stream re-run elsewhere).
bool NodeLost(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::UNKNOWN ||
         code == grpc::StatusCode::INTERNAL;
}

// Decode.Release: the reservation's request ends on the decode node and its blocks are freed.
// Best effort: a node that does not answer frees them at the reservation's expiry.
// `request_id` (may be empty): also every reservation of that request, for a Decode.Reserve the
// router gave up on before it answered (the reservation it may have made is unknown here).
void ReleaseReservation(const NodeRegistry::Node& decode, uint64_t reservation,
                        const std::string& request_id = "") {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  nv1::ReleaseRequest req;
  req.set_reservation(reservation);
  req.set_request_id(request_id);
  nv1::ReleaseResponse resp;
  (void)decode.decode->Release(&ctx, req, &resp);
}

FinishReason ReasonFromName(const std::string& name) {
  if (name == "length") return FinishReason::kLength;
  if (name == "cancelled") return FinishReason::kCancelled;
  if (name == "deadline") return FinishReason::kDeadline;
  if (name == "error") return FinishReason::kError;
  return FinishReason::kStop;
}

}  // namespace

double RemoteEngine::TransferBudgetSeconds(const NodeRegistry::Node* prefill, int64_t n_prompt) {
  // The prompts queued or running on the prefill node come before this one's last layer; at the
  // node's measured rate (with half again for a rate that drifts, and prompts arriving later that
  // share its steps) that wait is added to router.kv_transfer_timeout_ms, which then covers the
  // transfer and the unforeseen. Without it a busy prefill node's queue alone ran transfers past
  // a deadline counted from placement, and their decode nodes prefilled long prompts themselves
  // (bench/results/pd_vs_colocated_2026-12-04.md, 0.3 req/s). At most an hour (Decode.Reserve's
  // limit); the request's own deadline still bounds the prefill call.
  const std::optional<absl::Duration> wait = registry_.PrefillWait(prefill, n_prompt);
  const double wait_s = wait ? absl::ToDoubleSeconds(*wait) : 0.0;
  return std::min(3600.0, options_.kv_transfer_timeout_s + 1.5 * wait_s);
}

bool RemoteEngine::Disaggregate(Call& call, const NodeRegistry::Node* decode,
                                nv1::GenerateRequest& nreq, std::vector<int32_t>& sent,
                                engine::FinishInfo& info, bool* cancelled, int decode_cached) {
  const engine::GenerationRequest& req = call.request;
  const int64_t n_prompt = static_cast<int64_t>(req.prompt.size());
  std::vector<const NodeRegistry::Node*> tried;
  // At most two prefill nodes: a dead one is retried once elsewhere.
  for (int prefill_try = 0; prefill_try < 2; ++prefill_try) {
    const NodeRegistry::Node* pnode =
        registry_.PickPrefill(n_prompt, tried, req.prompt, decode_cached);
    if (pnode == nullptr) {
      if (prefill_try == 0) return false;
      break;
    }
    tried.push_back(pnode);
    const double budget_s = TransferBudgetSeconds(pnode, n_prompt);
    // 1. Reserve on the decode node.
    nv1::ReserveRequest rreq;
    *rreq.mutable_request() = nreq;
    rreq.set_deadline_s(budget_s);
    rreq.set_int8_wire(options_.int8_wire);
    nv1::ReserveResponse rresp;
    grpc::Status rst;
    {
      // Cancellable: a client that goes away while the router waits on a slow decode node ends
      // the wait at once (the node drops a reservation whose caller is gone).
      grpc::ClientContext rctx;
      rctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      {
        absl::MutexLock lock(&call.mu);
        if (call.cancelled) {
          *cancelled = true;
          return true;
        }
        call.context = &rctx;
        call.node = decode;
      }
      rst = decode->decode->Reserve(&rctx, rreq, &rresp);
      bool gave_up = false;
      {
        absl::MutexLock lock(&call.mu);
        call.context = nullptr;
        gave_up = call.cancelled;
      }
      if (gave_up) {
        *cancelled = true;
        if (rst.ok()) {
          nreq.set_reservation(rresp.reservation());  // the caller releases it
        } else {
          // The node may have made the reservation after all (the cancel raced its answer).
          call.after_finish.push_back(
              [decode, id = nreq.request_id()] { ReleaseReservation(*decode, 0, id); });
        }
        return true;
      }
    }
    if (!rst.ok()) {
      // The decode node cannot take a transfer (kv_transfer off: FAILED_PRECONDITION) or is in
      // trouble: the plain path handles (and retries) it.
      if (rst.error_code() != grpc::StatusCode::FAILED_PRECONDITION) {
        PD_LOG(kWarning, "request ", req.id, ": Decode.Reserve on ", decode->options.name,
               " failed (", static_cast<int>(rst.error_code()), " ", rst.error_message(), ")");
      }
      return false;
    }
    nreq.set_reservation(rresp.reservation());
    if (!rresp.has_kv() || rresp.kv().transport().empty()) {
      Path("decode_local");  // no blocks for a transfer now: the decode node prefills
      return true;
    }
    // 2. Prefill with the KV pushed to the decode node.
    nv1::PrefillRequest preq;
    preq.set_request_id(req.id);
    preq.mutable_prompt()->Add(req.prompt.begin(), req.prompt.end());
    node::ToProto(req.sampling, preq.mutable_sampling());
    for (int32_t t : req.stop_token_ids) preq.add_stop_token_ids(t);
    *preq.mutable_kv() = rresp.kv();
    // The prefix the decode node holds, which the prefill node may fetch rather than compute.
    preq.mutable_kv_source()->set_address(decode->options.address);
    preq.mutable_kv_source()->set_reservation(rresp.reservation());
    nv1::PrefillResponse presp;
    grpc::ClientContext pctx;
    absl::Time pdeadline = absl::Now() + absl::Seconds(budget_s);
    if (req.deadline < pdeadline) pdeadline = req.deadline;
    pctx.set_deadline(absl::ToChronoTime(pdeadline));
    {
      absl::MutexLock lock(&call.mu);
      if (call.cancelled) {
        *cancelled = true;
        return true;  // attach-and-cancel is not needed: the caller releases below
      }
      call.context = &pctx;
      call.node = pnode;
    }
    if (placements_ != nullptr) {
      placements_->WithLabels({pnode->options.name, pnode->options.role}).Increment();
    }
    registry_.AddActive(pnode, 1, n_prompt);
    const absl::Time t0 = absl::Now();
    const grpc::Status pst = pnode->prefill->Prefill(&pctx, preq, &presp);
    registry_.AddActive(pnode, -1, n_prompt);
    if (pst.ok()) registry_.ObservePrefill(pnode, n_prompt - presp.cached_tokens());
    {
      absl::MutexLock lock(&call.mu);
      call.context = nullptr;
      *cancelled = call.cancelled;
    }
    if (*cancelled) return true;
    if (pst.ok()) {
      Path("kv_transfer");
      Phase("prefill_queue", presp.queue_s());
      if (presp.pulled_tokens() > 0) Phase("prefix_pull", presp.pull_s());
      Phase("prefill", presp.prefill_s() - presp.pull_s() - presp.queue_s());
      Phase("transfer", presp.transfer_tail_s());
      nreq.set_first_token(presp.first_token());
      info.cached_tokens = presp.cached_tokens();
      if (!presp.stopped()) {
        // The first token is known now: stream it (TTFT) without waiting for the decode node.
        const absl::Time now = absl::Now();
        if (info.timing.first_token == absl::InfinitePast()) info.timing.first_token = now;
        if (info.timing.first_scheduled == absl::InfinitePast()) {
          info.timing.first_scheduled = t0 + absl::Seconds(presp.queue_s());
        }
        sent.push_back(presp.first_token());
        call.sink->OnTokens({presp.first_token()});
      }
      return true;
    }
    const grpc::StatusCode code = pst.error_code();
    const bool node_down = NodeLost(code);
    PD_LOG(kWarning, "request ", req.id, ": prefill on ", pnode->options.name, " failed (",
           static_cast<int>(code), " ", pst.error_message(), ")");
    if (node_down) registry_.ReportFailure(pnode, StrCat(static_cast<int>(code), " ",
                                                         pst.error_message()));
    if (node_down && prefill_try == 0 && registry_.PickPrefill(n_prompt, tried, req.prompt, decode_cached) != nullptr) {
      // Another prefill node: a fresh reservation (the old transfer may hold pushed layers),
      // under an id of its own: the decode node ends the released request on its engine thread,
      // which may not have happened yet when the new Reserve arrives.
      if (retries_ != nullptr) retries_->WithLabels({"prefill_failed"}).Increment();
      ReleaseReservation(*decode, rresp.reservation());
      nreq.clear_reservation();
      nreq.set_request_id(StrCat(nreq.request_id(), "#prefill", prefill_try + 1));
      continue;
    }
    // The decode node prefills (the reservation's request is already accepted there).
    Path("transfer_fallback");
    return true;
  }
  Path("transfer_fallback");
  return true;
}

void RemoteEngine::Run(std::shared_ptr<Call> call) {
  const engine::GenerationRequest& req = call->request;
  std::vector<int32_t> sent;  // tokens already given to the sink
  std::vector<const NodeRegistry::Node*> tried;
  engine::FinishInfo info;
  info.prompt_tokens = static_cast<int>(req.prompt.size());
  info.timing.arrival = call->arrival;
  info.timing.first_scheduled = absl::InfinitePast();
  info.timing.first_token = absl::InfinitePast();
  int attempt = 0;
  bool done = false;
  while (!done) {
    const int remaining = req.max_tokens - static_cast<int>(sent.size());
    const int64_t tokens = static_cast<int64_t>(req.prompt.size() + sent.size()) + remaining;
    // The prompt as this attempt sends it: what the node's prefix cache may already hold.
    std::vector<int32_t> full_prompt = req.prompt;
    full_prompt.insert(full_prompt.end(), sent.begin(), sent.end());
    int cached = 0;
    const NodeRegistry::Node* node = registry_.PickDecode(tokens, tried, full_prompt, &cached);
    if (node == nullptr && !tried.empty()) {
      // Every untried node is gone: a node tried earlier may be healthy again.
      node = registry_.PickDecode(tokens, {}, full_prompt, &cached);
    }
    if (node == nullptr) {
      info.reason = FinishReason::kError;
      info.status = absl::UnavailableError(StrCat("no healthy decode node can take the request (",
                                                  tokens, " tokens; ", sent.size(),
                                                  " tokens were sent before the failure)"));
      break;
    }
    tried.push_back(node);
    nv1::GenerateRequest nreq;
    nreq.set_request_id(attempt == 0 ? req.id : StrCat(req.id, "#retry", attempt));
    nreq.mutable_prompt()->Add(req.prompt.begin(), req.prompt.end());
    nreq.mutable_prompt()->Add(sent.begin(), sent.end());
    node::ToProto(req.sampling, nreq.mutable_sampling());
    nreq.set_max_tokens(remaining);
    for (int32_t t : req.stop_token_ids) nreq.add_stop_token_ids(t);
    nreq.set_priority(req.priority);
    nreq.set_no_speculation(!req.speculative);
    nreq.set_resumed_tokens(static_cast<int32_t>(sent.size()));

    // The first attempt may prefill on a prefill node (the disaggregated path).
    bool disaggregated = false;
    size_t skip = 0;  // leading tokens of the decode stream the sink already has
    // Only the part of the prompt the decode node does not hold counts: a next chat turn whose
    // earlier turns are in the node's prefix cache is a short prefill there.
    if (attempt == 0 && options_.disaggregate &&
        static_cast<int64_t>(req.prompt.size()) - cached >= options_.disaggregate_min_prompt &&
        registry_.HealthyCount("prefill") > 0) {
      bool cancelled = false;
      const size_t before = sent.size();
      disaggregated = Disaggregate(*call, node, nreq, sent, info, &cancelled, cached);
      skip = sent.size() - before;
      if (cancelled) {
        if (nreq.reservation() != 0) {
          call->after_finish.push_back(
              [node, r = nreq.reservation()] { ReleaseReservation(*node, r); });
        }
        absl::MutexLock lock(&call->mu);
        info.reason = call->cancel_reason;
        break;
      }
    }
    if (attempt == 0 && !disaggregated) Path("decode_local");

    grpc::ClientContext ctx;
    if (req.deadline != absl::InfiniteFuture()) ctx.set_deadline(absl::ToChronoTime(req.deadline));
    bool cancelled_before_attach = false;
    {
      absl::MutexLock lock(&call->mu);
      if (call->cancelled) {
        info.reason = call->cancel_reason;
        cancelled_before_attach = true;
      } else {
        call->context = &ctx;
        call->node = node;
        call->node_failed = false;
      }
    }
    if (cancelled_before_attach) {
      // The KV may already be pushed into the reservation: free it now, not at its expiry.
      if (nreq.reservation() != 0) {
        call->after_finish.push_back(
            [node, r = nreq.reservation()] { ReleaseReservation(*node, r); });
      }
      break;
    }
    if (placements_ != nullptr) {
      placements_->WithLabels({node->options.name, node->options.role}).Increment();
    }
    registry_.AddActive(node, 1, tokens);
    const absl::Time attached = absl::Now();
    std::unique_ptr<grpc::ClientReader<nv1::GenerateResponse>> reader =
        node->decode->Generate(&ctx, nreq);
    nv1::GenerateResponse resp;
    std::optional<nv1::Finish> finish;
    bool first_from_node = true;
    while (reader->Read(&resp)) {
      std::vector<int32_t> t(resp.tokens().begin(), resp.tokens().end());
      if (first_from_node && !t.empty()) {
        first_from_node = false;
        Phase(disaggregated && skip > 0 ? "first_decode" : "decode_prefill",
              absl::ToDoubleSeconds(absl::Now() - attached));
      }
      // The decode node streams the prefill node's first token again: drop it once.
      const size_t drop = std::min(skip, t.size());
      t.erase(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(drop));
      skip -= drop;
      if (!t.empty()) {
        if (info.timing.first_token == absl::InfinitePast()) info.timing.first_token = absl::Now();
        sent.insert(sent.end(), t.begin(), t.end());
        call->sink->OnTokens(t);
      }
      if (resp.has_finish()) finish = resp.finish();
    }
    const grpc::Status status = reader->Finish();
    registry_.AddActive(node, -1, tokens);
    bool cancelled, node_failed;
    FinishReason cancel_reason;
    {
      absl::MutexLock lock(&call->mu);
      call->context = nullptr;
      cancelled = call->cancelled;
      cancel_reason = call->cancel_reason;
      node_failed = call->node_failed;
    }
    if (finish && status.ok()) {
      info.reason = ReasonFromName(finish->reason());
      info.timing.preemptions += finish->preemptions();
      info.draft_tokens += finish->draft_tokens();
      info.accepted_tokens += finish->accepted_tokens();
      info.cached_tokens =
          std::max(info.cached_tokens, std::min(finish->cached_tokens(), info.prompt_tokens));
      break;
    }
    if (cancelled) {
      info.reason = cancel_reason;
      // A call cancelled before the node ran its handler never attached: the reservation would
      // wait for its expiry. Releasing an attached one is harmless (its stream released it).
      if (nreq.reservation() != 0) {
        call->after_finish.push_back(
            [node, r = nreq.reservation()] { ReleaseReservation(*node, r); });
      }
      break;
    }
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
        (req.deadline != absl::InfiniteFuture() && absl::Now() >= req.deadline)) {
      info.reason = FinishReason::kDeadline;
      break;
    }
    if (static_cast<int>(sent.size()) >= req.max_tokens) {
      // Every token arrived; only the finish was lost with the node.
      info.reason = FinishReason::kLength;
      break;
    }
    // Which failures another node can fix.
    const grpc::StatusCode code = status.error_code();
    std::string reason;
    if (node_failed) {
      reason = "node_failed";
    } else if (NodeLost(code) || code == grpc::StatusCode::CANCELLED ||
               code == grpc::StatusCode::ABORTED || (status.ok() && !finish)) {
      // Besides a failed node: a decode stream cancelled or aborted by its node (a drain that
      // outlasted its grace), or one that ended without its finish message.
      reason = "unavailable";
      registry_.ReportFailure(node, StrCat(static_cast<int>(code), " ", status.error_message()));
    } else if (code == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      reason = "exhausted";
    }
    if (reason.empty() || attempt >= options_.max_retries) {
      info.reason = FinishReason::kError;
      info.status = status.ok() ? absl::UnavailableError("the decode node ended the stream early")
                                : absl::Status(static_cast<absl::StatusCode>(code),
                                               StrCat("decode node ", node->options.name, ": ",
                                                      status.error_message()));
      break;
    }
    ++attempt;
    if (retries_ != nullptr) retries_->WithLabels({reason}).Increment();
    PD_LOG(kWarning, "request ", req.id, ": decode node ", node->options.name, " failed (",
           static_cast<int>(code), " ", status.error_message(), ") after ", sent.size(),
           " tokens; retry ", attempt, " on another node");
  }
  info.completion_tokens = static_cast<int>(sent.size());
  info.timing.finished = absl::Now();
  call->sink->OnFinish(info);
  for (const auto& release : call->after_finish) release();
  absl::MutexLock lock(&mu_);
  calls_.erase(req.id);
  finished_.push_back(std::move(call->thread));
}

}  // namespace pd::router
