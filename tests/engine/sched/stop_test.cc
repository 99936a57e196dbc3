#include "engine/sched/stop.h"

#include <gtest/gtest.h>

namespace pd::engine {
namespace {

TEST(StopMatcherTest, NoStopsPassesEverythingThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.Push("hello"), "hello");
  EXPECT_EQ(m.Flush(), "");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcherTest, StopSplitAcrossDeltasIsHeldAndCut) {
  StopMatcher m({"</end>"});
  EXPECT_EQ(m.Push("abc</"), "abc");  // "</" may start the stop string
  EXPECT_EQ(m.Push("en"), "");
  EXPECT_EQ(m.Push("d>tail"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "</end>");
  EXPECT_EQ(m.Push("more"), "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, FalseStartIsReleased) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.Push("ST"), "");
  EXPECT_EQ(m.Push("AR"), "STAR");
  EXPECT_EQ(m.Push("S"), "");
  EXPECT_EQ(m.Flush(), "S");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcherTest, EarliestOfSeveralStopsWins) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(m.Push("hello world"), "hel");
  EXPECT_EQ(m.matched(), "lo w");
}

TEST(StopMatcherTest, EmptyStopStringIsIgnored) {
  StopMatcher m({""});
  EXPECT_EQ(m.Push("x"), "x");
  EXPECT_FALSE(m.stopped());
}

}  // namespace
}  // namespace pd::engine
