// The health sample (contract/health_sample.hpp): what the agent sends reads
// back the same; what a hostile guest sends is cut down to what the rules
// allow, field by field, with every drop counted by reason.
#include "contract/health_sample.hpp"

#include <gtest/gtest.h>

#include <regex>

namespace proto = factory::proto;
using nlohmann::json;

namespace {

proto::HealthSample h200_sample() {
  proto::HealthSample h;
  h.time = "2026-12-01T10:00:00Z";
  h.hostname = "vm";
  h.plan_hash = std::string(64, 'a');
  h.gpu.source = "nvml";
  h.gpu.driver_version = "580.159.04";
  h.gpu.cuda_driver_version = "13.0";
  proto::GpuSample g;
  g.name = "NVIDIA H200";
  g.uuid = "GPU-93c19784-9a89-60fe-0a12-f2f7720f62a2";
  g.pci_bus_id = "00000000:00:06.0";
  g.minor_number = 0;
  g.memory_total_mib = 143771;
  g.memory_reserved_mib = 616;
  g.memory_used_mib = 0;
  g.memory_free_mib = 143156;
  g.utilization_percent = 0;
  g.memory_utilization_percent = 0;
  g.temperature_c = 35;
  g.memory_temperature_c = 33;
  g.power_draw_w = 121.85;
  g.power_limit_w = 700;
  g.sm_clock_mhz = 525;
  g.memory_clock_mhz = 3201;
  g.pstate = "P0";
  g.ecc_errors_uncorrected_volatile = 0;
  g.mig_mode = "Disabled";
  proto::GpuProcessSample p;
  p.pid = 4242;
  p.name = "/usr/bin/python3";
  p.used_memory_mib = 1024;
  g.processes.push_back(p);
  h.gpu.gpus.push_back(g);
  proto::OllamaSection o;
  o.version = "0.40.2";
  o.models.push_back({"llama3.2:1b", 2000, 2000, 100, 4096, "2026-12-01T10:05:00Z"});
  h.ollama = o;
  return h;
}

json roundtrip(const json& in, proto::Rejections& rejects) {
  auto d = proto::decode_health_sample(in);
  rejects = d.rejected;
  return d.value ? d.value->to_json() : json();
}

using proto::RejectReason;

}  // namespace

TEST(HealthSample, WhatTheAgentSendsReadsBackTheSame) {
  json sent = h200_sample().to_json();
  proto::Rejections rejects;
  EXPECT_EQ(roundtrip(sent, rejects), sent);
  EXPECT_TRUE(rejects.empty());
  // Unknown keys are a newer agent's: ignored, not counted.
  json newer = sent;
  newer["gpu"]["gpus"][0]["fan_percent"] = 30;
  newer["thermals"] = {{"x", 1}};
  EXPECT_EQ(roundtrip(newer, rejects), sent);
  EXPECT_TRUE(rejects.empty());
  // Unknown values stay unknown (null), never zero.
  EXPECT_TRUE(sent["gpu"]["gpus"][0].contains("memory_reserved_mib"));
  proto::HealthSample blank;
  json b = blank.to_json();
  EXPECT_EQ(b["gpu"]["source"], "none");
  EXPECT_TRUE(b["gpu"]["driver_version"].is_null());
  EXPECT_FALSE(b.contains("ollama"));
}

