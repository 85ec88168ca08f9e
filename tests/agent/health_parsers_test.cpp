// nvidia-smi parsers on REAL captures (tests/fixtures/real/), and the NVML
// loader: failing cleanly where libnvidia-ml is absent (as on this machine),
// and reading through a stand-in libnvidia-ml built here from the struct
// layouts of nvml.h (it checks the loader's dlopen/dlsym/ABI path, not NVIDIA's
// library; the real one is exercised on the device machine).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "agent/guest/nvidia_smi.hpp"
#include "agent/health/compare.hpp"
#include "agent/health/nvml.hpp"
#include "tests/agent/fake_nvml.hpp"
#include "tests/support/test_support.hpp"

namespace factory::agent {
namespace {

using factory::testing::fixtures_dir;
using factory::testing::slurp;

// A section of the third-party capture: the output under "# <title>".
std::string capture_section(const std::string& title) {
  std::string text = slurp(fixtures_dir() / "third-party/nvidia_gpu_exporter-h200-capture.txt");
  auto at = text.find("# " + title + "\n");
  EXPECT_NE(at, std::string::npos) << title;
  if (at == std::string::npos) return "";
  auto body = text.find("####\n", at);  // the banner line after "# $ command"
  body = text.find('\n', body) + 1;
  auto end = text.find("\n\n\n####", body);
  return text.substr(body, end == std::string::npos ? std::string::npos : end - body + 1);
}

std::vector<std::string> split_fields(const std::string& csv) {
  std::vector<std::string> out;
  std::stringstream ss(csv);
  std::string f;
  while (std::getline(ss, f, ',')) out.push_back(f);
  return out;
}

TEST(NvidiaSmiCsv, H200CaptureNoHeader) {
  // h200-passthrough-vm/nvidia-smi.txt: the csv line of a real H200 VM. The
  // capture does not list its --query-gpu fields; the first 16 are read off
  // the values and corroborated by the same machine's -q -x (uuid, name,
  // bus id, driver, fb total/used/free 143771/0/143156 MiB, gpu_temp 39 C,
  // power 128.5 W of 700 W, sm 1980 MHz, mem 3201 MHz, P0); the last three
  // are not identified and are ignored by the parser.
  std::string text = slurp(fixtures_dir() / "h200-passthrough-vm/nvidia-smi.txt");
  std::string line;
  std::istringstream in(text);
  std::string csv;
  while (std::getline(in, line))
    if (line.rfind("0, GPU-", 0) == 0) csv = line + "\n";
  ASSERT_FALSE(csv.empty());
  std::vector<std::string> fields = split_fields(
      "index,uuid,name,pci.bus_id,driver_version,memory.total,memory.used,memory.free,"
      "utilization.gpu,utilization.memory,temperature.gpu,power.draw,power.limit,clocks.sm,"
      "clocks.mem,pstate,unknown.17,unknown.18,unknown.19");
  auto r = parse_nvidia_smi_csv(csv, fields);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->driver_version, "580.159.04");
  ASSERT_EQ(r->gpus.size(), 1u);
  const auto& g = r->gpus[0];
  EXPECT_EQ(g.index, 0);
  EXPECT_EQ(g.name, "NVIDIA H200");
  EXPECT_EQ(g.uuid, "GPU-0108b095-397f-7583-e087-ade158522fa2");
  EXPECT_EQ(g.pci_bus_id, "00000000:00:06.0");
  EXPECT_EQ(g.memory_total_mib, 143771u);
  EXPECT_EQ(g.memory_used_mib, 0u);
  EXPECT_EQ(g.temperature_c, 39);
  EXPECT_EQ(g.utilization_percent, 0);

  auto j = r->to_json();
  EXPECT_EQ(j["source"], "nvidia-smi");
  EXPECT_EQ(j["gpus"][0]["memory_total_mib"], 143771);
  EXPECT_EQ(j["gpus"][0]["pci_bus_id"], "00000000:00:06.0");
}

TEST(NvidiaSmiCsv, WrongValueCountIsAnError) {
  auto r = parse_nvidia_smi_csv("NVIDIA L4, 23034\n", nvidia_smi_query_fields());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::protocol);
  EXPECT_NE(r.error().message.find("expected 20"), std::string::npos) << r.error().message;
}

