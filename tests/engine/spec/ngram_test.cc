#include "engine/spec/ngram.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pd::engine::spec {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(NgramLookup, ProposesWhatFollowedTheLatestOccurrence) {
  //                 0  1  2  3  4  5  6  7  8  9 10
  std::vector<int32_t> t = {5, 6, 7, 8, 1, 5, 6, 9, 2, 5, 6};
  // Suffix (5, 6) occurred at 0 and 5; the latest (5) wins: 9, 2, 5, 6.
  EXPECT_THAT(NgramDrafter::Lookup(t, 3, {}), ElementsAre(9, 2, 5));
  // Past the sequence's end the continuation repeats the period (9, 2, 5, 6).
  EXPECT_THAT(NgramDrafter::Lookup(t, 6, {}), ElementsAre(9, 2, 5, 6, 9, 2));
}

TEST(NgramLookup, LongerSuffixWins) {
  // Suffix 3-gram (1, 2, 3) occurs at 0 (followed by 4); the 2-gram (2, 3) occurs later at 6
  // (followed by 9): the longer match is preferred.
  std::vector<int32_t> t = {1, 2, 3, 4, 0, 0, 2, 3, 9, 1, 2, 3};
  EXPECT_THAT(NgramDrafter::Lookup(t, 2, {.min_n = 2, .max_n = 3}), ElementsAre(4, 0));
  EXPECT_THAT(NgramDrafter::Lookup(t, 2, {.min_n = 2, .max_n = 2}), ElementsAre(9, 1));
}

TEST(NgramLookup, NothingWhenTheSuffixNeverRecurs) {
  std::vector<int32_t> t = {1, 2, 3, 4, 5, 6};
  EXPECT_THAT(NgramDrafter::Lookup(t, 4, {}), IsEmpty());
  EXPECT_THAT(NgramDrafter::Lookup({7}, 4, {}), IsEmpty());
  EXPECT_THAT(NgramDrafter::Lookup({}, 4, {}), IsEmpty());
  EXPECT_THAT(NgramDrafter::Lookup(t, 0, {}), IsEmpty());
}

TEST(NgramLookup, PeriodicTextContinuesThePeriod) {
  // A run of one token: the suffix (4, 4) overlaps itself; its continuation is more 4s.
  std::vector<int32_t> t = {1, 4, 4, 4, 4};
  EXPECT_THAT(NgramDrafter::Lookup(t, 3, {}), ElementsAre(4, 4, 4));
  std::vector<int32_t> ab = {7, 1, 2, 1, 2};  // period 2
  EXPECT_THAT(NgramDrafter::Lookup(ab, 5, {}), ElementsAre(1, 2, 1, 2, 1));
}

TEST(NgramOptions, Validate) {
  EXPECT_TRUE(NgramOptions{}.Validate().ok());
  EXPECT_FALSE((NgramOptions{.min_n = 0, .max_n = 2}).Validate().ok());
  EXPECT_FALSE((NgramOptions{.min_n = 3, .max_n = 2}).Validate().ok());
}

TEST(NgramDrafter, ProposeFillsEveryRequestWithDeterministicProposals) {
  NgramDrafter d;
  std::vector<int32_t> a = {1, 2, 3, 1, 2}, b = {9, 8, 7};
  DraftRequest ra, rb;
  ra.tokens = a;
  ra.max_draft = 4;
  rb.tokens = b;
  rb.max_draft = 4;
  rb.draft = {42};  // stale output is replaced
  DraftRequest* reqs[] = {&ra, &rb};
  ASSERT_TRUE(d.Propose(reqs).ok());
  EXPECT_THAT(ra.draft, ElementsAre(3, 1, 2, 3));
  EXPECT_THAT(ra.q, IsEmpty());
  EXPECT_THAT(rb.draft, IsEmpty());
}

}  // namespace
}  // namespace pd::engine::spec
