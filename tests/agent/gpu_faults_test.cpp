// A card that breaks, as the agent sees it: NVML's fault figures and its
// Xid / ECC events read through the stand-in libnvidia-ml.so.1
// (fake_nvml.hpp, driven by its control file: the stand-in plays the
// driver of a card that fails, which no test machine has), the fault book
// that keeps each Xid until acknowledged (also across an agent restart),
// the event watcher on its own thread, and the named diagnoses with what
// the customer and the admin do. The real NVML is read on the device
// machine (tests/fixtures/device/).
#include "agent/diagnose/gpu_faults.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <mutex>

#include "agent/health/fault_book.hpp"
#include "agent/health/fault_watcher.hpp"
#include "agent/health/gpu_health.hpp"
#include "agent/health/nvml.hpp"
#include "agent/health/scheduler.hpp"
#include "tests/agent/fake_nvml.hpp"
#include "tests/support/test_support.hpp"

namespace factory::agent {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using factory::testing::eventually;
using factory::testing::TempDir;

constexpr const char* kUuid = "GPU-93c19784-9a89-60fe-0a12-f2f7720f62a2";

std::vector<std::string> codes(const std::vector<Diagnosis>& ds) {
  std::vector<std::string> out;
  for (const auto& d : ds) out.push_back(d.code);
  return out;
}

std::vector<std::string> codes(const proto::GpuSection& s) {
  std::vector<std::string> out;
  for (const auto& d : s.diagnoses) out.push_back(d.code);
  return out;
}

// A guest root with the stand-in where the agent's search finds it, its
// control file, and the agent's state directory.
class FaultyCard : public ::testing::Test {
 protected:
  void SetUp() override {
    so_ = build_fake_nvml(dir_.path(), fake_nvml_source());
    install_fake_nvml(dir_.path() / "root", so_);
    env_.root = dir_.path() / "root";
    env_.state_dir = dir_.path() / "state";
    std::filesystem::create_directories(env_.state_dir);
  }
  FakeNvmlControl control() { return FakeNvmlControl(fake_nvml_control(dir_.path())); }