TEST(NvidiaSmiCsv, OurQueryArguments) {
  auto args = nvidia_smi_query_args();
  ASSERT_EQ(args.size(), 2u);
  EXPECT_EQ(args[0],
            "--query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,memory.reserved,"
            "memory.used,memory.free,utilization.gpu,utilization.memory,temperature.gpu,"
            "temperature.memory,power.draw,power.limit,clocks.sm,clocks.mem,pstate,"
            "ecc.errors.uncorrected.volatile.total,mig.mode.current");
  EXPECT_EQ(args[1], "--format=csv,noheader,nounits");
  // What an nvidia-smi that refuses the full list is asked instead.
  EXPECT_EQ(nvidia_smi_query_args(nvidia_smi_basic_query_fields())[0],
            "--query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,driver_version,"
            "temperature.gpu,utilization.gpu");
}

TEST(NvidiaSmiCsv, DeviceCaptureWithHeaderHasEveryFigure) {
  // h200-passthrough-vm/2026-12-01: --format=csv with units, 20 fields,
  // clocks under the header's names (clocks.current.sm) and N/A fabric.
  auto r = parse_nvidia_smi_csv_with_header(
      slurp(fixtures_dir() / "h200-passthrough-vm/2026-12-01/nvidia-smi-query-gpu.csv"));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->driver_version, "580.159.04");
  ASSERT_EQ(r->gpus.size(), 1u);
  const auto& g = r->gpus[0];
  EXPECT_EQ(g.uuid, "GPU-93c19784-9a89-60fe-0a12-f2f7720f62a2");
  EXPECT_EQ(g.memory_total_mib, 143771u);
  EXPECT_EQ(g.memory_used_mib, 0u);
  EXPECT_EQ(g.memory_free_mib, 143156u);
  EXPECT_FALSE(g.memory_reserved_mib) << "not asked in that capture";
  EXPECT_EQ(g.utilization_percent, 0);
  EXPECT_EQ(g.memory_utilization_percent, 0);
  EXPECT_EQ(g.temperature_c, 35);
  EXPECT_EQ(g.memory_temperature_c, 33);
  EXPECT_DOUBLE_EQ(g.power_draw_w.value_or(0), 121.85);
  EXPECT_DOUBLE_EQ(g.power_limit_w.value_or(0), 700.0);
  EXPECT_EQ(g.sm_clock_mhz, 525);
  EXPECT_EQ(g.memory_clock_mhz, 3201);
  EXPECT_EQ(g.pstate, "P0");
  EXPECT_EQ(g.ecc_errors_uncorrected_volatile, 0u);
  EXPECT_EQ(g.mig_mode, "Disabled");
}

TEST(NvidiaSmiComputeApps, ProcessesGoToTheirGpu) {
  std::vector<GpuReading> gpus(2);
  gpus[0].uuid = "GPU-a";
  gpus[1].uuid = "GPU-b";
  apply_nvidia_smi_compute_apps(
      "GPU-b, 29211, /usr/local/lib/ollama/llama-server, 1662\n"
      "GPU-a, 7, python3 train.py --lr=1,2, 300\n"
      "GPU-a, [N/A], ghost, 1\n"
      "garbage\n",
      gpus);
  ASSERT_EQ(gpus[1].processes.size(), 1u);
  EXPECT_EQ(gpus[1].processes[0].pid, 29211u);
  EXPECT_EQ(gpus[1].processes[0].name, "/usr/local/lib/ollama/llama-server");
  EXPECT_EQ(gpus[1].processes[0].used_memory_mib, 1662u);
  ASSERT_EQ(gpus[0].processes.size(), 1u);
  EXPECT_EQ(gpus[0].processes[0].name, "python3 train.py --lr=1,2") << "commas in a name";

  // The third-party H200 under load (its query asked for more columns
  // first: the last four are ours).
  std::vector<GpuReading> h200(1);
  h200[0].uuid = "GPU-00000000-0000-0000-0000-000000000000";
  std::istringstream in(capture_section("load :: query-compute-apps (per-process)"));
  std::string ours;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("2026/", 0) != 0) continue;
    size_t at = 0;
    for (int i = 0; i < 4; ++i) at = line.find(", ", at) + 2;
    ours += line.substr(at) + "\n";
  }
  apply_nvidia_smi_compute_apps(ours, h200);
  ASSERT_EQ(h200[0].processes.size(), 3u);
  EXPECT_EQ(h200[0].processes[2].pid, 10309u);
  EXPECT_EQ(h200[0].processes[2].name, "./gpu_burn");
  EXPECT_EQ(h200[0].processes[2].used_memory_mib, 28234u);
}

