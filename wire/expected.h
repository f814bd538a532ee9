// A minimal Expected<T, E>: either a value or a typed error. g++ 12 in C++20 mode has no std::expected (C++23), and
// the house rule is that every fallible function returns a typed error. The API follows std::expected's names so a
// later switch is a search-and-replace.
#pragma once

#include <cassert>
#include <type_traits>
#include <utility>
#include <variant>

namespace uroce::wire {

template <typename E>
struct UnexpectedValue {
  E error;
};

// Wraps an error so that it converts to any Expected<T, E>: `return Unexpected(ParseError::kTruncated);`
template <typename E>
UnexpectedValue<std::decay_t<E>> Unexpected(E&& e) {
  return {std::forward<E>(e)};
}

template <typename T, typename E>
class Expected {
 public:
  static_assert(!std::is_same_v<T, E>, "value and error types must differ");

  Expected(const T& value) : v_(std::in_place_index<0>, value) {}  // NOLINT: implicit by design.
  Expected(T&& value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT
  template <typename G>
  Expected(UnexpectedValue<G> u) : v_(std::in_place_index<1>, E(std::move(u.error))) {}  // NOLINT

  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  // Precondition: has_value(). Checked by assert in debug builds.
  T& value() & {
    assert(has_value());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(has_value());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(has_value());
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  // Precondition: !has_value().
  const E& error() const {
    assert(!has_value());
    return std::get<1>(v_);
  }

  template <typename U>
  T value_or(U&& fallback) const& {
    return has_value() ? std::get<0>(v_) : static_cast<T>(std::forward<U>(fallback));
  }

 private:
  std::variant<T, E> v_;
};

}  // namespace uroce::wire
