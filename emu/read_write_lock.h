// A reader-writer lock whose waiting writers go first: std::shared_mutex on glibc prefers readers, so a thread
// creating or destroying an object (a writer) could wait for as long as packets keep arriving (readers come and go
// without a gap). Writer preference (PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP) bounds that wait by the readers
// already inside; in exchange a thread must never take the read side twice. Meets SharedMutex, so std::shared_lock
// and std::unique_lock work with it.
#pragma once

#include <pthread.h>

#include "emu/thread_annotations.h"

namespace uroce::emu {

class CAPABILITY("mutex") ReadWriteLock {
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

  void lock() ACQUIRE() { pthread_rwlock_wrlock(&lock_); }
  bool try_lock() TRY_ACQUIRE(true) { return pthread_rwlock_trywrlock(&lock_) == 0; }
  void unlock() RELEASE() { pthread_rwlock_unlock(&lock_); }
  void lock_shared() ACQUIRE_SHARED() { pthread_rwlock_rdlock(&lock_); }
  bool try_lock_shared() TRY_ACQUIRE(true) { return pthread_rwlock_tryrdlock(&lock_) == 0; }
  void unlock_shared() RELEASE_SHARED() { pthread_rwlock_unlock(&lock_); }

 private:
  pthread_rwlock_t lock_;
};

// Holds a ReadWriteLock shared (ReaderLock) or exclusively (WriterLock) for its scope; Unlock() lets go early.
class SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(ReadWriteLock& m) ACQUIRE_SHARED(m) : m_(&m) { m.lock_shared(); }
  ~ReaderLock() RELEASE() {
    if (m_) m_->unlock_shared();
  }
  void Unlock() RELEASE() {
    m_->unlock_shared();
    m_ = nullptr;
  }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  ReadWriteLock* m_;
};

class SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(ReadWriteLock& m) ACQUIRE(m) : m_(&m) { m.lock(); }
  ~WriterLock() RELEASE() {
    if (m_) m_->unlock();
  }
  void Unlock() RELEASE() {
    m_->unlock();
    m_ = nullptr;
  }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  ReadWriteLock* m_;
};

}  // namespace uroce::emu
