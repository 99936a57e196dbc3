// Runs a prompt on a node's Scheduler while pushing each layer of its K/V to a receiver's KV
// reservation, as soon as the step that completes the prompt has stored that layer. pd-prefill
// does this for every disaggregated request (Prefill.Prefill); pd-decode does it to hand a prompt
// prefix from its prefix cache to a prefill node that lacks it (Decode.SendPrefix: the cached
// rows are reused, only the last token is computed). docs/kv_transfer.md, "In the cluster".
//
// The prompt's blocks are held (Scheduler::SubmitExport hold_kv) until the stream has ended, so
// the transport may read them in place (zero-copy send); RunAndPush releases them on every path.
//
// Thread safety: one call per request, from any thread but the engine's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/sched/scheduler.h"
#include "kvtransfer/kv_transport.h"

namespace pd::node {

struct PushedPrompt {
  int32_t first_token = 0;
  engine::FinishInfo finish;
  absl::Time computed;    // the first token was known
  absl::Time first_push;  // layer 0 was handed to the stream (= computed when never)
  absl::Time last_push;   // the last layer was (= computed when never)
  absl::Time acked;       // the receiver acknowledged every layer (= computed without a stream)
};

// Runs `request` (max_tokens 1) and, with a non-null `stream`, pushes its prompt's K/V to it, then
// completes the stream and waits for the receiver's acknowledgement until `transfer_deadline`
// (+1 s). `cancelled` (may be empty) is polled every 20 ms, during the prefill and while waiting
// for the acknowledgement; when it answers true the request is cancelled (and the stream aborted). Errors (the stream is aborted with the reason on each): the Scheduler's acceptance
// errors; CANCELLED; DEADLINE_EXCEEDED (the request's deadline passed in the prefill); the
// request's own error; INTERNAL when no token came; the transfer's final status, its message
// prefixed with "KV transfer: ".
absl::StatusOr<PushedPrompt> RunAndPush(engine::Scheduler& scheduler,
                                        engine::GenerationRequest request,
                                        std::shared_ptr<kvtransfer::KvSendStream> stream,
                                        absl::Time transfer_deadline,
                                        const std::function<bool()>& cancelled);

}  // namespace pd::node