// to_text() writes the bytes without a tree (the coordinator's feed and
// store take every sample): the same JSON value as to_json() for every
// section, every optional key present and absent.
TEST(HealthSample, TheTextIsTheSameValueAsTheTree) {
  proto::HealthSample full = h200_sample();
  auto& g = full.gpu.gpus[0];
  g.serial = "1654123456789";
  g.lost = true;
  g.ecc_errors_corrected_volatile = 3;
  g.remapped_rows_pending = true;
  g.remapped_rows_failure = false;
  g.retired_pages_dbe = 2;
  g.pcie_replay_count = 17;
  g.clocks_event_reasons = proto::clocks_event::kSwPowerCap | proto::clocks_event::kGpuIdle;
  g.energy_mj = 123456789;
  g.nvlink = proto::NvlinkSample{18, 0, 1, std::nullopt, 4};
  g.mig_instances.push_back({"1g.18gb", 16.0, "MIG-6c1d8c5e-0f0b-5a8e-9b7c-0c1b2a3d4e5f"});
  g.xids.push_back({79, 2, "2026-12-01T09:00:00Z", "2026-12-01T09:30:00Z"});
  g.processes.push_back({7, "caf\xc3\xa9 \"worker\"", std::nullopt});
  proto::GpuSample second;
  second.index = 1;
  full.gpu.gpus.push_back(second);
  full.gpu.via = "chroot /run/nvidia/driver";
  full.gpu.diagnoses.push_back({"gpu_xid_79", "GPU has fallen off the bus",
                                "factory host quarantine", json{{"impact", "card"}, {"xid", 79}}});
  full.ollama->error = "model not loaded";
  full.ollama->diagnoses.push_back({"ollama_down", "s", "f", json::object()});
  proto::K8sSection k;
  k.allocatable = 10;
  k.nodes.push_back({"node-1", true, 10, 10, "on"});
  k.pods.push_back({"default", "pod", "Running", "ok", "node-1", 1, 4096, std::nullopt});
  k.diagnoses.push_back({"k8s_x", "s", "f", json{{"n", 1}}});
  full.k8s = k;
  proto::EndpointSection e;
  e.serving = true;
  e.requests = 9;
  e.certificate_expires_at = "2027-01-01T00:00:00Z";
  e.probe = proto::ProbeSample{"llama3.2:1b", false, 12.5, std::nullopt, "", "timed out"};
  full.endpoint = e;

  proto::HealthSample no_probe = full;
  no_probe.endpoint->probe.reset();
  proto::HealthSample failed;
  failed.gpu.error = "nvidia-smi: not found";

  proto::HealthSample blank;
  for (const auto* h : {&full, &no_probe, &failed, &blank}) {
    std::string text = h->to_text();
    EXPECT_EQ(json::parse(text), h->to_json()) << text;
  }
  EXPECT_TRUE(json::parse(no_probe.to_text())["endpoint"]["probe"].is_null());
  // Every section and optional key of the list made it into the tree.
  json t = full.to_json();
  for (const char* key : {"time", "hostname", "plan_hash", "gpu", "ollama", "k8s", "endpoint"})
    EXPECT_TRUE(t.contains(key)) << key;
  EXPECT_EQ(t["gpu"]["gpus"][0].size(), 39u) << t["gpu"]["gpus"][0].dump();
  EXPECT_EQ(t["gpu"]["gpus"][1].size(), 37u) << "no nvlink, no MIG instances";
  EXPECT_EQ(t["gpu"]["via"], "chroot /run/nvidia/driver");
  EXPECT_EQ(t["gpu"]["diagnoses"][0]["details"]["xid"], 79);
  EXPECT_EQ(t["ollama"]["error"], "model not loaded");
  EXPECT_EQ(t["endpoint"]["probe"]["error"], "timed out");
  EXPECT_FALSE(json::parse(failed.to_text())["gpu"].contains("diagnoses"));
}

