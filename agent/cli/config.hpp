#pragma once
// factory-agent's settings: every flag is also a key of its --config YAML.
// Flags win over the file; the file wins over the defaults documented here.
#include <chrono>
#include <string>

#include "common/error.hpp"

namespace factory::agent {

struct AgentConfig {
  std::string coordinator_url;           // wss://host:port (required)
  std::string ca_sha256;                 // pin: SHA-256 of the coordinator CA's DER
  std::string ca_file;                   // or: the CA certificate itself
  std::string token_file = "/etc/factory/bootstrap-token";  // deleted after enrollment
  std::string state_dir = "/var/lib/factory-agent";
  std::string root = "/";                // prefix for every guest path (tests: a simulated guest)
  std::string log_level = "info";
  std::chrono::milliseconds heartbeat{std::chrono::seconds(15)};
  std::chrono::milliseconds health_interval{std::chrono::seconds(60)};
  // Wait before a failed step's next attempt, times the failures so far.
  std::chrono::milliseconds retry_delay{std::chrono::seconds(10)};
  std::string ollama_url = "http://127.0.0.1:11434";
  std::chrono::milliseconds backoff_base{std::chrono::milliseconds(500)};
  std::chrono::milliseconds backoff_cap{std::chrono::minutes(2)};
  // Small: enough to spread a fleet rebooted at once over a few heartbeats,
  // short enough that a fresh guest shows up within a second.
  std::chrono::milliseconds first_connect_jitter{std::chrono::milliseconds(500)};
  size_t spool_max_events = 10000;
  size_t replay_rate_per_second = 200;   // backlog replay after an outage
  bool run_plan = true;                  // false: link only (tests of the spine)
};

Status load_agent_config_file(const std::string& path, AgentConfig& cfg);
Status validate(const AgentConfig& cfg);

}  // namespace factory::agent
