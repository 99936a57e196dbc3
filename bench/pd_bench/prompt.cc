#include "bench/pd_bench/prompt.h"

#include <random>

#include "common/status.h"

namespace pd::bench {

const std::vector<std::string_view>& PromptWords() {
  static const std::vector<std::string_view>* const kWords = new std::vector<std::string_view>{
      "the",    "of",     "and",     "to",       "in",      "is",       "was",     "for",
      "on",     "that",   "with",    "as",       "at",      "by",       "from",    "his",
      "her",    "they",   "this",    "have",     "had",     "not",      "are",     "but",
      "were",   "one",    "all",     "their",    "there",   "been",     "has",     "when",
      "who",    "will",   "more",    "would",    "can",     "said",     "out",     "some",
      "time",   "what",   "about",   "into",     "than",    "them",     "only",    "other",
      "new",    "people", "year",    "way",      "day",     "man",      "world",   "life",
      "hand",   "part",   "child",   "eye",      "woman",   "place",    "work",    "week",
      "case",   "point",  "number",  "group",    "problem", "fact",     "water",   "house",
      "money",  "story",  "night",   "home",     "book",    "room",     "state",   "city",
      "road",   "river",  "music",   "family",   "friend",  "school",   "game",    "word",
      "name",   "line",   "land",    "light",    "sound",   "table",    "paper",   "field",
      "tree",   "window", "market",  "garden",   "country", "morning",  "evening", "summer",
      "winter", "color",  "animal",  "letter",   "picture", "language", "moment",  "history",
      "power",  "office", "body",    "heart",    "voice",   "face",     "door",    "head",
      "result", "system", "program", "question", "service", "order",    "team",    "level",
      "price",  "report", "plan",    "idea",     "rule",    "member",   "center",  "car",
      "street", "food",   "student"};
  return *kWords;
}

std::string BuildPrompt(int tokens, uint64_t seed) {
  PD_CHECK(tokens >= 1);
  const std::vector<std::string_view>& words = PromptWords();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, words.size() - 1);
  std::string text;
  text.reserve(static_cast<size_t>(tokens) * 7);
  for (int i = 0; i < tokens; ++i) {
    if (i > 0) text.push_back(' ');
    const std::string_view w = words[pick(rng)];
    text.append(w.data(), w.size());
  }
  return text;
}

namespace {
uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c) {
  return SplitMix64(SplitMix64(SplitMix64(a) ^ b) ^ c);
}

}  // namespace pd::bench
