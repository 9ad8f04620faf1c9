// Remote-store microbenchmarks for the Burst-Gap model of the X-Stage.
//
// K producer CTAs each store B bytes per burst into their own slice of a destination buffer
// (a peer GPU's memory, or local memory for the control run, everything else identical),
// then compute for a gap G, N times. The host turns per-CTA %globaltimer stamps into issue
// times, periods and skews (xstage_bench.microbench.launch).
//
// Stamping: one thread per CTA reads %globaltimer, fenced by __syncthreads() on both sides,
// so "start" precedes every thread's first store and "end" follows every thread's last
// store *issue* (not its arrival). Stamps stay in shared memory until the bursts are over,
// so recording them adds no global traffic inside the measured window.
//
// Stores are inline-PTX st.global of 4, 8 or 16 bytes, `asm volatile` with a memory clobber:
// the compiler can neither drop a burst that a later burst overwrites nor merge them. The
// value of each 32-bit word is mix(tag) ^ word_index, so the host can check that every byte
// a point should write holds the value of the last burst that wrote it.
//
// Every wait is bounded by a timeout on %globaltimer: a timeout sets a bit in *err and the
// kernel winds down, so a bug fails the point instead of hanging the GPU.
//
// Where a burst's backpressure lands: a producer whose stores still wait to drain may find
// its next memory operation held until they do, so the wait can leave the timed store loop.
// Two things make that visible. With the grid barrier, each CTA also stamps when it reaches
// the barrier (before its arrival atomic), so the host separates the gap it spent from the
// time the barrier took after the last producer arrived (xstage_bench.microbench.
// stamp_metrics). And `next_op` puts one chosen operation right after each burst (thread 0:
// a plain load, a volatile load, an atomic, a fence or a TMA bulk load, all on local
// memory), so the period says which of them wait for the drain.

#include <stdint.h>

#define ERR_BARRIER_TIMEOUT 1u  // a grid barrier did not fill (producers not co-resident?)
#define ERR_ACK_TIMEOUT 2u      // drain probe: the receiver's acknowledgement never came
#define ERR_SIGNAL_TIMEOUT 4u   // drain probe: the receiver never saw all producers' signals
#define ERR_BAD_ARGUMENT 8u     // a launch argument the kernel cannot honour

#define GAP_COMPUTE 0  // gap = a calibrated FMA loop (the issuer really computes)
#define GAP_TIMER 1    // gap = spin on %globaltimer

#define SYNC_FREE 0     // producers run their bursts independently
#define SYNC_BARRIER 1  // grid-wide barrier before each burst (needs all CTAs co-resident)

#define NEXT_NONE 0           // straight into the gap (register work)
#define NEXT_LOAD 1           // a plain 4-byte global load
#define NEXT_VOLATILE_LOAD 2  // a volatile 4-byte global load
#define NEXT_ATOMIC 3         // a relaxed atomicAdd on a global word
#define NEXT_FENCE 4          // __threadfence()
#define NEXT_TMA_LOAD 5       // a 1 KiB TMA bulk copy into shared memory, awaited
#define TMA_BYTES 1024

__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The same read, ordered after every earlier memory operation in program order (the compiler
// may not move it across one): for a stamp taken right before an atomic.
__device__ __forceinline__ uint64_t globaltimer_ordered() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

__device__ __forceinline__ uint32_t load_acquire_gpu(const unsigned int* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint32_t load_acquire_sys(const unsigned int* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release_sys(unsigned int* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// The pattern: a burst's tag scrambled once, then xor-ed with the word's index in the
// destination buffer (the host recomputes it in store_pattern.expected_words).
__device__ __forceinline__ uint32_t mix(uint32_t tag) { return tag * 0x9E3779B1u; }

template <int W>
__device__ __forceinline__ void store_words(char* p, uint32_t m, uint32_t w);

template <>
__device__ __forceinline__ void store_words<4>(char* p, uint32_t m, uint32_t w) {
  asm volatile("st.global.u32 [%0], %1;" ::"l"(p), "r"(m ^ w) : "memory");
}

template <>
__device__ __forceinline__ void store_words<8>(char* p, uint32_t m, uint32_t w) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(m ^ w), "r"(m ^ (w + 1))
               : "memory");
}

template <>
__device__ __forceinline__ void store_words<16>(char* p, uint32_t m, uint32_t w) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(m ^ w),
               "r"(m ^ (w + 1)), "r"(m ^ (w + 2)), "r"(m ^ (w + 3))
               : "memory");
}

// One CTA's burst: `bytes` from `p`, threads striding by W bytes so a warp's stores coalesce.
// `word0` is the index of p's first 32-bit word in the destination buffer.
template <int W>
__device__ __forceinline__ void store_loop(char* p, uint32_t word0, uint32_t m,
                                           unsigned int bytes) {
  const unsigned int step = blockDim.x * W;
  for (unsigned int off = threadIdx.x * W; off < bytes; off += step) {
    store_words<W>(p + off, m, word0 + (off >> 2));
  }
}

