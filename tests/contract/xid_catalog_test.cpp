// The Xid table (contract/xid_catalog.hpp): the Xids issue 25 names are all
// in it, each with NVIDIA's mnemonic, a fix for the customer and one for
// the admin that fit a diagnosis, and docs/gpu-faults.md shows the same
// table (a row per Xid with its mnemonic and impact).
#include "contract/xid_catalog.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "contract/health_sample.hpp"

namespace gpu = factory::gpu;

TEST(XidCatalog, NamesEveryXidTheIssueAsksForWithBothFixes) {
  for (int xid : {13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 154}) {
    const gpu::XidEntry* e = gpu::find_xid(xid);
    ASSERT_NE(e, nullptr) << xid;
    EXPECT_FALSE(e->mnemonic.empty());
    EXPECT_FALSE(e->nvidia_action.empty());
    // "customer: ... admin: ..." is one diagnosis fix, at most kText.
    EXPECT_LE(e->customer.size() + e->admin.size() + 20, factory::proto::health_limits::kText)
        << xid;
  }
  EXPECT_EQ(gpu::find_xid(62), nullptr);
  // What faults a card: the ones that need the admin, never a program's own.
  EXPECT_TRUE(gpu::xid_faults_card(79));
  EXPECT_TRUE(gpu::xid_faults_card(48));
  EXPECT_TRUE(gpu::xid_faults_card(95));
  EXPECT_FALSE(gpu::xid_faults_card(13));
  EXPECT_FALSE(gpu::xid_faults_card(94)) << "contained: the program restarts";
  EXPECT_FALSE(gpu::xid_faults_card(1000));
}

TEST(XidCatalog, TheDocsShowTheSameTable) {
  std::ifstream in(std::string(FACTORY_SOURCE_DIR) + "/docs/gpu-faults.md");
  ASSERT_TRUE(in) << "docs/gpu-faults.md";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  for (const auto& e : gpu::xid_catalog()) {
    std::string row = "| " + std::to_string(e.xid) + " | `" + std::string(e.mnemonic) + "` | " +
                      std::string(e.description) + " | " + std::string(e.nvidia_action) + " | " +
                      std::string(gpu::impact_name(e.impact)) + " |";
    EXPECT_NE(doc.find(row), std::string::npos) << "docs/gpu-faults.md lacks the row\n" << row;
  }
}
