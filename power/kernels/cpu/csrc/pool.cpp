// Power's own threads for the CPU kernels. A decode step of a small model makes some eighty products, each too short
// to pay for waking a sleeping thread (OMP_WAIT_POLICY=passive), while a thread that keeps spinning takes the CPU that
// other processes on a contended host need. So an idle worker spins (with pause) for a bounded time while the host is
// quiet, and sleeps on a futex at once while it is contended, judged from how long the calling thread waited in the
// run queue (/proc/thread-self/schedstat's second field) over the last interval. Chunks are taken in turn from a
// shared counter, so a thread the scheduler preempts holds back one chunk, not a fixed share of the loop, and the
// caller waits only for the workers that entered the loop before it took the last chunk. Which thread
// computes a chunk never changes its result: the bodies write disjoint outputs by a fixed sequence per item.
#include "pool.h"

#include <ATen/Parallel.h>
#include <torch/library.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace power_pool {
namespace {

constexpr int64_t kChunksPerThread = 8;         // chunks enough that a preempted thread holds back little of a loop
constexpr int64_t kLargestChunk = 16;           // grains: one chunk's work stays short beside a wake-up
constexpr int64_t kCheckEveryNs = 20'000'000;   // how often the caller's run-queue delay is read
constexpr int64_t kLongestJudgedNs = 200'000'000;  // a longer interval since the last read is not judged
constexpr double kContendedShare = 0.05;        // run-queue delay over elapsed time from which the host is contended
constexpr int64_t kFirstHoldNs = 100'000'000;  // how long threads sleep after spinning first proved contended
constexpr int64_t kLongestHoldNs = 5'000'000'000;
constexpr int64_t kDefaultSpinNs = 200'000;

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

void futex_wait(std::atomic<uint32_t>& word, uint32_t seen) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>& word, int count) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, count, nullptr, nullptr, 0);
}

// Spins until ready() for at most budget_ns; whether it became true.
template <class Ready>
bool spin_until(const Ready& ready, int64_t budget_ns) {
    if (ready()) return true;
    if (budget_ns <= 0) return false;
    const int64_t until = now_ns() + budget_ns;
    for (;;) {
        for (int i = 0; i < 64; ++i) {
            cpu_relax();
            if (ready()) return true;
        }
        if (now_ns() > until) return false;
    }
}

// Waits until word != seen: spins within the budget, then sleeps (`sleepers` counts the sleeping threads, so the
// thread that changes the word wakes them only when there are any).
void await_change(std::atomic<uint32_t>& word, uint32_t seen, std::atomic<uint32_t>& sleepers, int64_t budget_ns) {
    if (spin_until([&] { return word.load(std::memory_order_acquire) != seen; }, budget_ns)) return;
    sleepers.fetch_add(1);
    while (word.load() == seen) futex_wait(word, seen);
    sleepers.fetch_sub(1);
}

// This thread's run-queue delay so far in nanoseconds; -1 when the kernel does not report it.
int64_t run_queue_delay_ns() {
    thread_local int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    char text[96];
    const ssize_t got = fd < 0 ? -1 : pread(fd, text, sizeof(text) - 1, 0);
    if (got <= 0) return -1;
    text[got] = '\0';
    char* rest = nullptr;
    std::strtoll(text, &rest, 10);  // the time spent running
    return std::strtoll(rest, nullptr, 10);
}

// Whether idle threads may spin, judged every kCheckEveryNs from the calling thread's run-queue delay over the
// interval. Spinning can itself be what delays the caller (a worker spinning on the caller's core), and then the
// delay vanishes as soon as the threads sleep: so after spinning proved contended the threads sleep for a hold that
// doubles each time it happens again, and resets once an interval of spinning was quiet.
struct HostJudge {
    int64_t last_at = 0, last_delay = -1, sleep_until = 0, hold = kFirstHoldNs;
    bool spinning = false;

    bool spin(int64_t at) {
        if (at - last_at < kCheckEveryNs) return spinning;
        const int64_t delay = run_queue_delay_ns();
        if (at - last_at > kLongestJudgedNs) {  // mostly time the caller did not ask for the CPU: it tells nothing
            last_at = at;
            last_delay = delay;
            return spinning;
        }
        const bool measured = last_delay >= 0 && delay >= 0;
        const bool contended = !measured || (double)(delay - last_delay) >= kContendedShare * (double)(at - last_at);
        last_at = at;
        last_delay = delay;
        if (contended && spinning) {
            sleep_until = at + hold;
            hold = std::min(2 * hold, kLongestHoldNs);
        } else if (!contended && spinning) {
            hold = kFirstHoldNs;
        }
        spinning = !contended && (spinning || at >= sleep_until);
        return spinning;
    }
};

// The door of the loop being run, one futex word: the workers inside it (low 16 bits) and whether the caller closed
// it (bit 16: it took the last chunk, so no worker may enter). A worker that enters an open door is in the loop
// being run, whichever loop woke it: the loop's fields are written before its door opens.
constexpr uint32_t kInside = 0xFFFF, kClosed = 1u << 16;