__device__ __forceinline__ void store_burst(int width, char* p, uint32_t word0, uint32_t m,
                                            unsigned int bytes) {
  if (width == 16) {
    store_loop<16>(p, word0, m, bytes);
  } else if (width == 8) {
    store_loop<8>(p, word0, m, bytes);
  } else {
    store_loop<4>(p, word0, m, bytes);
  }
}

// The compute gap: two independent FMA chains per thread. Floating-point chains cannot be
// folded by the compiler; the caller keeps the result alive through a conditional store.
__device__ __forceinline__ float compute_gap(long long iters, float x) {
  float a = x, b = x + 1.0f;
  for (long long i = 0; i < iters; ++i) {
    a = fmaf(a, 0.999999f, 1e-6f);
    b = fmaf(b, 1.000001f, -1e-6f);
  }
  return a + b;
}

// Thread 0 spins until %globaltimer reaches `until`; the others wait at the next barrier.
__device__ __forceinline__ void spin_until(uint64_t until) {
  if (threadIdx.x == 0) {
    while (globaltimer() < until) {
    }
  }
  __syncthreads();
}

// Grid-wide barrier on a monotonically increasing counter (zeroed by the host before the
// launch): arrival n waits for target = (n + 1) * gridDim.x. Only valid when every CTA is
// resident at once, which the host checks with the occupancy API. On timeout the CTA sets
// *aborted so it stops, and the others time out in turn: the kernel still ends.
// It aligns the bursts' starts and nothing more: no memory fence before the arrival, since a
// fence waits until this CTA's earlier remote stores are acknowledged, which would make every
// burst wait for the previous one to drain (the completion-coupled schedule, not ours). The
// arrival atomic itself may still be held until those stores drain (see the header): `reach`
// (may be null) gets the time thread 0 reached the barrier, before its atomic.
__device__ __forceinline__ void grid_barrier(unsigned int* counter, unsigned int target,
                                             long long timeout_ns, unsigned int* err,
                                             volatile int* aborted, unsigned long long* reach) {
  __syncthreads();
  if (threadIdx.x == 0 && !*aborted) {
    if (reach != nullptr) *reach = globaltimer_ordered();
    atomicAdd(counter, 1u);
    const uint64_t t0 = globaltimer();
    while (load_acquire_gpu(counter) < target) {
      if (globaltimer() - t0 > (uint64_t)timeout_ns) {
        atomicOr(err, ERR_BARRIER_TIMEOUT);
        *aborted = 1;
        break;
      }
    }
  }
  __syncthreads();
}

// The next operation after a burst (thread 0). Each returns something the caller keeps
// alive, so the compiler cannot drop it; TMA_LOAD waits on the mbarrier for its bytes.
__device__ __forceinline__ uint32_t tma_load(void* smem_dst, const void* src, uint64_t* mbar,
                                             uint32_t phase) {
  const uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem_dst);
  const uint32_t bar = (uint32_t)__cvta_generic_to_shared(mbar);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
               "r"((uint32_t)TMA_BYTES)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"((uint32_t)TMA_BYTES), "r"(bar)
      : "memory");
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, "
        "0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(phase)
        : "memory");
  }
  return reinterpret_cast<volatile uint32_t*>(smem_dst)[0];
}

__device__ __forceinline__ uint32_t next_operation(int op, unsigned int* word, const void* tma_src,
                                                   void* tma_dst, uint64_t* mbar, uint32_t phase) {
  uint32_t v = 0;
  switch (op) {
    case NEXT_LOAD:
      asm volatile("ld.global.u32 %0, [%1];" : "=r"(v) : "l"(word) : "memory");
      break;
    case NEXT_VOLATILE_LOAD:
      asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(word) : "memory");
      break;
    case NEXT_ATOMIC:
      v = atomicAdd(word, 1u);
      break;
    case NEXT_FENCE:
      __threadfence();
      break;
    case NEXT_TMA_LOAD:
      v = tma_load(tma_dst, tma_src, mbar, phase);
      break;
    default:
      break;
  }
  return v;
}

