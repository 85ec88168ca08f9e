#pragma once
// Leader election with a coordination.k8s.io/v1 Lease, as client-go's
// leaderelection package does it, so that replicas of one Deployment agree
// on one leader and `kubectl get lease` shows who it is:
//
//   - a candidate takes the Lease when it is absent, released (no holder) or
//     expired; a conditional write (the resourceVersion it read) decides a
//     race, and the loser reads a 409 and stays a follower;
//   - "expired" is judged by this process's own monotonic clock: the Lease
//     is expired when its record (holder, renewTime) has not changed for
//     leaseDurationSeconds since this process first saw it so. No two
//     machines' wall clocks are compared, so a skewed clock cannot make a
//     follower take a Lease its holder is still renewing;
//   - the leader renews every retry_period, and steps down (on_stop) once it
//     has not renewed for renew_deadline, which is shorter than the lease's
//     duration: it stops acting before anyone else may start;
//   - a clean stop releases the Lease (holder cleared) so the next leader
//     takes over at once instead of after the duration.
//
// It runs on a thread of its own (every call to the API server may wait);
// on_start and on_stop run on that thread, must return promptly, and
// alternate, starting with on_start.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "common/durations.hpp"
#include "coordinator/kube/client.hpp"

namespace factory::kube {

struct LeaderElectionOptions {
  std::string lease_name = "factory-coordinator";
  std::string ns;        // the Lease's namespace
  std::string identity;  // holderIdentity: unique per replica (the pod's name)
  std::chrono::seconds lease_duration{10};
  std::chrono::seconds renew_deadline{7};
  std::chrono::seconds retry_period{2};
};

struct LeaderCallbacks {
  std::function<void()> on_start;  // this replica leads now
  std::function<void()> on_stop;   // it no longer does (lost, could not renew, or stopping)
  // Another holder was seen (or "" when the Lease is free): for logs and status.
  std::function<void(const std::string& holder)> on_new_leader;
};

// What the elector knows now; any thread.
struct LeaderState {
  bool leading = false;
  std::string holder;  // the last holder seen ("" when none)
  std::uint64_t transitions = 0;
};

class LeaderElector {
 public:
  LeaderElector(KubeClient client, LeaderElectionOptions opts, LeaderCallbacks callbacks);
  ~LeaderElector();
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  // Starts the thread. Once.
  void start();
  // Steps down (on_stop when leading), releases the Lease if held, and joins.
  void stop();

  LeaderState state() const;

  // One round of the algorithm, for the thread and for tests: tries to take
  // or renew the Lease. True when this replica holds it after the call.
  bool try_acquire_or_renew();

 private:
  void run();
  void set_leading(bool leading);
  void release();
  // The Lease's spec as this replica writes it when it holds it.
  json record(const std::string& acquire_time, std::int64_t transitions) const;

  KubeClient client_;
  const LeaderElectionOptions opts_;
  const LeaderCallbacks callbacks_;

  // What was last observed of the Lease, and when (this process's clock).
  std::string observed_holder_;
  std::string observed_renew_;
  std::chrono::steady_clock::time_point observed_at_{};
  std::chrono::steady_clock::time_point last_renewed_{};  // by this replica

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  LeaderState state_;
  std::thread thread_;
};

// A Lease's MicroTime: RFC 3339 with microseconds, "2026-12-04T20:41:05.123456Z".
std::string format_micro_time(Clock::time_point t);

}  // namespace factory::kube
