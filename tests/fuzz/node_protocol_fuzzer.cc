// Fuzz target: the internal node API (proto/pdserve/node/v1/node.proto) as pd-decode and
// pd-prefill receive it: bytes parsed as a request message, then handed to the real services
// (decode_node/decode_service.h, prefill_node/prefill_service.h) over real Schedulers of a tiny
// model, a real KvReceiver and in-process KV transports, as gRPC would hand them a call.
//
// Input: byte 0 picks the message, byte 1 holds flags, the rest is the message's wire bytes.
//   0 ReserveRequest      Decode.Reserve; if it is accepted, with flag 0 the prompt is then run
//                         by Prefill.Prefill and its KV pushed into the reservation (the whole
//                         disaggregated path), and the reservation is released (Decode.Release).
//   1 PrefillRequest      Prefill.Prefill. Flag 0: the descriptor's fingerprint is set to the
//                         node's, so that the descriptor itself is read.
//   2 SendPrefixRequest   Decode.SendPrefix. Flag 0: it names a live reservation the harness made;
//                         flag 1: the fingerprint is the node's.
//   3 ReleaseRequest      Decode.Release.
//   4 KvTransferDescriptor  CheckFingerprint and TransferDescriptor::Parse, as both nodes do.
//   5 Sampling            node_convert's FromProto / ToProto and SamplingParams::Validate.
// A descriptor that parses is redirected to a KV address nobody serves and given a deadline at
// most one second away before the call, so that a push to it fails at once instead of waiting
// for a receiver (the parsing is what is under test; the transfer has kv_frame_fuzzer).
//
// What must hold: no crash or sanitizer report on any message; a request whose prompt is empty or
// holds an id outside the vocabulary is refused, never run; an accepted reservation comes with a
// descriptor that parses and fits the node's cache; a prefill's first token is in the
// vocabulary; Release always answers OK; the conversions round-trip; and after every call the
// nodes are back to idle: no reservation left, no request running or waiting, every KV block
// free (a leak would show here within one input).
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/status.h"
#include "decode_node/decode_service.h"
#include "google/protobuf/stubs/logging.h"
#include "engine/sched/sampler.h"
#include "engine/sched/scheduler.h"
#include "kvtransfer/kv_transport.h"
#include "node/kv_receiver.h"
#include "node/node_server.h"
#include "pdserve/node/v1/node.pb.h"
#include "prefill_node/prefill_service.h"
#include "proto/node_convert.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/testing/tiny_engine.h"

namespace pd::fuzz {
namespace {

namespace nv1 = ::pdserve::node::v1;

constexpr uint64_t kFingerprint = 0x0123456789abcdefULL;
constexpr char kNowhere[] = "fuzz-no-such-kv-transport";

// One decode node and one prefill node in this process, built on first use and kept.
struct Nodes {
  std::unique_ptr<engine::testing::TinyEngine> decode_model, prefill_model;
  std::unique_ptr<engine::Scheduler> decode_sched, prefill_sched;
  std::unique_ptr<kvtransfer::KvTransport> decode_kv, prefill_kv;
  std::unique_ptr<node::KvReceiver> receiver;
  std::unique_ptr<node::NodeState> decode_state, prefill_state;
  std::unique_ptr<node::DecodeService> decode;
  std::unique_ptr<node::PrefillService> prefill;
  int n_vocab = 0;
};

std::unique_ptr<engine::Scheduler> MakeScheduler(engine::Model& model) {
  engine::SchedulerOptions o;
  o.kv_blocks = 64;
  o.block_size = 16;
  o.max_running_seqs = 8;
  o.prefix_cache.enabled = true;
  auto s = engine::Scheduler::Create(model, o);
  PD_CHECK_OK(s.status());
  return std::move(*s);
}

std::unique_ptr<kvtransfer::KvTransport> Inproc() {
  kvtransfer::TransportOptions o;
  o.kind = "inproc";
  auto t = kvtransfer::KvTransport::Create(o);
  PD_CHECK_OK(t.status());
  return std::move(*t);
}

Nodes& GetNodes() {
  static Nodes* n = [] {
    SetMinLogLevel(LogLevel::kError);  // refused requests and failed transfers log at info
    // Protobuf logs every string field that is not UTF-8 before refusing the message.
    google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int,
                                       const std::string&) {});
    auto* nodes = new Nodes;
    engine::testing::TinyModelSpec spec;  // both nodes load the same model
    nodes->decode_model = engine::testing::MakeTinyEngine(spec);
    nodes->prefill_model = engine::testing::MakeTinyEngine(spec);
    nodes->n_vocab = spec.n_vocab;
    nodes->decode_sched = MakeScheduler(*nodes->decode_model->model);
    nodes->prefill_sched = MakeScheduler(*nodes->prefill_model->model);
    nodes->decode_kv = Inproc();
    nodes->prefill_kv = Inproc();
    nodes->receiver =
        std::make_unique<node::KvReceiver>(*nodes->decode_sched, *nodes->decode_kv, nullptr);
    nodes->decode_state = std::make_unique<node::NodeState>("decode", *nodes->decode_sched);
    nodes->decode_state->SetKvTransport(nodes->decode_kv.get());
    nodes->decode_state->SetModelFingerprint(kFingerprint);
    nodes->prefill_state = std::make_unique<node::NodeState>("prefill", *nodes->prefill_sched);
    nodes->prefill_state->SetKvTransport(nodes->prefill_kv.get());
    nodes->prefill_state->SetModelFingerprint(kFingerprint);
    nodes->decode =
        std::make_unique<node::DecodeService>(*nodes->decode_state, nodes->receiver.get());
    nodes->prefill = std::make_unique<node::PrefillService>(*nodes->prefill_state);
    return nodes;
  }();
  return *n;
}

