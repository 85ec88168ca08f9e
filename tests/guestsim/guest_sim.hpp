#pragma once
// C++ handle on a simulated guest (tests/guestsim/guestsim.sh) for tests:
// creates it under a directory, gives the GuestEnv and PATH the agent runs
// with there, sets failure knobs, reads the stand-ins' counters, reboots it,
// and stops its services when it goes away. Header-only because tests/
// builds only *_test.cpp files and its support library.
//
// A guest that cannot be created ends the test at once (SetupFailed, with
// guestsim.sh's message): its PATH would hold no stand-ins. That PATH holds
// nothing of this machine's but the listed harmless tools, and ends in guards
// for the commands that would act on it (reboot, systemctl, apt-get, ...);
// a guard that was hit fails the test when the GuestSim goes away.
//
// THIS IS A SIMULATION: see tests/guestsim/README.md for what it models.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "agent/guest/env.hpp"
#include "common/subprocess.hpp"
#include "tests/support/test_support.hpp"

namespace factory::testing {

class GuestSim {
 public:
  struct Options {
    std::string profile = "l4";           // l4 | l4-k8s | h200 | l4-gpu-operator | none
    int ollama_port = 0;                  // 0: a free loopback port
    std::filesystem::path fixtures = {};  // the real captures; empty: fixtures_dir()
  };

  explicit GuestSim(std::filesystem::path dir) : GuestSim(std::move(dir), Options{}) {}
  GuestSim(std::filesystem::path dir, Options o)
      : root_(std::move(dir) / "guest"), opt_(std::move(o)) {
    if (opt_.ollama_port == 0) opt_.ollama_port = free_loopback_port();
    state_dir_ = root_.parent_path() / "agent-state";
    std::filesystem::create_directories(state_dir_);
    const auto fixtures = opt_.fixtures.empty() ? fixtures_dir() : opt_.fixtures;
    auto r = factory::testing::run({script(), "create", root_.string(), "--profile", opt_.profile,
                                    "--ollama-port", std::to_string(opt_.ollama_port), "--fixtures",
                                    fixtures.string()});
    if (r.exit_code != 0)
      setup_failed("the guest simulator could not create a '" + opt_.profile + "' guest at " +
                   root_.string() + " (" + r.describe() + "): " + r.output);
  }
  ~GuestSim() {
    stop();
    const std::string calls = guarded();
    if (!calls.empty())
      ADD_FAILURE() << "commands reached the guard at the end of the simulated guest's PATH "
                       "(no stand-in answers them, and this machine's own must never run):\n"
                    << calls;
  }
  GuestSim(const GuestSim&) = delete;
  GuestSim& operator=(const GuestSim&) = delete;

  static std::string script() { return (source_dir() / "tests/guestsim/guestsim.sh").string(); }

  const std::filesystem::path& root() const { return root_; }
  int ollama_port() const { return opt_.ollama_port; }
  std::string ollama_url() const { return "http://127.0.0.1:" + std::to_string(opt_.ollama_port); }

  agent::GuestEnv env() const {
    agent::GuestEnv e;
    e.root = root_;
    e.ollama_url = ollama_url();
    e.state_dir = state_dir_;
    return e;
  }

  // The PATH the agent has in this guest (as `guestsim.sh path` prints it):
  // the stand-ins, what the guest installed, the listed host tools, the guards.
  // Every directory on it lies under the guest's root.
  std::string path() const {
    const auto g = root_ / ".guestsim";
    return (g / "bin").string() + ":" + (g / "installed-bin").string() + ":" +
           (g / "host-bin").string() + ":" + (g / "guard").string();
  }

  // Puts the guest's PATH into this process's environment while it lives:
  // steps run commands through PATH, as the agent does in a real guest.
  class PathScope {
   public:
    explicit PathScope(const std::string& path) {
      const char* old = ::getenv("PATH");
      old_ = old ? old : "";
      ::setenv("PATH", path.c_str(), 1);
    }
    ~PathScope() { ::setenv("PATH", old_.c_str(), 1); }
    PathScope(const PathScope&) = delete;
    PathScope& operator=(const PathScope&) = delete;

   private:
    std::string old_;
  };
  PathScope activate() const { return PathScope(path()); }

  void set_knob(const std::string& name, const std::string& value = "1") const {
    std::ofstream(root_ / ".guestsim/knobs" / name) << value;
  }
  void clear_knob(const std::string& name) const {
    std::filesystem::remove(root_ / ".guestsim/knobs" / name);
  }

  // A stand-in's counter (0 when it never ran).
  long counter(const std::string& name) const {
    std::ifstream in(root_ / ".guestsim/state/counters" / name);
    long n = 0;
    in >> n;
    return n;
  }
  std::string counters() const {
    return factory::testing::run({script(), "counters", root_.string()}).output;
  }

  // Runs a command in the guest (its PATH) and returns the result. The
  // guest's PATH is this process's PATH while it runs: run_command looks
  // argv[0] up in the caller's PATH, and a host command must never stand in
  // for a guest's (this machine's real apt-get or reboot!).
  CommandResult sh(const std::vector<std::string>& argv,
                   std::map<std::string, std::string> env = {}) const {
    env["PATH"] = path();
    PathScope scope(path());
    return factory::testing::run(argv, std::chrono::seconds(60), env);
  }

  // The simulated reboot, without ending this process (the test is driving
  // the steps itself, so it plays the agent that starts again after boot).
  CommandResult reboot() const {
    return sh({(root_ / ".guestsim/bin/reboot").string()},
              {{"FACTORY_GUESTSIM_REBOOT_KILL", "none"}});
  }

  std::string calls_log() const { return slurp(root_ / ".guestsim/log/calls.log"); }
  // The calls that hit a guard (one line each: the name, then its arguments).
  std::string guarded() const { return slurp(root_ / ".guestsim/log/guarded.log"); }
  // For a test that hits a guard on purpose: takes the record, so teardown
  // checks only what came after.
  std::string take_guarded() const {
    std::string calls = guarded();
    std::ofstream(root_ / ".guestsim/log/guarded.log", std::ios::trunc);
    return calls;
  }
  std::string ollama_log() const { return slurp(root_ / ".guestsim/log/ollama.log"); }
  // What `wall` broadcast to the guest's users: each line of each message,
  // prefixed with the time of its call (seconds since the epoch, with nanoseconds).
  std::string wall_log() const { return slurp(root_ / ".guestsim/log/wall.log"); }

  void stop() const { factory::testing::run({script(), "stop", root_.string()}); }

 private:
  std::filesystem::path root_;
  std::filesystem::path state_dir_;
  Options opt_;
};

}  // namespace factory::testing
