// Every version a built-in tier depends on, pinned or said to be unpinned
// (contract/pins.hpp), as `factory catalog show` and `tenant show` list them.
#include "contract/pins.hpp"

#include <gtest/gtest.h>

using namespace factory::catalog;

namespace {

std::vector<std::string> lines_of(const std::string& tier) {
  auto c = builtin();
  EXPECT_TRUE(c.ok());
  std::vector<std::string> out;
  for (const auto& p : tier_pins(*c->find(tier)))
    out.push_back(p.what + " = " + (p.pinned() ? p.version : "UNPINNED") +
                  (p.note.empty() ? "" : " (" + p.note + ")"));
  return out;
}

}  // namespace

TEST(Pins, GpuVmListsTheDriverHeldAndSaysTheImageMoves) {
  EXPECT_EQ(lines_of("gpu-vm"),
            (std::vector<std::string>{
                "VM image = UNPINNED (https://cloud-images.ubuntu.com/noble/current/"
                "noble-server-cloudimg-amd64.img is rebuilt under the same URL)",
                "NVIDIA driver = 615.71.09",
                "driver packages (nvidia-headless-open nvidia-persistenced) = 615.71.09-1ubuntu1 "
                "(held after install (apt-mark hold))",
                "Ollama = 0.40.2", "model llama3.2 = 1b (a tag, not a digest)"}));
}

TEST(Pins, GpuK8sPinsTheOperatorsDriver) {
  auto got = lines_of("gpu-k8s");
  auto has = [&](const std::string& l) {
    return std::find(got.begin(), got.end(), l) != got.end();
  };
  EXPECT_TRUE(has("RKE2 = v1.36.4+rke2r1"));
  EXPECT_TRUE(has("chart gpu-operator = v26.3.2"));
  EXPECT_TRUE(has("GPU Operator's driver = 580.126.20"));
  EXPECT_TRUE(has("chart hami = 2.10.0"));
  // One Helm for both releases.
  EXPECT_EQ(std::count_if(got.begin(), got.end(),
                          [](const std::string& l) { return l.rfind("Helm = ", 0) == 0; }),
            1)
      << testing::PrintToString(got);
}

TEST(Pins, AnOperatorWithoutDriverVersionSaysItIsTheChartsDefault) {
  auto c = builtin();
  ASSERT_TRUE(c.ok());
  Tier t = *c->find("gpu-k8s");
  for (auto& s : t.steps)
    if (s.id == "gpu-operator") s.params["values"].erase("driver");
  bool found = false;
  for (const auto& p : tier_pins(t))
    if (p.what == "GPU Operator's driver") {
      found = true;
      EXPECT_FALSE(p.pinned());
      EXPECT_EQ(p.note, "unset: the chart's default for its release");
      EXPECT_EQ(p.where, "step 'gpu-operator' params.values.driver.version");
    }
  EXPECT_TRUE(found);
  auto j = pins_json(tier_pins(t));
  EXPECT_TRUE(j[0]["version"].is_null());
  EXPECT_EQ(j[0]["pinned"], false);
}
