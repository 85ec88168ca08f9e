// The Tenant status the controller writes (coordinator/controller/
// tenant_status.hpp), from typed facts: no cluster here, the function is pure.
#include "coordinator/controller/tenant_status.hpp"

#include <gtest/gtest.h>

namespace factory::controller {
namespace {

using nlohmann::json;

json condition(const json& status, const std::string& type) {
  for (const auto& c : status["conditions"])
    if (c["type"] == type) return c;
  return nullptr;
}

store::TenantRecord ready_record() {
  store::TenantRecord r;
  r.name = "t1";
  r.tier = "gpu-vm";
  r.phase = "ready";
  store::KubeStatus k;
  k.state = "created";
  k.gpu_resource = "nvidia.com/GH100_H200";
  r.status.kube = k;
  return r;
}

TEST(TenantStatus, AReadyTenantIsReadyProvisionedConnectedAndNotDegraded) {
  TenantFacts f;
  f.generation = 3;
  f.record = ready_record();
  f.agent_connected = true;
  f.gpu = "nvidia.com/GH100_H200";
  json s = tenant_status(f, nullptr, "2026-12-05T08:00:00Z");
  EXPECT_EQ(s["phase"], "ready");
  EXPECT_EQ(s["observedGeneration"], 3);
  EXPECT_EQ(s["gpu"], "nvidia.com/GH100_H200");
  EXPECT_EQ(condition(s, "Ready")["status"], "True");
  EXPECT_EQ(condition(s, "Provisioned")["status"], "True");
  EXPECT_EQ(condition(s, "AgentConnected")["status"], "True");
  EXPECT_EQ(condition(s, "Degraded")["status"], "False");
  EXPECT_EQ(condition(s, "Degraded")["reason"], "Healthy");
  for (const auto& c : s["conditions"]) {
    EXPECT_EQ(c["lastTransitionTime"], "2026-12-05T08:00:00Z");
    EXPECT_EQ(c["observedGeneration"], 3);
  }
}

// A tenant a host drain stopped is not ready, and says why in the drain's
// words (not as a failure), with the node and the deadline beside it.
TEST(TenantStatus, ADrainedTenantSaysItIsStoppedForMaintenanceAndHowItComesBack) {
  TenantFacts f;
  f.generation = 2;
  f.record = ready_record();
  store::MaintenanceJournal m;
  m.state = "drained";
  m.node = "utho";
  m.deadline = "2026-12-05T08:10:00Z";
  f.record->status.maintenance = m;
  json s = tenant_status(f, nullptr, "2026-12-05T08:20:00Z");
  EXPECT_EQ(condition(s, "Ready")["status"], "False");
  EXPECT_EQ(condition(s, "Ready")["reason"], "Drained");
  EXPECT_NE(condition(s, "Ready")["message"].get<std::string>().find("factory host undrain utho"),
            std::string::npos);
  EXPECT_EQ(s["maintenance"],
            (json{{"state", "drained"}, {"node", "utho"}, {"deadline", "2026-12-05T08:10:00Z"}}));
  // Noticed only: it still runs, and is ready until its stop.
  f.record->status.maintenance->state = "noticed";
  json n = tenant_status(f, nullptr, "2026-12-05T08:05:00Z");
  EXPECT_EQ(condition(n, "Ready")["status"], "True");
  EXPECT_EQ(n["maintenance"]["state"], "noticed");
  // Back: no maintenance shown any more.
  f.record->status.maintenance->state = "back";
  EXPECT_FALSE(tenant_status(f, nullptr, "2026-12-05T08:30:00Z").contains("maintenance"));
}

// What makes a second pass over an unchanged tenant write nothing.
TEST(TenantStatus, TheSameFactsLaterGiveTheSameStatus) {
  TenantFacts f;
  f.generation = 1;
  f.record = ready_record();
  json first = tenant_status(f, nullptr, "2026-12-05T08:00:00Z");
  json second = tenant_status(f, first, "2026-12-05T09:30:00Z");
  EXPECT_EQ(first, second);
}

TEST(TenantStatus, ATransitionMovesOnlyItsOwnTime) {
  TenantFacts f;
  f.generation = 1;
  f.record = ready_record();
  f.agent_connected = true;
  json before = tenant_status(f, nullptr, "2026-12-05T08:00:00Z");
  f.agent_connected = false;
  f.agent_state = "lost";
  json after = tenant_status(f, before, "2026-12-05T09:00:00Z");
  EXPECT_EQ(condition(after, "AgentConnected")["status"], "False");
  EXPECT_EQ(condition(after, "AgentConnected")["reason"], "Lost");
  EXPECT_EQ(condition(after, "AgentConnected")["lastTransitionTime"], "2026-12-05T09:00:00Z");
  EXPECT_EQ(condition(after, "Ready")["lastTransitionTime"], "2026-12-05T08:00:00Z");
}

TEST(TenantStatus, DriftPutBackIsSaidAndStaysSaidUntilSomethingElseIs) {
  TenantFacts f;
  f.generation = 1;
  f.record = ready_record();
  f.drift = {"Service tenants/t1-ssh is missing"};
  json repaired = tenant_status(f, nullptr, "2026-12-05T08:00:00Z");
  EXPECT_EQ(condition(repaired, "Degraded")["status"], "False");
  EXPECT_EQ(condition(repaired, "Degraded")["reason"], "Repaired");
  EXPECT_NE(condition(repaired, "Degraded")["message"].get<std::string>().find("t1-ssh"),
            std::string::npos);
  // The next pass sees no drift: the report stays, and nothing is written.
  f.drift.clear();
  EXPECT_EQ(tenant_status(f, repaired, "2026-12-05T08:00:10Z"), repaired);
  // A repair that failed is Degraded.
  f.drift = {"VirtualMachine tenants/t1 is missing"};
  f.repair_error = "the API server refused";
  json failed = tenant_status(f, repaired, "2026-12-05T08:01:00Z");
  EXPECT_EQ(condition(failed, "Degraded")["status"], "True");
  EXPECT_EQ(condition(failed, "Degraded")["reason"], "Drift");
}

TEST(TenantStatus, ASpecEditThatCannotApplyIsSaid) {
  TenantFacts f;
  f.generation = 2;
  f.record = ready_record();
  f.not_applied = {"memory \"4Gi\", not \"8Gi\""};
  json s = tenant_status(f, nullptr, "2026-12-05T08:00:00Z");
  EXPECT_EQ(condition(s, "Degraded")["status"], "True");
  EXPECT_EQ(condition(s, "Degraded")["reason"], "SpecNotApplied");
  EXPECT_NE(condition(s, "Degraded")["message"].get<std::string>().find("memory"),
            std::string::npos);
  EXPECT_EQ(s["observedGeneration"], 2);
  EXPECT_EQ(condition(s, "Ready")["status"], "True") << "it still runs as it was";
}

TEST(TenantStatus, TheAgentsDiagnosisIsTheReasonInCamelCase) {
  TenantFacts f;
  f.generation = 1;
  f.record = ready_record();
  f.record->phase = "degraded";
  f.active_diagnoses = json::array(
      {{{"code", "gpu_xid_79"}, {"summary", "the GPU fell off the bus"}, {"fix", "restart"}}});
  json s = tenant_status(f, nullptr, "2026-12-05T08:00:00Z");
  EXPECT_EQ(condition(s, "Degraded")["reason"], "GpuXid79");
  EXPECT_EQ(condition(s, "Degraded")["message"], "the GPU fell off the bus. Fix: restart");
  EXPECT_EQ(condition(s, "Ready")["reason"], "Degraded");
}

TEST(TenantStatus, ACreateThatFailedIsSaidWithoutARecord) {
  TenantFacts f;
  f.generation = 1;
  f.create_error = "no free nvidia.com/AD104GL_L4: 2 of 2 in use";
  json s = tenant_status(f, nullptr, "2026-12-05T08:00:00Z");
  EXPECT_EQ(s["phase"], "failed");
  EXPECT_EQ(condition(s, "Provisioned")["reason"], "CreateFailed");
  EXPECT_EQ(condition(s, "Degraded")["reason"], "CreateFailed");
  EXPECT_EQ(condition(s, "AgentConnected")["reason"], "NeverConnected");
}

TEST(TenantStatus, ReasonsAreCamelCaseWordsWhateverTheCodeHolds) {
  EXPECT_EQ(camel_case("ollama_not_answering"), "OllamaNotAnswering");
  EXPECT_EQ(camel_case("never_connected"), "NeverConnected");
  EXPECT_EQ(camel_case("x<script>y"), "Xscripty");
  EXPECT_EQ(camel_case(""), "Unknown");
  EXPECT_EQ(camel_case(std::string(500, 'a')).size(), 128u);
}

}  // namespace
}  // namespace factory::controller
