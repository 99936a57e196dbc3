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

absl::Status SplitHostPort(const std::string& target, std::string* host, int* port) {
  const auto bad = [&] {
    return absl::InvalidArgumentError(
        pd::StrCat("target '", target, "': expected HOST:PORT (or [IPV6]:PORT)"));
  };
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad();
  std::string h = target.substr(0, colon);
  if (h.front() == '[') {
    if (h.size() < 3 || h.back() != ']') return bad();
    h = h.substr(1, h.size() - 2);
  }
  int p = 0;
  if (!absl::SimpleAtoi(target.substr(colon + 1), &p) || p <= 0 || p > 65535) return bad();
  *host = h;
  *port = p;
  return absl::OkStatus();
}

}  // namespace pd::bench
