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
json diagnosis_for(const json& health, const std::string& code, int index,
                   const std::string& uuid) {
  if (!health.is_object() || !health.contains("gpu") || !health["gpu"].is_object()) return nullptr;
  const json& gpu = health["gpu"];
  if (!gpu.contains("diagnoses") || !gpu["diagnoses"].is_array()) return nullptr;
  json any;
  for (const auto& d : gpu["diagnoses"]) {
    if (!d.is_object() || text(d, "code") != code) continue;
    const json& det = d.contains("details") ? d["details"] : json();
    if (det.is_object() && ((!uuid.empty() && text(det, "uuid") == uuid) ||
                            (uuid.empty() && det.value("gpu", -1) == index)))
      return d;
    if (any.is_null()) any = d;
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

std::vector<CardFault> card_faults(const json& health) {
  std::vector<CardFault> out;
  if (!health.is_object() || !health.contains("gpu") || !health["gpu"].is_object()) return out;
  const std::string seen_at = text(health, "received_at");
  for (const auto& g : health["gpu"].value("gpus", json::array())) {
    if (!g.is_object()) continue;
    CardFault base;
    base.gpu_index = g.value("index", 0);
    base.uuid = text(g, "uuid");
    base.serial = text(g, "serial");
    base.name = text(g, "name");
    base.pci_bus_id = text(g, "pci_bus_id");
    base.seen_at = seen_at;
    const std::string who = base.uuid.empty() ? "gpu" + std::to_string(base.gpu_index) : base.uuid;
    auto add = [&](const std::string& kind, int xid, const std::string& code) {
      CardFault f = base;
      f.kind = kind;
      f.xid = xid;
      f.key = who + "/" + (kind == "xid" ? "xid-" + std::to_string(xid) : kind);
      f.code = code;
      const json d = diagnosis_for(health, code, f.gpu_index, f.uuid);
      f.summary = text(d, "summary");
      f.fix = text(d, "fix");
      out.push_back(std::move(f));
    };
    if (g.value("lost", false) == true) add("lost", 0, "gpu_lost");
    if (g.contains("remapped_rows_failure") && g["remapped_rows_failure"] == true)
      add("row_remap_failure", 0, "gpu_row_remap_failure");
    for (const auto& x : g.value("xids", json::array())) {
      if (!x.is_object() || !x.contains("xid") || !x["xid"].is_number_integer()) continue;
      int id = x["xid"].get<int>();
      if (gpu::xid_faults_card(id)) add("xid", id, "gpu_xid_" + std::to_string(id));
    }
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
