#include "tests/support/test_support.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

extern char** environ;

namespace factory::testing {
namespace fs = std::filesystem;

fs::path source_dir() {
  return FACTORY_SOURCE_DIR;
}
fs::path fixtures_dir() {
  if (const char* s = ::getenv("FACTORY_FIXTURES_DIR")) return s;
  return FACTORY_FIXTURES_DIR;
}
std::string factory_bin() {
  return FACTORY_BIN;
}
std::string agent_bin() {
  return FACTORY_AGENT_BIN;
}

void setup_failed(const std::string& what) {
  throw SetupFailed(what);
}

TempDir::TempDir(const std::string& prefix) {
  fs::path base = fs::path(FACTORY_BINARY_DIR) / "test-tmp";
  fs::create_directories(base);
  std::mt19937_64 rng{std::random_device{}()};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = prefix;
  if (info) name += std::string("-") + info->name();
  for (auto& c : name)
    if (!isalnum(static_cast<unsigned char>(c)) && c != '-') c = '_';
  path_ = base / (name + "-" + std::to_string(rng() % 1000000));
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  if (::getenv("FACTORY_KEEP_TEST_DIRS")) return;
  std::error_code ec;
  fs::remove_all(path_, ec);
}

int free_loopback_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

CommandResult run(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                  const std::map<std::string, std::string>& env) {
  CommandSpec spec;
  spec.argv = argv;
  spec.timeout = timeout;
  spec.env = env;
  auto r = run_command(spec);
  if (!r) {
    ADD_FAILURE() << "could not run " << argv[0] << ": " << r.error().message;
    return {};
  }
  return *r;
}

std::set<std::string> needed_libraries(const std::string& binary) {
  auto r = run({"readelf", "--dynamic", "--wide", binary});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::set<std::string> libs;
  std::istringstream in(r.output);
  std::string line;
  while (std::getline(in, line)) {
    auto a = line.find("(NEEDED)");
    if (a == std::string::npos) continue;
    auto l = line.find('[', a), rb = line.find(']', a);
    libs.insert(line.substr(l + 1, rb - l - 1));
  }
  return libs;
}

std::string promtool_complaints(const std::string& metrics) {
  CommandSpec check;
  check.argv = {"promtool", "check", "metrics"};
  check.stdin_data = metrics;
  auto r = run_command(check);
  if (!r) return "promtool (Debian's prometheus package) is needed: " + r.error().message;
  if (r->exit_code == 0) return "";
  // Exit 3 is lint only (1 would be an exposition it cannot parse).
  std::string rest;
  std::istringstream in(r->output);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    // The lints promtool also raises on dcgm-exporter's own output, from
    // the names and types Factory keeps so its dashboards and rules work:
    // the camelCase `modelName` label, its counters without `_total`
    // (DCGM_FI_DEV_PCIE_REPLAY_COUNTER, ..._TOTAL_ENERGY_CONSUMPTION), and
    // the word COUNTER in DCGM_FI_DEV_PCIE_REPLAY_COUNTER.
    bool dcgm_lint = false;
    if (r->exit_code == 3 && line.rfind("DCGM_FI_DEV_", 0) == 0)
      for (const char* lint : {"label names should be written in 'snake_case' not 'camelCase'",
                               "counter metrics should have \"_total\" suffix",
                               "metric name should not include type 'counter'"})
        dcgm_lint |= line.find(lint) != std::string::npos;
    if (!dcgm_lint) rest += line + "\n";
  }
  if (rest.empty() && r->exit_code != 3) rest = "promtool " + r->describe() + "\n";
  return rest;
}

bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout,
                std::chrono::milliseconds every) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(every);
  }
  return pred();
}

OutOfDescriptors::OutOfDescriptors() {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  saved_soft_ = rl.rlim_cur;
  rl.rlim_cur = std::min<rlim_t>(rl.rlim_cur, 64);
  ::setrlimit(RLIMIT_NOFILE, &rl);
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fillers_.push_back(fd);
}

OutOfDescriptors::~OutOfDescriptors() {
  for (int fd : fillers_) ::close(fd);
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = static_cast<rlim_t>(saved_soft_);
  ::setrlimit(RLIMIT_NOFILE, &rl);
}

Process::Process(const std::vector<std::string>& argv, const fs::path& log_file,
                 const std::map<std::string, std::string>& env)
    : log_(log_file) {
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos && env.count(kv.substr(0, eq))) continue;
    envs.push_back(kv);
  }
  for (auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> a = argv;
  for (auto& s : a) args.push_back(s.data());
  args.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ == 0) {
    ::setpgid(0, 0);
    int fd = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, 0);
    ::execve(a[0].c_str(), args.data(), envp.data());
    _exit(127);
  }
}

Process::~Process() {
  stop();
}

Process::Process(Process&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)), status_(o.status_), reaped_(o.reaped_), log_(o.log_) {}

Process& Process::operator=(Process&& o) noexcept {
  if (this != &o) {
    stop();
    pid_ = std::exchange(o.pid_, -1);
    status_ = o.status_;
    reaped_ = o.reaped_;
    log_ = o.log_;
  }
  return *this;
}

bool Process::running() {
  if (pid_ <= 0 || reaped_) return false;
  int st;
  pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return false;
  }
  return true;
}

void Process::kill(int sig) {
  if (pid_ > 0 && !reaped_) ::kill(pid_, sig);
}

int Process::wait() {
  if (pid_ <= 0) return -1;
  if (!reaped_) {
    int st;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  return status_;
}

void Process::stop() {
  if (pid_ <= 0 || reaped_) return;
  ::kill(pid_, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (running() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (running()) {
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
  }
  wait();
}

std::string Process::log() const {
  return slurp(log_);
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace factory::testing
