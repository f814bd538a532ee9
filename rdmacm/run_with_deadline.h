// For tests of calls that may block: run them on threads of their own under a deadline, so that a call that never
// returns fails the test (and aborts it) instead of hanging it.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace uroce::rdmacm::testing {

// Runs `work` on threads of their own; aborts if they have not all finished within `deadline`.
inline void RunWithDeadline(std::vector<std::function<void()>> work, const std::string& what,
                            std::chrono::seconds deadline) {
  std::atomic<int> left{int(work.size())};
  std::vector<std::thread> threads;
  for (auto& w : work)
    threads.emplace_back([&left, w] {
      w();
      --left;
    });
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (left > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (left > 0) {
    ADD_FAILURE() << what << ": not finished after " << deadline.count() << " s";
    std::abort();
  }
  for (auto& t : threads) t.join();
}

}  // namespace uroce::rdmacm::testing
