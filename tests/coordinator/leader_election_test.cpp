// Leader election over a coordination.k8s.io/v1 Lease, against the fake API
// server (tests/fakes/kube_apiserver.py), which stands in for kube-apiserver:
// it stores Leases, answers a stale resourceVersion with 409 Conflict and a
// second create with 409 AlreadyExists, and can forbid a verb (an RBAC
// change, or an API server the leader can no longer reach for writes).
// Timings are shortened (a 3 s lease) so each case runs in seconds; the
// algorithm is the same at the defaults.
#include "coordinator/kube/leader_election.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "tests/fakes/fake_kube.hpp"
#include "tests/support/test_support.hpp"

namespace factory::kube {
namespace {

using namespace std::chrono_literals;
using factory::testing::eventually;
using factory::testing::FakeKube;
using steady = std::chrono::steady_clock;

KubeClient client_for(const FakeKube& kube) {
  auto a = load_kubeconfig(kube.kubeconfig());
  EXPECT_TRUE(a.ok());
  return KubeClient(*a, 5s);
}

LeaderElectionOptions fast(const std::string& identity) {
  LeaderElectionOptions o;
  o.ns = "default";
  o.identity = identity;
  o.lease_duration = 3s;
  o.renew_deadline = 2s;
  o.retry_period = 1s;
  return o;
}

// A candidate on its own thread, and what its callbacks saw.
struct Candidate {
  std::atomic<int> starts{0}, stops{0};
  std::atomic<bool> leading{false};
  std::mutex mu;
  steady::time_point started_at{}, stopped_at{};
  std::unique_ptr<LeaderElector> elector;

