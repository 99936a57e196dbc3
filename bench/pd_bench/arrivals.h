// Poisson arrivals: independent exponential gaps of mean 1/rate. Deterministic for a given seed.
// Thread safety: none (one generator per dispatching thread).
#pragma once

#include <cstdint>
#include <random>

namespace pd::bench {

class PoissonArrivals {
 public:
  // Precondition: rate > 0 (requests per second).
  PoissonArrivals(double rate, uint64_t seed);

  // Seconds from the previous arrival to the next one.
  double NextGap();

 private:
  std::mt19937_64 rng_;
  std::exponential_distribution<double> gap_;
};

}  // namespace pd::bench
