#pragma once
// A collector with a deadline that is never waited on past it. A wedged GPU
// driver blocks NVML calls (and nvidia-smi, in uninterruptible sleep, past
// SIGKILL) for as long as it stays wedged: so each collection runs on a
// thread of its own, the caller waits for it only until the deadline, and a
// collection still under way then is left to finish (or never) on its own.
// While it has not returned, the collector is not started again: one stuck
// thread per collector at most, and every sample says it is still stuck.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace factory::agent {

template <class T>
class TimedCollector {
 public:
  using Clock = std::chrono::steady_clock;

  struct Outcome {
    std::optional<T> value;  // it returned in time
    std::string error;       // it threw (a bug: the next run tries again)
    bool hung = false;       // it did not return by the deadline (or had not since an earlier one)
    Clock::time_point running_since{};  // when the hung run started
  };

  // A run in flight, to await().
  class Run {
   public:
    Run() = default;

   private:
    friend class TimedCollector;
    struct State {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      std::optional<T> value;
      std::string error;
      Clock::time_point started;
    };
    std::shared_ptr<State> state_;
    bool refused_ = false;  // an earlier run is still stuck: nothing started
  };

  // Starts fn on its own thread unless an earlier run has not returned yet.
  // fn must own what it uses (copies, not references to the caller's
  // objects): it may outlive the caller.
  Run start(std::function<T()> fn) {
    std::lock_guard lk(mu_);
    Run run;
    if (current_) {
      std::lock_guard slk(current_->mu);
      if (!current_->done) {
        run.state_ = current_;
        run.refused_ = true;
        return run;
      }
    }
    auto state = std::make_shared<typename Run::State>();
    state->started = Clock::now();
    current_ = state;
    run.state_ = state;
    std::thread([state, fn = std::move(fn)] {
      std::optional<T> value;
      std::string error;
      try {
        value = fn();
      } catch (const std::exception& e) {
        error = e.what();
      } catch (...) {
        error = "unknown exception";
      }
      std::lock_guard slk(state->mu);
      state->value = std::move(value);
      state->error = std::move(error);
      state->done = true;
      state->cv.notify_all();
    }).detach();
    return run;
  }

  // Waits for the run until `deadline`, and no longer.
  Outcome await(const Run& run, Clock::time_point deadline) const {
    Outcome out;
    auto& s = *run.state_;
    std::unique_lock lk(s.mu);
    if (!run.refused_) s.cv.wait_until(lk, deadline, [&] { return s.done; });
    if (!s.done || run.refused_) {
      out.hung = true;
      out.running_since = s.started;
      return out;
    }
    out.value = std::move(s.value);
    out.error = std::move(s.error);
    return out;
  }

 private:
  std::mutex mu_;
  std::shared_ptr<typename Run::State> current_;
};

}  // namespace factory::agent
