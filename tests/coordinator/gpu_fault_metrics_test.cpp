// /metrics for a broken card (coordinator/feed/metrics.cpp): every fault
// figure of a tenant's latest health sample under dcgm-exporter's name and
// type with the GPU series' labels, the last Xid as DCGM_FI_DEV_XID_ERRORS,
// Factory's own factory_gpu_xid and factory_gpu_lost; nothing for what the
// guest did not report; and promtool accepting the whole exposition (but
// for the lints it also raises on dcgm-exporter's own names). The sample
// is what the coordinator keeps after decode_health_sample, fed to a real
// SQLite store.
#include <gtest/gtest.h>

#include <chrono>
#include <sstream>

#include "contract/health_sample.hpp"
#include "coordinator/feed/feed_state.hpp"
#include "coordinator/feed/metrics.hpp"
#include "coordinator/store/store.hpp"
#include "tests/support/test_support.hpp"

namespace factory::feed {
namespace {

using nlohmann::json;

const std::string kLabels =
    "{gpu=\"0\",UUID=\"GPU-93c19784-9a89-60fe-0a12-f2f7720f62a2\",pci_bus_id=\"00000000:00:06."
    "0\",device=\"nvidia0\",modelName=\"NVIDIA H200\",hostname=\"vm\",tenant=\"tenant-1\","
    "tier=\"gpu-vm\"}";

// Factory's own GPU series: the same labels in snake_case.
const std::string kOwnLabels =
    "{gpu=\"0\",uuid=\"GPU-93c19784-9a89-60fe-0a12-f2f7720f62a2\",pci_bus_id=\"00000000:00:06."
    "0\",device=\"nvidia0\",model_name=\"NVIDIA H200\",hostname=\"vm\",tenant=\"tenant-1\","
    "tier=\"gpu-vm\"}";

proto::GpuSample faulty_h200() {
  proto::GpuSample g;
  g.name = "NVIDIA H200";
  g.uuid = "GPU-93c19784-9a89-60fe-0a12-f2f7720f62a2";
  g.pci_bus_id = "00000000:00:06.0";
  g.minor_number = 0;
  g.temperature_c = 35;
  g.ecc_errors_uncorrected_volatile = 2;
  g.ecc_errors_corrected_volatile = 10;
  g.ecc_errors_corrected_aggregate = 20;
  g.ecc_errors_uncorrected_aggregate = 3;
  g.remapped_rows_correctable = 4;
  g.remapped_rows_uncorrectable = 1;
  g.remapped_rows_pending = true;
  g.remapped_rows_failure = false;
  g.pcie_replay_count = 77;
  g.clocks_event_reasons = 0x44;
  g.energy_mj = 987654321012;
  g.nvlink = proto::NvlinkSample{18, 1, 2, 3, 4};
  g.xids.push_back({13, 2, "2026-12-01T09:00:00Z", "2026-12-01T09:05:00Z"});
  g.xids.push_back({79, 1, "2026-12-01T09:10:00Z", "2026-12-01T09:10:00Z"});
  return g;
}

class GpuFaultMetrics : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = store::open_sqlite_store(dir_.path().string());
    ASSERT_TRUE(s) << s.error().message;
    store_ = std::move(*s);
    store::TenantRecord t;
    t.name = "tenant-1";
    t.tier = "gpu-vm";
    t.phase = "ready";
    ASSERT_TRUE(store_->put_tenant(t).ok());
  }
  // What the coordinator keeps: the agent's JSON read back by the same
  // untrusting reader the agents module uses.
  void health(const proto::GpuSample& g) {
    proto::HealthSample h;
    h.time = "2026-12-01T10:00:00Z";
    h.hostname = "vm";
    h.gpu.source = "nvml";
    h.gpu.gpus.push_back(g);
    auto kept = proto::decode_health_sample(h.to_json());
    ASSERT_TRUE(kept.value);
    ASSERT_TRUE(kept.rejected.empty());
    store_->put_health("tenant-1", std::make_shared<const store::LatestHealth>(store::LatestHealth{
                                       std::move(*kept.value), "2026-12-01T10:00:01Z"}));
  }
  std::string metrics() { return render_metrics(*store_, state_); }

  factory::testing::TempDir dir_{"gpu-fault-metrics"};
  std::unique_ptr<store::Store> store_;
  FeedState state_;
};

