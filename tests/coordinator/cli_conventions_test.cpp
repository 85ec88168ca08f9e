// What a newcomer meets in the first hour with `factory` and `factory-agent`,
// through the real binaries: exit statuses 0/1/2, `-o table|json|yaml`,
// help that shows the global flags and examples, FACTORY_* environment
// variables, a checked --log-level, a config whose every key is checked, and
// messages that say a URL or a path once.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "coordinator/enroll/ca.hpp"
#include "tests/support/test_support.hpp"

using factory::testing::agent_bin;
using factory::testing::factory_bin;
using factory::testing::free_loopback_port;
using factory::testing::run;
using factory::testing::TempDir;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// Every invocation names its config, so nothing depends on /etc/factory or
// on FACTORY_* variables of the shell running the tests (each is set to ""
// unless a test sets it: CLI11 treats an empty variable as unset).
factory::CommandResult fac(const std::vector<std::string>& args,
                           std::map<std::string, std::string> env = {}) {
  for (const char* v : {"FACTORY_CONFIG", "FACTORY_SERVER", "FACTORY_TOKEN_FILE"})
    env.emplace(v, "");
  std::vector<std::string> argv = {factory_bin()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, std::chrono::seconds(60), env);
}

factory::CommandResult agent(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {agent_bin()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv);
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

size_t lines(const std::string& text) {
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

// A usage error: exit 2, and one line "<program>: <what>; see `<command> --help`".
void expect_usage_error(const factory::CommandResult& r, const std::string& program,
                        const std::string& command) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output.rfind(program + ": ", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("; see `" + command + " --help`"), std::string::npos) << r.output;
  EXPECT_EQ(lines(r.output), 1u) << r.output;
}

// A state directory as `factory serve` leaves it, for the commands that read
// the CA and the admin token from it (no server runs).
fs::path make_state(const TempDir& dir) {
  fs::path state = dir / "state";
  auto ca = factory::enroll::CertificateAuthority::load_or_create(state);
  EXPECT_TRUE(ca.ok()) << ca.error().message;
  write(state / "admin.token", "not-a-real-token\n");
  return state;
}

}  // namespace

TEST(CliConventions, ExitStatusIsZeroOneOrTwo) {
  TempDir dir;
  const std::string cfg = (dir / "absent.yaml").string();
  for (auto args : std::vector<std::vector<std::string>>{
           {"--help"}, {"--version"}, {"status", "--help"}, {"tenant", "create", "--help"}}) {
    auto r = fac(args);
    EXPECT_EQ(r.exit_code, 0) << args[0] << ": " << r.output;
  }
  // CLI11's own codes (105 conversion, 106 validation, 109 extras, ...) are all 2.
  expect_usage_error(fac({}), "factory", "factory");
  expect_usage_error(fac({"bogus"}), "factory", "factory");
  expect_usage_error(fac({"tenant"}), "factory", "factory tenant");
  expect_usage_error(fac({"--config", cfg, "status", "--nope"}), "factory", "factory status");
  expect_usage_error(fac({"--config", cfg, "token", "create"}), "factory", "factory token create");
  expect_usage_error(
      fac({"--config", cfg, "tenant", "create", "a", "--tier", "gpu-vm", "--gpus", "many"}),
      "factory", "factory tenant create");
  auto missing = fac({"tenant"});
  EXPECT_NE(missing.output.find("factory: a subcommand is required"), std::string::npos)
      << missing.output;
  // An error that is not the command line's: 1.
  TempDir sdir;
  const fs::path state = make_state(sdir);
  write(sdir / "c.yaml", "state_dir: " + state.string() + "\n");
  auto down = fac({"--config", (sdir / "c.yaml").string(), "--server",
                   "https://127.0.0.1:" + std::to_string(free_loopback_port()), "status"});
  EXPECT_EQ(down.exit_code, 1) << down.output;

  // The agent alike; its own 3 (refused: do not restart) is the spine tests'.
  EXPECT_EQ(agent({"--help"}).exit_code, 0);
  EXPECT_EQ(agent({"health", "--help"}).exit_code, 0);
  expect_usage_error(agent({"--bogus"}), "factory-agent", "factory-agent");
  expect_usage_error(agent({"plan", "--tier"}), "factory-agent", "factory-agent plan");
  expect_usage_error(agent({"--heartbeat", "often"}), "factory-agent", "factory-agent");
}

