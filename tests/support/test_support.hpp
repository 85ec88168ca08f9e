#pragma once
// Helpers every test uses: temp dirs, paths to the built binaries and the
// real captures, running a binary and capturing its output, free loopback
// ports, and starting a real `factory serve` on loopback.
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/subprocess.hpp"

namespace factory::testing {

std::filesystem::path source_dir();
// The real captures (tests/fixtures/real); $FACTORY_FIXTURES_DIR overrides it,
// which is how a test shows what a guest test does when they are missing.
std::filesystem::path fixtures_dir();
std::string factory_bin();
std::string agent_bin();

// A simulator or test double that could not set up. Going on would test
// nothing, and could reach this machine where the double should have
// answered, so it is thrown: the test ends there, wherever the double was
// made (test body, fixture SetUp, helper), and GoogleTest reports it as a
// fatal failure with this message.
struct SetupFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void setup_failed(const std::string& what);

// A directory under the build tree, removed when the object goes away
// (kept when FACTORY_KEEP_TEST_DIRS is set, for post-mortems).
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "t");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& p) const { return path_ / p; }

 private:
  std::filesystem::path path_;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_loopback_port();

// Runs a binary (no shell) and returns its result; fails the test if it cannot start.
CommandResult run(const std::vector<std::string>& argv,
                  std::chrono::milliseconds timeout = std::chrono::seconds(60),
                  const std::map<std::string, std::string>& env = {});

// The shared libraries an executable names as NEEDED (`readelf --dynamic`):
// what must be installed where it runs. Fails the test when readelf does.
std::set<std::string> needed_libraries(const std::string& binary);

// `promtool check metrics` (Debian's prometheus package) on an exposition:
// "" when it has nothing to say, else what it said. The one lint it is
// allowed is on the DCGM series' `modelName` label: dcgm-exporter's own
// name, camelCase, which promtool's style check flags on dcgm-exporter's
// output too, and which the dashboards made for it select on. Anything else
// (a parse error, another lint) is returned.
std::string promtool_complaints(const std::string& metrics);

// Polls until pred() is true or the timeout passes.
bool eventually(const std::function<bool()>& pred,
                std::chrono::milliseconds timeout = std::chrono::seconds(10),
                std::chrono::milliseconds every = std::chrono::milliseconds(20));

// While it lives, this process has no file descriptor left to open: what a
// flood of connections does to a server (issue 23). A low soft limit
// (RLIMIT_NOFILE), then every slot under it filled with /dev/null; the limit
// and the slots are given back when it goes.
class OutOfDescriptors {
 public:
  OutOfDescriptors();
  ~OutOfDescriptors();
  OutOfDescriptors(const OutOfDescriptors&) = delete;
  OutOfDescriptors& operator=(const OutOfDescriptors&) = delete;

 private:
  unsigned long long saved_soft_ = 0;
  std::vector<int> fillers_;
};

// A child process running in the background (a server, an agent), its output
// going to a log file; killed (SIGTERM, then SIGKILL) when destroyed.
class Process {
 public:
  Process() = default;
  Process(const std::vector<std::string>& argv, const std::filesystem::path& log_file,
          const std::map<std::string, std::string>& env = {});
  ~Process();
  Process(Process&& o) noexcept;
  Process& operator=(Process&& o) noexcept;
  int pid() const { return pid_; }
  bool running();
  void kill(int sig);
  int wait();   // exit status (128+sig if signalled)
  void stop();  // SIGTERM then wait, SIGKILL after 5 s
  std::string log() const;
  const std::filesystem::path& log_file() const { return log_; }

 private:
  int pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
  std::filesystem::path log_;
};

std::string slurp(const std::filesystem::path& p);

}  // namespace factory::testing
