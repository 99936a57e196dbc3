#include "bench/pd_bench/client.h"

#include "absl/strings/numbers.h"
#include "common/strings.h"

namespace pd::bench {
namespace {
double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

void StreamTimer::Sent() {
  sent_ = last_ = Clock::now();
  record_->send_s = Seconds(sent_ - origin_);
}

void StreamTimer::Content(int tokens) {
  const Clock::time_point now = Clock::now();
  if (!have_content_) {
    record_->ttft_s = Seconds(now - sent_);
    have_content_ = true;
  } else {
    record_->itl_s.push_back(Seconds(now - last_));
  }
  last_ = now;
  record_->stream_tokens += tokens;
}

void StreamTimer::Ended() {
  if (ended_) return;
  ended_ = true;
  record_->e2e_s = Seconds(Clock::now() - sent_);
}

}  // namespace pd::bench
