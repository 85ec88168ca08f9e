// `factory serve` refuses, creating nothing, when it cannot be the one
// coordinator of its state directory: another serve holds the state's lock
// (named by its pid), or a listener's address cannot be bound.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include "tests/support/coordinator_harness.hpp"

using namespace factory::testing;
namespace fs = std::filesystem;

namespace {

// A loopback port this test listens on, so no one else can.
class TakenPort {
 public:
  TakenPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(fd_, 1) != 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      setup_failed("cannot listen on a loopback port");
    port_ = ntohs(a.sin_port);
  }
  ~TakenPort() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1, port_ = 0;
};

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

factory::CommandResult serve(const fs::path& config) {
  // A serve that is refused exits at once; one that is not would run until
  // the deadline, which the test then reports.
  return run({factory_bin(), "--config", config.string(), "serve"}, std::chrono::seconds(20));
}

}  // namespace

TEST(ServeGuard, SecondServeOnTheSameStateRefusesNamingTheHoldersPid) {
  TempDir dir("serve-lock");
  CoordinatorHarness h(dir.path());
  h.start();
  const std::string pid = "pid " + std::to_string(h.pid());

  // The same config: the lock is found before the ports, and named.
  auto same = serve(h.config_path());
  EXPECT_EQ(same.exit_code, 1) << same.describe() << ": " << same.output;
  EXPECT_NE(same.output.find("another `factory serve` (" + pid + ") is using state_dir " +
                             h.state_dir().string()),
            std::string::npos)
      << same.output;
  EXPECT_NE(same.output.find((h.state_dir() / "serve.lock").string()), std::string::npos)
      << same.output;

  // Other free ports, the same state: still refused, by the lock alone.
  const fs::path other = dir / "other.yaml";
  write(other, "state_dir: " + h.state_dir().string() +
                   "\nagents:\n  listen: 127.0.0.1:" + std::to_string(free_loopback_port()) +
                   "\napi:\n  listen: 127.0.0.1:" + std::to_string(free_loopback_port()) + "\n");
  auto moved = serve(other);
  EXPECT_EQ(moved.exit_code, 1) << moved.describe() << ": " << moved.output;
  EXPECT_NE(moved.output.find(pid), std::string::npos) << moved.output;
  EXPECT_TRUE(h.running()) << "the first coordinator must be untouched";
  EXPECT_TRUE(h.status().contains("tenants"));

  // A crash leaves no stale lock: the kernel lets go with the process.
  h.kill9();
  h.start();
  EXPECT_TRUE(h.status().contains("tenants"));
}

TEST(ServeGuard, ListenerThatCannotBindCreatesNothing) {
  TempDir dir("serve-bind");
  TakenPort taken;
  const std::string busy = "127.0.0.1:" + std::to_string(taken.port());
  for (const char* which : {"agents", "api"}) {
    const fs::path state = dir / (std::string(which) + "-state");
    const std::string free = "127.0.0.1:" + std::to_string(free_loopback_port());
    const bool agents = std::string(which) == "agents";
    const fs::path cfg = dir / (std::string(which) + ".yaml");
    write(cfg, "state_dir: " + state.string() + "\nagents:\n  listen: " + (agents ? busy : free) +
                   "\napi:\n  listen: " + (agents ? free : busy) + "\n");
    auto r = serve(cfg);
    EXPECT_EQ(r.exit_code, 1) << r.describe() << ": " << r.output;
    EXPECT_NE(r.output.find("cannot listen on " + busy + " (" + which + ".listen)"),
              std::string::npos)
        << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "one line: " << r.output;
    // No CA, no admin token, no database: not even the folder.
    EXPECT_FALSE(fs::exists(state)) << which << ": " << state << " was created";
  }
}
