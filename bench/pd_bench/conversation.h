// pd-bench's multi-turn chat workload (--multi-turn): conversations of `turns` user turns. Each
// turn sends the whole conversation so far (system prompt, user 1, assistant 1 as the server
// returned it, user 2, ...) as one chat request; the next turn follows the answer after a think
// time. Conversations share a few system prompts, so that a server's prefix cache can reuse the
// KV of a system prompt across conversations and of a conversation's history across its turns.
//
// Every text is built from the prompt word list (prompt.h: one word, one token) and depends only
// on (seed, conversation, turn): system prompt i starts with two words that encode i, so that no
// two system prompts share a first word (up to 147 prompts) or their first two words (beyond);
// user messages are random words seeded per (conversation, turn).
//
// Thread safety: the options and free functions are pure; a Conversation is used by one thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/pd_bench/client.h"
#include "bench/pd_bench/workload.h"

namespace pd::bench {

enum class ThinkTime { kFixed, kExponential };
enum class SystemPromptAssignment { kRoundRobin, kRandom };

struct ConversationOptions {
  int64_t conversations = 10;  // measured conversations; 0 = no limit (then --duration stops)
  int turns = 4;               // user turns per conversation
  // Pause between a turn's answer and the next turn's send: always `think_time_ms`, or drawn from
  // an exponential distribution of that mean (seeded per conversation and turn).
  double think_time_ms = 0;
  ThinkTime think_time = ThinkTime::kFixed;
  int system_prompts = 1;  // distinct system prompts; 0 = no system message
  int system_words = 256;  // words (tokens) of each system prompt
  // Conversation c gets system prompt c % system_prompts, or one drawn uniformly (seeded per c).
  SystemPromptAssignment assignment = SystemPromptAssignment::kRoundRobin;
  LengthDist user_words = LengthDist::Fixed(64);  // words of each user message
  LengthDist output = LengthDist::Fixed(64);      // max_tokens (with ignore_eos) of each turn
  uint64_t seed = 0;

  // INVALID_ARGUMENT naming the flag: turns < 1, conversations < 0, think time < 0,
  // system_prompts < 0 or more than the two leading words can tell apart, system_words < 1 (with
  // system prompts; < 2 with more than 147 of them).
  absl::Status Validate() const;
};

// System prompt `index` (0 <= index < options.system_prompts) of `system_words` words.
std::string SystemPrompt(const ConversationOptions& options, int index);

// The system prompt of conversation `conversation`; -1 when there are none.
int SystemPromptOf(const ConversationOptions& options, int64_t conversation);

// The user message of `turn` (1-based) of `conversation`.
std::string UserMessage(const ConversationOptions& options, int64_t conversation, int turn);

// max_tokens of `turn` of `conversation`.
int TurnMaxTokens(const ConversationOptions& options, int64_t conversation, int turn);

// Seconds to wait after the answer to `turn` before sending turn + 1.
double ThinkTimeS(const ConversationOptions& options, int64_t conversation, int turn);

// One conversation's history. Not thread safe; one driving thread at a time.
class Conversation {
 public:
  // Starts with the system message of SystemPromptOf(options, index), if any. `options` must
  // outlive the conversation.
  Conversation(const ConversationOptions& options, int64_t index);

  int64_t index() const { return index_; }
  // Turns answered so far; the next turn is next_turn() = turns_done() + 1.
  int turns_done() const { return turns_done_; }
  int next_turn() const { return turns_done_ + 1; }
  bool finished() const { return turns_done_ >= options_.turns; }

  // The next turn's request messages: the history and the next user message.
  // Precondition: !finished().
  std::vector<ChatMessage> NextMessages() const;
  // Words sent with the next turn (system and user messages) plus the `answer_tokens` of the
  // earlier answers: the prompt length the workload asks for, before the chat template.
  int NextPromptTokens() const;

  // Records the answer (as the server returned it, `tokens` long) to the turn NextMessages()
  // built. Precondition: !finished().
  void AddAnswer(std::string text, int tokens);

  const std::vector<ChatMessage>& history() const { return history_; }

 private:
  const ConversationOptions& options_;
  const int64_t index_;
  int turns_done_ = 0;
  std::vector<ChatMessage> history_;
  int history_tokens_ = 0;  // words of the history's messages, answers counted by their tokens
};

}  // namespace pd::bench