struct Pool {
    std::atomic<int64_t> wait{kAdaptive};
    std::atomic<int64_t> spin_ns{kDefaultSpinNs};
    std::atomic<int64_t> budget_ns{0};  // the spin in force: spin_ns, or 0 while the host is contended
    std::mutex caller;  // one loop at a time; a second caller runs its loop inline
    std::vector<std::thread> workers;
    std::atomic<bool> stopping{false};
    // the loop being run
    Body body = nullptr;
    const void* context = nullptr;
    int64_t n = 0, chunk = 1;
    std::atomic<int64_t> next{0};
    std::atomic<uint32_t> generation{0}, door{kClosed};  // futex words: a new loop is posted; see kInside
    std::atomic<uint32_t> idle_workers{0}, caller_sleeps{0};

    void take_chunks() {
        for (int64_t begin = next.fetch_add(chunk); begin < n; begin = next.fetch_add(chunk)) {
            body(context, begin, std::min(n, begin + chunk));
        }
    }

    // Enters the loop unless the caller closed it: a worker that wakes after the caller did all the work is not
    // waited for.
    bool enter() {
        uint32_t seen = door.load();
        do {
            if (seen & kClosed) return false;
        } while (!door.compare_exchange_weak(seen, seen + 1));
        return true;
    }

    void leave() {
        const uint32_t left = door.fetch_sub(1) - 1;
        if ((left & kInside) == 0 && (left & kClosed) && caller_sleeps.load()) futex_wake(door, 1);
    }

    // `seen`: the generation when the worker was started (it may first run after the next loop is posted).
    void work(uint32_t seen) {
        for (;;) {
            await_change(generation, seen, idle_workers, budget_ns.load(std::memory_order_relaxed));
            seen = generation.load(std::memory_order_acquire);
            if (stopping.load()) return;
            if (!enter()) continue;
            take_chunks();
            leave();
        }
    }

    void resize(int64_t count) {
        if ((int64_t)workers.size() == count) return;
        stopping.store(true);
        generation.fetch_add(1);
        futex_wake(generation, INT_MAX);
        for (auto& worker : workers) worker.join();
        workers.clear();
        stopping.store(false);
        const uint32_t now = generation.load();
        for (int64_t i = 0; i < count; ++i) workers.emplace_back([this, now] { work(now); });
    }

    // The spin in force: spin_ns, or 0 when waiting sleeps (kSleep, or kAdaptive while the host is contended).
    void judge_host() {
        thread_local HostJudge judge;
        const int64_t mode = wait.load();
        budget_ns.store(mode == kSpin || (mode == kAdaptive && judge.spin(now_ns())) ? spin_ns.load() : 0);
    }

    void run(int64_t count, int64_t step, Body f, const void* arguments) {
        body = f;
        context = arguments;
        n = count;
        chunk = step;
        next.store(0);
        door.store(0);
        generation.fetch_add(1);
        if (idle_workers.load() > 0) futex_wake(generation, INT_MAX);
        take_chunks();
        const uint32_t closed = door.fetch_or(kClosed) | kClosed;
        if ((closed & kInside) == 0) return;
        if (spin_until([&] { return (door.load(std::memory_order_acquire) & kInside) == 0; }, budget_ns.load())) return;
        caller_sleeps.store(1);
        for (uint32_t now = door.load(); now & kInside; now = door.load()) futex_wait(door, now);
        caller_sleeps.store(0);
    }
};

Pool* current = nullptr;

// The pool of this process; a child after fork() starts its own (the parent's workers do not exist in it, so
// their records are left behind rather than joined).
Pool& pool() {
    static const bool registered = [] {
        current = new Pool();
        return pthread_atfork(nullptr, nullptr, [] { current = new Pool(); }) == 0;
    }();
    (void)registered;
    return *current;
}

}  // namespace

void set_wait(int64_t wait, int64_t spin_us) {
    Pool& p = pool();
    p.wait.store(wait);
    p.spin_ns.store(spin_us * 1000);
}

void run(int64_t n, int64_t grain, Body body, const void* context) {
    if (n <= 0) return;
    const int64_t threads = at::get_num_threads();
    const int64_t chunk = std::clamp((n + threads * kChunksPerThread - 1) / (threads * kChunksPerThread), grain,
                                     grain * kLargestChunk);
    Pool& p = pool();
    std::unique_lock<std::mutex> lock(p.caller, std::try_to_lock);
    if (threads <= 1 || chunk >= n || !lock.owns_lock()) {
        body(context, 0, n);
        return;
    }
    p.resize(threads - 1);
    p.judge_host();
    p.run(n, chunk, body, context);
}

}  // namespace power_pool

// Registered as torch.ops.<POWER_OPS>.set_wait (power/kernels/cpu/build.py sets it from power.kernels.cpu.waits.kernel_wait).
TORCH_LIBRARY_FRAGMENT(POWER_OPS, m) { m.def("set_wait(int wait, int spin_us) -> ()", &power_pool::set_wait); }
