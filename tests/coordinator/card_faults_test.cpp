// The card faults the coordinator records from a tenant's health sample
// (coordinator/agents/card_faults.hpp): judged by the Xid's number against
// the table in common/, never by the words the guest sent; recorded once
// per card and fault, bounded.
#include "coordinator/agents/card_faults.hpp"

#include <gtest/gtest.h>

#include "contract/health_sample.hpp"

namespace factory::coordinator {
namespace {

using nlohmann::json;

store::LatestHealth sample_with(const proto::GpuSample& g,
                                std::vector<proto::DiagnosisSample> ds = {}) {
  proto::HealthSample h;
  h.time = "2026-12-01T10:00:00Z";
  h.gpu.source = "nvml";
  h.gpu.gpus.push_back(g);
  h.gpu.diagnoses = std::move(ds);
  return {std::move(h), "2026-12-01T10:00:01Z"};
}

proto::GpuSample card() {
  proto::GpuSample g;
  g.name = "NVIDIA H200";
  g.uuid = "GPU-93c19784-9a89-60fe-0a12-f2f7720f62a2";
  g.serial = "1654923011234";
  g.pci_bus_id = "00000000:00:06.0";
  return g;
}

TEST(CardFaults, ACardFaultIsJudgedByItsNumberNotTheGuestsWords) {
  proto::GpuSample g = card();
  g.xids.push_back({79, 1, "2026-12-01T09:59:00Z", "2026-12-01T09:59:00Z"});
  g.xids.push_back({13, 4, "2026-12-01T09:00:00Z", "2026-12-01T09:30:00Z"});  // the program's own
  g.xids.push_back({94, 1, "2026-12-01T09:00:00Z", "2026-12-01T09:00:00Z"});  // contained: watch
  auto faults = card_faults(
      sample_with(g, {{"gpu_xid_79",
                       "GPU 0 reported Xid 79",
                       "customer: wait. admin: quarantine",
                       {{"uuid", g.uuid}}},
                      // A guest's claim that Xid 13 needs the admin changes nothing.
                      {"gpu_xid_13", "the card is on fire", "replace it", {{"impact", "card"}}}}));
  ASSERT_EQ(faults.size(), 1u);
  const auto& f = faults[0];
  EXPECT_EQ(f.key, g.uuid + "/xid-79");
  EXPECT_EQ(f.kind, "xid");
  EXPECT_EQ(f.xid, 79);
  EXPECT_EQ(f.serial, "1654923011234");
  EXPECT_EQ(f.summary, "GPU 0 reported Xid 79");
  EXPECT_EQ(f.fix, "customer: wait. admin: quarantine");
  EXPECT_EQ(f.seen_at, "2026-12-01T10:00:01Z");

  proto::GpuSample lost = card();
  lost.lost = true;
  lost.remapped_rows_failure = true;
  auto two = card_faults(sample_with(lost));
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].key, lost.uuid + "/lost");
  EXPECT_EQ(two[1].key, lost.uuid + "/row_remap_failure");
  EXPECT_TRUE(card_faults(sample_with(card())).empty()) << "a healthy card";
  // A card lost before it was ever named is its index.
  proto::GpuSample nameless;
  nameless.index = 1;
  nameless.lost = true;
  EXPECT_EQ(card_faults(sample_with(nameless))[0].key, "gpu1/lost");
}

TEST(CardFaults, RecordedOncePerCardAndFaultAndBounded) {
  store::TenantStatus status;
  proto::GpuSample g = card();
  g.xids.push_back({48, 1, "", ""});
  auto faults = card_faults(sample_with(g));
  EXPECT_EQ(record_card_faults(status, faults).size(), 1u);
  EXPECT_TRUE(record_card_faults(status, faults).empty()) << "seen again: nothing new";
  EXPECT_EQ(status.gpu_faults->at(g.uuid + "/xid-48").first_seen.value_or(""),
            "2026-12-01T10:00:01Z");
  for (int i = 0; i < 40; ++i) {
    CardFault f = faults[0];
    f.key = "GPU-" + std::to_string(i) + "/lost";
    f.seen_at = "2026-12-02T10:00:" + std::string(i < 10 ? "0" : "") + std::to_string(i) + "Z";
    record_card_faults(status, {f});
  }
  EXPECT_EQ(status.gpu_faults->size(), kMaxCardFaultRecords);
  EXPECT_FALSE(status.gpu_faults->contains(g.uuid + "/xid-48")) << "the oldest went first";
  EXPECT_TRUE(status.gpu_faults->contains("GPU-39/lost"));
}

}  // namespace
}  // namespace factory::coordinator
