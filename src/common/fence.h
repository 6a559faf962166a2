// fence.h: memory fences that ThreadSanitizer builds accept. GCC refuses
// std::atomic_thread_fence under -fsanitize=thread (TSan does not model
// fences); there each is a compiler barrier, which is what release and
// acquire fences compile to on x86 (TSO) anyway.
#pragma once

namespace sv {

[[gnu::always_inline]] inline void fence_release() {
#if defined(__SANITIZE_THREAD__)
  __atomic_signal_fence(__ATOMIC_RELEASE);
#else
  __atomic_thread_fence(__ATOMIC_RELEASE);
#endif
}

[[gnu::always_inline]] inline void fence_acquire() {
#if defined(__SANITIZE_THREAD__)
  __atomic_signal_fence(__ATOMIC_ACQUIRE);
#else
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
#endif
}

[[gnu::always_inline]] inline void fence_seq_cst() {
#if defined(__SANITIZE_THREAD__)
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

}  // namespace sv
