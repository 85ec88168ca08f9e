// Not a test of its own (CTest does not run it): a guest test as any other,
// run by tests/agent/guestsim_test.cpp as a child process with
// FACTORY_FIXTURES_DIR pointing at a folder that does not exist, to show that
// a guest test whose simulator cannot be made fails at once and runs nothing
// after it. FACTORY_PROBE_MARK names a file the body writes before each
// command it would run; it must never be written.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "tests/guestsim/guest_sim.hpp"

namespace factory::testing {
namespace {

void mark(const std::string& what) {
  if (const char* m = std::getenv("FACTORY_PROBE_MARK"))
    std::ofstream(m, std::ios::app) << what << "\n";
}

TEST(Probe, RebootsTheGuest) {
  TempDir dir("probe");
  GuestSim sim(dir.path(), {"h200", 0});
  mark("systemctl reboot");
  sim.sh({"sh", "-c", "systemctl reboot"}, {{"FACTORY_GUESTSIM_REBOOT_KILL", "none"}});
  mark("apt-get install");
  sim.sh({"apt-get", "install", "-y", "nvidia-headless-open"});
  EXPECT_EQ(sim.counter("reboot"), 1);
}

}  // namespace
}  // namespace factory::testing
