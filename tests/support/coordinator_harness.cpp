#include "tests/support/coordinator_harness.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sqlite3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "common/atomic_file.hpp"
#include "common/net/http_client.hpp"
#include "common/pki.hpp"

namespace factory::testing {
namespace fs = std::filesystem;

namespace {
bool port_open(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}
}  // namespace

CoordinatorHarness::CoordinatorHarness(fs::path dir, std::string extra_yaml,
                                       std::string agents_yaml, std::string api_yaml)
    : dir_(std::move(dir)), state_(dir_ / "state") {
  agents_port_ = free_loopback_port();
  api_port_ = free_loopback_port();
  while (api_port_ == agents_port_) api_port_ = free_loopback_port();
  std::ofstream f(config_path());
  f << "state_dir: " << state_.string() << "\n"
    << "external_url: wss://127.0.0.1:" << agents_port_ << "\n"
    << "agents:\n  listen: 127.0.0.1:" << agents_port_
    << "\n  idle_timeout: 10s\n"
    // The agent binary the coordinator serves (and hashes into tenants' user-data).
    << "  binary: " << agent_bin() << "\n"
    << agents_yaml << "api:\n  listen: 127.0.0.1:" << api_port_ << "\n"
    << api_yaml << "log_level: debug\n"
    << extra_yaml;
}

CoordinatorHarness::~CoordinatorHarness() {
  stop();
}

void CoordinatorHarness::start() {
  std::vector<std::string> argv = {factory_bin(), "serve", "--config", config_path().string()};
  if (log_through_pipe_)
    // bash replaces itself with the coordinator (the pid stays the one
    // pid() names); the cat it started keeps the log file as its stdout.
    argv.insert(argv.begin(),
                {"/bin/bash", "-c", "exec > >(exec cat) 2>&1; exec \"$@\"", "coordinator"});
  proc_ = Process(argv, dir_ / ("coordinator." + std::to_string(++starts_) + ".log"), env_);
  bool up = eventually([&] { return port_open(api_port_) && port_open(agents_port_); },
                       std::chrono::seconds(15));
  ASSERT_TRUE(up) << "factory serve did not start listening; its log:\n" << proc_.log();
}

void CoordinatorHarness::stop() {
  proc_.stop();
}
void CoordinatorHarness::kill9() {
  proc_.kill(SIGKILL);
  proc_.wait();
}

CommandResult CoordinatorHarness::factory(const std::vector<std::string>& args,
                                          std::chrono::milliseconds timeout) {
  std::vector<std::string> argv = {factory_bin(), "--config", config_path().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, timeout, env_);
}

nlohmann::json CoordinatorHarness::create_token(const std::string& tenant, const std::string& ttl) {
  std::vector<std::string> args = {"token", "create", "--tenant", tenant, "-o", "json"};
  if (!ttl.empty()) {
    args.push_back("--ttl");
    args.push_back(ttl);
  }
  auto r = factory(args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.output;
  return j;
}

nlohmann::json CoordinatorHarness::status() {
  auto r = factory({"status", "-o", "json"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output, nullptr, false);
  return j.is_discarded() ? nlohmann::json::object() : j;
}

std::optional<nlohmann::json> CoordinatorHarness::tenant(const std::string& name) {
  auto s = status();
  for (auto& t : s.value("tenants", nlohmann::json::array()))
    if (t.value("name", "") == name) return t;
  return std::nullopt;
}

bool CoordinatorHarness::agent_connected(const std::string& tenant_name) {
  auto t = tenant(tenant_name);
  return t && (*t)["agent"].value("connected", false);
}

std::string CoordinatorHarness::admin_token() const {
  std::string t = slurp(state_ / "admin.token");
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  return t;
}

std::string CoordinatorHarness::ca_sha256() {
  auto pem = read_file(state_ / "ca.crt");
  if (!pem) return "";
  auto sha = pki::certificate_sha256(*pem);
  return sha ? *sha : "";
}

namespace {

// The coordinator's database, opened for this one query; SQLITE_OPEN_READONLY
// leaves the running coordinator's writes alone.
struct Db {
  sqlite3* db = nullptr;
  Db(const std::filesystem::path& path, bool writable) {
    int flags = writable ? SQLITE_OPEN_READWRITE : SQLITE_OPEN_READONLY;
    if (sqlite3_open_v2(path.c_str(), &db, flags, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << "cannot open " << path << ": " << sqlite3_errmsg(db);
      sqlite3_close(db);
      db = nullptr;
    } else {
      sqlite3_busy_timeout(db, 5000);
    }
  }
  ~Db() { sqlite3_close(db); }
};

std::string column_text(sqlite3_stmt* s, int col) {
  const auto* p = sqlite3_column_text(s, col);
  return p ? reinterpret_cast<const char*>(p) : "";
}

}  // namespace

std::vector<nlohmann::json> CoordinatorHarness::stored_events(const std::string& tenant) const {
  std::vector<nlohmann::json> out;
  Db d(state_ / "store" / "factory.db", false);
  if (!d.db) return out;
  sqlite3_stmt* s = nullptr;
  sqlite3_prepare_v2(d.db,
                     "SELECT agent_id, event_id, received_at, body FROM events WHERE tenant = ?1 "
                     "ORDER BY seq",
                     -1, &s, nullptr);
  sqlite3_bind_text(s, 1, tenant.c_str(), -1, SQLITE_TRANSIENT);
  while (sqlite3_step(s) == SQLITE_ROW) {
    out.push_back({{"agent_id", column_text(s, 0)},
                   {"id", static_cast<uint64_t>(sqlite3_column_int64(s, 1))},
                   {"received_at", column_text(s, 2)},
                   {"event", nlohmann::json::parse(column_text(s, 3), nullptr, false)}});
  }
  sqlite3_finalize(s);
  return out;
}

std::string CoordinatorHarness::metrics() {
  auto ca = read_file(state_ / "ca.crt");
  EXPECT_TRUE(ca) << "no CA yet";
  if (!ca) return "";
  net::TlsClientOptions tls;
  tls.ca_pem = *ca;
  net::HttpClient client(tls);
  net::HttpRequest req;
  req.url = "https://127.0.0.1:" + std::to_string(api_port_) + "/metrics";
  // /metrics takes the admin token unless api.metrics_public opens it.
  req.headers["Authorization"] = "Bearer " + admin_token();
  auto r = client.request(req);
  EXPECT_TRUE(r) << r.error().message;
  if (!r) return "";
  EXPECT_EQ(r->status, 200);
  return r->body;
}

std::map<std::string, nlohmann::json> CoordinatorHarness::stored_health() const {
  std::map<std::string, nlohmann::json> out;
  Db d(state_ / "store" / "factory.db", false);
  if (!d.db) return out;
  sqlite3_stmt* s = nullptr;
  sqlite3_prepare_v2(d.db, "SELECT tenant, sample FROM health", -1, &s, nullptr);
  while (sqlite3_step(s) == SQLITE_ROW)
    out[column_text(s, 0)] = nlohmann::json::parse(column_text(s, 1), nullptr, false);
  sqlite3_finalize(s);
  return out;
}

std::optional<nlohmann::json> CoordinatorHarness::stored_record(const std::string& tenant) const {
  Db d(state_ / "store" / "factory.db", false);
  if (!d.db) return std::nullopt;
  sqlite3_stmt* s = nullptr;
  sqlite3_prepare_v2(d.db, "SELECT record FROM tenants WHERE name = ?1", -1, &s, nullptr);
  sqlite3_bind_text(s, 1, tenant.c_str(), -1, SQLITE_TRANSIENT);
  std::optional<nlohmann::json> out;
  if (sqlite3_step(s) == SQLITE_ROW) out = nlohmann::json::parse(column_text(s, 0), nullptr, false);
  sqlite3_finalize(s);
  return out;
}

void CoordinatorHarness::write_stored_record(const nlohmann::json& record) {
  Db d(state_ / "store" / "factory.db", true);
  if (!d.db) return;
  sqlite3_stmt* s = nullptr;
  sqlite3_prepare_v2(d.db, "UPDATE tenants SET record = ?2 WHERE name = ?1", -1, &s, nullptr);
  const std::string name = record.value("name", "");
  const std::string text = record.dump();
  sqlite3_bind_text(s, 1, name.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 2, text.c_str(), -1, SQLITE_TRANSIENT);
  EXPECT_EQ(sqlite3_step(s), SQLITE_DONE) << sqlite3_errmsg(d.db);
  EXPECT_EQ(sqlite3_changes(d.db), 1) << "no stored record of tenant " << name;
  sqlite3_finalize(s);
}

void CoordinatorHarness::exec_sql(const std::string& sql) {
  Db d(state_ / "store" / "factory.db", true);
  if (!d.db) return;
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(d.db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK)
      << (err ? err : "") << "\n"
      << sql;
  sqlite3_free(err);
}

AgentProcess::AgentProcess(CoordinatorHarness& h, const nlohmann::json& token, AgentOptions o) {
  state_ = h.dir() / o.state_dir_name;
  token_file_ = h.dir() / (o.state_dir_name + ".token");
  log_ = h.dir() / (o.state_dir_name + ".log");
  EXPECT_TRUE(write_file_atomic(token_file_, token.value("token", "") + "\n", 0600).ok());
  std::string pin = token.value("ca_sha256", "");
  if (o.pin_wrong_ca) pin = std::string(64, 'a');
  argv_ = {agent_bin(),
           "--coordinator-url",
           token.value("coordinator_url", ""),
           "--ca-sha256",
           pin,
           "--token-file",
           token_file_.string(),
           "--state-dir",
           state_.string(),
           "--log-level",
           "debug",
           "--heartbeat",
           "1"};
  fs::path root = o.root;
  std::string path = o.path_env;
  if (root.empty()) {
    root = h.dir() / (o.state_dir_name + ".root");
    path = (h.dir() / (o.state_dir_name + ".path")).string();
    fs::create_directories(root);
    fs::create_directories(path);
  }
  argv_.push_back("--root");
  argv_.push_back(root.string());
  argv_.insert(argv_.end(), o.extra_args.begin(), o.extra_args.end());
  env_ = std::move(o.env);
  // A PATH the caller put in env wins (a guest simulator's).
  if (!path.empty() && !env_.count("PATH")) env_["PATH"] = path;
  restart();
}

void AgentProcess::restart() {
  if (starts_++ > 0) {
    std::ofstream f(log_, std::ios::app);
    f << "---- restart " << starts_ << " ----\n";
  }
  proc_ = Process(argv_, log_, env_);
}

std::string AgentProcess::log() const {
  return slurp(log_);
}

CommandResult wscat(const std::string& url, const fs::path& ca_file,
                    const std::vector<std::string>& frames, double wait_seconds,
                    const std::string& cert_file, const std::string& key_file) {
  CommandSpec spec;
  spec.argv = {"node", (source_dir() / "tests/support/ws_peer.js").string(), url, ca_file.string()};
  if (!cert_file.empty()) spec.argv.insert(spec.argv.end(), {cert_file, key_file});
  spec.argv.push_back("--");
  spec.argv.push_back(std::to_string(wait_seconds));
  spec.argv.insert(spec.argv.end(), frames.begin(), frames.end());
  spec.timeout = std::chrono::seconds(30);
  // The machine's node may not search Debian's module directory by itself.
  spec.env["NODE_PATH"] = "/usr/share/nodejs";
  auto r = run_command(spec);
  if (!r) {
    ADD_FAILURE() << "wscat could not run: " << r.error().message;
    return {};
  }
  return *r;
}

}  // namespace factory::testing
