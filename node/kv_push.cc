#include "node/kv_push.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/strings.h"
#include "node/queue_sink.h"

namespace pd::node {
namespace {

// When the export hook pushed the first and the last layer (engine thread -> caller).
struct PushTimes {
  absl::Mutex mu;
  absl::Time first = absl::InfinitePast();
  absl::Time last = absl::InfinitePast();
  int64_t kv_seq = -1;  // the exported sequence, whose blocks the scheduler holds for the send
  // A cache in device memory (a GPU layer): the layers' blocks copied to host memory, which the
  // transport reads instead of the device pointers (kv_transport.h: spans are host memory). Kept
  // until RunAndPush returns, like the held blocks, for a zero-copy send.
  std::vector<std::vector<char>> staged;
};

// Replaces `spans` (device pointers of a cache not in host memory) with host copies of the same
// blocks, appended to `staged`.
absl::Status StageOnHost(const engine::KvCache& kv, int64_t seq, std::vector<engine::KvSpan>& spans,
                         std::vector<std::vector<char>>& staged) {
  for (engine::KvSpan& s : spans) {
    std::vector<char>& buf = staged.emplace_back(s.bytes);
    if (absl::Status st = kv.Export(seq, s.layer, s.block_index, s.part, buf.data(), s.bytes);
        !st.ok()) {
      return st;
    }
    s.data = buf.data();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PushedPrompt> RunAndPush(engine::Scheduler& sched, engine::GenerationRequest request,
                                        std::shared_ptr<kvtransfer::KvSendStream> stream,
                                        absl::Time transfer_deadline,
                                        const std::function<bool()>& cancelled) {
  auto fail = [&](absl::Status why) {
    if (stream != nullptr)
      stream->Abort(absl::AbortedError(StrCat("the prefill failed: ", why.message())));
    return why;
  };
  const std::string id = request.id;
  auto sink = std::make_shared<QueueSink>();
  const auto times = std::make_shared<PushTimes>();
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
        std::move(request), sink,
        [stream, times, n_layer](const engine::KvCache& kv, int64_t seq, int layer) {
          absl::StatusOr<std::vector<engine::KvSpan>> spans = kv.ExportSpans(seq, layer);
          std::vector<std::vector<char>> staged;
          if (spans.ok() && !kv.host_memory()) {
            if (absl::Status st = StageOnHost(kv, seq, *spans, staged); !st.ok()) spans = st;
          }
          const absl::Time now = absl::Now();
          {
            absl::MutexLock l(&times->mu);
            times->kv_seq = seq;
            if (layer == 0) times->first = now;
            if (layer == n_layer - 1) times->last = now;
            // The vectors' heap buffers do not move with them: the spans stay valid.
            for (std::vector<char>& buf : staged) times->staged.push_back(std::move(buf));
          }
          if (!spans.ok()) {
            stream->Abort(spans.status());
            return;
          }
          // A failed push ends the stream; its final status reaches the caller's Wait.
          (void)stream->Push(layer, *spans);
        },
        /*hold_kv=*/true);
  } else {
    submitted = sched.Submit(std::move(request), sink);
  }
  if (!submitted.ok()) return fail(submitted);
  std::vector<int32_t> tokens;
  std::optional<engine::FinishInfo> finish;
  bool was_cancelled = false;
  while (!finish) {
    sink->Wait(absl::Now() + absl::Milliseconds(20), &tokens, &finish);
    if (!was_cancelled && cancelled && cancelled()) {
      sched.Cancel(id, engine::FinishReason::kCancelled);
      was_cancelled = true;
    }
  }
  if (was_cancelled) return fail(absl::CancelledError("the call was cancelled"));
  if (finish->reason == engine::FinishReason::kError) return fail(finish->status);
  if (finish->reason == engine::FinishReason::kDeadline) {
    return fail(absl::DeadlineExceededError("deadline passed during prefill"));
  }
  if (tokens.empty()) return fail(absl::InternalError("the prefill produced no token"));
  PushedPrompt out;
  out.first_token = tokens[0];
  out.finish = *std::move(finish);
  out.computed = absl::Now();
  out.first_push = out.last_push = out.acked = out.computed;
  if (stream == nullptr) return out;
  if (absl::Status c = stream->Complete(); !c.ok()) return fail(c);
  // The receiver acknowledges; a caller that goes away meanwhile (the router's client hung up)
  // aborts the transfer at once rather than holding the prompt's blocks until its deadline.
  const absl::Time wait_end = std::max(transfer_deadline, absl::Now()) + absl::Seconds(1);
  while (!stream->Ended() && absl::Now() < wait_end) {
    if (cancelled && cancelled()) {
      return fail(absl::CancelledError("the call was cancelled while the KV transfer ran"));
    }
    (void)stream->Wait(std::min(absl::Milliseconds(20), wait_end - absl::Now()));
  }
  const absl::Status st = stream->Wait(absl::ZeroDuration());
  if (!st.ok()) {
    stream->Abort(st);
    return absl::Status(st.code(), StrCat("KV transfer: ", st.message()));
  }
  out.acked = absl::Now();
  absl::MutexLock l(&times->mu);
  if (times->last != absl::InfinitePast()) out.last_push = times->last;
  out.first_push = times->first != absl::InfinitePast() ? times->first : out.last_push;
  return out;
}

}  // namespace pd::node
