#pragma once
// Errors as values. Anything that can fail for a reason a user should read
// returns Result<T>; the message is one line that says what went wrong, and
// context() prefixes where it happened ("store: write tenants.json: No space left").
#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace factory {

enum class Errc {
  invalid_argument,  // bad input from the user or a peer
  not_found,
  already_exists,
  conflict,             // state changed under us / precondition on version
  permission_denied,    // authenticated but not allowed
  unauthenticated,      // no or bad credentials
  failed_precondition,  // the system is not in a state where this can work
  unavailable,          // a peer or service cannot be reached (retryable)
  timeout,
  io,
  protocol,  // a peer spoke nonsense
  internal,
};

const char* errc_name(Errc c);

struct Error {
  Errc code = Errc::internal;
  std::string message;

  Error() = default;
  Error(Errc c, std::string m) : code(c), message(std::move(m)) {}

  // Prefixes "what: " so an error carried up reads from outermost to innermost.
  Error& context(const std::string& what) {
    message = what + ": " + message;
    return *this;
  }
  Error with_context(const std::string& what) const {
    Error e = *this;
    e.context(what);
    return e;
  }
};

// The system error of the last failed call, as "what: strerror(errno)".
Error errno_error(const std::string& what, int err);

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const {
    assert(!ok());
    return std::get<1>(v_);
  }
  Error& error() {
    assert(!ok());
    return std::get<1>(v_);
  }

  T value_or(T other) const { return ok() ? std::get<0>(v_) : std::move(other); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : err_(std::move(error)), failed_(true) {}  // NOLINT
  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const Error& error() const {
    assert(failed_);
    return err_;
  }
  Error& error() {
    assert(failed_);
    return err_;
  }

 private:
  Error err_;
  bool failed_ = false;
};

using Status = Result<void>;

inline Status ok_status() {
  return {};
}

}  // namespace factory