// The coded fields' formats, written out by hand, are exactly the regular
// expressions they replaced: every string of up to four characters over an
// alphabet of each format's edges, and the length limits.
TEST(HealthSample, HandWrittenFormatsAreTheirRegularExpressions) {
  namespace f = proto::health_formats;
  struct Format {
    const char* name;
    std::regex re;
    bool (*check)(std::string_view);
  };
  const std::vector<Format> formats = {
      {"diagnosis_code", std::regex("^[a-z][a-z0-9_]{0,63}$"), f::diagnosis_code},
      {"pstate", std::regex("^P([0-9]|1[0-5])$"), f::pstate},
      {"mig_uuid", std::regex("^MIG-[0-9A-Za-z-]{1,60}$"), f::mig_uuid},
      {"k8s_resource", std::regex("^[A-Za-z0-9.-]+/[A-Za-z0-9_.-]+$"), f::k8s_resource},
  };
  const std::string alphabet = "azAZ0159_-./PMIG \n\xc3";
  std::vector<std::string> inputs = {"",
                                     "MIG-",
                                     "MIG-a",
                                     "MIG-6c1d8c5e-0f0b",
                                     "nvidia.com/gpu",
                                     "P16",
                                     "P01",
                                     "P10",
                                     "P15",
                                     "a/b/c",
                                     "/gpu",
                                     "nvidia.com/",
                                     "gpu_xid_79",
                                     "ollama_not_answering"};
  for (std::size_t len = 1; len <= 4; ++len) {
    std::vector<std::size_t> at(len, 0);
    for (;;) {
      std::string x;
      for (auto i : at) x += alphabet[i];
      inputs.push_back(x);
      std::size_t k = 0;
      while (k < len && ++at[k] == alphabet.size()) at[k++] = 0;
      if (k == len) break;
    }
  }
  for (std::size_t n : {63, 64, 65}) inputs.push_back("a" + std::string(n - 1, 'b'));
  for (std::size_t n : {59, 60, 61}) inputs.push_back("MIG-" + std::string(n, 'A'));
  std::size_t accepted = 0;
  for (const auto& fmt : formats)
    for (const auto& x : inputs) {
      bool want = std::regex_match(x, fmt.re);
      accepted += want;
      ASSERT_EQ(fmt.check(x), want) << fmt.name << " on \"" << x << "\"";
    }
  EXPECT_GT(accepted, 1000u) << "the inputs reach both sides of every format";
}

TEST(HealthSample, BadFieldsAreDroppedAndCountedByReason) {
  json in = h200_sample().to_json();
  auto& g = in["gpu"]["gpus"][0];
  g["utilization_percent"] = 250;                 // out_of_range
  g["temperature_c"] = "hot";                     // wrong_type
  g["name"] = "NVIDIA \x1b]2;pwned\x07 H200";     // bad_format: a terminal escape
  g["uuid"] = std::string(200, 'u');              // too_long
  g["memory_used_mib"] = -5;                      // out_of_range
  g["power_draw_w"] = 1e9;                        // out_of_range
  g["pstate"] = "P99";                            // bad_format
  g["mig_mode"] = "Sometimes";                    // unknown_value
  in["ollama"]["models"][0]["size_vram"] = 5000;  // more on the GPU than the model: capped
  in["gpu"]["diagnoses"] =
      json::array({{{"code", "Not A Code!"}, {"summary", "x"}},
                   {{"code", "ok_code"}, {"summary", "fine"}, {"fix", "none"}}});
  auto decoded = proto::decode_health_sample(in);
  ASSERT_TRUE(decoded.value);
  const proto::HealthSample& h = *decoded.value;
  const proto::Rejections& rejects = decoded.rejected;
  const auto& r = h.gpu.gpus.at(0);
  EXPECT_FALSE(r.utilization_percent);
  EXPECT_FALSE(r.temperature_c);
  EXPECT_EQ(r.name, "");
  EXPECT_EQ(r.uuid, "");
  EXPECT_FALSE(r.memory_used_mib);
  EXPECT_FALSE(r.power_draw_w);
  EXPECT_EQ(r.pstate, "");
  EXPECT_EQ(r.mig_mode, "");
  // What was fine is kept.
  EXPECT_EQ(r.memory_total_mib, 143771u);
  EXPECT_EQ(r.memory_reserved_mib, 616u);
  EXPECT_EQ(r.pci_bus_id, "00000000:00:06.0");
  EXPECT_EQ(h.ollama->models.at(0).size_vram, 2000u);
  ASSERT_EQ(h.gpu.diagnoses.size(), 1u);
  EXPECT_EQ(h.gpu.diagnoses[0].code, "ok_code");
  // One vocabulary with every other message's reader (guest_input.hpp).
  EXPECT_EQ(rejects.count(RejectReason::out_of_range), 4u);
  EXPECT_EQ(rejects.count(RejectReason::wrong_type), 1u);
  EXPECT_EQ(rejects.count(RejectReason::bad_format), 3u);  // name, pstate, diagnosis code
  EXPECT_EQ(rejects.count(RejectReason::unknown_value), 1u);
  EXPECT_EQ(rejects.count(RejectReason::too_long), 1u);
  EXPECT_EQ(rejects.total(), 10u);
  ASSERT_FALSE(rejects.kept().empty());
  EXPECT_EQ(rejects.kept()[0].field, "gpu.gpus[0].name");
  EXPECT_EQ(rejects.kept()[0].reason, RejectReason::bad_format);
  // Nothing of the guest's text reaches the names of the fields dropped.
  for (const auto& f : rejects) EXPECT_EQ(f.field.find("pwned"), std::string::npos) << f.field;
}