TEST(NvidiaSmiQMemory, FbMemoryOfTheDeviceCapture) {
  // `nvidia-smi -q` on the H200 VM: Used 0 MiB with Reserved 616 MiB apart.
  auto m = parse_nvidia_smi_q_memory(
      slurp(fixtures_dir() / "h200-passthrough-vm/2026-12-01/nvidia-smi-q.txt"));
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].total, 143771u);
  EXPECT_EQ(m[0].reserved, 616u);
  EXPECT_EQ(m[0].used, 0u);
  EXPECT_EQ(m[0].free, 143156u);
  // The BAR1 block that follows is not the frame buffer.
  auto third = parse_nvidia_smi_q_memory(capture_section("idle :: query (-q)"));
  ASSERT_EQ(third.size(), 1u);
  EXPECT_EQ(third[0].reserved, 614u);
  EXPECT_EQ(third[0].free, 143158u);
}

TEST(NvidiaSmiCsv, ThirdPartyH200WithHeaderIdleAndLoad) {
  // nvidia_gpu_exporter's H200 capture: --format=csv with units and its
  // 200-odd field header, [N/A] and [Requested functionality ...] values.
  auto idle = parse_nvidia_smi_csv_with_header(
      capture_section("idle :: query-gpu (csv, what the exporter parses)"));
  ASSERT_TRUE(idle) << idle.error().message;
  EXPECT_EQ(idle->driver_version, "590.48.01");
  ASSERT_EQ(idle->gpus.size(), 1u);
  EXPECT_EQ(idle->gpus[0].name, "NVIDIA H200");
  EXPECT_EQ(idle->gpus[0].pci_bus_id, "00000000:83:00.0");
  EXPECT_EQ(idle->gpus[0].memory_total_mib, 143771u);
  EXPECT_EQ(idle->gpus[0].memory_used_mib, 0u);

  auto load = parse_nvidia_smi_csv_with_header(
      capture_section("load :: query-gpu (csv, what the exporter parses)"));
  ASSERT_TRUE(load) << load.error().message;
  ASSERT_EQ(load->gpus.size(), 1u);
  EXPECT_EQ(load->gpus[0].utilization_percent, 100);
  EXPECT_GT(load->gpus[0].memory_used_mib.value_or(0), 30000u);
  EXPECT_EQ(load->gpus[0].temperature_c, 52);
}

TEST(NvidiaSmiXml, H200Capture) {
  auto r = parse_nvidia_smi_xml(slurp(fixtures_dir() / "h200-passthrough-vm/nvidia-smi-q-x.xml"));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->driver_version, "580.159.04");
  ASSERT_EQ(r->gpus.size(), 1u);
  const auto& g = r->gpus[0];
  EXPECT_EQ(g.name, "NVIDIA H200");
  EXPECT_EQ(g.uuid, "GPU-0108b095-397f-7583-e087-ade158522fa2");
  EXPECT_EQ(g.pci_bus_id, "00000000:00:06.0");
  EXPECT_EQ(g.memory_total_mib, 143771u);  // fb_memory_usage, not bar1 (262144)
  EXPECT_EQ(g.memory_used_mib, 0u);
  EXPECT_EQ(g.temperature_c, 39);
  EXPECT_EQ(g.utilization_percent, 0);
  // Every figure the sample has, as the same machine's XML gives it.
  EXPECT_EQ(r->cuda_driver_version, "13.0");
  EXPECT_EQ(g.minor_number, 0);
  EXPECT_EQ(g.memory_reserved_mib, 616u);
  EXPECT_EQ(g.memory_free_mib, 143156u);
  EXPECT_EQ(g.memory_temperature_c, 39);
  EXPECT_DOUBLE_EQ(g.power_draw_w.value_or(0), 128.50);
  EXPECT_DOUBLE_EQ(g.power_limit_w.value_or(0), 700.0);
  EXPECT_EQ(g.sm_clock_mhz, 1980);
  EXPECT_EQ(g.memory_clock_mhz, 3201);
  EXPECT_EQ(g.pstate, "P0");
  EXPECT_EQ(g.ecc_errors_uncorrected_volatile, 0u);
  EXPECT_EQ(g.mig_mode, "Disabled");
  EXPECT_TRUE(g.processes.empty());
}

