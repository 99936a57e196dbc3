// pd-decode: a decode node (engine + pdserve.node.v1.Decode + Node + health + /metrics).
// Wiring only: the role is decode_node/decode_role.h, the runtime node/node_main.h.
#include <memory>

#include "decode_node/decode_role.h"
#include "node/node_main.h"

int main(int argc, char** argv) {
  return pd::node::NodeMain("pd-decode", std::make_unique<pd::node::DecodeRole>(), argc, argv);
}