  TempDir dir_{"gpu-faults"};
  std::string so_;
  GuestEnv env_;
};

TEST_F(FaultyCard, HealthyH200ReadsEveryFaultFigure) {
  auto lib = NvmlLibrary::load({so_});
  ASSERT_TRUE(lib) << lib.error().message;
  auto r = (*lib)->read();
  ASSERT_TRUE(r) << r.error().message;
  const auto& g = r->gpus.at(0);
  EXPECT_FALSE(g.lost);
  EXPECT_EQ(g.serial, "1654923011234") << "the board's serial: the same on the host";
  EXPECT_EQ(g.ecc_errors_corrected_volatile, 0u);
  EXPECT_EQ(g.ecc_errors_corrected_aggregate, 0u);
  EXPECT_EQ(g.ecc_errors_uncorrected_aggregate, 0u);
  EXPECT_EQ(g.remapped_rows_correctable, 0u);
  EXPECT_EQ(g.remapped_rows_uncorrectable, 0u);
  EXPECT_EQ(g.remapped_rows_pending, false);
  EXPECT_EQ(g.remapped_rows_failure, false);
  // Hopper remaps rows; page retirement is not supported: unknown, not 0.
  EXPECT_FALSE(g.retired_pages_sbe);
  EXPECT_FALSE(g.retired_pages_pending);
  EXPECT_EQ(g.pcie_replay_count, 0u);
  EXPECT_EQ(g.clocks_event_reasons, proto::clocks_event::kGpuIdle);
  EXPECT_EQ(g.energy_mj, 123456789u);
  EXPECT_FALSE(g.nvlink) << "a card without NVLinks has no nvlink figures";
  EXPECT_TRUE(diagnose_gpu_faults(g).empty());
}

TEST_F(FaultyCard, InjectedFaultsReadBackAsNvmlReportsThem) {
  auto c = control();
  c.set("remapped", "3 2 1 1");
  c.set("retired", "4 5 1");
  c.set("replay", "77");
  c.set("reasons", "0x48");  // HW slowdown + HW thermal slowdown
  c.set("energy", "987654321012");
  c.set("ecc", "10 20 1 2");
  c.set("nvlink", "18 1 2 3 4");
  auto lib = NvmlLibrary::load({so_});
  ASSERT_TRUE(lib) << lib.error().message;
  auto r = (*lib)->read();
  ASSERT_TRUE(r) << r.error().message;
  const auto& g = r->gpus.at(0);
  EXPECT_EQ(g.remapped_rows_correctable, 3u);
  EXPECT_EQ(g.remapped_rows_uncorrectable, 2u);
  EXPECT_EQ(g.remapped_rows_pending, true);
  EXPECT_EQ(g.remapped_rows_failure, true);
  EXPECT_EQ(g.retired_pages_sbe, 4u);
  EXPECT_EQ(g.retired_pages_dbe, 5u);
  EXPECT_EQ(g.retired_pages_pending, true);
  EXPECT_EQ(g.pcie_replay_count, 77u);
  EXPECT_EQ(g.clocks_event_reasons, 0x48u);
  EXPECT_EQ(g.energy_mj, 987654321012u);
  EXPECT_EQ(g.ecc_errors_corrected_volatile, 10u);
  EXPECT_EQ(g.ecc_errors_corrected_aggregate, 20u);
  EXPECT_EQ(g.ecc_errors_uncorrected_volatile, 1u);
  EXPECT_EQ(g.ecc_errors_uncorrected_aggregate, 2u);
  ASSERT_TRUE(g.nvlink);
  EXPECT_EQ(g.nvlink->links, 18u);
  EXPECT_EQ(g.nvlink->crc_flit_errors, 1u);
  EXPECT_EQ(g.nvlink->crc_data_errors, 2u);
  EXPECT_EQ(g.nvlink->replay_errors, 3u);
  EXPECT_EQ(g.nvlink->recovery_errors, 4u);
  EXPECT_EQ(codes(diagnose_gpu_faults(g)),
            (std::vector<std::string>{"gpu_row_remap_failure", "gpu_ecc_uncorrected",
                                      "gpu_thermal_slowdown", "gpu_power_slowdown"}));
  // What a card lacks (a driver without the call) stays unknown.
  c.set("remapped", "");
  auto again = (*lib)->read();
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->gpus[0].remapped_rows_correctable);
  EXPECT_FALSE(again->gpus[0].remapped_rows_failure);
}

// NVML_ERROR_GPU_IS_LOST is a card that fell off the bus: said as such,
// with the card named as it was, and told apart from a driver that does not
// answer at all (the collector's deadline: health_collector_hung).
TEST_F(FaultyCard, ALostGpuIsNamedAndToldApartFromAWedgedDriver) {
  auto lib = NvmlLibrary::load({so_});
  ASSERT_TRUE(lib) << lib.error().message;
  ASSERT_TRUE((*lib)->read());  // seen once, healthy
  auto c = control();
  for (const char* mode : {"1", "2"}) {  // the handle, or the device's calls, answer 15
    c.set("lost", mode);
    auto r = (*lib)->read();
    ASSERT_TRUE(r) << "a lost card is a reading, not a failed read: " << r.error().message;
    ASSERT_EQ(r->gpus.size(), 1u);
    const auto& g = r->gpus[0];
    EXPECT_TRUE(g.lost) << mode;
    EXPECT_EQ(g.uuid, kUuid) << "named as it was last seen";
    EXPECT_EQ(g.pci_bus_id, "00000000:00:06.0");
    EXPECT_EQ(g.serial, "1654923011234");
    EXPECT_FALSE(g.memory_total_mib) << "its figures are unknown";
    EXPECT_EQ(codes(diagnose_gpu_faults(g)), std::vector<std::string>{"gpu_lost"});
  }
  c.clear("lost");
  auto back = (*lib)->read();
  ASSERT_TRUE(back);
  EXPECT_FALSE(back->gpus[0].lost);

  // The wedged driver: the GPU collector never returns.
  TempDir hang_dir("gpu-hang");
  auto hang = build_fake_nvml(hang_dir.path(), fake_nvml_source("", "sleep(30);"));
  GuestEnv env = env_;
  env.root = hang_dir.path() / "root";
  install_fake_nvml(env.root, hang);
  HealthDeadlines d;
  d.gpu = 300ms;
  HealthProbe probe(env, d);
  auto s = probe.sample({});
  EXPECT_EQ(codes(s.gpu), std::vector<std::string>{"health_collector_hung"});
  EXPECT_TRUE(s.gpu.gpus.empty());
}