TEST(CliConventions, OutputFlagNamesItsThreeChoices) {
  TempDir dir;
  const std::string cfg = (dir / "absent.yaml").string();
  auto help = fac({"status", "--help"});
  ASSERT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("-o, --output table|json|yaml"), std::string::npos) << help.output;
  EXPECT_EQ(help.output.find("ENUM"), std::string::npos) << help.output;
  EXPECT_EQ(help.output.find("->"), std::string::npos) << help.output;
  auto show = fac({"catalog", "show", "--help"});
  EXPECT_NE(show.output.find("-o, --output json|yaml"), std::string::npos) << show.output;

  auto xml = fac({"--config", cfg, "status", "-o", "xml"});
  expect_usage_error(xml, "factory", "factory status");
  EXPECT_NE(xml.output.find("'xml' is not an output format (one of table, json, yaml)"),
            std::string::npos)
      << xml.output;
  auto yaml_only = fac({"--config", cfg, "catalog", "show", "gpu-vm", "-o", "table"});
  expect_usage_error(yaml_only, "factory", "factory catalog show");
  EXPECT_NE(yaml_only.output.find("(one of json, yaml)"), std::string::npos) << yaml_only.output;

  // Case does not matter, and the value still selects the format.
  auto upper = fac({"--config", cfg, "catalog", "list", "-o", "JSON"});
  ASSERT_EQ(upper.exit_code, 0) << upper.output;
  EXPECT_EQ(json::parse(upper.output)["source"], "built-in");

  auto agent_xml = agent({"health", "-o", "xml"});
  expect_usage_error(agent_xml, "factory-agent", "factory-agent health");
  EXPECT_NE(agent_xml.output.find("(one of table, json, yaml)"), std::string::npos)
      << agent_xml.output;
  auto agent_help = agent({"health", "--help"});
  EXPECT_NE(agent_help.output.find("-o, --output table|json|yaml"), std::string::npos)
      << agent_help.output;
}