// Periodic and isolated bursts.
//
// CTA k stores to destination k % n_dst, at slice (k / n_dst) * B of that buffer. Burst n
// goes to rotation slot (slot_base + n) % n_slots, slot_stride bytes apart: n_slots = 1
// rewrites the same lines every burst, n_slots > 1 walks through a buffer larger than L2.
// Before every burst, thread 0 idles idle_ns on the timer (isolated bursts: the path drains
// completely); with sync == SYNC_BARRIER all CTAs then meet at a grid barrier. After every
// burst, thread 0 first performs `next_op` on its own word of `scratch` (local memory,
// K * 64 bytes, then TMA_BYTES for the TMA source; see next_operation), then, after every
// burst but the last, comes the gap: gap_iters FMA iterations or gap_ns of timer spin.
//
// stamps: [3][n_bursts][K] u64 (start, end, reach: when the CTA reached the grid barrier
// before that burst, sync = barrier only, else 0); dynamic shared memory: 3 * n_bursts * 8.
extern "C" __global__ void __launch_bounds__(1024)
    burst_train(const unsigned long long* dsts, int n_dst, unsigned int bytes_per_producer,
                unsigned long long slot_stride, int n_slots, int slot_base, int width,
                int n_bursts, unsigned int tag_base, int gap_mode, long long gap_iters,
                long long gap_ns, long long idle_ns, int sync, unsigned int* barrier_counter,
                long long timeout_ns, unsigned long long* stamps, unsigned int* err,
                float* sink, int next_op, unsigned int* scratch) {
  extern __shared__ unsigned long long shared_stamps[];
  __shared__ int aborted;
  __shared__ alignas(128) unsigned char tma_dst[TMA_BYTES];
  __shared__ alignas(8) uint64_t mbar;
  const int k = blockIdx.x;
  const int K = gridDim.x;
  unsigned long long* t_start = shared_stamps;
  unsigned long long* t_end = shared_stamps + n_bursts;
  unsigned long long* t_reach = shared_stamps + 2 * n_bursts;
  unsigned int* my_word = scratch + k * 16;  // 64 bytes apart: no two CTAs share a line
  const unsigned int* tma_src = scratch + K * 16;

  if (threadIdx.x == 0) {
    aborted = 0;
    if ((width != 4 && width != 8 && width != 16) || n_slots < 1 || n_dst < 1 ||
        bytes_per_producer % width != 0 || next_op < NEXT_NONE || next_op > NEXT_TMA_LOAD ||
        (next_op != NEXT_NONE && scratch == nullptr)) {
      atomicOr(err, ERR_BAD_ARGUMENT);
      aborted = 1;
    }
    if (next_op == NEXT_TMA_LOAD) {
      const uint32_t bar = (uint32_t)__cvta_generic_to_shared(&mbar);
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
  }
  __syncthreads();
  if (aborted) return;

  char* dst = reinterpret_cast<char*>(dsts[k % n_dst]);
  const unsigned long long slice = (unsigned long long)(k / n_dst) * bytes_per_producer;
  float acc = threadIdx.x * 1e-3f;

  int n = 0;
  for (; n < n_bursts; ++n) {
    if (idle_ns > 0) spin_until(globaltimer() + idle_ns);
    if (sync == SYNC_BARRIER) {
      grid_barrier(barrier_counter, (unsigned int)(n + 1) * K, timeout_ns, err, &aborted,
                   &t_reach[n]);
    }
    __syncthreads();
    if (aborted) break;
    if (threadIdx.x == 0) t_start[n] = globaltimer();
    __syncthreads();

    const unsigned long long off = (unsigned long long)((slot_base + n) % n_slots) * slot_stride + slice;
    store_burst(width, dst + off, (uint32_t)(off >> 2), mix(tag_base + n), bytes_per_producer);

    __syncthreads();
    if (threadIdx.x == 0) t_end[n] = globaltimer();
    if (next_op != NEXT_NONE && threadIdx.x == 0) {
      acc += 1e-30f * (float)(next_operation(next_op, my_word, tma_src, tma_dst, &mbar, n & 1) & 1u);
    }
    if (n + 1 < n_bursts) {
      if (gap_mode == GAP_COMPUTE) {
        acc = compute_gap(gap_iters, acc);
      } else {
        // Thread 0 owns t_end[n]; the timer gap is measured from the end of the burst.
        if (threadIdx.x == 0) {
          while (globaltimer() < t_end[n] + gap_ns) {
          }
        }
      }
    }
  }

  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    stamps[(size_t)i * K + k] = t_start[i];
    stamps[((size_t)n_bursts + i) * K + k] = t_end[i];
    stamps[((size_t)2 * n_bursts + i) * K + k] = sync == SYNC_BARRIER ? t_reach[i] : 0ull;
  }
  if (acc == -1.2345f) *sink = acc;  // never true; keeps the gap's FMAs alive
}

