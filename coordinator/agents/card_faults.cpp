#include "coordinator/agents/card_faults.hpp"

#include <algorithm>

#include "contract/xid_catalog.hpp"

namespace factory::coordinator {

using nlohmann::json;

namespace {

std::string text(const json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// The diagnosis for this code on this GPU (its details name the GPU), else
// the first with the code; null when the agent sent none.
const proto::DiagnosisSample* diagnosis_for(const proto::GpuSection& gpu, const std::string& code,
                                            int index, const std::string& uuid) {
  const proto::DiagnosisSample* any = nullptr;
  for (const auto& d : gpu.diagnoses) {
    if (d.code != code) continue;
    // details is the one free-form part of a diagnosis (bounded and clean
    // by the sample's reader): the agent names the GPU there.
    const json& det = d.details;
    if (det.is_object() && ((!uuid.empty() && text(det, "uuid") == uuid) ||
                            (uuid.empty() && det.value("gpu", -1) == index)))
      return &d;
    if (!any) any = &d;
  }
  return any;
}

}  // namespace

json CardFault::to_json() const {
  json j = {{"gpu", gpu_index},
            {"uuid", uuid},
            {"serial", serial},
            {"name", name},
            {"pci_bus_id", pci_bus_id},
            {"kind", kind},
            {"code", code},
            {"summary", summary},
            {"fix", fix},
            {"first_seen", seen_at}};
  if (kind == "xid") j["xid"] = xid;
  return j;
}

std::vector<CardFault> card_faults(const store::LatestHealth& health) {
  std::vector<CardFault> out;
  const proto::GpuSection& section = health.sample.gpu;
  for (const auto& g : section.gpus) {
    CardFault base;
    base.gpu_index = g.index;
    base.uuid = g.uuid;
    base.serial = g.serial;
    base.name = g.name;
    base.pci_bus_id = g.pci_bus_id;
    base.seen_at = health.received_at;
    const std::string who = base.uuid.empty() ? "gpu" + std::to_string(base.gpu_index) : base.uuid;
    auto add = [&](const std::string& kind, int xid, const std::string& code) {
      CardFault f = base;
      f.kind = kind;
      f.xid = xid;
      f.key = who + "/" + (kind == "xid" ? "xid-" + std::to_string(xid) : kind);
      f.code = code;
      if (const auto* d = diagnosis_for(section, code, f.gpu_index, f.uuid)) {
        f.summary = d->summary;
        f.fix = d->fix;
      }
      out.push_back(std::move(f));
    };
    if (g.lost) add("lost", 0, "gpu_lost");
    if (g.remapped_rows_failure.value_or(false))
      add("row_remap_failure", 0, "gpu_row_remap_failure");
    for (const auto& x : g.xids)
      if (gpu::xid_faults_card(x.xid)) add("xid", x.xid, "gpu_xid_" + std::to_string(x.xid));
  }
  return out;
}

std::vector<CardFault> record_card_faults(json& status, const std::vector<CardFault>& faults) {
  if (!status.is_object()) status = json::object();
  json& book = status["gpu_faults"];
  if (!book.is_object()) book = json::object();
  std::vector<CardFault> fresh;
  for (const auto& f : faults) {
    if (book.contains(f.key)) continue;
    book[f.key] = f.to_json();
    fresh.push_back(f);
  }
  while (book.size() > kMaxCardFaultRecords) {
    std::string oldest;
    std::string oldest_at;
    for (auto& [k, v] : book.items()) {
      std::string at = v.is_object() ? v.value("first_seen", "") : "";
      if (oldest.empty() || at < oldest_at) {
        oldest = k;
        oldest_at = at;
      }
    }
    book.erase(oldest);
  }
  return fresh;
}

}  // namespace factory::coordinator
