// tenant create's MIG rule (coordinator/kubevirt/kubevirt_provider.cpp,
// mig_capable_resources): a tier that cuts its card into MIG slices takes
// only an allowlisted card whose PCI device has MIG, and says why not.
#include <gtest/gtest.h>

#include "coordinator/kubevirt/kubevirt_provider.hpp"

namespace factory::kubevirt {
namespace {

using nlohmann::json;

// The KubeVirt CR as `factory kubevirt allowlist` writes it.
json kubevirt(std::vector<std::pair<std::string, std::string>> entries) {
  json list = json::array();
  for (auto& [sel, name] : entries)
    list.push_back({{"pciVendorSelector", sel}, {"resourceName", name}});
  return {{"items",
           json::array(
               {{{"spec",
                  {{"configuration", {{"permittedHostDevices", {{"pciHostDevices", list}}}}}}}}})}};
}

TEST(TenantMig, TheRunbooksL4IsRefusedWithTheReason) {
  auto kv = kubevirt({{"10de:27b8", "nvidia.com/AD104GL_L4"}});
  auto r = mig_capable_resources({"nvidia.com/AD104GL_L4"}, kv, "gpu-k8s-mig");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::failed_precondition);
  EXPECT_EQ(r.error().message,
            "tier gpu-k8s-mig needs a MIG-capable GPU (A30, A100, H100, H200, B200): "
            "nvidia.com/AD104GL_L4 (10de:27b8) has no MIG; allowlist a MIG-capable card or "
            "choose a tier without MIG");
}

TEST(TenantMig, AnH200IsTakenAndAnL4BesideItLeftOut) {
  auto kv = kubevirt(
      {{"10de:27b8", "nvidia.com/AD104GL_L4"}, {"10de:2335", "nvidia.com/GH100_H200_SXM_141GB"}});
  auto r = mig_capable_resources({"nvidia.com/AD104GL_L4", "nvidia.com/GH100_H200_SXM_141GB"}, kv,
                                 "gpu-k8s-mig");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(*r, std::vector<std::string>{"nvidia.com/GH100_H200_SXM_141GB"});
}

TEST(TenantMig, AResourceOutsideTheAllowlistCannotBeJudged) {
  auto r = mig_capable_resources({"nvidia.com/SOMETHING"}, kubevirt({}), "gpu-k8s-mig");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("nvidia.com/SOMETHING is not in the KubeVirt CR's allowlist"),
            std::string::npos)
      << r.error().message;
}

}  // namespace
}  // namespace factory::kubevirt