TEST(NvidiaSmiXml, GarbageIsAProtocolError) {
  auto r = parse_nvidia_smi_xml("<nvidia_smi_log><gpu>");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::protocol);
  auto other = parse_nvidia_smi_xml("<?xml version=\"1.0\"?><something/>");
  ASSERT_FALSE(other);
}

TEST(NvidiaSmiTable, RunbookL4IdleKmdHeader) {
  // The runbook's guest prints the newer "KMD Version:" header.
  auto r = parse_nvidia_smi_table(slurp(fixtures_dir() / "l4-runbook/tenant1-nvidia-smi-idle.txt"));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->driver_version, "615.71.09");
  ASSERT_EQ(r->gpus.size(), 1u);
  EXPECT_EQ(r->gpus[0].name, "NVIDIA L4");
  EXPECT_EQ(r->gpus[0].pci_bus_id, "00000000:09:00.0");
  EXPECT_EQ(r->gpus[0].memory_total_mib, 23034u);
  EXPECT_EQ(r->gpus[0].memory_used_mib, 0u);
  EXPECT_EQ(r->gpus[0].temperature_c, 47);
  EXPECT_EQ(r->gpus[0].utilization_percent, 0);
  // "P8             17W /   72W"; the newer header's "CUDA UMD Version: 13.4".
  EXPECT_EQ(r->gpus[0].pstate, "P8");
  EXPECT_DOUBLE_EQ(r->gpus[0].power_draw_w.value_or(0), 17);
  EXPECT_DOUBLE_EQ(r->gpus[0].power_limit_w.value_or(0), 72);
  EXPECT_EQ(r->cuda_driver_version, "13.4");
}

TEST(NvidiaSmiTable, RunbookL4WithOllamaLoadedStopsAtProcesses) {
  auto r = parse_nvidia_smi_table(
      slurp(fixtures_dir() / "l4-runbook/tenant1-nvidia-smi-ollama-loaded.txt"));
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->gpus.size(), 1u);  // the process row is not a GPU
  EXPECT_EQ(r->gpus[0].memory_used_mib, 1670u);
  EXPECT_EQ(r->gpus[0].temperature_c, 51);
}

TEST(NvidiaSmiTable, HamiPodSeesItsLimit) {
  auto r = parse_nvidia_smi_table(
      slurp(fixtures_dir() / "l4-runbook/tenant2-pod-nvidia-smi-hami-1024MiB.txt"));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->driver_version, "580.126.20");
  ASSERT_EQ(r->gpus.size(), 1u);
  EXPECT_EQ(r->gpus[0].memory_total_mib, 1024u);
}

TEST(NvidiaSmiTable, H200DriverVersionHeader) {
  auto r = parse_nvidia_smi_table(slurp(fixtures_dir() / "h200-passthrough-vm/nvidia-smi.txt"));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->driver_version, "580.159.04");
  ASSERT_EQ(r->gpus.size(), 1u);
  EXPECT_EQ(r->gpus[0].name, "NVIDIA H200");
  EXPECT_EQ(r->gpus[0].memory_total_mib, 143771u);
  EXPECT_EQ(r->cuda_driver_version, "13.0");
  EXPECT_EQ(r->gpus[0].pstate, "P0");
  EXPECT_DOUBLE_EQ(r->gpus[0].power_draw_w.value_or(0), 128);

  auto load = parse_nvidia_smi_table(capture_section("load :: nvidia-smi (default table)"));
  ASSERT_TRUE(load) << load.error().message;
  ASSERT_EQ(load->gpus.size(), 1u);
  EXPECT_EQ(load->gpus[0].memory_used_mib, 32362u);
  EXPECT_EQ(load->gpus[0].utilization_percent, 100);
}

