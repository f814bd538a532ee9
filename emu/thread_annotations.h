// Clang's thread-safety analysis (-Wthread-safety): which lock guards which state, which functions need a lock held,
// checked at compile time in the `tsa` build (tools/uroce test runs it; `bazel build --config=tsa` in a clang output
// base). Other compilers see nothing. libstdc++'s mutexes carry no annotations, so the locks the analysis follows
// are these: Mutex (std::mutex) and the annotated ReadWriteLock (read_write_lock.h), taken with MutexLock,
// ReaderLock and WriterLock -- or std::unique_lock where a lock must be released early, through the *Unlock helpers.
#pragma once

#include <mutex>

#if defined(__clang__)
#define UROCE_TSA(x) __attribute__((x))
#else
#define UROCE_TSA(x)
#endif

#define CAPABILITY(name) UROCE_TSA(capability(name))
#define SCOPED_CAPABILITY UROCE_TSA(scoped_lockable)
#define GUARDED_BY(m) UROCE_TSA(guarded_by(m))
#define PT_GUARDED_BY(m) UROCE_TSA(pt_guarded_by(m))
#define REQUIRES(...) UROCE_TSA(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) UROCE_TSA(requires_shared_capability(__VA_ARGS__))
#define ACQUIRE(...) UROCE_TSA(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) UROCE_TSA(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) UROCE_TSA(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) UROCE_TSA(release_shared_capability(__VA_ARGS__))
#define RELEASE_GENERIC(...) UROCE_TSA(release_generic_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) UROCE_TSA(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) UROCE_TSA(locks_excluded(__VA_ARGS__))
#define RETURN_CAPABILITY(x) UROCE_TSA(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS UROCE_TSA(no_thread_safety_analysis)

namespace uroce::emu {

// std::mutex, as a capability the analysis knows.
class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { m_.lock(); }
  void unlock() RELEASE() { m_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return m_.try_lock(); }

 private:
  std::mutex m_;
};

// Holds a Mutex for its scope; Unlock() lets go before the end (then the destructor does nothing).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& m) ACQUIRE(m) : m_(&m) { m.lock(); }
  ~MutexLock() RELEASE() {
    if (m_) m_->unlock();
  }
  void Unlock() RELEASE() {
    m_->unlock();
    m_ = nullptr;
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* m_;
};

}  // namespace uroce::emu
