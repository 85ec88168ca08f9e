#include "agent/health/fault_watcher.hpp"

#include <spdlog/spdlog.h>

#include <condition_variable>
#include <mutex>
#include <thread>

namespace factory::agent {

struct FaultWatcher::Shared {
  GuestEnv env;
  FaultBook book;
  FaultWatchOptions options;

  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  bool started = false;
  bool exited = false;
  OnFault on_fault;  // cleared by the destructor: a thread left behind calls nothing
  State state;

  Shared(GuestEnv e, FaultBook b, OnFault f, FaultWatchOptions o)
      : env(std::move(e)), book(std::move(b)), options(o), on_fault(std::move(f)) {}

  bool stop_requested() {
    std::lock_guard lk(mu);
    return stopping;
  }
  // Sleeps `d` unless stopped first; false when stopped.
  bool pause(std::chrono::milliseconds d) {
    std::unique_lock lk(mu);
    return !cv.wait_for(lk, d, [&] { return stopping; });
  }
  void failed(const std::string& error) {
    std::lock_guard lk(mu);
    if (state.error != error) spdlog::warn("gpu faults: not watching NVML events: {}", error);
    state.watching = false;
    state.error = error;
  }
  // Under the lock, so the destructor's clearing waits for a call under way.
  void notify() {
    std::lock_guard lk(mu);
    if (on_fault && !stopping) on_fault();
  }

  void run() {
    while (!stop_requested()) {
      auto lib = NvmlLibrary::load(nvml_library_candidates(env));
      if (!lib) {
        failed(lib.error().message);
        if (!pause(options.retry)) break;
        continue;
      }
      auto set = (*lib)->watch_events();
      if (!set) {
        failed(set.error().message);
        if (!pause(options.retry)) break;
        continue;
      }
      {
        std::lock_guard lk(mu);
        state.watching = true;
        state.error.clear();
        state.registrations = (*set)->registrations();
      }
      for (const auto& r : (*set)->registrations())
        if (!r.error.empty()) spdlog::warn("gpu faults: GPU {}: {}", r.index, r.error);
      watch(**set);
      // The set before the library it came from.
      set->reset();
      lib->reset();
      if (!stop_requested() && !pause(options.retry)) break;
    }
    std::lock_guard lk(mu);
    exited = true;
    cv.notify_all();
  }

  void watch(NvmlEventSet& set) {
    while (!stop_requested()) {
      auto next = set.wait(options.wait_slice);
      if (!next) {
        // A GPU fell off the bus: news for health at once (its sample shows
        // the card lost), then the set is made again without it.
        failed(next.error().message);
        notify();
        return;
      }
      if (!*next) continue;  // the slice passed
      const NvmlEvent& e = **next;
      {
        std::lock_guard lk(mu);
        ++state.events;
        if (e.kind == NvmlEvent::Kind::xid) ++state.xids;
      }
      if (e.kind == NvmlEvent::Kind::xid) {
        spdlog::warn("gpu faults: GPU {} ({}) reported Xid {}", e.gpu_index, e.uuid, e.xid);
        if (auto st = book.record(e.uuid, e.gpu_index, static_cast<int>(e.xid), Clock::now());
            !st.ok())
          spdlog::error("gpu faults: Xid {} not recorded: {}", e.xid, st.error().message);
      }
      notify();
    }
  }
};

FaultWatcher::FaultWatcher(GuestEnv env, FaultBook book, OnFault on_fault,
                           FaultWatchOptions options)
    : shared_(std::make_shared<Shared>(std::move(env), std::move(book), std::move(on_fault),
                                       options)) {}

FaultWatcher::~FaultWatcher() {
  stop();
  std::unique_lock lk(shared_->mu);
  if (shared_->started)
    shared_->cv.wait_for(lk, shared_->options.wait_slice + std::chrono::seconds(2),
                         [&] { return shared_->exited; });
  // Still inside NVML: it keeps its own reference to what it uses, and
  // calls nothing of ours again.
  shared_->on_fault = nullptr;
}

void FaultWatcher::start() {
  {
    std::lock_guard lk(shared_->mu);
    if (shared_->started) return;
    shared_->started = true;
  }
  std::thread([s = shared_] { s->run(); }).detach();
}

void FaultWatcher::stop() {
  std::lock_guard lk(shared_->mu);
  shared_->stopping = true;
  shared_->cv.notify_all();
}

FaultWatcher::State FaultWatcher::state() const {
  std::lock_guard lk(shared_->mu);
  return shared_->state;
}

}  // namespace factory::agent
