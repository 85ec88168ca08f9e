#include "agent/cli/config.hpp"

#include "common/durations.hpp"
#include "common/log.hpp"
#include "common/validation.hpp"
#include "common/yaml_json.hpp"

namespace factory::agent {

namespace {
// A duration as a number of seconds (2.5), "250ms", or parse_duration's "90s".
Status read_duration(validation::ConfigMap& m, const char* key, std::chrono::milliseconds& out) {
  const nlohmann::json* v = m.take(key);
  if (!v) return {};
  if (v->is_number()) {
    out = std::chrono::milliseconds(static_cast<int64_t>(v->get<double>() * 1000));
    return {};
  }
  if (!v->is_string()) return m.wrong_type(key, "a duration like 10s or 250ms");
  const auto& s = v->get_ref<const std::string&>();
  if (s.size() > 2 && s.substr(s.size() - 2) == "ms") {
    try {
      out = std::chrono::milliseconds(std::stoll(s.substr(0, s.size() - 2)));
      return {};
    } catch (const std::exception&) {
      return m.bad_value(key, "'" + s + "' is not a duration like 10s or 250ms");
    }
  }
  auto d = parse_duration(s);
  if (!d) return m.bad_value(key, d.error().message);
  out = *d;
  return {};
}
}  // namespace

Status load_agent_config_file(const std::string& path, AgentConfig& cfg) {
  auto doc = load_yaml_file(path);
  if (!doc) return doc.error();
  auto m = validation::ConfigMap::open(*doc, path);
  if (!m) return m.error();
  auto max_quiet = static_cast<std::size_t>(cfg.health_max_quiet);
  // Left to right (a braced list is sequenced): done() sees every key read.
  for (auto st : {m->read("coordinator_url", cfg.coordinator_url),
                  m->read("ca_sha256", cfg.ca_sha256),
                  m->read("ca_file", cfg.ca_file),
                  m->read("token_file", cfg.token_file),
                  m->read("state_dir", cfg.state_dir),
                  m->read("root", cfg.root),
                  m->read("log_level", cfg.log_level),
                  m->read("ollama_url", cfg.ollama_url),
                  m->read("endpoint_listen", cfg.endpoint_listen),
                  m->read("binary_path", cfg.binary_path),
                  m->read("endpoint_max_connections", cfg.endpoint_max_connections, 1'000'000),
                  m->read("endpoint_max_connections_per_address",
                          cfg.endpoint_max_connections_per_address, 1'000'000),
                  m->read("spool_max_events", cfg.spool_max_events, 100'000'000),
                  m->read("replay_rate_per_second", cfg.replay_rate_per_second, 1'000'000),
                  m->read("run_plan", cfg.run_plan),
                  m->read("health_max_quiet", max_quiet, 1000),
                  read_duration(*m, "heartbeat", cfg.heartbeat),
                  read_duration(*m, "health_interval", cfg.health_interval),
                  read_duration(*m, "retry_delay", cfg.retry_delay),
                  read_duration(*m, "backoff_base", cfg.backoff_base),
                  read_duration(*m, "backoff_cap", cfg.backoff_cap),
                  read_duration(*m, "first_connect_jitter", cfg.first_connect_jitter),
                  read_duration(*m, "endpoint_first_byte_timeout", cfg.endpoint_first_byte_timeout),
                  read_duration(*m, "endpoint_usage_interval", cfg.endpoint_usage_interval),
                  m->done()})
    if (!st.ok()) return st;
  cfg.health_max_quiet = static_cast<int>(max_quiet);
  return {};
}

Status validate(const AgentConfig& cfg) {
  if (auto st = check_log_level(cfg.log_level); !st.ok())
    return st.error().with_context("log_level");
  if (cfg.coordinator_url.rfind("wss://", 0) != 0)
    return Error(Errc::invalid_argument,
                 "--coordinator-url must be a wss:// URL (got '" + cfg.coordinator_url + "')");
  if (cfg.ca_sha256.empty() && cfg.ca_file.empty())
    return Error(Errc::invalid_argument,
                 "pin the coordinator's CA with --ca-sha256 or --ca-file; the agent never "
                 "sends its token to an unverified server");
  if (!cfg.ca_sha256.empty() && cfg.ca_sha256.size() != 64)
    return Error(Errc::invalid_argument, "--ca-sha256 must be 64 hex characters");
  if (cfg.health_interval < std::chrono::milliseconds(100) ||
      cfg.health_interval > std::chrono::hours(1))
    return Error(Errc::invalid_argument, "health_interval must be between 100ms and 1h");
  if (cfg.health_max_quiet < 1 || cfg.health_max_quiet > 1000)
    return Error(Errc::invalid_argument, "health_max_quiet must be from 1 to 1000 intervals");
  if (cfg.backoff_cap > std::chrono::minutes(10))
    return Error(Errc::invalid_argument, "backoff_cap above 10m would hide an agent for too long");
  if (cfg.endpoint_max_connections == 0 || cfg.endpoint_max_connections_per_address == 0)
    return Error(Errc::invalid_argument,
                 "endpoint_max_connections and endpoint_max_connections_per_address must be at "
                 "least 1");
  if (cfg.binary_path.empty() || cfg.binary_path.front() != '/')
    return Error(Errc::invalid_argument,
                 "binary_path must be an absolute path (the unit's ExecStart), got '" +
                     cfg.binary_path + "'");
  if (cfg.endpoint_first_byte_timeout < std::chrono::seconds(1))
    return Error(Errc::invalid_argument, "endpoint_first_byte_timeout must be at least 1s");
  if (cfg.endpoint_usage_interval < std::chrono::seconds(1) ||
      cfg.endpoint_usage_interval > std::chrono::hours(1))
    return Error(Errc::invalid_argument, "endpoint_usage_interval must be between 1s and 1h");
  return {};
}

}  // namespace factory::agent