TEST_F(FaultyCard, TheEventSetRegistersXidAndEccAndWaits) {
  auto lib = NvmlLibrary::load({so_});
  ASSERT_TRUE(lib) << lib.error().message;
  auto set = (*lib)->watch_events();
  ASSERT_TRUE(set) << set.error().message;
  ASSERT_EQ((*set)->registrations().size(), 1u);
  const auto& reg = (*set)->registrations()[0];
  EXPECT_EQ(reg.uuid, kUuid);
  EXPECT_EQ(reg.registered, 0xbu) << "Xid (0x8) and both ECC events (0x1, 0x2)";
  EXPECT_TRUE(reg.error.empty()) << reg.error;

  auto quiet = (*set)->wait(50ms);
  ASSERT_TRUE(quiet) << quiet.error().message;
  EXPECT_FALSE(*quiet) << "nothing happened: a timeout, not an error";

  auto c = control();
  c.event("xid 79");
  c.event("dbe");
  auto xid = (*set)->wait(1s);
  ASSERT_TRUE(xid && *xid);
  EXPECT_EQ((*xid)->kind, NvmlEvent::Kind::xid);
  EXPECT_EQ((*xid)->xid, 79u);
  EXPECT_EQ((*xid)->uuid, kUuid);
  EXPECT_EQ((*xid)->gpu_index, 0);
  auto dbe = (*set)->wait(1s);
  ASSERT_TRUE(dbe && *dbe);
  EXPECT_EQ((*dbe)->kind, NvmlEvent::Kind::ecc_uncorrected);
  c.event("lost");
  auto lost = (*set)->wait(1s);
  ASSERT_FALSE(lost);
  EXPECT_EQ(lost.error().code, Errc::unavailable) << lost.error().message;
}

TEST(FaultBook, KeepsEachXidWithCountAndTimesUntilAcknowledged) {
  TempDir dir("fault-book");
  FaultBook book(FaultBook::file_in(dir.path()));
  auto t0 = Clock::now();
  ASSERT_TRUE(book.record(kUuid, 0, 79, t0).ok());
  ASSERT_TRUE(book.record(kUuid, 0, 79, t0 + 5s).ok());
  ASSERT_TRUE(book.record(kUuid, 0, 13, t0 + 6s).ok());
  ASSERT_TRUE(book.record("GPU-other", 1, 13, t0 + 7s).ok());
  // Another process (or an agent started again) reads the same.
  auto list = FaultBook(book.file()).list();
  ASSERT_TRUE(list) << list.error().message;
  ASSERT_EQ(list->size(), 3u);
  const auto& x79 = (*list)[0];
  EXPECT_EQ(x79.xid, 79);
  EXPECT_EQ(x79.count, 2u);
  EXPECT_EQ(x79.first_at, format_rfc3339(t0));
  EXPECT_EQ(x79.last_at, format_rfc3339(t0 + 5s));
  EXPECT_EQ(std::filesystem::status(book.file()).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);

  auto gone = book.acknowledge("", 13);
  ASSERT_TRUE(gone);
  EXPECT_EQ(*gone, 2u) << "Xid 13 on every GPU";
  auto rest = book.list();
  ASSERT_EQ(rest->size(), 1u);
  EXPECT_EQ((*rest)[0].xid, 79);
  EXPECT_EQ(*book.acknowledge(kUuid, 0), 1u);
  EXPECT_TRUE(book.list()->empty());
}