TEST(HealthSample, ListsAreCutToTheirCaps) {
  json in = h200_sample().to_json();
  json gpus = json::array();
  for (int i = 0; i < 40; ++i) {
    json g = in["gpu"]["gpus"][0];
    g["index"] = i % 64;
    gpus.push_back(g);
  }
  gpus.push_back("not a gpu");
  in["gpu"]["gpus"] = gpus;
  json procs = json::array();
  for (int i = 1; i <= 500; ++i) procs.push_back({{"pid", i}, {"name", "p"}});
  in["gpu"]["gpus"][0]["processes"] = procs;
  auto d = proto::decode_health_sample(in);
  ASSERT_TRUE(d.value);
  EXPECT_EQ(d.value->gpu.gpus.size(), proto::health_limits::kGpus);
  EXPECT_EQ(d.value->gpu.gpus[0].processes.size(), proto::health_limits::kProcesses);
  EXPECT_EQ(d.rejected.count(RejectReason::too_many), 2u);
}

TEST(HealthSample, WhatIsNotASampleIsRejectedWhole) {
  auto whole = proto::decode_health_sample(json::array({1, 2}));
  EXPECT_FALSE(whole.value);
  EXPECT_FALSE(whole.refusal.empty());
  EXPECT_EQ(whole.rejected.count(RejectReason::wrong_type), 1u);
  auto d = proto::decode_health_sample({{"gpu", "everything is fine"}, {"k8s", 7}});
  ASSERT_TRUE(d.value);
  EXPECT_EQ(d.rejected.count(RejectReason::wrong_type), 2u);
  EXPECT_EQ(d.value->gpu.source, "none");
  EXPECT_FALSE(d.value->k8s);
}

TEST(HealthSample, TheAgentClipsItsOwnSampleToWhatIsAccepted) {
  proto::HealthSample h = h200_sample();
  // A process name with a control character and cut inside a UTF-8 character.
  std::string name = "worker\x01" + std::string(200, 'x') + "\xc3\xa9";
  h.gpu.gpus[0].processes[0].name = name;
  h.gpu.gpus[0].name = std::string(127, 'n') + "\xc3\xa9";  // 129 bytes: the é would be cut
  h.gpu.error = "bad byte \xff here";
  for (int i = 0; i < 100; ++i)
    h.gpu.diagnoses.push_back({"code_" + std::to_string(i), "s", "f", {}});
  proto::make_sendable(h);
  EXPECT_EQ(h.gpu.gpus[0].name, std::string(127, 'n'));
  EXPECT_EQ(h.gpu.gpus[0].processes[0].name.substr(0, 8), "worker?x");
  EXPECT_EQ(h.gpu.error, "bad byte ? here");
  EXPECT_EQ(h.gpu.diagnoses.size(), proto::health_limits::kDiagnoses);
  auto clipped = proto::decode_health_sample(h.to_json());
  EXPECT_TRUE(clipped.rejected.empty()) << clipped.rejected.total();

  // Too big for a frame: the per-process lists go first.
  proto::HealthSample big = h200_sample();
  for (int g = 1; g < 16; ++g) big.gpu.gpus.push_back(big.gpu.gpus[0]);
  proto::GpuProcessSample p;
  p.name.assign(120, 'p');
  p.used_memory_mib = 1;
  for (auto& g : big.gpu.gpus)
    for (int i = 0; i < 63; ++i) {
      p.pid = static_cast<uint32_t>(i + 10);
      g.processes.push_back(p);
    }
  ASSERT_GT(big.to_json().dump().size(), proto::health_limits::kSampleBytes);
  proto::make_sendable(big);
  EXPECT_LE(big.to_json().dump().size(), proto::health_limits::kSampleBytes);
  EXPECT_EQ(big.gpu.gpus.size(), 16u);
  EXPECT_TRUE(big.gpu.gpus[0].processes.empty());
  EXPECT_EQ(big.gpu.gpus[0].memory_reserved_mib, 616u);
}

