#include "proto/node_convert.h"

namespace pd::node {

engine::SamplingParams FromProto(const ::pdserve::node::v1::Sampling& s) {
  engine::SamplingParams p;
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  p.top_p = s.top_p();
  p.min_p = s.min_p();
  p.repetition_penalty = s.repetition_penalty();
  p.penalty_last_n = s.penalty_last_n();
  p.seed = s.seed();
  return p;
}

void ToProto(const engine::SamplingParams& s, ::pdserve::node::v1::Sampling* out) {
  out->set_temperature(s.temperature);
  out->set_top_k(s.top_k);
  out->set_top_p(s.top_p);
  out->set_min_p(s.min_p);
  out->set_repetition_penalty(s.repetition_penalty);
  out->set_penalty_last_n(s.penalty_last_n);
  out->set_seed(s.seed);
}

}  // namespace pd::node