TEST(FaultBook, IsBoundedPerGpuDroppingTheLeastRecentlySeen) {
  TempDir dir("fault-book");
  FaultBook book(FaultBook::file_in(dir.path()));
  auto t0 = Clock::now();
  for (int i = 0; i < static_cast<int>(FaultBook::kPerGpu) + 3; ++i)
    ASSERT_TRUE(book.record(kUuid, 0, 100 + i, t0 + std::chrono::seconds(i)).ok());
  auto list = book.list();
  ASSERT_EQ(list->size(), FaultBook::kPerGpu);
  EXPECT_EQ(list->front().xid, 103) << "the three seen longest ago went";
  // A book that is not one (a torn write cannot happen; an edited file can)
  // is read as empty rather than stopping health.
  std::ofstream(book.file()) << "{not json";
  EXPECT_TRUE(book.list()->empty());
}

// The watcher on its own thread: each Xid into the book, each event a call
// for a sample now.
TEST_F(FaultyCard, TheWatcherRecordsEveryXidAndAsksForASampleAtOnce) {
  std::mutex mu;
  int faults = 0;
  FaultWatchOptions o;
  o.wait_slice = 50ms;
  o.retry = 100ms;
  FaultWatcher watcher(
      env_, FaultBook(FaultBook::file_in(env_.state_dir)),
      [&] {
        std::lock_guard lk(mu);
        ++faults;
      },
      o);
  watcher.start();
  ASSERT_TRUE(eventually([&] { return watcher.state().watching; }, 10s)) << watcher.state().error;
  control().event("xid 48");
  control().event("xid 48");
  ASSERT_TRUE(eventually(
      [&] {
        std::lock_guard lk(mu);
        return faults >= 2;
      },
      10s));
  auto list = FaultBook(FaultBook::file_in(env_.state_dir)).list();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].xid, 48);
  EXPECT_EQ((*list)[0].count, 2u);
  EXPECT_EQ((*list)[0].uuid, kUuid);
  EXPECT_EQ(watcher.state().xids, 2u);
}

// The acceptance in the agent: an Xid 79 reaches the health sink at once
// (the interval is an hour), named with its fix, and stays in every sample,
// across an agent restart, until acknowledged.
TEST_F(FaultyCard, AnXid79IsReportedAtOnceAndKeptUntilAcknowledged) {
  std::mutex mu;
  std::vector<proto::HealthSample> got;
  auto sink = [&](const proto::HealthSample& s) {
    std::lock_guard lk(mu);
    got.push_back(s);
  };
  auto has_xid79 = [&] {
    std::lock_guard lk(mu);
    return !got.empty() && !got.back().gpu.gpus.empty() && got.back().gpu.gpus[0].last_xid() == 79;
  };
  HealthScheduleOptions o;
  o.interval = std::chrono::hours(1);
  o.faults.wait_slice = 50ms;
  {
    HealthScheduler health(env_, o, nullptr, sink);
    health.start();
    ASSERT_TRUE(
        eventually([&] { return health.fault_watch() && health.fault_watch()->watching; }, 10s));
    ASSERT_TRUE(eventually(
        [&] {
          std::lock_guard lk(mu);
          return got.size() == 1;
        },
        10s));
    auto at = std::chrono::steady_clock::now();
    control().event("xid 79");
    ASSERT_TRUE(eventually(has_xid79, 10s));
    auto took = std::chrono::steady_clock::now() - at;
    EXPECT_LT(took, 5s) << "at once, not at the next interval";
    std::lock_guard lk(mu);
    const auto& s = got.back();
    const auto& x = s.gpu.gpus[0].xids.at(0);
    EXPECT_EQ(x.count, 1u);
    EXPECT_FALSE(x.first_at.empty());
    ASSERT_FALSE(s.gpu.diagnoses.empty());
    const auto& d = s.gpu.diagnoses[0];
    EXPECT_EQ(d.code, "gpu_xid_79");
    EXPECT_NE(d.summary.find("GPU has fallen off the bus"), std::string::npos) << d.summary;
    EXPECT_NE(d.fix.find("factory host quarantine"), std::string::npos) << d.fix;
    EXPECT_EQ(d.details["impact"], "card");
  }
  // The agent restarts: the first sample of the new one still says so.
  got.clear();
  {
    HealthScheduler health(env_, o, nullptr, sink);
    health.start();
    ASSERT_TRUE(eventually(has_xid79, 10s));
    ASSERT_TRUE(FaultBook(FaultBook::file_in(env_.state_dir)).acknowledge("", 79));
    health.report_now();
    ASSERT_TRUE(eventually(
        [&] {
          std::lock_guard lk(mu);
          return got.size() >= 2 && got.back().gpu.gpus[0].xids.empty();
        },
        10s));
    std::lock_guard lk(mu);
    EXPECT_TRUE(got.back().gpu.diagnoses.empty()) << "acknowledged: no longer a problem";
  }
}

