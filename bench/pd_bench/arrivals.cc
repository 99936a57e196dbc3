#include "bench/pd_bench/arrivals.h"

#include "common/status.h"

namespace pd::bench {

PoissonArrivals::PoissonArrivals(double rate, uint64_t seed) : rng_(seed), gap_(rate) {
  PD_CHECK(rate > 0);
}

double PoissonArrivals::NextGap() { return gap_(rng_); }

}  // namespace pd::bench
