// The engine's types <-> the internal node API's messages (pdserve/node/v1/node.proto), shared by
// the router (which sends them) and the nodes (which read them), so both sides agree field by
// field.
#pragma once

#include "engine/sched/sampler.h"
#include "pdserve/node/v1/node.pb.h"

namespace pd::node {

engine::SamplingParams FromProto(const ::pdserve::node::v1::Sampling& s);
void ToProto(const engine::SamplingParams& s, ::pdserve::node::v1::Sampling* out);

}  // namespace pd::node
