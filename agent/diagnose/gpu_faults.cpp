#include "agent/diagnose/gpu_faults.hpp"

#include <algorithm>

namespace factory::agent {

using nlohmann::json;
namespace ce = proto::clocks_event;

namespace {

// "GPU 0 (GPU-93c19784..., 00000000:00:06.0)"
std::string which(const proto::GpuSample& g) {
  std::string id;
  if (!g.uuid.empty()) id = g.uuid;
  if (!g.pci_bus_id.empty()) id += (id.empty() ? "" : ", ") + g.pci_bus_id;
  return "GPU " + std::to_string(g.index) + (id.empty() ? "" : " (" + id + ")");
}

json identity(const proto::GpuSample& g) {
  return {{"gpu", g.index}, {"uuid", g.uuid}, {"pci_bus_id", g.pci_bus_id}};
}

// The fix as one line with both parts; both also in details, whole.
std::string both(const std::string& customer, const std::string& admin) {
  return "customer: " + customer + ". admin: " + admin;
}

Diagnosis make(const std::string& code, const proto::GpuSample& g, const std::string& summary,
               const std::string& customer, const std::string& admin, const std::string& impact,
               json extra = json::object()) {
  json details = identity(g);
  details["impact"] = impact;
  details["customer"] = customer;
  details["admin"] = admin;
  for (auto& [k, v] : extra.items()) details[k] = v;
  return {code, summary, both(customer, admin), std::move(details)};
}

std::string times(std::uint64_t n) {
  return n == 1 ? "once" : std::to_string(n) + " times";
}

}  // namespace

Diagnosis diagnose_xid(const proto::GpuSample& g, const proto::XidSample& x) {
  json extra = {
      {"xid", x.xid}, {"count", x.count}, {"first_at", x.first_at}, {"last_at", x.last_at}};
  std::string seen = times(x.count) + (x.last_at.empty() ? "" : ", last at " + x.last_at);
  const gpu::XidEntry* e = gpu::find_xid(x.xid);
  if (!e) {
    extra["catalog"] = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html";
    return make("gpu_xid_unlisted", g,
                which(g) + " reported Xid " + std::to_string(x.xid) + " (" + seen +
                    "), which Factory's table does not name",
                "if a program failed, restart it",
                "look the Xid up in NVIDIA's Xid catalog and act on its resolution bucket; "
                "`factory-agent faults ack` in the guest clears it once handled",
                "unknown", std::move(extra));
  }
  extra["mnemonic"] = std::string(e->mnemonic);
  extra["nvidia_action"] = std::string(e->nvidia_action);
  std::string meaning;
  switch (e->impact) {
    case gpu::XidImpact::application:
      meaning = "a program failed; the card is healthy";
      break;
    case gpu::XidImpact::watch:
      meaning = "the card works; it wants a reset when convenient";
      break;
    case gpu::XidImpact::card:
      meaning = "the card needs the admin before it is trusted again";
      break;
  }
  return make("gpu_xid_" + std::to_string(x.xid), g,
              which(g) + " reported Xid " + std::to_string(x.xid) + " (" +
                  std::string(e->description) + ", " + seen + "): " + meaning,
              std::string(e->customer), std::string(e->admin),
              std::string(gpu::impact_name(e->impact)), std::move(extra));
}

std::vector<Diagnosis> diagnose_gpu_faults(const proto::GpuSample& g) {
  std::vector<Diagnosis> out;
  if (g.lost)
    out.push_back(make(
        "gpu_lost", g,
        which(g) +
            " is lost: NVML answers NVML_ERROR_GPU_IS_LOST (the card fell off the bus; Xid 79)",
        "nothing in the VM can reach the card: wait for the admin to move you to a healthy card",
        "quarantine the card (`factory host quarantine --pci ADDR --reason ...`), move the tenant "
        "to a healthy card (docs/gpu-faults.md), then reboot the node and read its kernel log for "
        "PCIe errors; if it recurs, contact NVIDIA support",
        "card"));
  bool explained_ecc = false;
  for (const auto& x : g.xids) {
    out.push_back(diagnose_xid(g, x));
    explained_ecc |= x.xid == 48 || x.xid == 94 || x.xid == 95;
  }
  if (g.remapped_rows_failure.value_or(false))
    out.push_back(make(
        "gpu_row_remap_failure", g,
        which(g) + " could not remap a failing memory row (row remapping failure; " +
            std::to_string(g.remapped_rows_uncorrectable.value_or(0)) +
            " rows remapped for uncorrectable errors)",
        "restart your programs once the admin has reset the card or moved you to a healthy one",
        "quarantine the card, move the tenant to a healthy card and reset the card; "
        "if the failure stays after the reset (`nvidia-smi -q -d ROW_REMAPPER`), contact NVIDIA "
        "support for a replacement",
        "card"));
  else if (g.remapped_rows_pending.value_or(false))
    out.push_back(make("gpu_row_remap_pending", g,
                       which(g) + " has a memory row remapping that takes effect at its next reset",
                       "nothing: the card works until then",
                       "reset the card at a convenient time (quarantine, reset, release)",
                       "watch"));
  if (!explained_ecc && g.ecc_errors_uncorrected_volatile.value_or(0) > 0)
    out.push_back(
        make("gpu_ecc_uncorrected", g,
             which(g) + " counted " + std::to_string(*g.ecc_errors_uncorrected_volatile) +
                 " uncorrectable ECC errors since its driver loaded",
             "restart programs that failed; their results since then may be wrong",
             "read `nvidia-smi -q -d ECC,ROW_REMAPPER` in the guest; reset the card (quarantine, "
             "reset, release) and contact NVIDIA support if the count grows",
             "watch", {{"ecc_errors_uncorrected_volatile", *g.ecc_errors_uncorrected_volatile}}));
  const std::uint64_t reasons = g.clocks_event_reasons.value_or(0);
  if (reasons & (ce::kSwThermalSlowdown | ce::kHwThermalSlowdown)) {
    std::string temp = g.temperature_c ? ", " + std::to_string(*g.temperature_c) + " C" : "";
    out.push_back(make(
        "gpu_thermal_slowdown", g,
        which(g) + " runs at reduced clocks to cool down (" +
            std::string(reasons & ce::kHwThermalSlowdown ? "hardware" : "software") +
            " thermal slowdown" + temp + ")",
        "expect slower work until it cools; nothing to change in the VM",
        "check the host's cooling: airflow, fans and inlet temperature of the node", "watch",
        {{"clocks_event_reasons", reasons & (ce::kSwThermalSlowdown | ce::kHwThermalSlowdown)}}));
  }
  if (reasons & (ce::kHwSlowdown | ce::kHwPowerBrakeSlowdown))
    out.push_back(
        make("gpu_power_slowdown", g,
             which(g) + " runs at reduced clocks by hardware (" +
                 std::string(reasons & ce::kHwPowerBrakeSlowdown ? "power brake" : "HW slowdown") +
                 "): the board's power supply or temperature forced it",
             "expect slower work; nothing to change in the VM",
             "check the node's power supplies and the card's power cables; if it persists with "
             "healthy power, contact the hardware vendor",
             "watch",
             {{"clocks_event_reasons", reasons & (ce::kHwSlowdown | ce::kHwPowerBrakeSlowdown)}}));
  return out;
}

}  // namespace factory::agent
