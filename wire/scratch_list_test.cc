#include "wire/scratch_list.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>

namespace uroce::wire {
namespace {

TEST(ScratchList, AThreadGetsItsListBackEmptyWithItsStorage) {
  const int* storage = nullptr;
  {
    ScratchList<int> a;
    a->assign(100, 7);
    storage = a->data();
  }
  ScratchList<int> b;
  EXPECT_TRUE(b->empty());
  b->push_back(1);
  EXPECT_EQ(b->data(), storage);  // no allocation: the same storage
}

TEST(ScratchList, ANestedUseGetsAListOfItsOwn) {
  ScratchList<int> outer;
  outer->assign({1, 2, 3});
  {
    ScratchList<int> inner;
    EXPECT_TRUE(inner->empty());
    EXPECT_NE(&*inner, &*outer);
    inner->push_back(9);
  }
  EXPECT_EQ(*outer, (std::vector<int>{1, 2, 3}));
}

TEST(ScratchList, ThreadsHaveListsOfTheirOwn) {
  ScratchList<int> here;
  here->push_back(1);
  std::vector<int>* there = nullptr;
  std::thread([&] {
    ScratchList<int> l;
    l->push_back(2);
    there = &*l;
  }).join();
  EXPECT_NE(there, &*here);
  EXPECT_EQ(*here, std::vector<int>{1});
}

// What the engine's exit handler does: use a list after the thread's thread_local objects are gone. The list used
// there must be one of the call's own (a destroyed vector written there corrupts the heap; under ASan this fails as
// a use after free).
void UseAtExit() {
  ScratchList<int> l;
  l->assign(1000, 5);
  if ((*l)[999] != 5) _exit(3);
}

TEST(ScratchList, UsableFromAnExitHandlerAfterTheThreadsObjectsAreGone) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::atexit(UseAtExit);  // registered before the thread_local below exists: it runs after its destruction
    {
      ScratchList<int> l;  // makes the thread's list
      l->push_back(1);
    }
    std::exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace uroce::wire
