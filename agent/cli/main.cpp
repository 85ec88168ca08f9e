// factory-agent: provisions a guest VM at first boot and reports to the coordinator.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <thread>

#include "agent/cli/config.hpp"
#include "agent/cli/local_commands.hpp"
#include "agent/cli/runtime.hpp"
#include "agent/link/link.hpp"
#include "agent/link/spool.hpp"
#include "agent/link/version.hpp"
#include "common/atomic_file.hpp"
#include "common/cli/app.hpp"
#include "common/log.hpp"

using namespace factory;
using namespace factory::agent;

namespace {

// Connections to the model endpoint, the requests to Ollama, health and the
// link all take descriptors, and the soft limit systemd leaves a service
// (1,024) is far below what the kernel allows it (the hard limit): a flood of
// idle connections once used them all. The raise is for this process and
// what it starts.
void raise_descriptor_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
  const rlim_t was = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) {
    spdlog::warn("cannot raise the open-file limit from {}: {}", was, std::strerror(errno));
    return;
  }
  spdlog::info("open-file limit raised from {} to {} (the hard limit)", was, rl.rlim_cur);
}

int run_agent(int argc, char** argv) {
  // Named here, so help says "Usage: factory-agent ..." however it was started.
  CLI::App app{
      "factory-agent: provisions this guest as its catalog item says and reports to the "
      "coordinator",
      "factory-agent"};
  cli::apply_conventions(app);
  app.set_version_flag("--version", "factory-agent " + std::string(agent_version()));
  AgentConfig cfg;
  std::string config_file;
  double heartbeat_s = 0;
  app.add_option("--config", config_file, "YAML file; every flag below is also a key of it");
  auto* url = app.add_option("--coordinator-url", cfg.coordinator_url,
                             "wss://host:port of the coordinator");
  auto* sha =
      app.add_option("--ca-sha256", cfg.ca_sha256, "SHA-256 of the coordinator CA (pins it)");
  auto* caf = app.add_option("--ca-file", cfg.ca_file, "The coordinator CA certificate (pins it)");
  auto* tok = app.add_option("--token-file", cfg.token_file,
                             "One-time bootstrap token; deleted after enrollment");
  auto* sd =
      app.add_option("--state-dir", cfg.state_dir, "Identity, spool and plan journal (0700)");
  auto* root =
      app.add_option("--root", cfg.root, "Filesystem root of the guest (tests: a simulated guest)");
  auto* ll = cli::add_log_level_option(app, cfg.log_level, "Log level (default: info)");
  auto* hb = app.add_option("--heartbeat", heartbeat_s, "Seconds between heartbeats");
  bool no_plan = false;
  app.add_flag("--link-only", no_plan, "Connect and report, but do not run plans");
  std::string ollama_url;
  size_t replay_rate = 0;
  auto* rr =
      app.add_option("--replay-rate", replay_rate,
                     "Events per second when replaying a backlog after an outage (default 200)");
  double retry_delay_s = -1;
  auto* rd = app.add_option("--retry-delay", retry_delay_s,
                            "Seconds before a failed step's next attempt (times the failures)");
  auto* ou = app.add_option("--ollama-url", ollama_url,
                            "Ollama's API on this guest (default http://127.0.0.1:11434)");
  std::string endpoint_listen;
  auto* el = app.add_option("--endpoint-listen", endpoint_listen,
                            "Where a model endpoint's proxy listens (default 0.0.0.0:<the plan's "
                            "endpoint port>)");
  double health_interval_s = 0;
  auto* hi =
      app.add_option("--health-interval", health_interval_s,
                     "Seconds between health samples, whatever the plan is doing (default 10)");
  double usage_interval_s = 0;
  auto* ui = app.add_option("--endpoint-usage-interval", usage_interval_s,
                            "Seconds between a model endpoint's usage reports (default 60)");
  uint64_t synthetic = 0;
  double synthetic_rate = 100;
  app.add_option("--synthetic-events", synthetic,
                 "Soak testing: make sure N numbered synthetic events exist (counting those a "
                 "previous run emitted) and deliver them like any other event");
  app.add_option("--synthetic-rate", synthetic_rate, "Synthetic events per second");
  LocalCommand local;
  add_local_commands(app, local);
  cli::set_examples(
      app, {{"factory-agent --config /etc/factory/agent.yaml", "what the systemd unit runs"},
            {"factory-agent health", "this guest's GPU and Ollama, as a table"},
            {"factory-agent plan --tier gpu-vm --check-only", "how far a tier's plan has got"}});
  if (auto done = cli::parse(app, argc, argv)) return *done;
  if (local.run) {
    setup_logging("factory-agent", "warn");
    return local.run();
  }
  if (!config_file.empty()) {
    // The file supplies defaults; flags given on the command line win.
    AgentConfig from_file;
    if (auto st = load_agent_config_file(config_file, from_file); !st.ok()) {
      std::cerr << "factory-agent: " << st.error().message << "\n";
      return cli::kExitUsage;
    }
    auto keep = [](CLI::Option* o, std::string& flag_value, const std::string& file_value) {
      if (o->count() == 0) flag_value = file_value;
    };
    keep(url, cfg.coordinator_url, from_file.coordinator_url);
    keep(sha, cfg.ca_sha256, from_file.ca_sha256);
    keep(caf, cfg.ca_file, from_file.ca_file);
    keep(tok, cfg.token_file, from_file.token_file);
    keep(sd, cfg.state_dir, from_file.state_dir);
    keep(root, cfg.root, from_file.root);
    keep(ll, cfg.log_level, from_file.log_level);
    if (hb->count() == 0) cfg.heartbeat = from_file.heartbeat;
    if (hi->count() == 0) cfg.health_interval = from_file.health_interval;
    cfg.health_max_quiet = from_file.health_max_quiet;
    if (rd->count() == 0) cfg.retry_delay = from_file.retry_delay;
    cfg.ollama_url = from_file.ollama_url;
    cfg.backoff_base = from_file.backoff_base;
    cfg.backoff_cap = from_file.backoff_cap;
    cfg.first_connect_jitter = from_file.first_connect_jitter;
    cfg.spool_max_events = from_file.spool_max_events;
    if (rr->count() == 0) cfg.replay_rate_per_second = from_file.replay_rate_per_second;
    cfg.run_plan = from_file.run_plan;
    cfg.endpoint_listen = from_file.endpoint_listen;
    cfg.endpoint_max_connections = from_file.endpoint_max_connections;
    cfg.endpoint_max_connections_per_address = from_file.endpoint_max_connections_per_address;
    cfg.endpoint_first_byte_timeout = from_file.endpoint_first_byte_timeout;
    if (ui->count() == 0) cfg.endpoint_usage_interval = from_file.endpoint_usage_interval;
    cfg.binary_path = from_file.binary_path;
  }
  if (usage_interval_s > 0)
    cfg.endpoint_usage_interval =
        std::chrono::milliseconds(static_cast<int64_t>(usage_interval_s * 1000));
  if (health_interval_s > 0)
    cfg.health_interval = std::chrono::milliseconds(static_cast<int64_t>(health_interval_s * 1000));
  if (heartbeat_s > 0)
    cfg.heartbeat = std::chrono::milliseconds(static_cast<int64_t>(heartbeat_s * 1000));
  if (no_plan) cfg.run_plan = false;
  if (ou->count()) cfg.ollama_url = ollama_url;
  if (el->count()) cfg.endpoint_listen = endpoint_listen;
  if (replay_rate > 0) cfg.replay_rate_per_second = replay_rate;
  if (retry_delay_s >= 0)
    cfg.retry_delay = std::chrono::milliseconds(static_cast<int64_t>(retry_delay_s * 1000));
  if (auto st = validate(cfg); !st.ok()) {
    std::cerr << "factory-agent: " << st.error().message << "\n";
    return cli::kExitUsage;
  }
  setup_logging("factory-agent", cfg.log_level);
  raise_descriptor_limit();
  if (auto st = ensure_dir(cfg.state_dir, 0700); !st.ok()) {
    std::cerr << "factory-agent: state dir: " << st.error().message << "\n";
    return cli::kExitError;
  }
  auto spool =
      EventSpool::open(std::filesystem::path(cfg.state_dir) / "spool", cfg.spool_max_events);
  if (!spool) {
    std::cerr << "factory-agent: " << spool.error().message << "\n";
    return cli::kExitError;
  }

  // Signals are taken by one thread, which asks the link to stop cleanly.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  GuestEnv env;
  env.root = cfg.root;
  env.state_dir = cfg.state_dir;
  env.ollama_url = cfg.ollama_url;
  // Health runs in every mode; plans only unless --link-only.
  AgentRuntimeOptions ro;
  ro.run_plan = cfg.run_plan;
  ro.health.interval = cfg.health_interval;
  ro.health.max_quiet = cfg.health_max_quiet;
  ro.engine.retry_delay = cfg.retry_delay;
  ro.endpoint.listen = cfg.endpoint_listen;
  ro.endpoint.max_connections = cfg.endpoint_max_connections;
  ro.endpoint.max_connections_per_address = cfg.endpoint_max_connections_per_address;
  ro.endpoint.first_byte_timeout = cfg.endpoint_first_byte_timeout;
  ro.endpoint.usage_every = cfg.endpoint_usage_interval;
  ro.upgrade.binary_path = cfg.binary_path;
  ro.upgrade.ca_file = cfg.ca_file;
  AgentRuntime runtime(env, **spool, std::move(ro));
  LinkCallbacks cb;
  cb.on_plan = [&runtime](const nlohmann::json& p) { runtime.on_plan(p); };
  cb.on_command = [&runtime](const nlohmann::json& c) { runtime.on_command(c); };
  cb.heartbeat_fields = [&runtime] { return runtime.heartbeat_fields(); };
  cb.on_endpoint = [&runtime](const nlohmann::json& e) { runtime.model_endpoint().on_endpoint(e); };
  // A new binary on trial confirms once a health sample went out.
  cb.on_health_sent = [&runtime] { runtime.upgrader().on_health_sent(); };
  // Named endpoint keys fail closed while the coordinator is not heard.
  cb.on_session_end = [&runtime] { runtime.model_endpoint().on_link_lost(); };
  AgentLink link(cfg, **spool, cb);
  runtime.model_endpoint().set_link(
      [&link](const std::string& type, nlohmann::json body) {
        link.offer_request(type, std::move(body));
      },
      [&link](const std::string& type) { link.withdraw_request(type); });
  runtime.set_health_sink(
      [&link](const proto::HealthSample& sample) { link.offer_health(sample.to_json()); });
  runtime.start();
  std::thread sig([&] {
    int s = 0;
    sigwait(&set, &s);
    if (s == SIGINT || s == SIGTERM) {
      // systemd stops the agent this way for a reboot too: after the plan
      // asked for one, the stop is the guest going down.
      const bool rebooting = runtime.rebooting();
      spdlog::info("signal {}: {}", s, rebooting ? "the guest is rebooting" : "stopping");
      link.stop(rebooting ? "rebooting" : "stopping");
    }
  });
  sig.detach();
  std::atomic<bool> done{false};
  std::thread load;
  if (synthetic > 0) {
    load = std::thread([&] {
      auto gap =
          std::chrono::microseconds(static_cast<int64_t>(1e6 / std::max(synthetic_rate, 0.001)));
      // Continues where a previous (killed) run stopped: ids are durable.
      while (!done && (*spool)->last_id() < synthetic) {
        uint64_t n = (*spool)->last_id() + 1;
        if (auto r = (*spool)->emit({{"kind", "synthetic"}, {"n", n}}); !r) {
          spdlog::error("synthetic events: {}", r.error().message);
          break;
        }
        std::this_thread::sleep_for(gap);
      }
    });
  }
  spdlog::info("factory-agent {} starting; coordinator {}", agent_version(), cfg.coordinator_url);
  int rc = link.run();
  done = true;
  // The link is gone: nothing may be offered to it after. Then the step
  // under way is stopped (its command gets SIGTERM, then SIGKILL after the
  // grace) and the plan's thread joined, the journal saying where to resume.
  runtime.set_health_sink(nullptr);
  runtime.stop();
  if (load.joinable()) load.join();
  // 0, 1, or the link's kExitNeedsAdmin (3): refused, do not restart me.
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_agent(argc, argv);
  } catch (const std::exception& e) {
    // A bug, not a user error: still one line, and the error status.
    std::cerr << "factory-agent: internal error: " << e.what() << "\n";
    return cli::kExitError;
  }
}