TEST(HealthSample, CleanTextRefusesControlCharacters) {
  EXPECT_TRUE(proto::is_clean_text("NVIDIA H200", 64));
  EXPECT_TRUE(proto::is_clean_text("llama3.2:1b é", 64));
  EXPECT_FALSE(proto::is_clean_text("a\nb", 64));
  EXPECT_FALSE(proto::is_clean_text("a\x1b[31mb", 64));
  EXPECT_FALSE(proto::is_clean_text("a\x7f", 64));
  EXPECT_FALSE(
      proto::is_clean_text("a\xc2\x9b"
                           "31m",
                           64));  // C1 CSI
  EXPECT_FALSE(proto::is_clean_text(std::string(65, 'a'), 64));
}

TEST(HealthSample, MigSlicesReadBackAndHostileOnesAreDropped) {
  proto::HealthSample h = h200_sample();
  auto& g = h.gpu.gpus.at(0);
  g.mig_mode = "Enabled";
  for (int i = 0; i < 7; ++i)
    g.mig_instances.push_back(
        {"1g.18gb", 16.0, "MIG-1f2b7c6e-1a59-5d2e-9c14-2a8e3f6b0c0" + std::to_string(i)});
  json sent = h.to_json();
  proto::Rejections rejects;
  EXPECT_EQ(roundtrip(sent, rejects), sent);
  EXPECT_TRUE(rejects.empty());
  EXPECT_EQ(sent["gpu"]["gpus"][0]["mig_instances"].size(), 7u);
  // A GPU without slices sends no mig_instances at all (older readers see no change).
  EXPECT_FALSE(h200_sample().to_json()["gpu"]["gpus"][0].contains("mig_instances"));

  json bad = sent;
  auto& list = bad["gpu"]["gpus"][0]["mig_instances"];
  list[0]["profile"] = "1g.18gb; reboot";                // not a profile: the slice is dropped
  list[1]["uuid"] = "GPU-not-a-mig-device\nfake";        // bad text / not a MIG UUID
  list[2]["memory_gib"] = 1e9;                           // out of range
  for (int i = 0; i < 10; ++i) list.push_back(list[3]);  // more than any card has
  auto back = proto::decode_health_sample(bad);
  ASSERT_TRUE(back.value);
  const auto& m = back.value->gpu.gpus.at(0).mig_instances;
  EXPECT_EQ(m.size(), proto::health_limits::kMigInstances - 1);
  EXPECT_EQ(m[0].uuid, "");
  EXPECT_FALSE(m[1].memory_gib);
  EXPECT_FALSE(back.rejected.empty());
}