  Candidate(const FakeKube& kube, const std::string& identity) {
    elector = std::make_unique<LeaderElector>(client_for(kube), fast(identity),
                                              LeaderCallbacks{.on_start =
                                                                  [this] {
                                                                    ++starts;
                                                                    leading = true;
                                                                    std::lock_guard lk(mu);
                                                                    started_at = steady::now();
                                                                  },
                                                              .on_stop =
                                                                  [this] {
                                                                    ++stops;
                                                                    leading = false;
                                                                    std::lock_guard lk(mu);
                                                                    stopped_at = steady::now();
                                                                  },
                                                              .on_new_leader = nullptr});
  }
};

std::string holder(const FakeKube& kube) {
  auto lease =
      kube.get("/apis/coordination.k8s.io/v1/namespaces/default/leases/factory-coordinator");
  if (!lease.is_object() || !lease.contains("spec")) return "<none>";
  return lease["spec"].value("holderIdentity", "");
}

TEST(LeaderElection, OneOfThreeCandidatesLeadsAndTheLeaseNamesIt) {
  FakeKube kube;
  std::vector<std::unique_ptr<Candidate>> cs;
  for (auto id : {"replica-a", "replica-b", "replica-c"})
    cs.push_back(std::make_unique<Candidate>(kube, id));
  for (auto& c : cs) c->elector->start();
  auto leaders = [&] {
    int n = 0;
    for (auto& c : cs) n += c->leading ? 1 : 0;
    return n;
  };
  ASSERT_TRUE(eventually([&] { return leaders() == 1; }, 10s, 50ms));
  // Several renewals later there is still exactly one, and it is the holder.
  for (int i = 0; i < 40; ++i) {
    ASSERT_EQ(leaders(), 1);
    std::this_thread::sleep_for(100ms);
  }
  std::string leader;
  for (auto& c : cs)
    if (c->leading) leader = c->elector->state().holder;
  EXPECT_EQ(holder(kube), leader);
  for (auto& c : cs) EXPECT_EQ(c->starts + 0, c->leading ? 1 : 0) << "no flapping";
  auto lease =
      kube.get("/apis/coordination.k8s.io/v1/namespaces/default/leases/factory-coordinator");
  EXPECT_EQ(lease["spec"]["leaseDurationSeconds"], 3);
  EXPECT_TRUE(lease["spec"].contains("renewTime"));
  EXPECT_TRUE(lease["spec"].contains("acquireTime"));
  for (auto& c : cs) c->elector->stop();
}

// A leader that dies (kill -9: no release, no more renewals) is replaced
// once its lease has gone unrenewed for its duration, judged by the
// follower's own clock since it last saw the record change; not before.
TEST(LeaderElection, ADeadLeaderIsReplacedAfterTheDurationNotBefore) {
  FakeKube kube;
  LeaderElector a(client_for(kube), fast("replica-a"), {});
  LeaderElector b(client_for(kube), fast("replica-b"), {});
  ASSERT_TRUE(a.try_acquire_or_renew());
  auto dead_at = steady::now();  // a never renews again
  EXPECT_FALSE(b.try_acquire_or_renew());
  bool took = false;
  while (!took && steady::now() - dead_at < 10s) {
    took = b.try_acquire_or_renew();
    if (!took) std::this_thread::sleep_for(200ms);
  }
  auto after = steady::now() - dead_at;
  ASSERT_TRUE(took);
  EXPECT_GE(after, 3s) << "taken before the lease expired";
  EXPECT_LT(after, 5s);
  EXPECT_EQ(holder(kube), "replica-b");
  auto lease =
      kube.get("/apis/coordination.k8s.io/v1/namespaces/default/leases/factory-coordinator");
  EXPECT_EQ(lease["spec"]["leaseTransitions"], 1);
  // The old leader, back (a paused process), finds it taken and does not lead.
  EXPECT_FALSE(a.try_acquire_or_renew());
  EXPECT_EQ(holder(kube), "replica-b");
}

// A clean stop releases the Lease: the next candidate takes it at its next
// try, not a lease duration later.
TEST(LeaderElection, AReleasedLeaseIsTakenAtOnce) {
  FakeKube kube;
  Candidate a(kube, "replica-a");
  a.elector->start();
  ASSERT_TRUE(eventually([&] { return a.leading.load(); }, 10s, 20ms));
  Candidate b(kube, "replica-b");
  b.elector->start();
  std::this_thread::sleep_for(1500ms);
  EXPECT_FALSE(b.leading);
  auto stop_at = steady::now();
  a.elector->stop();
  EXPECT_EQ(a.stops, 1);
  ASSERT_TRUE(eventually([&] { return b.leading.load(); }, 10s, 20ms));
  EXPECT_LT(steady::now() - stop_at, 2500ms) << "waited for expiry instead of the release";
  EXPECT_EQ(holder(kube), "replica-b");
  b.elector->stop();
  EXPECT_EQ(holder(kube), "") << "released on stop";
}

// A leader that cannot renew (here: its writes are forbidden) stops acting
// within renew_deadline, before its lease expires for the others.
TEST(LeaderElection, ALeaderThatCannotRenewStepsDownBeforeItsLeaseExpires) {
  FakeKube kube;
  Candidate a(kube, "replica-a");
  a.elector->start();
  ASSERT_TRUE(eventually([&] { return a.leading.load(); }, 10s, 20ms));
  kube.control("/_fake/forbid", {{"verb", "update"}, {"resource", "leases"}});
  auto cut_at = steady::now();
  ASSERT_TRUE(eventually([&] { return !a.leading.load(); }, 10s, 20ms));
  std::lock_guard lk(a.mu);
  // Its last renewal was at most one retry period before the cut; it must
  // have stopped before that renewal's lease ran out (3 s).
  EXPECT_LT(a.stopped_at - cut_at, 3s);
  EXPECT_EQ(a.stops, 1);
}

TEST(LeaderElection, MicroTimeIsRfc3339WithMicroseconds) {
  auto t = Clock::time_point(std::chrono::microseconds(1764880865123456));
  EXPECT_EQ(format_micro_time(t), "2025-12-04T20:41:05.123456Z");
}

}  // namespace
}  // namespace factory::kube