// Drain probe, sender side: when is a burst's data visible at the receiver?
//
// Each burst (after idle_ns and a grid barrier, as an isolated burst) is followed by:
//   1. every thread: __threadfence_system(), which returns once that thread's stores are
//      ordered before its later writes system-wide; thread 0 stamps "fence" after the CTA
//      barrier, so fence = all of this CTA's stores are acknowledged;
//   2. thread 0 adds 1 to a counter in the receiver's memory (ordered after the data);
//   3. the receiver (drain_probe_recv, on the peer GPU) waits until all K producers have
//      signalled, so it has seen every byte of the burst, and writes an ack into our memory;
//   4. thread 0 waits for the ack and stamps "ack" on this GPU's clock.
// The two GPUs' %globaltimer clocks are not known to agree, so only sender stamps are
// compared: visible = earliest ack - earliest start is an upper bound on when the burst
// became visible at the receiver (by one signal + one ack one-way latency); a run with
// B = 0 measures that protocol cost alone (handshake).
//
// stamps: [4][n_bursts][K] u64 (start, end, fence, ack); dynamic shared: 4 * n_bursts * 8.
extern "C" __global__ void __launch_bounds__(1024)
    drain_probe_send(unsigned long long dst, unsigned int bytes_per_producer, int n_bursts,
                     unsigned int tag_base, long long idle_ns, unsigned int* barrier_counter,
                     unsigned long long peer_signal, const unsigned int* ack,
                     long long timeout_ns, unsigned long long* stamps, unsigned int* err) {
  extern __shared__ unsigned long long shared_stamps[];
  __shared__ int aborted;
  const int k = blockIdx.x;
  const int K = gridDim.x;
  unsigned long long* t_start = shared_stamps;
  unsigned long long* t_end = shared_stamps + n_bursts;
  unsigned long long* t_fence = shared_stamps + 2 * n_bursts;
  unsigned long long* t_ack = shared_stamps + 3 * n_bursts;
  unsigned int* signal = reinterpret_cast<unsigned int*>(peer_signal);
  char* base = reinterpret_cast<char*>(dst);
  const unsigned long long slice = (unsigned long long)k * bytes_per_producer;

  if (threadIdx.x == 0) aborted = 0;
  __syncthreads();

  int n = 0;
  for (; n < n_bursts; ++n) {
    spin_until(globaltimer() + idle_ns);
    grid_barrier(barrier_counter, (unsigned int)(n + 1) * K, timeout_ns, err, &aborted, nullptr);
    if (aborted) break;
    if (threadIdx.x == 0) t_start[n] = globaltimer();
    __syncthreads();

    store_loop<16>(base + slice, (uint32_t)(slice >> 2), mix(tag_base + n), bytes_per_producer);

    __syncthreads();
    if (threadIdx.x == 0) t_end[n] = globaltimer();
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
      t_fence[n] = globaltimer();
      atomicAdd_system(signal, 1u);
      const uint64_t t0 = globaltimer();
      while (load_acquire_sys(ack) < (unsigned int)(n + 1)) {
        if (globaltimer() - t0 > (uint64_t)timeout_ns) {
          atomicOr(err, ERR_ACK_TIMEOUT);
          aborted = 1;
          break;
        }
      }
      t_ack[n] = globaltimer();
    }
    __syncthreads();
    if (aborted) break;
  }

  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    for (int s = 0; s < 4; ++s) {
      stamps[((size_t)s * n_bursts + i) * K + k] = shared_stamps[s * n_bursts + i];
    }
  }
}

// Drain probe, receiver side: one thread on the peer GPU. For burst n it waits until the
// signal counter (in its own memory) reaches (n + 1) * producers, then writes n + 1 into the
// sender's ack word with release semantics. recv_ns[n] is its own clock, kept for reference
// only (it is not comparable with the sender's).
extern "C" __global__ void drain_probe_recv(const unsigned int* signal,
                                            unsigned long long remote_ack, int n_bursts,
                                            int producers, long long timeout_ns,
                                            unsigned long long* recv_ns, unsigned int* err) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  unsigned int* ack = reinterpret_cast<unsigned int*>(remote_ack);
  for (int n = 0; n < n_bursts; ++n) {
    const unsigned int target = (unsigned int)(n + 1) * producers;
    const uint64_t t0 = globaltimer();
    while (load_acquire_sys(signal) < target) {
      if (globaltimer() - t0 > (uint64_t)timeout_ns) {
        atomicOr(err, ERR_SIGNAL_TIMEOUT);
        return;
      }
    }
    recv_ns[n] = globaltimer();
    store_release_sys(ack, (unsigned int)(n + 1));
  }
}

// Bulk SM-store ceiling: grid-stride 16-byte stores of the pattern over `bytes` (no loads),
// the path's store bandwidth with every SM issuing.
extern "C" __global__ void __launch_bounds__(1024)
    bulk_store(unsigned long long dst, unsigned long long bytes, unsigned int tag) {
  char* base = reinterpret_cast<char*>(dst);
  const uint32_t m = mix(tag);
  const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x * 16;
  for (unsigned long long off = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) * 16;
       off < bytes; off += step) {
    store_words<16>(base + off, m, (uint32_t)(off >> 2));
  }
}