TEST_F(GpuFaultMetrics, EveryFaultFigureUnderDcgmExportersName) {
  health(faulty_h200());
  std::string m = metrics();
  for (const auto& [series, value] : std::vector<std::pair<std::string, std::string>>{
           {"DCGM_FI_DEV_XID_ERRORS", "79"},  // the one seen last
           {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "77"},
           {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "4"},
           {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "1"},
           {"DCGM_FI_DEV_ROW_REMAP_FAILURE", "0"},
           {"DCGM_FI_DEV_ROW_REMAP_PENDING", "1"},
           {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "68"},
           {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "987654321012"},
           {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "10"},
           {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "2"},
           {"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "20"},
           {"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "3"},
           {"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "1"},
           {"DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "2"},
           {"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "3"},
           {"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "4"}})
    EXPECT_NE(m.find(series + kLabels + " " + value + "\n"), std::string::npos) << series << "\n"
                                                                                << m;
  // dcgm-exporter's types: the counters are counters.
  for (const char* counter :
       {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"})
    EXPECT_NE(m.find(std::string("# TYPE ") + counter + " counter\n"), std::string::npos);
  EXPECT_NE(m.find("# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n"), std::string::npos);
  EXPECT_NE(m.find("factory_gpu_lost" + kOwnLabels + " 0\n"), std::string::npos) << m;
  // Each Xid kept, with what it means for the card.
  std::string base = kOwnLabels.substr(0, kOwnLabels.size() - 1);
  EXPECT_NE(m.find("factory_gpu_xid" + base + ",xid=\"79\",impact=\"card\"} 1\n"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("factory_gpu_xid" + base + ",xid=\"13\",impact=\"application\"} 2\n"),
            std::string::npos);
  // Page retirement is not Hopper's: not reported, not shown as 0.
  EXPECT_EQ(m.find("DCGM_FI_DEV_RETIRED_SBE{"), std::string::npos);
  EXPECT_EQ(factory::testing::promtool_complaints(m), "") << m;
}

TEST_F(GpuFaultMetrics, AHealthyCardShowsZerosAndALostOneSaysSo) {
  proto::GpuSample g = faulty_h200();
  g.xids.clear();
  g.nvlink.reset();
  health(g);
  std::string m = metrics();
  EXPECT_NE(m.find("DCGM_FI_DEV_XID_ERRORS" + kLabels + " 0\n"), std::string::npos)
      << "no Xid not yet acknowledged: 0, as dcgm-exporter shows it";
  EXPECT_EQ(m.find("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{"), std::string::npos)
      << "no links, no NVLink series";
  proto::GpuSample lost;
  lost.name = g.name;
  lost.uuid = g.uuid;
  lost.pci_bus_id = g.pci_bus_id;
  lost.minor_number = 0;
  lost.lost = true;
  health(lost);
  m = metrics();
  EXPECT_NE(m.find("factory_gpu_lost" + kOwnLabels + " 1\n"), std::string::npos) << m;
  EXPECT_EQ(m.find("DCGM_FI_DEV_PCIE_REPLAY_COUNTER{"), std::string::npos)
      << "a lost card's figures are unknown";
  EXPECT_EQ(factory::testing::promtool_complaints(m), "") << m;
}

// Issue 28: a model endpoint's usage per key (the record's, as the agent's
// endpoint_usage events were folded in) on /metrics, labels escaped as the
// other series', and promtool checking the whole exposition.
TEST_F(GpuFaultMetrics, AnEndpointsTokensAndRequestsPerKeyPassPromtool) {
  store::TenantRecord t5;
  t5.name = "t5";
  t5.tier = "model-endpoint";
  t5.phase = "ready";
  t5.endpoint.emplace();
  t5.endpoint->usage.emplace();
  const auto at = std::chrono::system_clock::now();
  ASSERT_TRUE(t5.endpoint->usage->add("default", {10, 2, 100, 250}, at).ok());
  ASSERT_TRUE(t5.endpoint->usage->add("ci", {3, 0, 30, 70}, at).ok());
  ASSERT_TRUE(t5.endpoint->usage->add("ci", {1, 1, 0, 0}, at).ok());
  ASSERT_TRUE(store_->put_tenant(t5).ok());
  std::string m = metrics();
  for (const auto& line : std::vector<std::string>{
           "factory_endpoint_tokens_total{tenant=\"t5\",key=\"default\",direction=\"prompt\"} "
           "100\n",
           "factory_endpoint_tokens_total{tenant=\"t5\",key=\"default\",direction=\"completion\"} "
           "250\n",
           "factory_endpoint_tokens_total{tenant=\"t5\",key=\"ci\",direction=\"prompt\"} 30\n",
           "factory_endpoint_tokens_total{tenant=\"t5\",key=\"ci\",direction=\"completion\"} 70\n",
           "factory_endpoint_key_requests_total{tenant=\"t5\",key=\"default\",outcome=\"ok\"} 8\n",
           "factory_endpoint_key_requests_total{tenant=\"t5\",key=\"default\",outcome=\"error\"} "
           "2\n",
           "factory_endpoint_key_requests_total{tenant=\"t5\",key=\"ci\",outcome=\"ok\"} 3\n",
           "factory_endpoint_key_requests_total{tenant=\"t5\",key=\"ci\",outcome=\"error\"} 1\n",
       })
    EXPECT_NE(m.find(line), std::string::npos) << line << m;
  EXPECT_NE(m.find("# TYPE factory_endpoint_tokens_total counter\n"), std::string::npos);
  EXPECT_EQ(m.find("tenant=\"tenant-1\",key="), std::string::npos) << "no endpoint, no series";
  EXPECT_EQ(factory::testing::promtool_complaints(m), "") << m;
}

// GPU time per tenant (docs/usage.md): counters from the record's GpuUsage,
// by tenant, tier and card model; promtool accepts them.
TEST_F(GpuFaultMetrics, GpuSecondsPerTenantAreCountersPromtoolAccepts) {
  auto r = store_->update_tenant("tenant-1", [](store::TenantRecord& t) {
    store::GpuUsage u;
    store::UsageObservation o;
    o.running = true;
    o.instance = "vmi-1";
    o.gpu_model = "nvidia.com/GH100_H200";
    o.gpus = 2;
    o.now = 1796000000;
    o.running_since = 1796000000 - 100;
    u.observe(o);
    u.add_busy(o.now, 50);
    t.status.gpu_usage = u;
    return Status{};
  });
  ASSERT_TRUE(r.ok());
  std::string m = metrics();
  EXPECT_NE(m.find("# TYPE factory_tenant_gpu_seconds_total counter\n"), std::string::npos);
  EXPECT_NE(m.find("factory_tenant_gpu_seconds_total{tenant=\"tenant-1\",tier=\"gpu-vm\","
                   "gpu_model=\"nvidia.com/GH100_H200\"} 200\n"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("factory_tenant_gpu_busy_seconds_total{tenant=\"tenant-1\",tier=\"gpu-vm\"} "
                   "50\n"),
            std::string::npos)
      << m;
  EXPECT_EQ(factory::testing::promtool_complaints(m), "") << m;
}

}  // namespace
}  // namespace factory::feed
