// pd-prefill: a prefill node (engine + pdserve.node.v1.Prefill + Node + health + /metrics).
// Wiring only: the role is prefill_node/prefill_role.h, the runtime node/node_main.h.
#include <memory>

#include "node/node_main.h"
#include "prefill_node/prefill_role.h"

int main(int argc, char** argv) {
  return pd::node::NodeMain("pd-prefill", std::make_unique<pd::node::PrefillRole>(), argc, argv);
}
