#pragma once
// factory-agent's settings: every flag is also a key of its --config YAML.
// Flags win over the file; the file wins over the defaults documented here
// and in LinkOptions (agent/link/link.hpp).
#include <chrono>
#include <string>

#include "agent/endpoint/proxy.hpp"
#include "agent/link/link.hpp"
#include "common/error.hpp"

namespace factory::agent {

// The link's settings (LinkOptions: coordinator_url, the CA pin, token_file,
// state_dir, heartbeat, backoff, first-connect jitter, replay rate) and these.
struct AgentConfig : LinkOptions {
  std::string root = "/";  // prefix for every guest path (tests: a simulated guest)
  std::string log_level = "info";
  // Health is sampled every health_interval, whatever the plan is doing, and
  // sent when it changed or at least every health_max_quiet intervals.
  std::chrono::milliseconds health_interval{std::chrono::seconds(10)};
  int health_max_quiet = 6;
  // Wait before a failed step's next attempt, times the failures so far.
  std::chrono::milliseconds retry_delay{std::chrono::seconds(10)};
  std::string ollama_url = "http://127.0.0.1:11434";
  // A model endpoint's proxy: "" = 0.0.0.0:<the plan's endpoint port>.
  std::string endpoint_listen;
  // ... its connections at once, in all and from one source address, and how
  // long Ollama may take to begin an answer (agent/endpoint/proxy.hpp says
  // why these defaults).
  size_t endpoint_max_connections = endpoint::ProxyOptions{}.max_connections;
  size_t endpoint_max_connections_per_address =
      endpoint::ProxyOptions{}.max_connections_per_address;
  std::chrono::milliseconds endpoint_first_byte_timeout =
      endpoint::ProxyOptions{}.upstream_first_byte_timeout;
  // How often the endpoint's usage per key goes to the coordinator (durable
  // endpoint_usage events; once more at stop): at most one event per key.
  std::chrono::milliseconds endpoint_usage_interval{std::chrono::seconds(60)};
  // The unit's ExecStart: the file an upgrade replaces with a link to the
  // new binary (agent/upgrade; deploy/factory-agent.service).
  std::string binary_path = "/usr/local/bin/factory-agent";
  size_t spool_max_events = 10000;
  bool run_plan = true;  // false: link only (tests of the spine)
};

Status load_agent_config_file(const std::string& path, AgentConfig& cfg);
Status validate(const AgentConfig& cfg);

}  // namespace factory::agent
