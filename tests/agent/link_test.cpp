// The agent link's exit status when it cannot begin with what is on disk
// (agent/link/link.hpp, startup_exit_status): 3 tells systemd "refused, do
// not restart me" (RestartPreventExitStatus=3), so it must mean that and
// nothing else. The files are real, read by the real read_file and
// load_identity; running out of descriptors is real too
// (tests/support/test_support.hpp, OutOfDescriptors).
#include "agent/link/link.hpp"

#include <gtest/gtest.h>

#include "agent/link/identity.hpp"
#include "common/atomic_file.hpp"
#include "tests/support/test_support.hpp"

namespace factory::agent {
namespace {

using factory::testing::OutOfDescriptors;
using factory::testing::TempDir;

// Issue 23: an agent not yet enrolled, out of descriptors, said "not
// enrolled ... read token: Too many open files" and exited 3, which systemd
// reads as "never restart me". A failed read is an error a restart may cure.
TEST(LinkStartup, ATokenUnreadableForWantOfDescriptorsIsExit1NotTheRefusalsExit3) {
  TempDir dir("link");
  ASSERT_TRUE(write_file_atomic(dir / "bootstrap-token", "a-token\n", 0600).ok());
  Result<std::string> token = Error(Errc::internal, "not read");
  {
    OutOfDescriptors full;
    token = read_file(dir / "bootstrap-token");
  }
  ASSERT_FALSE(token.ok()) << "the token was read with no descriptor left";
  EXPECT_NE(token.error().message.find("Too many open files"), std::string::npos)
      << token.error().message;
  EXPECT_EQ(startup_exit_status(token.error()), 1);

  // The identity, likewise.
  Result<std::optional<AgentIdentity>> identity = std::optional<AgentIdentity>{};
  ASSERT_TRUE(write_file_atomic(dir / kIdentityFile, "{}", 0600).ok());
  {
    OutOfDescriptors full;
    identity = load_identity(dir.path());
  }
  ASSERT_FALSE(identity.ok());
  EXPECT_EQ(startup_exit_status(identity.error()), 1) << identity.error().message;
}

// What does need an admin keeps 3: no bootstrap token at all, an identity
// file that is not one.
TEST(LinkStartup, NoTokenOrABrokenIdentityStillNeedsTheAdmin) {
  TempDir dir("link");
  auto missing = read_file(dir / "bootstrap-token");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(startup_exit_status(missing.error()), kExitNeedsAdmin);

  ASSERT_TRUE(write_file_atomic(dir / kIdentityFile, "not json", 0600).ok());
  auto corrupt = load_identity(dir.path());
  ASSERT_FALSE(corrupt.ok());
  EXPECT_EQ(startup_exit_status(corrupt.error()), kExitNeedsAdmin) << corrupt.error().message;

  ASSERT_TRUE(write_file_atomic(dir / kIdentityFile, R"({"tenant":"t1"})", 0600).ok());
  auto incomplete = load_identity(dir.path());
  ASSERT_FALSE(incomplete.ok());
  EXPECT_EQ(startup_exit_status(incomplete.error()), kExitNeedsAdmin) << incomplete.error().message;
}

}  // namespace
}  // namespace factory::agent
