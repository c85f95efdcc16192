// The runtime's threads: one pool, sized by --threads (default: all cores).
#pragma once

#include <cstdint>
#include <functional>

namespace moert {

/// Sets the number of worker threads (>= 1) used by parallelFor.
void setNumThreads(int threads);
int numThreads();

/// Runs body(begin, end) over [0, n) split into contiguous chunks, one per
/// thread (at least `grain` items each); returns when all are done. Nested
/// calls run serially.
void parallelFor(int64_t n, const std::function<void(int64_t, int64_t)> &body,
                 int64_t grain = 1);

} // namespace moert
