// pd-decode: a decode node (engine + pdserve.node.v1.Decode + Node + health + /metrics).
// Wiring only; the logic is in decode_service.h and node_main.h.
#include "decode_node/decode_service.h"
#include "decode_node/node_main.h"

int main(int argc, char** argv) {
  return pd::node::NodeMain(
      "pd-decode", "decode",
      [](pd::node::NodeState& s) { return std::make_unique<pd::node::DecodeService>(s); }, argc,
      argv);
}
