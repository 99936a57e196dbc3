// pd-prefill: a prefill node (engine + pdserve.node.v1.Prefill + Node + health + /metrics).
// Wiring only; the logic is in prefill_service.h and decode_node/node_main.h.
#include "decode_node/node_main.h"
#include "prefill_node/prefill_service.h"

int main(int argc, char** argv) {
  return pd::node::NodeMain(
      "pd-prefill", "prefill",
      [](pd::node::NodeState& s) { return std::make_unique<pd::node::PrefillService>(s); }, argc,
      argv);
}