// A broken card's figures (issue 25): what the agent sends reads back the
// same, and what a hostile guest sends in their place is dropped field by
// field, counted, never shown.
TEST(HealthSample, FaultFiguresReadBackAndHostileOnesAreDropped) {
  proto::HealthSample h = h200_sample();
  auto& g = h.gpu.gpus[0];
  g.ecc_errors_corrected_volatile = 10;
  g.ecc_errors_corrected_aggregate = 20;
  g.ecc_errors_uncorrected_aggregate = 2;
  g.remapped_rows_correctable = 3;
  g.remapped_rows_uncorrectable = 1;
  g.remapped_rows_pending = true;
  g.remapped_rows_failure = false;
  g.pcie_replay_count = 77;
  g.clocks_event_reasons = proto::clocks_event::kHwThermalSlowdown;
  g.energy_mj = 987654321012;
  g.nvlink = proto::NvlinkSample{18, 1, 2, 3, 4};
  g.xids.push_back({13, 2, "2026-12-01T09:00:00Z", "2026-12-01T09:30:00Z"});
  g.xids.push_back({79, 1, "2026-12-01T09:10:00Z", "2026-12-01T09:10:00Z"});
  json sent = h.to_json();
  proto::Rejections rejects;
  EXPECT_EQ(roundtrip(sent, rejects), sent);
  EXPECT_TRUE(rejects.empty());
  EXPECT_EQ(g.last_xid(), 13) << "13 was seen last, at 09:30";
  EXPECT_TRUE(sent["gpu"]["gpus"][0]["retired_pages_sbe"].is_null()) << "unknown stays null";
  EXPECT_FALSE(h200_sample().to_json()["gpu"]["gpus"][0].contains("nvlink"))
      << "only a card with links";

  json bad = sent;
  json& b = bad["gpu"]["gpus"][0];
  b["lost"] = "yes";
  b["ecc_errors_corrected_volatile"] = -1;
  b["remapped_rows_correctable"] = 1e12;
  b["remapped_rows_pending"] = 1;
  b["pcie_replay_count"] = 1ULL << 40;
  b["clocks_event_reasons"] = 1ULL << 40;
  b["energy_mj"] = 1e300;
  b["nvlink"] = "lots";
  b["xids"] = json::array({{{"xid", 1000}, {"count", 1}},
                           {{"xid", 48}, {"count", 0}, {"last_at", "yesterday\u001b[2J"}},
                           {{"xid", 63}, {"first_at", "not a time"}},
                           "79"});
  auto back = proto::decode_health_sample(bad);
  ASSERT_TRUE(back.value);
  const proto::Rejections& r = back.rejected;
  const auto& x = back.value->gpu.gpus[0];
  EXPECT_FALSE(x.lost);
  EXPECT_FALSE(x.ecc_errors_corrected_volatile);
  EXPECT_FALSE(x.remapped_rows_correctable);
  EXPECT_FALSE(x.remapped_rows_pending);
  EXPECT_FALSE(x.pcie_replay_count);
  EXPECT_FALSE(x.clocks_event_reasons);
  EXPECT_FALSE(x.energy_mj);
  EXPECT_FALSE(x.nvlink);
  ASSERT_EQ(x.xids.size(), 2u) << "Xid 1000 and the string are no Xids";
  EXPECT_EQ(x.xids[0].xid, 48);
  EXPECT_EQ(x.xids[0].count, 1u) << "a count out of range reads as once";
  EXPECT_EQ(x.xids[0].last_at, "") << "a control character is no time";
  EXPECT_EQ(x.xids[1].first_at, "");
  EXPECT_EQ(x.remapped_rows_uncorrectable, 1u) << "the rest of the card is kept";
  EXPECT_GE(r.count(RejectReason::wrong_type), 6u);
  EXPECT_GE(r.count(RejectReason::out_of_range), 5u);
  EXPECT_GE(r.count(RejectReason::bad_format), 2u);

  // More Xids than a sample carries: the agent keeps the most recent.
  proto::HealthSample many = h200_sample();
  for (int i = 0; i < 20; ++i) many.gpu.gpus[0].xids.push_back({100 + i, 1, "", ""});
  proto::make_sendable(many);
  ASSERT_EQ(many.gpu.gpus[0].xids.size(), proto::health_limits::kXids);
  EXPECT_EQ(many.gpu.gpus[0].xids.front().xid, 104);
}
