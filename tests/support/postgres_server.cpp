#include "tests/support/postgres_server.hpp"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/subprocess.hpp"
#include "tests/support/test_support.hpp"

namespace factory::testing {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr const char* kSuperuser = "factory";

// The newest /usr/lib/postgresql/<version>/bin holding a server; empty when
// there is none.
fs::path find_bindir() {
  fs::path best;
  int best_version = -1;
  std::error_code ec;
  for (auto& e : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    int v = std::atoi(e.path().filename().c_str());
    if (v > best_version && fs::exists(e.path() / "bin" / "postgres") &&
        fs::exists(e.path() / "bin" / "initdb") && fs::exists(e.path() / "bin" / "psql")) {
      best = e.path() / "bin";
      best_version = v;
    }
  }
  return best;
}

// Who the server runs as: this process, or `nobody` when it is root.
struct RunAs {
  bool drop = false;
  uid_t uid = 0;
  gid_t gid = 0;
};

RunAs run_as() {
  RunAs r;
  if (::geteuid() != 0) return r;
  const passwd* pw = ::getpwnam("nobody");
  if (!pw) setup_failed("postgres: running as root and there is no user 'nobody' to run it as");
  r.drop = true;
  r.uid = pw->pw_uid;
  r.gid = pw->pw_gid;
  return r;
}

}  // namespace

PostgresServer& PostgresServer::instance() {
  static PostgresServer server;
  return server;
}

PostgresServer::PostgresServer() {
  bindir_ = find_bindir();
  if (bindir_.empty())
    setup_failed(
        "postgres: no PostgreSQL server under /usr/lib/postgresql/*/bin (initdb, postgres, "
        "psql): run `make test-deps` (Debian's postgresql package)");
  char tmpl[] = "/tmp/factory-pg-XXXXXX";
  if (!::mkdtemp(tmpl)) setup_failed("postgres: cannot make a directory under /tmp");
  root_ = tmpl;
  try {
    init_cluster();
    for (int attempt = 0; attempt < 3; ++attempt)
      if (start_once()) return;
    setup_failed("postgres: the server did not start; its log:\n" + slurp(root_ / "server.log"));
  } catch (const SetupFailed&) {
    // No destructor runs for a constructor that threw: the directory goes here.
    stop();
    throw;
  }
}

PostgresServer::~PostgresServer() {
  stop();
}

void PostgresServer::init_cluster() {
  RunAs who = run_as();
  if (who.drop && ::chown(root_.c_str(), who.uid, who.gid) != 0)
    setup_failed("postgres: cannot give " + root_.string() + " to nobody");
  CommandSpec spec;
  if (who.drop)
    spec.argv = {"setpriv", "--reuid=" + std::to_string(who.uid),
                 "--regid=" + std::to_string(who.gid), "--clear-groups"};
  for (const std::string& a :
       {(bindir_ / "initdb").string(), std::string("-D"), (root_ / "data").string(),
        std::string("-U"), std::string(kSuperuser), std::string("--auth=trust"),
        std::string("--encoding=UTF8"), std::string("--locale=C"), std::string("--no-sync"),
        std::string("--no-instructions")})
    spec.argv.push_back(a);
  spec.env = {{"LC_ALL", "C"}};
  spec.timeout = 120s;
  auto r = run_command(spec);
  if (!r) setup_failed("postgres: initdb: " + r.error().message);
  if (!r->ok()) setup_failed("postgres: initdb " + r->describe() + ":\n" + r->tail(30));
}

// One try on a port that was free a moment ago: false when the server
// exited (the port was taken meanwhile) or never answered.
bool PostgresServer::start_once() {
  RunAs who = run_as();
  port_ = free_loopback_port();
  const std::string log = (root_ / "server.log").string();
  int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) setup_failed("postgres: cannot open " + log);
  const std::string postgres = (bindir_ / "postgres").string(), data = (root_ / "data").string(),
                    sockets = root_.string(), port = std::to_string(port_);
  std::vector<std::string> args = {
      postgres, "-D", data, "-k", sockets, "-p", port, "-c", "listen_addresses=127.0.0.1",
      // A test server: nothing to keep after a crash.
      "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=200",
      // Dynamic shared memory in the data directory, not /dev/shm: a server
      // killed with its test leaves its /dev/shm segments behind, and a
      // later server whose random name meets one it may not open stops with
      // "could not open shared memory segment: Permission denied" (seen in
      // scripts/fresh-machine-check.sh's chroot).
      "-c", "dynamic_shared_memory_type=mmap"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) setup_failed("postgres: fork failed");
  if (pid == 0) {
    // Its own process group, so that the backends go with it; only
    // async-signal-safe calls from here to exec.
    ::setpgid(0, 0);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    if (who.drop &&
        (::setgroups(0, nullptr) != 0 || ::setgid(who.gid) != 0 || ::setuid(who.uid) != 0))
      ::_exit(126);
    // After the uid change, which would clear it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(125);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(log_fd);
  pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    CommandSpec ready;
    ready.argv = {(bindir_ / "pg_isready").string(), "-q", "-h", "127.0.0.1", "-p", port};
    ready.timeout = 5s;
    if (auto r = run_command(ready); r && r->ok()) return true;
    std::this_thread::sleep_for(50ms);
  }
  stop();
  return false;
}

void PostgresServer::stop() {
  if (pid_ > 0) {
    // A fast shutdown (SIGINT) ends the backends too; whatever is left
    // after it is killed, the whole group.
    ::kill(pid_, SIGINT);
    int status = 0;
    bool gone = false;
    for (int i = 0; i < 200 && !gone; ++i) {
      gone = ::waitpid(pid_, &status, WNOHANG) == pid_;
      if (!gone) std::this_thread::sleep_for(50ms);
    }
    if (!gone) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
    }
    pid_ = -1;
  }
  std::error_code ec;
  if (!root_.empty() && !std::getenv("FACTORY_KEEP_TEST_DIRS")) fs::remove_all(root_, ec);
}

std::string PostgresServer::conninfo(const std::string& dbname) const {
  return "host=127.0.0.1 port=" + std::to_string(port_) + " user=" + kSuperuser +
         " dbname=" + dbname;
}

std::string PostgresServer::create_database() {
  std::string name = "test_" + std::to_string(++databases_);
  sql("postgres", "CREATE DATABASE " + name);
  return conninfo(name);
}

std::string PostgresServer::sql(const std::string& dbname, const std::string& query) const {
  CommandSpec spec;
  spec.argv = {(bindir_ / "psql").string(),
               "-X",
               "-q",
               "-At",
               "-v",
               "ON_ERROR_STOP=1",
               "-h",
               "127.0.0.1",
               "-p",
               std::to_string(port_),
               "-U",
               kSuperuser,
               "-d",
               dbname,
               "-c",
               query};
  spec.timeout = 60s;
  auto r = run_command(spec);
  if (!r) setup_failed("postgres: psql: " + r.error().message);
  if (!r->ok()) setup_failed("postgres: psql '" + query + "' " + r->describe() + ": " + r->tail());
  std::string out = r->output;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace factory::testing
