// `pdctl chat`: an interactive chat with a model. Reads user turns line by line from stdin and
// answers each, streamed to stdout, with the whole conversation as context; /reset forgets the
// history, /exit (or end of input) quits. A turn that fails (e.g. the conversation outgrew the
// context) is reported on stderr and dropped. Exit codes: 0 at the end of input; 2 bad input;
// 1 any other failure.
#pragma once

#include <string>

#include "CLI/CLI.hpp"
#include "tools/pdctl/generate_cmd.h"

namespace pd::tools {

struct ChatFlags {
  GenerateFlags generate;     // the engine and sampling options; no prompt
  std::string system;         // system message; "" = none
  std::string template_name;  // "" = from the model
};

CLI::App* AddChatCommand(CLI::App& app, ChatFlags* flags);
int RunChat(const ChatFlags& flags);

}  // namespace pd::tools
