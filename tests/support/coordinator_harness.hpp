#pragma once
// A real `factory serve` on loopback with its own state directory, and real
// `factory-agent` processes dialing it: what integration tests (and the demo)
// run against. Nothing here is mocked; only the ports and paths are private.
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/test_support.hpp"

namespace factory::testing {

class CoordinatorHarness {
 public:
  // extra_yaml is appended to the generated config (e.g. "tokens:\n  default_ttl: 5m\n");
  // agents_yaml and api_yaml go inside its agents: and api: mappings, indented
  // by the caller (e.g. "  quota:\n    events_per_second: 5\n").
  explicit CoordinatorHarness(std::filesystem::path dir, std::string extra_yaml = "",
                              std::string agents_yaml = "", std::string api_yaml = "");
  ~CoordinatorHarness();

  // Environment for `factory serve` and every CLI call from now on (a shared
  // fake clock: LD_PRELOAD of libfaketime).
  void set_env(std::map<std::string, std::string> env) { env_ = std::move(env); }
  const std::map<std::string, std::string>& env() const { return env_; }

  // The coordinator's log goes through a pipe to a `cat` that writes the
  // file, instead of to the file itself: a test that limits the
  // coordinator's own file writes (prlimit RLIMIT_FSIZE, a full disk's
  // stand-in) still reads what it logged. Call before start().
  void log_through_pipe() { log_through_pipe_ = true; }
  void start();  // spawns `factory serve` and waits until the API answers
  void stop();   // SIGTERM
  void kill9();  // SIGKILL, as a crash would
  bool running() { return proc_.running(); }
  int pid() const { return proc_.pid(); }

  CommandResult factory(const std::vector<std::string>& args,
                        std::chrono::milliseconds timeout = std::chrono::seconds(60));
  nlohmann::json create_token(const std::string& tenant, const std::string& ttl = "");
  nlohmann::json status();
  std::optional<nlohmann::json> tenant(const std::string& name);
  bool agent_connected(const std::string& tenant);

  const std::filesystem::path& dir() const { return dir_; }
  const std::filesystem::path& state_dir() const { return state_; }
  std::filesystem::path config_path() const { return dir_ / "coordinator.yaml"; }
  std::string agents_url() const { return "wss://127.0.0.1:" + std::to_string(agents_port_); }
  int agents_port() const { return agents_port_; }
  int api_port() const { return api_port_; }
  std::string ca_sha256();
  std::string log() const { return proc_.log(); }
  std::string admin_token() const;
  // Every event stored for a tenant, oldest first, as
  // {"agent_id", "id", "received_at", "event"}: read from the coordinator's
  // database (SQLite allows a reader beside the running writer).
  std::vector<nlohmann::json> stored_events(const std::string& tenant) const;
  // The tenant's stored record, and a replacement for it, written straight
  // into the database: for tests that rewind a coordinator's state while it
  // is down (as a crash at some point would have left it).
  std::optional<nlohmann::json> stored_record(const std::string& tenant) const;
  void write_stored_record(const nlohmann::json& record);
  // Runs SQL on the coordinator's database while it is down: for tests that
  // make the store fail (a trigger that refuses a write, as a failing disk would).
  void exec_sql(const std::string& sql);
  // The rows of the database's health table: the latest sample of each
  // tenant, as the store saved it (coalesced: one row per tenant).
  std::map<std::string, nlohmann::json> stored_health() const;
  // GET /metrics (public).
  std::string metrics();

 private:
  std::filesystem::path dir_, state_;
  int agents_port_, api_port_;
  std::map<std::string, std::string> env_;
  Process proc_;
  bool log_through_pipe_ = false;
  int starts_ = 0;
};

struct AgentOptions {
  std::string state_dir_name = "agent";
  std::vector<std::string> extra_args;
  bool pin_wrong_ca = false;
  std::map<std::string, std::string> env;  // added to the agent's environment
  // The guest the agent reports on. Empty: an empty directory of its own,
  // with an empty PATH, so health (which samples at once) reads nothing of
  // the machine the tests run on and runs none of its commands.
  std::filesystem::path root;
  std::string path_env;  // PATH for the agent (with root: the guest's, e.g. GuestSim::path())
};

// Starts `factory-agent` enrolling with the token of a create_token() answer.
class AgentProcess {
 public:
  AgentProcess(CoordinatorHarness& h, const nlohmann::json& token, AgentOptions o = {});
  void restart();  // same state dir, as systemd would after a crash or reboot
  Process& proc() { return proc_; }
  const std::filesystem::path& state_dir() const { return state_; }
  const std::filesystem::path& token_file() const { return token_file_; }
  std::string log() const;

 private:
  std::vector<std::string> argv_;
  std::map<std::string, std::string> env_;
  std::filesystem::path state_, token_file_, log_;
  Process proc_;
  int starts_ = 0;
};

// A peer of our own on wscat's library (Debian's node-ws,
// tests/support/ws_peer.js) against a wss URL: once connected it sends each
// frame, waits, and returns everything it printed ("< {...}" lines are frames
// received). wscat itself drops what it reads before its handshake ends.
CommandResult wscat(const std::string& url, const std::filesystem::path& ca_file,
                    const std::vector<std::string>& frames, double wait_seconds = 1.0,
                    const std::string& cert_file = "", const std::string& key_file = "");

}  // namespace factory::testing
