// Client helpers that need no server: target parsing and the stream timer.
#include "bench/pd_bench/client.h"

#include <thread>

#include "gtest/gtest.h"

namespace pd::bench {
namespace {

TEST(SplitHostPortTest, HostsPortsAndIpv6) {
  std::string host;
  int port = 0;
  ASSERT_TRUE(SplitHostPort("127.0.0.1:50051", &host, &port).ok());
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 50051);
  ASSERT_TRUE(SplitHostPort("localhost:8080", &host, &port).ok());
  EXPECT_EQ(host, "localhost");
  ASSERT_TRUE(SplitHostPort("[::1]:9000", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 9000);
  for (const char* bad :
       {"", "host", ":80", "host:", "host:0", "host:70000", "host:8x", "[::1:80", "[]:80"}) {
    EXPECT_EQ(SplitHostPort(bad, &host, &port).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(StreamTimerTest, TtftItlAndEndAreRelativeToTheSend) {
  RequestRecord r;
  const Clock::time_point origin = Clock::now();
  StreamTimer timer(origin, &r);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  timer.Sent();
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  timer.Content(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  timer.Content(3);
  timer.Ended();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  timer.Ended();  // only the first end counts
  EXPECT_GE(r.send_s, 0.005);
  EXPECT_GE(r.ttft_s, 0.010);
  ASSERT_EQ(r.itl_s.size(), 1u);
  EXPECT_GE(r.itl_s[0], 0.010);
  EXPECT_EQ(r.stream_tokens, 4);
  EXPECT_GE(r.e2e_s, r.ttft_s + r.itl_s[0] - 1e-9);
  EXPECT_LT(r.e2e_s, r.ttft_s + r.itl_s[0] + 0.05);  // the 100 ms before the second end: not
}

}  // namespace
}  // namespace pd::bench
