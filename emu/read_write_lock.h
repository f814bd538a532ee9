// A reader-writer lock whose waiting writers go first: std::shared_mutex on glibc prefers readers, so a thread
// creating or destroying an object (a writer) could wait for as long as packets keep arriving (readers come and go
// without a gap). Writer preference (PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP) bounds that wait by the readers
// already inside; in exchange a thread must never take the read side twice. Meets SharedMutex, so std::shared_lock
// and std::unique_lock work with it.
#pragma once

#include <pthread.h>

namespace uroce::emu {

class ReadWriteLock {
 public:
  ReadWriteLock() {
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&lock_, &attr);
    pthread_rwlockattr_destroy(&attr);
  }
  ~ReadWriteLock() { pthread_rwlock_destroy(&lock_); }
  ReadWriteLock(const ReadWriteLock&) = delete;
  ReadWriteLock& operator=(const ReadWriteLock&) = delete;

  void lock() { pthread_rwlock_wrlock(&lock_); }
  bool try_lock() { return pthread_rwlock_trywrlock(&lock_) == 0; }
  void unlock() { pthread_rwlock_unlock(&lock_); }
  void lock_shared() { pthread_rwlock_rdlock(&lock_); }
  bool try_lock_shared() { return pthread_rwlock_tryrdlock(&lock_) == 0; }
  void unlock_shared() { pthread_rwlock_unlock(&lock_); }

 private:
  pthread_rwlock_t lock_;
};

}  // namespace uroce::emu
