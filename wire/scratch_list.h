// ScratchList<T>: a vector a thread reuses from one call to the next, so that a pass over held ACKs, timers or a
// message's pieces allocates nothing once its thread has run it. Two cases where the thread's list cannot be used get
// a list of their own for the call instead: a nested use on the same thread (the list is in use), and a use after
// the thread's thread_local objects have been destroyed -- the engine's exit handler still sends held ACKs then
// (verbs_api/engine.cc), and a destroyed vector written there corrupted the heap under a thread still running
// (libfabric's fi_pingpong -e rdm: SIGSEGV inside malloc in librdmacm's thread).
#pragma once

#include <vector>

namespace uroce::wire {

template <typename T>
class ScratchList {
 public:
  ScratchList() {
    Slot* slot = ThreadSlot();
    if (slot != nullptr && !slot->in_use) {
      slot->in_use = true;
      slot_ = slot;
      list_ = &slot->list;
      list_->clear();
    }
  }
  ~ScratchList() {
    if (slot_ != nullptr) {
      slot_->list.clear();  // its storage stays for the next call
      slot_->in_use = false;
    }
  }
  ScratchList(const ScratchList&) = delete;
  ScratchList& operator=(const ScratchList&) = delete;

  std::vector<T>& operator*() { return *list_; }
  std::vector<T>* operator->() { return list_; }

 private:
  struct Slot {
    std::vector<T> list;
    bool in_use = false;
    ~Slot() { Gone() = true; }
  };
  // Trivially destructible, so still readable after the thread's other thread_local objects are gone.
  static bool& Gone() {
    static thread_local bool gone = false;
    return gone;
  }
  static Slot* ThreadSlot() {
    if (Gone()) return nullptr;
    static thread_local Slot slot;
    return Gone() ? nullptr : &slot;
  }

  Slot* slot_ = nullptr;
  std::vector<T> own_;
  std::vector<T>* list_ = &own_;
};

}  // namespace uroce::wire