TEST(CliConventions, SubcommandHelpShowsTheGlobalFlags) {
  auto r = fac({"tenant", "create", "--help"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Usage: factory tenant create"), std::string::npos) << r.output;
  auto global = r.output.find("Global options:");
  ASSERT_NE(global, std::string::npos) << r.output;
  for (const char* flag : {"--config", "--server", "--token-file", "--log-level", "FACTORY_CONFIG",
                           "FACTORY_SERVER", "FACTORY_TOKEN_FILE"})
    EXPECT_NE(r.output.find(flag, global), std::string::npos) << flag << "\n" << r.output;
  // A command in a group shows its group's options too.
  auto check = fac({"host", "check", "--help"});
  auto group = check.output.find("Options of `factory host`");
  ASSERT_NE(group, std::string::npos) << check.output;
  EXPECT_NE(check.output.find("--host-root", group), std::string::npos) << check.output;
  EXPECT_NE(check.output.find("Global options:", group), std::string::npos) << check.output;
  // The agent's local commands take none of the daemon's flags, and list none.
  auto health = agent({"health", "--help"});
  EXPECT_EQ(health.output.find("--coordinator-url"), std::string::npos) << health.output;
}

TEST(CliConventions, MainCommandsHelpHasExamples) {
  const std::vector<std::vector<std::string>> commands = {{},
                                                          {"serve"},
                                                          {"status"},
                                                          {"token", "create"},
                                                          {"tenant", "create"},
                                                          {"tenant", "list"},
                                                          {"tenant", "show"},
                                                          {"tenant", "delete"},
                                                          {"tenant", "retry"},
                                                          {"tenant", "restart"},
                                                          {"tenant", "keys", "create"},
                                                          {"tenant", "keys", "list"},
                                                          {"tenant", "keys", "revoke"},
                                                          {"catalog", "list"},
                                                          {"catalog", "show"},
                                                          {"catalog", "validate"},
                                                          {"host", "check"},
                                                          {"host", "bind"},
                                                          {"host", "unbind"},
                                                          {"kubevirt", "allowlist"}};
  for (const auto& c : commands) {
    std::string name = "factory";
    for (const auto& w : c) name += " " + w;
    auto args = c;
    args.push_back("--help");
    auto r = fac(args);
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.output;
    auto ex = r.output.find("\nExamples:\n");
    ASSERT_NE(ex, std::string::npos) << name << ": " << r.output;
    // Each example is one this command runs, not an inherited one.
    EXPECT_NE(r.output.find("\n  " + name, ex), std::string::npos) << name << ": " << r.output;
    if (!c.empty()) {
      EXPECT_EQ(occurrences(r.output, "Examples:"), 1u) << name << ": " << r.output;
    }
  }
  auto status = fac({"status", "--help"});
  EXPECT_EQ(status.output.find("factory serve --config"), std::string::npos) << status.output;
  for (std::string c : {"", "health", "plan"}) {
    auto r = c.empty() ? agent({"--help"}) : agent({c, "--help"});
    auto ex = r.output.find("\nExamples:\n");
    ASSERT_NE(ex, std::string::npos) << c << ": " << r.output;
    EXPECT_NE(r.output.find("\n  factory-agent " + c, ex), std::string::npos) << r.output;
  }
}

TEST(CliConventions, EnvironmentVariablesLikeVaultAddrAndFlagsWin) {
  TempDir dir;
  const fs::path state = make_state(dir);
  const fs::path cfg = dir / "c.yaml";
  write(cfg, "state_dir: " + state.string() +
                 "\napi:\n  listen: 127.0.0.1:" + std::to_string(free_loopback_port()) + "\n");
  const std::string absent = (dir / "absent.yaml").string();

  // FACTORY_CONFIG names the config as --config does, and must exist as it must.
  auto gone = fac({"status"}, {{"FACTORY_CONFIG", absent}});
  EXPECT_EQ(gone.exit_code, 1) << gone.output;
  EXPECT_NE(gone.output.find("config file " + absent + " not found"), std::string::npos)
      << gone.output;
  auto flag_config = fac({"--config", cfg.string(), "status"}, {{"FACTORY_CONFIG", absent}});
  EXPECT_EQ(flag_config.output.find(absent), std::string::npos) << flag_config.output;

  // FACTORY_SERVER is the API address; the URL is said once.
  const std::string env_url = "https://127.0.0.1:" + std::to_string(free_loopback_port());
  auto r = fac({"status"}, {{"FACTORY_CONFIG", cfg.string()}, {"FACTORY_SERVER", env_url}});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot reach the coordinator API at " + env_url), std::string::npos)
      << r.output;
  EXPECT_EQ(occurrences(r.output, env_url), 1u) << r.output;
  EXPECT_EQ(lines(r.output), 1u) << r.output;
  std::string flag_url = "https://127.0.0.1:" + std::to_string(free_loopback_port());
  while (flag_url == env_url)
    flag_url = "https://127.0.0.1:" + std::to_string(free_loopback_port());
  r = fac({"--server", flag_url, "status"},
          {{"FACTORY_CONFIG", cfg.string()}, {"FACTORY_SERVER", env_url}});
  EXPECT_NE(r.output.find(flag_url), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(env_url), std::string::npos) << r.output;

  // FACTORY_TOKEN_FILE is the admin token; its path is said once.
  const std::string env_token = (dir / "env.token").string();
  r = fac({"status"}, {{"FACTORY_CONFIG", cfg.string()}, {"FACTORY_TOKEN_FILE", env_token}});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("admin token: read " + env_token + ": No such file"), std::string::npos)
      << r.output;
  EXPECT_EQ(occurrences(r.output, env_token), 1u) << r.output;
  const std::string flag_token = (dir / "flag.token").string();
  r = fac({"--token-file", flag_token, "status"},
          {{"FACTORY_CONFIG", cfg.string()}, {"FACTORY_TOKEN_FILE", env_token}});
  EXPECT_NE(r.output.find(flag_token), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(env_token), std::string::npos) << r.output;
}

TEST(CliConventions, LogLevelIsChecked) {
  TempDir dir;
  const std::string cfg = (dir / "absent.yaml").string();
  auto loud = fac({"--config", cfg, "--log-level", "loud", "catalog", "list"});
  expect_usage_error(loud, "factory", "factory catalog list");
  EXPECT_NE(loud.output.find("'loud' is not a log level (one of trace, debug, info, warn, error)"),
            std::string::npos)
      << loud.output;
  EXPECT_EQ(fac({"--config", cfg, "--log-level", "debug", "catalog", "list"}).exit_code, 0);

  write(dir / "loud.yaml", "log_level: loud\n");
  auto in_file = fac({"--config", (dir / "loud.yaml").string(), "status"});
  EXPECT_EQ(in_file.exit_code, 2) << in_file.output;
  EXPECT_NE(in_file.output.find("log_level: 'loud' is not a log level"), std::string::npos)
      << in_file.output;

  expect_usage_error(agent({"--log-level", "loud"}), "factory-agent", "factory-agent");
  write(dir / "agent.yaml", "coordinator_url: wss://127.0.0.1:1\nca_sha256: " +
                                std::string(64, 'a') + "\nlog_level: chatty\n");
  auto agent_file = agent({"--config", (dir / "agent.yaml").string()});
  EXPECT_EQ(agent_file.exit_code, 2) << agent_file.output;
  EXPECT_NE(agent_file.output.find("log_level: 'chatty' is not a log level"), std::string::npos)
      << agent_file.output;
}

TEST(CliConventions, ConfigKeysAreCheckedAtEveryDepthAndNamedByPath) {
  TempDir dir;
  struct Case {
    std::string yaml, message;
  };
  const std::vector<Case> cases = {
      {"stat_dir: /x\n", "unknown key 'stat_dir'"},
      {"agents:\n  listn: 127.0.0.1:1\n",
       "unknown key 'agents.listn' (known: listen, binary, idle_timeout, cert_ttl, renewal_grace, "
       "upgrade_grace, quota)"},
      {"api:\n  lissen: 127.0.0.1:1\n",
       "unknown key 'api.lissen' (known: listen, metrics_public, events_heartbeat)"},
      {"tokens:\n  default_tll: 1h\n", "unknown key 'tokens.default_tll'"},
      {"kube:\n  namspace: x\n", "unknown key 'kube.namspace'"},
      {"threads:\n  iox: 2\n", "unknown key 'threads.iox' (known: io, workers)"},
      {"state_dir: 5\n", "state_dir: want a string, got a number"},
      {"agents:\n  cert_ttl: 5\n", "agents.cert_ttl: want a duration like 90s, 1h, got a number"},
      {"agents:\n  cert_ttl: soon\n", "agents.cert_ttl: "},
      {"agents: 3\n", "agents: want a map, got a number"},
      {"api:\n  listen: [a, b]\n", "api.listen: want a string, got a list"},
      {"threads:\n  io: many\n", "threads.io: want a whole number from 0 to 64, got a string"},
      {"kube:\n  request_timeout: true\n", "kube.request_timeout: want a duration"},
      {"- a\n", "want a map, got a list"},
  };
  for (const auto& c : cases) {
    write(dir / "c.yaml", c.yaml);
    auto r = fac({"--config", (dir / "c.yaml").string(), "status"});
    EXPECT_EQ(r.exit_code, 2) << c.yaml << r.output;
    EXPECT_NE(r.output.find((dir / "c.yaml").string() + ": " + c.message), std::string::npos)
        << c.yaml << r.output;
    EXPECT_EQ(lines(r.output), 1u) << r.output;
  }
  // The agent's --config file alike.
  for (const auto& c : std::vector<Case>{
           {"heartbeet: 3\n", "unknown key 'heartbeet'"},
           {"run_plan: maybe\n", "run_plan: want true or false, got a string"},
           {"spool_max_events: -1\n", "spool_max_events: want a whole number"},
           {"heartbeat: [1]\n", "heartbeat: want a duration like 10s or 250ms, got a list"}}) {
    write(dir / "a.yaml", c.yaml);
    auto r = agent({"--config", (dir / "a.yaml").string()});
    EXPECT_EQ(r.exit_code, 2) << c.yaml << r.output;
    EXPECT_NE(r.output.find((dir / "a.yaml").string() + ": " + c.message), std::string::npos)
        << c.yaml << r.output;
  }
}

// Issue 23, point 4: a script that passes a customer's name along must not
// be able to reach another route. `tenant retry 't5/credentials/rotate?'`
// rotated t5's key; `tenant show 't5/credentials' -o json` printed it. Every
// name is checked before any request: exit 2 naming the rule, and nothing
// reaches the coordinator (a loopback listener here stands in for it and
// counts who connects).
TEST(CliConventions, TenantNamesAreCheckedBeforeAnyRequestIsSent) {
  TempDir dir;
  const fs::path state = make_state(dir);
  write(dir / "c.yaml", "state_dir: " + state.string() + "\n");
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 16), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string server = "https://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  const std::vector<std::string> base = {"--config", (dir / "c.yaml").string(), "--server", server};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.begin(), base.begin(), base.end());
    return fac(args);
  };
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"tenant", "retry", "t5/credentials/rotate?"},
           {"tenant", "restart", "t5/credentials/rotate", "--dry-run"},
           {"tenant", "show", "t5/credentials", "-o", "json"},
           {"tenant", "credentials", "t5/../t6"},
           {"tenant", "delete", "t5%2Fx"},
           {"tenant", "delete", "t5", "--namespace", "tenants?x=y"},
           {"tenant", "create", "Bad_Name", "--tier", "gpu-vm"},
           {"token", "create", "--tenant", "t5/credentials"},
       }) {
    auto r = with(args);
    const std::string command = "factory " + args[0] + " " + args[1];
    expect_usage_error(r, "factory", command);
    EXPECT_NE(r.output.find("a-z, 0-9 and '-'"), std::string::npos)
        << "the rule it broke: " << r.output;
  }
  // A key name is checked the same way (issue 28): it is a path segment too.
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"tenant", "keys", "revoke", "t5", "--key-name", "ci/../default"},
           {"tenant", "keys", "create", "t5", "--key-name", "Bad_Key"},
           {"tenant", "keys", "create", "t5", "--key-name", "a.b", "--dry-run"},
           {"tenant", "keys", "create", "t5/keys", "--key-name", "ci"},
           {"tenant", "keys", "list", "t5/../t6"},
       }) {
    auto r = with(args);
    expect_usage_error(r, "factory", "factory tenant keys " + args[2]);
    EXPECT_NE(r.output.find("a-z, 0-9 and '-'"), std::string::npos) << r.output;
  }
  // A valid name goes through: the stand-in, which speaks no TLS, is reached.
  std::atomic<int> accepted{0};
  std::atomic<bool> done{false};
  std::thread stand_in([&] {
    while (!done) {
      int c = ::accept(listener, nullptr, nullptr);
      if (c >= 0) {
        ::close(c);  // the client fails at once, no handshake to wait for
        ++accepted;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  });
  auto reached = with({"tenant", "retry", "t5"});
  done = true;
  stand_in.join();
  ::close(listener);
  EXPECT_EQ(reached.exit_code, 1) << reached.output;
  EXPECT_EQ(accepted, 1) << "only the valid name's request reached the coordinator";
}
