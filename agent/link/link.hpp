#pragma once
// The agent's connection to the coordinator: enroll once with the bootstrap
// token (after checking the server against the pinned CA), then mTLS sessions
// that replay the spool, send heartbeats, renew the certificate before it
// expires, and hand plans and commands to the plan runner. Reconnects with
// capped exponential backoff and full jitter, after a random first delay;
// the backoff starts over only after a session the coordinator did not end
// with an error (store_failed, over_quota: refusals like any other).
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "agent/link/spool.hpp"
#include "common/error.hpp"

namespace factory::agent {

// Exit status when the agent can never succeed without an admin's help
// (token refused, certificate revoked). systemd's RestartPreventExitStatus=3
// keeps it from restarting in a loop.
inline constexpr int kExitNeedsAdmin = 3;

// The exit status when the link cannot begin with what is on disk (its
// identity, the bootstrap token): kExitNeedsAdmin only where waiting cannot
// help and an admin must act (no token at all, an identity file that is not
// one); 1 for anything a restart may cure (out of file descriptors, a disk
// error), which systemd restarts. Never 3 for a failure that is not a refusal.
int startup_exit_status(const Error& e);

// How long a planned stop may take the link at most.
inline constexpr std::chrono::seconds kStopDeadline{3};

// What the link needs to know, with the defaults the agent documents (its
// settings, agent/cli/config.hpp, are these and more).
struct LinkOptions {
  std::string coordinator_url;  // wss://host:port (required)
  std::string ca_sha256;        // pin: SHA-256 of the coordinator CA's DER
  std::string ca_file;          // or: the CA certificate itself
  std::string token_file = "/etc/factory/bootstrap-token";  // deleted after enrollment
  std::string state_dir = "/var/lib/factory-agent";         // identity (and spool, journal)
  std::chrono::milliseconds heartbeat{std::chrono::seconds(15)};
  std::chrono::milliseconds backoff_base{std::chrono::milliseconds(500)};
  std::chrono::milliseconds backoff_cap{std::chrono::minutes(2)};
  // Small: enough to spread a fleet rebooted at once over a few heartbeats,
  // short enough that a fresh guest shows up within a second.
  std::chrono::milliseconds first_connect_jitter{std::chrono::milliseconds(500)};
  size_t replay_rate_per_second = 200;  // backlog replay after an outage
};

struct LinkCallbacks {
  std::function<void(const nlohmann::json& plan_frame_body)> on_plan;
  std::function<void(const nlohmann::json& command)> on_command;
  // A model endpoint's frame: its key hash, and a certificate when asked
  // for with an endpoint_csr request (offer_request).
  std::function<void(const nlohmann::json& endpoint)> on_endpoint;
  // Extra fields for each heartbeat (current plan hash, health summary).
  std::function<nlohmann::json()> heartbeat_fields;
  // A health sample went out on a session the coordinator welcomed (its
  // hello accepted): what a newly installed binary waits for to call itself
  // working (agent/upgrade). Runs on the link's thread: it must not wait.
  std::function<void()> on_health_sent;
  // A session (welcomed or not) has ended, or could not begin: the
  // coordinator's word may be changing unheard from now on (the model
  // endpoint's named keys fail closed on it). Runs on the link's thread.
  std::function<void()> on_session_end;
};

class AgentLink {
 public:
  AgentLink(LinkOptions options, EventSpool& spool, LinkCallbacks cb);
  ~AgentLink();
  // Blocks until stop() or a failure that needs an admin. Returns the exit status.
  int run();
  // Thread-safe. A planned stop: the session's close frame carries `reason`
  // ("stopping", "rebooting"), which the coordinator shows as "stopped" or
  // "rebooting" rather than a lost connection; run() returns once it is
  // sent, or after kStopDeadline whatever the link was doing.
  void stop(std::string reason = "stopping");
  void wake();
  // Thread-safe: the agent's latest health sample (contract/health_sample.hpp),
  // sent as a "health" frame as soon as a session is up. Health is state: it
  // is not spooled nor acknowledged, a newer sample replaces one not sent
  // yet, and each new session starts with the latest.
  void offer_health(nlohmann::json sample);
  // Thread-safe: a frame to send as soon as a session is up, and again at
  // the start of every later session, until withdraw_request(type): how a
  // request whose answer may be lost with its session (an endpoint
  // certificate) is asked until it is answered. One per type; a newer one
  // replaces it.
  void offer_request(std::string type, nlohmann::json body);
  void withdraw_request(const std::string& type);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace factory::agent
