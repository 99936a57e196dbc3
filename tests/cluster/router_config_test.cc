// The router section of the shared config schema (common/config.h, docs/config.md).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/config.h"
#include "common/status_matchers.h"

namespace pd {
namespace {

using ::testing::HasSubstr;

TEST(RouterConfigTest, NodesAndPoliciesParse) {
  absl::StatusOr<ServeOptions> o = ParseServeOptions(R"(
router:
  nodes:
    - {name: p0, role: prefill, address: "10.0.0.1:7000"}
    - {name: d0, role: decode, address: "10.0.0.2:7000"}
  health_interval_ms: 100
  decode_policy: round_robin
  prefill_policy: round_robin
  max_retries: 0
)",
                                                     "t");
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->router.nodes.size(), 2u);
  EXPECT_EQ(o->router.nodes[1].name, "d0");
  EXPECT_EQ(o->router.nodes[1].role, "decode");
  EXPECT_EQ(o->router.nodes[1].address, "10.0.0.2:7000");
  EXPECT_EQ(o->router.health_interval_ms, 100);
  EXPECT_EQ(o->router.decode_policy, "round_robin");
  EXPECT_EQ(o->router.max_retries, 0);
}

TEST(RouterConfigTest, DefaultsEvictWithinTwoSeconds) {
  // A dead node is out after unhealthy_after polls, each at most interval + timeout apart.
  const RouterOptions r;
  EXPECT_LE(r.unhealthy_after * (r.health_interval_ms + r.health_timeout_ms), 2000);
}

TEST(RouterConfigTest, ErrorsNameTheFullKey) {
  EXPECT_THAT(
      ParseServeOptions("router:\n  nodes:\n    - {name: a, role: decode, adress: x}\n", "t")
          .status()
          .message(),
      HasSubstr("router.nodes[0].adress: unknown key"));
  EXPECT_THAT(
      ParseServeOptions("router:\n  nodes:\n    - {name: a, role: cook, address: h:1}\n", "t")
          .status()
          .message(),
      HasSubstr("router.nodes[0].role: must be prefill or decode"));
  EXPECT_THAT(
      ParseServeOptions("router:\n  nodes:\n    - {name: a, role: decode, address: h}\n", "t")
          .status()
          .message(),
      HasSubstr("router.nodes[0].address: must be host:port"));
  EXPECT_THAT(ParseServeOptions("router:\n  nodes:\n    - {name: a, role: decode, address: h:1}\n"
                                "    - {name: a, role: decode, address: h:2}\n",
                                "t")
                  .status()
                  .message(),
              HasSubstr("router.nodes[1].name: 'a' is used twice"));
  EXPECT_THAT(ParseServeOptions("router:\n  decode_policy: nearest\n", "t").status().message(),
              HasSubstr("router.decode_policy: must be kv_aware, least_loaded, round_robin or "
                        "random"));
  EXPECT_THAT(ParseServeOptions("router:\n  prefix_weight: -1\n", "t").status().message(),
              HasSubstr("router.prefix_weight"));
  EXPECT_THAT(ParseServeOptions("router:\n  seq_cost_tokens: -1\n", "t").status().message(),
              HasSubstr("router.seq_cost_tokens"));
  EXPECT_THAT(ParseServeOptions("router:\n  nodes: 3\n", "t").status().message(),
              HasSubstr("router.nodes: expected a list"));
  EXPECT_THAT(ParseServeOptions("router:\n  helth_interval_ms: 3\n", "t").status().message(),
              HasSubstr("router.helth_interval_ms: unknown key"));
}

}  // namespace
}  // namespace pd