bool PromptIsValid(const google::protobuf::RepeatedField<int32_t>& prompt, int n_vocab) {
  if (prompt.empty()) return false;
  for (int32_t id : prompt) {
    if (id < 0 || id >= n_vocab) return false;
  }
  return true;
}

// A parsed descriptor pointed at nobody with a deadline soon (see the file comment); bytes that
// do not parse are left as they are for the node to refuse.
void Defuse(nv1::KvTransferDescriptor* kv) {
  absl::StatusOr<kvtransfer::TransferDescriptor> d =
      kvtransfer::TransferDescriptor::Parse(kv->transport());
  if (!d.ok()) return;
  d->address = kNowhere;
  d->deadline = std::min(d->deadline, absl::Now() + absl::Seconds(1));
  kv->set_transport(d->Serialize());
}

// The nodes are idle again: the calls' requests ended and freed their blocks (cancellations take
// effect before the engines' next step, so allow them a moment).
void CheckIdle(Nodes& n) {
  PD_CHECK_MSG(n.receiver->live() == 0, "a reservation outlived its Release");
  const absl::Time until = absl::Now() + absl::Seconds(10);
  for (engine::Scheduler* s : {n.decode_sched.get(), n.prefill_sched.get()}) {
    while (true) {
      const engine::EngineLoad l = s->Load();
      if (l.running == 0 && l.waiting == 0 && l.kv_blocks_free == l.kv_blocks_total) break;
      PD_CHECK_MSG(absl::Now() < until, "a request or KV blocks were left behind");
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
}

void Release(Nodes& n, uint64_t reservation) {
  grpc::ServerContext ctx;
  nv1::ReleaseRequest req;
  req.set_reservation(reservation);
  nv1::ReleaseResponse resp;
  PD_CHECK_MSG(n.decode->Release(&ctx, &req, &resp).ok(), "Decode.Release failed");
}

void CheckPrefill(Nodes& n, const nv1::PrefillRequest& req) {
  grpc::ServerContext ctx;
  nv1::PrefillResponse resp;
  const grpc::Status s = n.prefill->Prefill(&ctx, &req, &resp);
  if (!PromptIsValid(req.prompt(), n.n_vocab)) {
    PD_CHECK_MSG(!s.ok(), "Prefill ran a prompt outside the vocabulary");
  }
  if (!s.ok()) return;
  PD_CHECK_MSG(resp.first_token() >= 0 && resp.first_token() < n.n_vocab,
               "Prefill answered a token outside the vocabulary");
  bool stop = false;
  for (int32_t t : req.stop_token_ids()) stop |= t == resp.first_token();
  PD_CHECK(resp.stopped() == stop);
}

void FuzzReserve(Nodes& n, uint8_t flags, const nv1::ReserveRequest& req) {
  grpc::ServerContext ctx;
  nv1::ReserveResponse resp;
  const grpc::Status s = n.decode->Reserve(&ctx, &req, &resp);
  if (!PromptIsValid(req.request().prompt(), n.n_vocab)) {
    PD_CHECK_MSG(!s.ok(), "Reserve accepted a prompt outside the vocabulary");
  }
  if (!s.ok()) {
    PD_CHECK(!s.error_message().empty());
    return;
  }
  PD_CHECK(resp.reservation() != 0);
  if (resp.has_kv()) {
    PD_CHECK(resp.kv().model_fingerprint() == kFingerprint);
    absl::StatusOr<kvtransfer::TransferDescriptor> d =
        kvtransfer::TransferDescriptor::Parse(resp.kv().transport());
    PD_CHECK_MSG(d.ok(), "Reserve handed out a descriptor that does not parse");
    PD_CHECK(d->geometry.CheckCache(n.decode_sched->kv_options()).ok());
    PD_CHECK(d->geometry.n_tokens == req.request().prompt_size());
    if (flags & 1) {
      // The router's next step: the prefill node runs the prompt and pushes it here.
      nv1::PrefillRequest p;
      p.set_request_id(req.request().request_id());
      *p.mutable_prompt() = req.request().prompt();
      *p.mutable_sampling() = req.request().sampling();
      *p.mutable_kv() = resp.kv();
      CheckPrefill(n, p);
    }
  }
  Release(n, resp.reservation());
}

void FuzzSendPrefix(Nodes& n, uint8_t flags, nv1::SendPrefixRequest req) {
  uint64_t held = 0;
  if (flags & 1) {
    // A reservation of a valid request (no KV transfer is opened for it here).
    grpc::ServerContext ctx;
    nv1::ReserveRequest r;
    r.mutable_request()->set_request_id("fuzz-prefix-holder");
    for (int i = 0; i < 40; ++i) r.mutable_request()->add_prompt(i % n.n_vocab);
    r.mutable_request()->set_max_tokens(4);
    node::ToProto(engine::SamplingParams::Greedy(), r.mutable_request()->mutable_sampling());
    r.set_deadline_s(5);
    nv1::ReserveResponse resp;
    if (n.decode->Reserve(&ctx, &r, &resp).ok()) held = resp.reservation();
    req.set_reservation(held);
  }
  if (flags & 2) req.mutable_kv()->set_model_fingerprint(kFingerprint);
  Defuse(req.mutable_kv());
  grpc::ServerContext ctx;
  nv1::SendPrefixResponse resp;
  const grpc::Status s = n.decode->SendPrefix(&ctx, &req, &resp);
  if (s.ok()) PD_CHECK(resp.kv_bytes() > 0);
  if (held != 0) Release(n, held);
}

void FuzzDescriptor(Nodes& n, const nv1::KvTransferDescriptor& kv) {
  const grpc::Status fp = node::CheckFingerprint(kv, *n.prefill_state, "the fuzzer");
  PD_CHECK(fp.ok() == (kv.model_fingerprint() == kFingerprint));
  absl::StatusOr<kvtransfer::TransferDescriptor> d =
      kvtransfer::TransferDescriptor::Parse(kv.transport());
  if (!d.ok()) {
    PD_CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  PD_CHECK(d->Serialize() == kv.transport());
  (void)d->geometry.CheckCache(n.prefill_sched->kv_options());
}

void FuzzSampling(const nv1::Sampling& s) {
  const engine::SamplingParams p = node::FromProto(s);
  nv1::Sampling back;
  node::ToProto(p, &back);
  nv1::Sampling known = s;
  known.DiscardUnknownFields();
  PD_CHECK_MSG(back.SerializeAsString() == known.SerializeAsString(),
               "Sampling does not survive FromProto / ToProto");
  const absl::Status v = p.Validate();
  if (v.ok()) {
    PD_CHECK(p.temperature >= 0 && p.top_p > 0 && p.top_p <= 1 && p.min_p >= 0 && p.min_p <= 1 &&
             p.repetition_penalty > 0 && p.penalty_last_n >= 0);
  } else {
    PD_CHECK(v.code() == absl::StatusCode::kInvalidArgument);
  }
}

template <typename Message>
bool Parse(std::string_view bytes, Message* m) {
  return m->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

}  // namespace

int FuzzNodeProtocol(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  const size_t which = in.Pick(6);
  const uint8_t flags = in.Byte();
  const std::string_view bytes = in.Rest();
  Nodes& n = GetNodes();
  switch (which) {
    case 0: {
      nv1::ReserveRequest m;
      if (Parse(bytes, &m)) FuzzReserve(n, flags, m);
      break;
    }
    case 1: {
      nv1::PrefillRequest m;
      if (!Parse(bytes, &m)) break;
      if (flags & 1) m.mutable_kv()->set_model_fingerprint(kFingerprint);
      if (m.has_kv()) Defuse(m.mutable_kv());
      CheckPrefill(n, m);
      break;
    }
    case 2: {
      nv1::SendPrefixRequest m;
      if (Parse(bytes, &m)) FuzzSendPrefix(n, flags, m);
      break;
    }
    case 3: {
      nv1::ReleaseRequest m;
      if (Parse(bytes, &m)) Release(n, m.reservation());
      break;
    }
    case 4: {
      nv1::KvTransferDescriptor m;
      if (Parse(bytes, &m)) FuzzDescriptor(n, m);
      break;
    }
    case 5: {
      nv1::Sampling m;
      if (Parse(bytes, &m)) FuzzSampling(m);
      break;
    }
  }
  CheckIdle(n);
  return 0;
}

}  // namespace pd::fuzz
