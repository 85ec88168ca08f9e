#pragma once
// Every message an agent sends, decoded into types with limits before the
// coordinator keeps or shows any of it. The guest is the customer's: its
// agent may send anything, so each field is checked for its type, its
// length, its range and (for names) its characters; a field that fails is
// dropped and reported as a Rejection (the session counts them in
// factory_agent_messages_rejected_total{tenant,reason}), never kept for a
// printer to trip over. A message that cannot stand without the field (an
// event without an id) is refused whole. What is kept is re-encoded from
// the types (to_json), so nothing the decoder did not read reaches the store.
//
// Free text (a step's message, a command's output) keeps its bytes: it is
// shown through display::sanitize wherever a terminal, a log or a page gets
// it, and JSON output stays exact. Names (hostname, version, step ids,
// codes) must match their grammar or are dropped.
//
// Pure functions over the envelope's JSON body: no state, no I/O, no
// exceptions, so a fuzz target can call them directly.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "contract/agent_upgrade.hpp"
#include "contract/endpoint_usage.hpp"
#include "contract/guest_input.hpp"

namespace factory::coordinator {

// What the decoders allow. Sizes are bytes of UTF-8.
namespace limits {
inline constexpr std::size_t kHostname = 253;  // RFC 1123
inline constexpr std::size_t kVersion = 64;
inline constexpr std::size_t kAgentId = 64;
inline constexpr std::size_t kName = 64;  // step ids, diagnosis codes, tiers, states
inline constexpr std::size_t kPlanHash = 128;
inline constexpr std::size_t kTime = 40;       // RFC 3339
inline constexpr std::size_t kMessage = 4096;  // one line a person reads
inline constexpr std::size_t kOutputTail = 16384;
inline constexpr std::size_t kToken = 256;
inline constexpr std::size_t kCsr = 6144;                   // a P-256 CSR is about 500 bytes of PEM
inline constexpr std::uint64_t kCount = 1'000'000'000'000;  // counters (events, bytes)
inline constexpr std::uint64_t kSteps = 1024;               // steps in a plan
inline constexpr std::size_t kRangesAround = 256;  // ranges a guest cluster was picked around
inline constexpr std::uint64_t kAttempts = 1'000'000;
inline constexpr std::size_t kFeatures = 32;  // names in a hello's features
// Free-form JSON (a health report, a diagnosis's details, an event kind
// this coordinator does not know yet) is bounded by proto::FreeFormLimits.
inline constexpr int kDepth = proto::FreeFormLimits{}.depth;
inline constexpr std::size_t kItems = proto::FreeFormLimits{}.items;
inline constexpr std::size_t kKey = proto::FreeFormLimits{}.key;
inline constexpr std::size_t kString = proto::FreeFormLimits{}.string;
}  // namespace limits

// The one reader of guest input and its reasons (contract/guest_input.hpp),
// under the names this module has always used.
using proto::Decoded;
using proto::kAllRejectReasons;
using proto::reason_name;
using proto::Rejection;
using proto::Rejections;
using proto::RejectReason;

// hello: {agent_id?, agent_version?, hostname?, tenant?, features?}
struct AgentHello {
  std::string agent_id, agent_version, hostname;
  // What the agent's build says it can do (protocol.hpp's kAgentFeatures):
  // names, at most kFeatures of them; none from an older agent.
  std::vector<std::string> features;
  // A tenant the agent claims to be; the certificate decides, this is only
  // compared with it.
  std::optional<std::string> tenant;
};
Decoded<AgentHello> decode_hello(const nlohmann::json& body);

// heartbeat: {pending_events, dropped_events, plan_hash?, plan_state?, steps_done?, steps_total?}
struct AgentHeartbeat {
  std::uint64_t pending_events = 0, dropped_events = 0;
  std::optional<std::string> plan_hash, plan_state;
  std::optional<std::uint64_t> steps_done, steps_total;
};
Decoded<AgentHeartbeat> decode_heartbeat(const nlohmann::json& body);

// enroll: {token, csr, agent_version?, hostname?}
struct EnrollRequest {
  std::string token, csr, agent_version, hostname;
};
Decoded<EnrollRequest> decode_enroll(const nlohmann::json& body);

// renew: {csr}
struct RenewRequest {
  std::string csr;
};
Decoded<RenewRequest> decode_renew(const nlohmann::json& body);

// A named failure with its fix, as the agent's diagnose module reports it.
struct AgentDiagnosis {
  std::string code, summary, fix;
  nlohmann::json details = nlohmann::json::object();  // free-form, bounded
  nlohmann::json to_json() const;
};

// The guest cluster's ranges as an rke2 step chose them, and what it chose
// them around: {"cluster-cidr","service-cidr","cluster-dns","around":[{range,source}]}.
struct GuestRangesReport {
  std::string cluster_cidr, service_cidr, cluster_dns;
  std::vector<std::pair<std::string, std::string>> around;  // range, source
  nlohmann::json to_json() const;
};

// {"kind":"progress","plan_hash","step","state","attempt","message","output_tail",
//  "diagnosis","percent","completed","total","allocatable","expected","ranges"}
struct ProgressEvent {
  std::string step;
  std::optional<std::string> plan_hash, state, message, output_tail;
  std::optional<std::int64_t> attempt;
  std::optional<AgentDiagnosis> diagnosis;
  std::optional<double> percent;  // 0-100
  std::optional<std::uint64_t> completed, total, allocatable, expected;
  std::optional<GuestRangesReport> ranges;
};
// {"kind":"plan","plan_hash","tier","state","steps_total","steps_done","message","failed_step"}
struct PlanEvent {
  std::optional<std::string> plan_hash, tier, state, message, failed_step;
  std::optional<std::uint64_t> steps_total, steps_done;
};
// {"kind":"journal_reset","plan_hash","reason","message"}
struct JournalResetEvent {
  std::optional<std::string> plan_hash, reason, message;
};
// {"kind":"maintenance","notice_id","state","node","deadline"}: the guest got
// a host drain's notice (state "received") or its withdrawal ("cancelled").
struct MaintenanceEvent {
  std::string notice_id;
  std::optional<std::string> state, node, deadline;
};
// {"kind":"tier_upgrade","upgrade_id","state","from_hash","to_hash","step",
//  "message","diagnosis"} (contract/tier_upgrade.hpp). Without a valid
// upgrade_id and state it says nothing a journal can use: kind and id only.
struct TierUpgradeEvent {
  std::string upgrade_id, state;
  std::optional<std::string> from_hash, to_hash, step, message;
  std::optional<AgentDiagnosis> diagnosis;
};
// {"kind":"agent_upgrade","upgrade_id","state","from_version","to_version",
// "reason"}: what the agent made of an upgrade order, as
// contract/agent_upgrade.hpp decodes it (every field checked, the reason
// display-safe text of at most 512 bytes). One that fails the contract's
// decoder is stored as id and kind only.
struct AgentUpgradeReport {
  proto::AgentUpgradeEvent report;
};
// {"kind":"endpoint_usage","key","requests","errors","prompt_tokens",
// "completion_tokens"} (contract/endpoint_usage.hpp): a model endpoint's
// usage of one key since the agent's previous report. One that fails the
// contract's reader is stored as id and kind only.
struct EndpointUsageReport {
  proto::EndpointUsageEvent usage;
};
// {"kind":"log","level","message"}
struct LogEvent {
  std::optional<std::string> level, message;
};
// {"kind":"diagnosis","code","summary","fix","details"}
struct DiagnosisEvent {
  AgentDiagnosis diagnosis;
};
// {"kind":"health", ...}: the agent's health report while it still travels
// as an event; free-form and bounded.
struct HealthEvent {
  nlohmann::json report = nlohmann::json::object();
};
// A kind this coordinator does not know (a newer agent's): stored, bounded,
// and projected onto nothing.
struct OtherEvent {
  nlohmann::json fields = nlohmann::json::object();
};

// An event: {id, time?, kind, truncated?, ...the kind's fields}.
struct AgentEvent {
  std::uint64_t id = 0;  // the agent's durable spool id, > 0
  std::string kind;
  std::optional<std::string> time;
  bool truncated = false;  // the agent's spool cut it to fit a frame
  // monostate: a known kind whose defining field was dropped (a progress
  // event without a valid step): stored as id/kind/time only.
  std::variant<std::monostate, ProgressEvent, PlanEvent, JournalResetEvent, LogEvent,
               DiagnosisEvent, HealthEvent, MaintenanceEvent, AgentUpgradeReport, OtherEvent,
               TierUpgradeEvent, EndpointUsageReport>
      body;

  // The form stored and shown: only what was decoded.
  nlohmann::json to_json() const;
};
Decoded<AgentEvent> decode_event(const nlohmann::json& body);

}  // namespace factory::coordinator
