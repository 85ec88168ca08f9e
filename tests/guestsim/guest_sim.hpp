#pragma once
// C++ handle on a simulated guest (tests/guestsim/guestsim.sh) for tests:
// creates it under a directory, gives the GuestEnv and PATH the agent runs
// with there, sets failure knobs, reads the stand-ins' counters, reboots it,
// and stops its services when it goes away. Header-only because tests/
// builds only *_test.cpp files and its support library.
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
    std::string profile = "l4";  // l4 | l4-k8s | h200 | l4-gpu-operator | none
    int ollama_port = 0;         // 0: a free loopback port
  };

  explicit GuestSim(std::filesystem::path dir) : GuestSim(std::move(dir), Options{}) {}
  GuestSim(std::filesystem::path dir, Options o)
      : root_(std::move(dir) / "guest"), opt_(std::move(o)) {
    if (opt_.ollama_port == 0) opt_.ollama_port = free_loopback_port();
    state_dir_ = root_.parent_path() / "agent-state";
    std::filesystem::create_directories(state_dir_);
    auto r = factory::testing::run({script(), "create", root_.string(), "--profile", opt_.profile,
                                    "--ollama-port", std::to_string(opt_.ollama_port), "--fixtures",
                                    fixtures_dir().string()});
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
  ~GuestSim() { stop(); }
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

  // The PATH the agent has in this guest: the stand-ins first.
  std::string path() const {
    return (root_ / ".guestsim/bin").string() + ":" + (root_ / ".guestsim/installed-bin").string() +
           ":/usr/bin:/bin";
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
  std::string ollama_log() const { return slurp(root_ / ".guestsim/log/ollama.log"); }

  void stop() const { factory::testing::run({script(), "stop", root_.string()}); }

 private:
  std::filesystem::path root_;
  std::filesystem::path state_dir_;
  Options opt_;
};

}  // namespace factory::testing
