// The agent runs on a stock Ubuntu 24.04 guest, not only where it was built:
// everything but glibc is linked in, and dlopen stays available for NVML.
#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "tests/support/test_support.hpp"

using namespace factory::testing;

namespace {
std::set<std::string> needed(const std::string& binary) {
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
}  // namespace

TEST(AgentBinary, DependsOnGlibcOnly) {
  const std::set<std::string> glibc = {"libc.so.6",       "libm.so.6",  "libdl.so.2",
                                       "libpthread.so.0", "librt.so.1", "ld-linux-x86-64.so.2"};
  auto libs = needed(agent_bin());
  ASSERT_FALSE(libs.empty()) << "a dynamic executable: glibc is not linked statically";
  for (auto& l : libs)
    EXPECT_TRUE(glibc.count(l)) << agent_bin() << " needs " << l << ", which a stock guest lacks";
  std::string all;
  for (auto& l : libs) all += l + " ";
  std::cout << "[ figures  ] factory-agent NEEDED: " << all << "\n";
}

TEST(AgentBinary, KeepsDlopenForNvml) {
  auto r = run({"nm", "-D", "--undefined-only", agent_bin()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(" dlopen"), std::string::npos)
      << "NVML is loaded at run time with dlopen";
  EXPECT_EQ(r.output.find("nvml"), std::string::npos) << "no link-time dependency on NVML";
}

TEST(AgentBinary, NeedsNoNewerGlibcThanUbuntu2404) {
  // Ubuntu 24.04 ships glibc 2.39; anything up to it is fine.
  auto r = run({"objdump", "-T", agent_bin()});
  ASSERT_EQ(r.exit_code, 0);
  std::istringstream in(r.output);
  std::string tok;
  int worst_minor = 0;
  while (in >> tok) {
    auto at = tok.find("GLIBC_2.");  // objdump prints "(GLIBC_2.34)" or "GLIBC_2.34"
    if (at == std::string::npos) continue;
    int minor = std::atoi(tok.c_str() + at + 8);
    worst_minor = std::max(worst_minor, minor);
  }
  EXPECT_GT(worst_minor, 0);
  EXPECT_LE(worst_minor, 39) << "needs GLIBC_2." << worst_minor;
}

TEST(AgentBinary, RunsAndPrintsItsVersion) {
  auto r = run({agent_bin(), "--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find(FACTORY_VERSION), std::string::npos);
  r = run({agent_bin(), "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("--coordinator-url"), std::string::npos);
  r = run({agent_bin(), "--coordinator-url", "wss://127.0.0.1:1", "--token-file", "/nonexistent"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("pin the coordinator's CA"), std::string::npos) << r.output;
}