TEST(NvidiaSmiTable, NoHeaderIsAnError) {
  auto r = parse_nvidia_smi_table(
      "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n");
  ASSERT_FALSE(r);
}

TEST(NvidiaSmiList, H200AndL4) {
  auto h = parse_nvidia_smi_list(slurp(fixtures_dir() / "h200-passthrough-vm/nvidia-smi.txt"));
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].name, "NVIDIA H200");
  EXPECT_EQ(h[0].uuid, "GPU-0108b095-397f-7583-e087-ade158522fa2");
  auto l =
      parse_nvidia_smi_list("GPU 0: NVIDIA L4 (UUID: GPU-69f37bdd-70f5-800e-2a0d-8249c9b1cb41)\n");
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].name, "NVIDIA L4");
}

// --- NVML

TEST(Nvml, AbsentLibraryFailsCleanly) {
  // No libnvidia-ml on this machine (and none under a simulated root).
  auto lib = NvmlLibrary::load({"libnvidia-ml.so.1"});
  ASSERT_FALSE(lib);
  EXPECT_EQ(lib.error().code, Errc::not_found);
  EXPECT_NE(lib.error().message.find("NVML is not installed"), std::string::npos)
      << lib.error().message;
  EXPECT_NE(lib.error().message.find("libnvidia-ml.so.1"), std::string::npos)
      << lib.error().message;

  factory::testing::TempDir dir("nvml");
  GuestEnv env;
  env.root = dir.path();
  auto cands = nvml_library_candidates(env);
  ASSERT_FALSE(cands.empty());
  for (const auto& c : cands) EXPECT_EQ(c.rfind(dir.path().string(), 0), 0u) << c;
  auto r = read_gpus_via_nvml(env);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::not_found);
}

TEST(Nvml, RealRootUsesTheDynamicLoader) {
  GuestEnv env;  // root "/"
  auto cands = nvml_library_candidates(env);
  ASSERT_EQ(cands.size(), 1u);
  EXPECT_EQ(cands[0], "libnvidia-ml.so.1");
}

TEST(Nvml, ReadsThroughAStandInLibrary) {
  factory::testing::TempDir dir("nvml");
  auto so = build_fake_nvml(dir.path(), fake_nvml_source());
  auto lib = NvmlLibrary::load({(dir.path() / "absent.so").string(), so});
  ASSERT_TRUE(lib) << lib.error().message;
  EXPECT_EQ((*lib)->path(), so);
  auto r = (*lib)->read();
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->source, "nvml");
  EXPECT_EQ(r->driver_version, "580.159.04");
  EXPECT_EQ(r->cuda_driver_version, "13.0");
  ASSERT_EQ(r->gpus.size(), 1u);
  const auto& g = r->gpus[0];
  EXPECT_EQ(g.name, "NVIDIA H200");
  EXPECT_EQ(g.uuid, "GPU-93c19784-9a89-60fe-0a12-f2f7720f62a2");
  EXPECT_EQ(g.pci_bus_id, "00000000:00:06.0");
  EXPECT_EQ(g.minor_number, 0);
  // nvidia-smi -q's FB Memory Usage: Total 143771, Reserved 616, Used 0, Free 143156.
  EXPECT_EQ(g.memory_total_mib, 143771u);
  EXPECT_EQ(g.memory_reserved_mib, 616u);
  EXPECT_EQ(g.memory_used_mib, 0u);
  EXPECT_EQ(g.memory_free_mib, 143156u);
  EXPECT_EQ(g.temperature_c, 35);
  EXPECT_EQ(g.memory_temperature_c, 33);
  EXPECT_EQ(g.utilization_percent, 0);
  EXPECT_EQ(g.memory_utilization_percent, 0);
  EXPECT_DOUBLE_EQ(g.power_draw_w.value_or(0), 121.85);
  EXPECT_DOUBLE_EQ(g.power_limit_w.value_or(0), 700);
  EXPECT_EQ(g.sm_clock_mhz, 525);
  EXPECT_EQ(g.memory_clock_mhz, 3201);
  EXPECT_EQ(g.pstate, "P0");
  EXPECT_EQ(g.ecc_errors_uncorrected_volatile, 0u);
  EXPECT_EQ(g.mig_mode, "Disabled");
  ASSERT_EQ(g.processes.size(), 1u);
  EXPECT_EQ(g.processes[0].pid, 4242u);
  EXPECT_EQ(g.processes[0].name, "python3");
  EXPECT_EQ(g.processes[0].used_memory_mib, 1024u);

  // The bytes behind the MiB, for the device check.
  nlohmann::json raw;
  ASSERT_TRUE((*lib)->read(&raw));
  EXPECT_EQ(raw[0]["memory"]["memory_v2_bytes"]["reserved"], 644939776ULL);
  EXPECT_EQ(raw[0]["memory"]["memory_v1_bytes"]["total"], 150754820096ULL);

  // Under a simulated root, the library is found in the root's lib directory.
  GuestEnv env;
  env.root = dir.path() / "root";
  install_fake_nvml(env.root, so);
  auto via_root = read_gpus_via_nvml(env);
  ASSERT_TRUE(via_root) << via_root.error().message;
  EXPECT_EQ(via_root->gpus.size(), 1u);
}

