#include "agent/cli/config.hpp"

#include "common/durations.hpp"
#include "common/yaml_json.hpp"

namespace factory::agent {

namespace {
Status read_duration(const nlohmann::json& j, const char* key, std::chrono::milliseconds& out) {
  if (!j.contains(key)) return {};
  const auto& v = j[key];
  if (v.is_number()) {
    out = std::chrono::milliseconds(static_cast<int64_t>(v.get<double>() * 1000));
    return {};
  }
  if (!v.is_string()) return Error(Errc::invalid_argument, std::string(key) + ": want a duration");
  const auto& s = v.get_ref<const std::string&>();
  if (s.size() > 2 && s.substr(s.size() - 2) == "ms") {
    out = std::chrono::milliseconds(std::stoll(s.substr(0, s.size() - 2)));
    return {};
  }
  auto d = parse_duration(s);
  if (!d) return d.error().with_context(key);
  out = *d;
  return {};
}
}  // namespace

Status load_agent_config_file(const std::string& path, AgentConfig& cfg) {
  auto doc = load_yaml_file(path);
  if (!doc) return doc.error();
  const auto& j = *doc;
  if (j.is_null()) return {};
  if (!j.is_object()) return Error(Errc::invalid_argument, path + ": want a YAML mapping");
  try {
    auto str = [&](const char* k, std::string& out) {
      if (j.contains(k)) out = j[k].get<std::string>();
    };
    str("coordinator_url", cfg.coordinator_url);
    str("ca_sha256", cfg.ca_sha256);
    str("ca_file", cfg.ca_file);
    str("token_file", cfg.token_file);
    str("state_dir", cfg.state_dir);
    str("root", cfg.root);
    str("log_level", cfg.log_level);
    str("ollama_url", cfg.ollama_url);
    if (j.contains("spool_max_events")) cfg.spool_max_events = j["spool_max_events"].get<size_t>();
    if (j.contains("replay_rate_per_second"))
      cfg.replay_rate_per_second = j["replay_rate_per_second"].get<size_t>();
    if (j.contains("run_plan")) cfg.run_plan = j["run_plan"].get<bool>();
    if (j.contains("health_max_quiet")) cfg.health_max_quiet = j["health_max_quiet"].get<int>();
  } catch (const nlohmann::json::exception& e) {
    return Error(Errc::invalid_argument, path + ": " + e.what());
  }
  for (auto [k, out] : {std::pair{"heartbeat", &cfg.heartbeat},
                        std::pair{"health_interval", &cfg.health_interval},
                        std::pair{"retry_delay", &cfg.retry_delay},
                        std::pair{"backoff_base", &cfg.backoff_base},
                        std::pair{"backoff_cap", &cfg.backoff_cap},
                        std::pair{"first_connect_jitter", &cfg.first_connect_jitter}}) {
    if (auto st = read_duration(j, k, *out); !st.ok()) return st.error().with_context(path);
  }
  return {};
}

Status validate(const AgentConfig& cfg) {
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
  return {};
}

}  // namespace factory::agent
