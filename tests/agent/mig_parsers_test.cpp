// The MIG parsers (agent/guest/mig.hpp) on the real H200's capture
// (h200-passthrough-vm/2026-12-01/nvidia-smi-mig-lgip-and-lgi.txt: the
// profiles it offers with MIG disabled) and, where no capture exists because
// the real card's MIG mode must not be changed, on the layouts NVIDIA's MIG
// user guide documents (-lgi, -lci, -L with MIG devices, -cgi -C, -mig).
#include <gtest/gtest.h>

#include "agent/guest/mig.hpp"
#include "tests/support/test_support.hpp"

namespace factory::agent {
namespace {

using factory::testing::fixtures_dir;
using factory::testing::slurp;

std::string real_lgip() {
  return slurp(fixtures_dir() / "h200-passthrough-vm/2026-12-01/nvidia-smi-mig-lgip-and-lgi.txt");
}

TEST(MigProfiles, TheRealH200OffersSevenProfilesWithTheirIds) {
  auto p = parse_mig_profiles(real_lgip());
  ASSERT_TRUE(p) << p.error().message;
  ASSERT_EQ(p->size(), 7u);
  std::vector<std::pair<std::string, int>> got;
  for (const auto& x : *p) got.emplace_back(x.name, x.id);
  std::vector<std::pair<std::string, int>> want = {
      {"1g.18gb", 19}, {"1g.18gb+me", 20}, {"1g.35gb", 15}, {"2g.35gb", 14},
      {"3g.71gb", 9},  {"4g.71gb", 5},     {"7g.141gb", 0}};
  EXPECT_EQ(got, want);
  const auto& small = p->front();
  EXPECT_EQ(small.gpu, 0);
  EXPECT_EQ(small.free, 7);
  EXPECT_EQ(small.total, 7);
  EXPECT_DOUBLE_EQ(small.memory_gib, 16.0);
  EXPECT_EQ(small.sm, 16);
  EXPECT_DOUBLE_EQ(p->back().memory_gib, 140.0);
  EXPECT_EQ(p->back().sm, 132);
}

TEST(MigGpuInstances, TheRealH200WithMigDisabledHasNone) {
  // The capture ends in -lgi's answer on that card.
  auto g = parse_mig_gpu_instances("No MIG-enabled devices found.\n");
  ASSERT_TRUE(g) << g.error().message;
  EXPECT_TRUE(g->empty());
}

// -lgi as the MIG user guide lays it out, with the H200's profiles.
const char* const kLgi =
    "+-------------------------------------------------------+\n"
    "| GPU instances:                                        |\n"
    "| GPU   Name             Profile  Instance   Placement  |\n"
    "|                          ID       ID       Start:Size |\n"
    "|=======================================================|\n"
    "|   0  MIG 1g.18gb         19        7          0:1     |\n"
    "+-------------------------------------------------------+\n"
    "|   0  MIG 1g.18gb         19        8          1:1     |\n"
    "+-------------------------------------------------------+\n"
    "|   0  MIG 3g.71gb          9        2          4:4     |\n"
    "+-------------------------------------------------------+\n";

TEST(MigGpuInstances, DocumentedTableGivesEachInstance) {
  auto g = parse_mig_gpu_instances(kLgi);
  ASSERT_TRUE(g) << g.error().message;
  ASSERT_EQ(g->size(), 3u);
  EXPECT_EQ((*g)[0].profile, "1g.18gb");
  EXPECT_EQ((*g)[0].profile_id, 19);
  EXPECT_EQ((*g)[0].instance_id, 7);
  EXPECT_EQ((*g)[1].placement_start, 1);
  EXPECT_EQ((*g)[2].profile, "3g.71gb");
  EXPECT_EQ((*g)[2].placement_start, 4);
  EXPECT_EQ((*g)[2].placement_size, 4);
}

TEST(MigComputeInstances, DocumentedTableGivesEachInstance) {
  const char* lci =
      "+--------------------------------------------------------------------+\n"
      "| Compute instances:                                                 |\n"
      "| GPU     GPU       Name             Profile   Instance   Placement  |\n"
      "|       Instance                       ID        ID       Start:Size |\n"
      "|         ID                                                         |\n"
      "|====================================================================|\n"
      "|   0      7       MIG 1g.18gb          0         0          0:1     |\n"
      "+--------------------------------------------------------------------+\n"
      "|   0      2       MIG 3g.71gb          2         0          0:3     |\n"
      "+--------------------------------------------------------------------+\n";
  auto c = parse_mig_compute_instances(lci);
  ASSERT_TRUE(c) << c.error().message;
  ASSERT_EQ(c->size(), 2u);
  EXPECT_EQ((*c)[0].gpu_instance_id, 7);
  EXPECT_EQ((*c)[1].profile, "3g.71gb");
  EXPECT_EQ((*c)[1].profile_id, 2);
}

TEST(MigDevices, ListWithMigDevicesGivesTheirUuidsUnderTheirGpu) {
  // The real card's -L line, with MIG devices as the user guide shows them.
  std::string list =
      "GPU 0: NVIDIA H200 (UUID: GPU-0108b095-397f-7583-e087-ade158522fa2)\n"
      "  MIG 1g.18gb     Device  0: (UUID: MIG-1f2b7c6e-1a59-5d2e-9c14-2a8e3f6b0c01)\n"
      "  MIG 1g.18gb     Device  1: (UUID: MIG-1f2b7c6e-1a59-5d2e-9c14-2a8e3f6b0c02)\n"
      "GPU 1: NVIDIA H200 (UUID: GPU-0108b095-397f-7583-e087-ade158522fa3)\n";
  auto d = parse_mig_devices(list);
  ASSERT_TRUE(d) << d.error().message;
  ASSERT_EQ(d->size(), 2u);
  EXPECT_EQ((*d)[0].gpu, 0);
  EXPECT_EQ((*d)[1].device, 1);
  EXPECT_EQ((*d)[1].uuid, "MIG-1f2b7c6e-1a59-5d2e-9c14-2a8e3f6b0c02");
  // The real capture (MIG disabled) has no MIG device.
  auto none = parse_mig_devices(slurp(fixtures_dir() / "h200-passthrough-vm/nvidia-smi.txt"));
  ASSERT_TRUE(none) << none.error().message;
  EXPECT_TRUE(none->empty());
}

TEST(MigDevices, MigLineBeforeAnyGpuIsRefused) {
  auto d = parse_mig_devices("  MIG 1g.18gb     Device  0: (UUID: MIG-abc)\n");
  EXPECT_FALSE(d);
}

TEST(MigModes, QueryLinesGiveCurrentAndPending) {
  // The real H200's answer (tests/fixtures/device/h200-2026-12-01b/mig.txt
  // asked for name and bus id too; the agent asks for the index).
  auto m = parse_mig_modes("0, Disabled, Disabled\n1, Disabled, Enabled\n2, [N/A], [N/A]\n");
  ASSERT_TRUE(m) << m.error().message;
  ASSERT_EQ(m->size(), 3u);
  EXPECT_EQ((*m)[0].current, false);
  EXPECT_EQ((*m)[1].pending, true);
  EXPECT_FALSE((*m)[2].current.has_value());
  EXPECT_FALSE(parse_mig_modes("0, Maybe, Disabled\n"));
  EXPECT_FALSE(parse_mig_modes(""));
}

TEST(MigModeChange, EnabledPendingAndRefused) {
  auto done = parse_mig_mode_change("Enabled MIG Mode for GPU 00000000:00:06.0\nAll done.\n", 0);
  EXPECT_EQ(done.change, MigModeChange::done);
  auto pending = parse_mig_mode_change(
      "Warning: MIG mode is in pending enable state for GPU 00000000:00:06.0:In use by another "
      "client\n00000000:00:06.0 is currently being used by one or more other processes (e.g. CUDA "
      "application or a monitoring application such as another instance of nvidia-smi). Please "
      "first kill all processes using the device and retry the command or reboot the system to "
      "make MIG mode effective.\nAll done.\n",
      0);
  EXPECT_EQ(pending.change, MigModeChange::pending);
  EXPECT_NE(pending.reason.find("pending enable"), std::string::npos);
  auto refused = parse_mig_mode_change(
      "Unable to enable MIG Mode for GPU 00000000:09:00.0: Not Supported\nTerminating early due to "
      "previous errors.\n",
      3);
  EXPECT_EQ(refused.change, MigModeChange::refused);
  EXPECT_NE(refused.reason.find("Not Supported"), std::string::npos);
  auto disabled =
      parse_mig_mode_change("Disabled MIG Mode for GPU 00000000:00:06.0\nAll done.\n", 0);
  EXPECT_EQ(disabled.change, MigModeChange::done);
}

TEST(MigCreate, SuccessLinesGiveTheInstancesAndFailuresTheirLine) {
  auto ok = parse_mig_create(
      "Successfully created GPU instance ID  2 on GPU  0 using profile MIG 3g.71gb (ID  9)\n"
      "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  2 using profile MIG "
      "3g.71gb (ID  2)\n"
      "Successfully created GPU instance ID  7 on GPU  0 using profile MIG 1g.18gb (ID 19)\n"
      "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  7 using profile MIG "
      "1g.18gb (ID  0)\n");
  EXPECT_EQ(ok.gpu_instances, (std::vector<int>{2, 7}));
  EXPECT_EQ(ok.compute_instances, 2);
  EXPECT_TRUE(ok.failure.empty());
  auto bad = parse_mig_create(
      "Unable to create a GPU instance on GPU  0 using profile 19: Insufficient Resources\n"
      "Failed to create GPU instances: Insufficient Resources\n");
  EXPECT_TRUE(bad.gpu_instances.empty());
  EXPECT_NE(bad.failure.find("Insufficient Resources"), std::string::npos);
}

TEST(MigProfileNames, OnlyMigsOwnShape) {
  EXPECT_TRUE(valid_mig_profile_name("1g.18gb"));
  EXPECT_TRUE(valid_mig_profile_name("7g.141gb"));
  EXPECT_TRUE(valid_mig_profile_name("1g.18gb+me"));
  EXPECT_FALSE(valid_mig_profile_name("1g.18GB"));
  EXPECT_FALSE(valid_mig_profile_name("9g.18gb"));
  EXPECT_FALSE(valid_mig_profile_name("1g.18gb; reboot"));
  EXPECT_FALSE(valid_mig_profile_name(""));
  EXPECT_EQ(mig_profile_slices("3g.71gb"), 3);
  EXPECT_EQ(mig_profile_slices("nonsense"), 0);
}

TEST(MigParsers, HostileOutputIsAnErrorNotACrash) {
  EXPECT_FALSE(parse_mig_profiles(std::string(kMigMaxOutput + 1, 'x')));
  // A line longer than any row (built in place: GCC 12's -Warray-bounds
  // misfires on string(n, c) + "...").
  std::string long_line(5000, '|');
  long_line += '\n';
  EXPECT_FALSE(parse_mig_profiles(long_line));
  EXPECT_FALSE(parse_mig_profiles("|   0  MIG ; rm -rf /  19  7/7  16.00  No  16  1  0 |\n"));
  EXPECT_FALSE(parse_mig_profiles("garbage\n"));
  EXPECT_FALSE(parse_mig_gpu_instances("|   0  MIG 1g.18gb  99999999999  7  0:1 |\n"));
  std::string many;
  for (int i = 0; i < 600; ++i)
    many += "|   0  MIG 1g.18gb         19        7          0:1     |\n";
  EXPECT_FALSE(parse_mig_gpu_instances(many));
  // A free count above the total is not what nvidia-smi prints.
  EXPECT_FALSE(parse_mig_profiles(
      "| GPU instance profiles: |\n|   0  MIG 1g.18gb   19   8/7   16.00   No   16   1   0   |\n"));
}

}  // namespace
}  // namespace factory::agent