// The health probe keeps its NVML loaded (read_gpus_via_nvml) while the
// fault watcher loads and lets go of its own: NVML counts initializations
// and shuts down only at zero, so the watcher's nvmlShutdown leaves the
// probe's reads working. The stand-in once shut down at the first call, and
// FaultyCard.AnXid79IsReportedAtOnceAndKeptUntilAcknowledged failed on CI
// when a restarted agent's first sample ran after the old watcher let go.
TEST(Nvml, AHolderLettingGoLeavesTheOtherHoldersReadsWorking) {
  factory::testing::TempDir dir("nvml-holders");
  auto so = build_fake_nvml(dir.path(), fake_nvml_source());
  GuestEnv env;
  env.root = dir.path() / "root";
  install_fake_nvml(env.root, so);
  auto kept = read_gpus_via_nvml(env);
  ASSERT_TRUE(kept) << kept.error().message;
  {
    auto watcher = NvmlLibrary::load(nvml_library_candidates(env));
    ASSERT_TRUE(watcher) << watcher.error().message;
    ASSERT_TRUE((*watcher)->read());
  }
  auto after = read_gpus_via_nvml(env);
  ASSERT_TRUE(after) << after.error().message;
  EXPECT_EQ(after->gpus.size(), 1u);
}

// A driver older than R510 has no v2 memory info: used is v1's (reserved
// in it, as that driver's nvidia-smi showed it) and reserved stays unknown,
// never guessed; the figures such a driver lacks stay unknown too.
TEST(Nvml, WithoutV2MemoryInfoReservedIsUnknownNotGuessed) {
  factory::testing::TempDir dir("nvml");
  std::string src = fake_nvml_source("int nvmlDeviceGetMemoryInfo_v2");
  auto at = src.find("int nvmlDeviceGetFieldValues");
  src.erase(at, src.find('\n', at) - at);
  auto lib = NvmlLibrary::load({build_fake_nvml(dir.path(), src)});
  ASSERT_TRUE(lib) << lib.error().message;
  auto r = (*lib)->read();
  ASSERT_TRUE(r) << r.error().message;
  const auto& g = r->gpus.at(0);
  EXPECT_EQ(g.memory_total_mib, 143771u);
  // v1 counts the reserved 644939776 B as used (the old agent truncated it
  // to 615; rounded up as nvidia-smi rounds, 616).
  EXPECT_EQ(g.memory_used_mib, 616u) << "v1: reserved counted as used";
  EXPECT_FALSE(g.memory_reserved_mib);
  EXPECT_EQ(g.memory_free_mib, 143156u);
  EXPECT_FALSE(g.memory_temperature_c);
  EXPECT_EQ(g.temperature_c, 35);
}

TEST(Nvml, MissingSymbolIsNamed) {
  factory::testing::TempDir dir("nvml");
  auto so = build_fake_nvml(dir.path(), fake_nvml_source("int nvmlDeviceGetPciInfo_v3"));
  auto lib = NvmlLibrary::load({so});
  ASSERT_FALSE(lib);
  EXPECT_EQ(lib.error().code, Errc::failed_precondition);
  EXPECT_NE(lib.error().message.find("nvmlDeviceGetPciInfo_v3"), std::string::npos)
      << lib.error().message;
}

}  // namespace

