// Power's own threads for the CPU kernels (pool.cpp): a parallel loop whose idle threads spin for a bounded time while
// the host is quiet and sleep at once when it is contended (docs/runtime.md, "How kernel threads wait").
#pragma once

#include <cstdint>

namespace power_pool {

// How idle kernel threads wait: sleep at once, spin up to the budget, or spin only while the host is quiet (this
// thread's run-queue delay, /proc/thread-self/schedstat, is a small share of the time that passed).
enum Wait : int64_t { kSleep = 0, kSpin = 1, kAdaptive = 2 };

void set_wait(int64_t wait, int64_t spin_us);

using Body = void (*)(const void* context, int64_t begin, int64_t end);

// Calls body(context, begin, end) over [0, n) in chunks of at least `grain` items, taken in turn by the calling thread
// and the pool's workers (at::get_num_threads() threads in all); inline when one thread or one chunk does.
void run(int64_t n, int64_t grain, Body body, const void* context);

template <class F>
void parallel_for(int64_t n, int64_t grain, const F& f) {
    run(n, grain, [](const void* context, int64_t begin, int64_t end) { (*static_cast<const F*>(context))(begin, end); },
        &f);
}

}  // namespace power_pool
