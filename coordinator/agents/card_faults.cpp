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

store::GpuFaultRecord CardFault::record() const {
  store::GpuFaultRecord r;
  r.gpu = gpu_index;
  r.uuid = uuid;
  r.serial = serial;
  r.name = name;
  r.pci_bus_id = pci_bus_id;
  r.kind = kind;
  r.code = code;
  r.summary = summary;
  r.fix = fix;
  r.first_seen = seen_at;
  if (kind == "xid") r.xid = xid;
  return r;
}

json CardFault::to_json() const {
  return record().to_json();
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

std::vector<CardFault> record_card_faults(store::TenantStatus& status,
                                          const std::vector<CardFault>& faults) {
  if (!status.gpu_faults) status.gpu_faults.emplace();
  auto& book = *status.gpu_faults;
  std::vector<CardFault> fresh;
  for (const auto& f : faults) {
    if (book.contains(f.key)) continue;
    book[f.key] = f.record();
    fresh.push_back(f);
  }
  while (book.size() > kMaxCardFaultRecords) {
    auto oldest = book.end();
    std::string oldest_at;
    for (auto it = book.begin(); it != book.end(); ++it) {
      std::string at = it->second.first_seen.value_or("");
      if (oldest == book.end() || at < oldest_at) {
        oldest = it;
        oldest_at = at;
      }
    }
    book.erase(oldest);
  }
  return fresh;
}

}  // namespace factory::coordinator