// `nvidia-smi -q`'s fault figures on the real H200 (2026-12-01 capture,
// driver 580.159.04): what the device check compares the agent's NVML
// figures with. The H200 remaps rows and has no page retirement (N/A).
TEST(NvidiaSmiQFaults, TheH200CaptureAndTheComparison) {
  auto f = parse_nvidia_smi_q_faults(
      slurp(fixtures_dir() / "h200-passthrough-vm/2026-12-01/nvidia-smi-q.txt"));
  ASSERT_EQ(f.size(), 1u);
  const auto& g = f[0];
  EXPECT_FALSE(g.serial.empty());
  EXPECT_EQ(g.replays, 0u);
  EXPECT_EQ(g.reasons, 0x1u) << "Idle active, every other reason not";
  EXPECT_EQ(g.ecc_corrected_volatile, 0u);
  EXPECT_EQ(g.ecc_uncorrected_volatile, 0u);
  EXPECT_EQ(g.ecc_corrected_aggregate, 0u);
  EXPECT_EQ(g.ecc_uncorrected_aggregate, 0u);
  EXPECT_FALSE(g.retired_sbe);
  EXPECT_FALSE(g.retired_pending);
  EXPECT_EQ(g.remapped_correctable, 0u);
  EXPECT_EQ(g.remapped_uncorrectable, 0u);
  EXPECT_EQ(g.remapped_pending, false);
  EXPECT_EQ(g.remap_failure, false);

  // The agent's sample with the same figures agrees; one that invents a
  // figure nvidia-smi says N/A for, or is off by one replay, does not.
  nlohmann::json gpu = {{"serial", g.serial},
                        {"pcie_replay_count", 0},
                        {"clocks_event_reasons", 1},
                        {"ecc_errors_corrected_volatile", 0},
                        {"ecc_errors_uncorrected_volatile", 0},
                        {"ecc_errors_corrected_aggregate", 0},
                        {"ecc_errors_uncorrected_aggregate", 0},
                        {"retired_pages_sbe", nullptr},
                        {"retired_pages_dbe", nullptr},
                        {"retired_pages_pending", nullptr},
                        {"remapped_rows_correctable", 0},
                        {"remapped_rows_uncorrectable", 0},
                        {"remapped_rows_pending", false},
                        {"remapped_rows_failure", false}};
  nlohmann::json agent = {{"gpu", {{"gpus", {gpu}}}}};
  SmiComparison same;
  compare_faults(same, agent, f);
  EXPECT_EQ(same.checks.size(), 14u);
  EXPECT_TRUE(same.ok()) << same.to_text();
  agent["gpu"]["gpus"][0]["retired_pages_sbe"] = 0;
  agent["gpu"]["gpus"][0]["pcie_replay_count"] = 1;
  SmiComparison differ;
  compare_faults(differ, agent, f);
  int bad = 0;
  for (const auto& c : differ.checks) bad += c.ok ? 0 : 1;
  EXPECT_EQ(bad, 2) << differ.to_text();
}

// The device run of 2026-12-03 (tests/fixtures/device/h200-2026-12-03-faults,
// the real NVML of driver 580.159.04 on an H200): the agent's fault figures
// agree with `nvidia-smi -q` read in the same run, every one both report.
TEST(NvidiaSmiQFaults, TheH200DeviceRunAgrees) {
  const auto dir = factory::testing::source_dir() / "tests/fixtures/device/h200-2026-12-03-faults";
  auto agent = nlohmann::json::parse(slurp(dir / "agent-health.json"));
  auto q = parse_nvidia_smi_q_faults(slurp(dir / "nvidia-smi-q.txt"));
  ASSERT_EQ(q.size(), 1u);
  SmiComparison c;
  compare_faults(c, agent, q);
  EXPECT_EQ(c.checks.size(), 14u);
  EXPECT_TRUE(c.ok()) << c.to_text();
  const auto& g = agent["gpu"]["gpus"][0];
  EXPECT_EQ(g["serial"], q[0].serial);
  EXPECT_TRUE(g["retired_pages_sbe"].is_null()) << "N/A on Hopper: unknown, never 0";
  EXPECT_GT(g["energy_mj"].get<std::uint64_t>(), 0u);
}

}  // namespace factory::agent