TEST(GpuFaultDiagnoses, EachXidOfTheTableIsNamedWithBothFixes) {
  proto::GpuSample g;
  g.uuid = kUuid;
  for (const auto& e : gpu::xid_catalog()) {
    proto::XidSample x{e.xid, 3, "2026-12-01T10:00:00Z", "2026-12-01T10:05:00Z"};
    Diagnosis d = diagnose_xid(g, x);
    EXPECT_EQ(d.code, "gpu_xid_" + std::to_string(e.xid));
    EXPECT_NE(d.summary.find("3 times, last at 2026-12-01T10:05:00Z"), std::string::npos)
        << d.summary;
    EXPECT_EQ(d.details["customer"], std::string(e.customer));
    EXPECT_EQ(d.details["admin"], std::string(e.admin));
    EXPECT_EQ(d.details["mnemonic"], std::string(e.mnemonic));
    // The whole fix fits what the coordinator keeps of one.
    EXPECT_LE(d.fix.size(), proto::health_limits::kText) << e.xid;
    EXPECT_LE(d.summary.size(), proto::health_limits::kText) << e.xid;
  }
  proto::XidSample odd{62, 1, "", ""};
  EXPECT_EQ(diagnose_xid(g, odd).code, "gpu_xid_unlisted");
}

TEST(GpuFaultDiagnoses, ThePowerCapAtFullLoadIsNoProblem) {
  proto::GpuSample g;
  g.clocks_event_reasons = proto::clocks_event::kSwPowerCap | proto::clocks_event::kGpuIdle;
  EXPECT_TRUE(diagnose_gpu_faults(g).empty());
  g.clocks_event_reasons = proto::clocks_event::kHwPowerBrakeSlowdown;
  EXPECT_EQ(codes(diagnose_gpu_faults(g)), std::vector<std::string>{"gpu_power_slowdown"});
  g.clocks_event_reasons = proto::clocks_event::kSwThermalSlowdown;
  g.temperature_c = 91;
  auto d = diagnose_gpu_faults(g);
  ASSERT_EQ(codes(d), std::vector<std::string>{"gpu_thermal_slowdown"});
  EXPECT_NE(d[0].summary.find("91 C"), std::string::npos) << d[0].summary;
  // Uncorrectable ECC with the Xid that explains it is said once, by the Xid.
  proto::GpuSample e;
  e.ecc_errors_uncorrected_volatile = 2;
  EXPECT_EQ(codes(diagnose_gpu_faults(e)), std::vector<std::string>{"gpu_ecc_uncorrected"});
  e.xids.push_back({48, 1, "", ""});
  EXPECT_EQ(codes(diagnose_gpu_faults(e)), std::vector<std::string>{"gpu_xid_48"});
  proto::GpuSample p;
  p.remapped_rows_pending = true;
  EXPECT_EQ(codes(diagnose_gpu_faults(p)), std::vector<std::string>{"gpu_row_remap_pending"});
}

}  // namespace
}  // namespace factory::agent
