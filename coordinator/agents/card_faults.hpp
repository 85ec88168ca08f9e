#pragma once
// The card faults a tenant's health sample shows: a card lost (it fell off
// the bus), a memory row that could not be remapped, an Xid that needs the
// admin. The agents module records each one on the tenant
// (status.gpu_faults, keyed, with when the coordinator first saw it) and
// announces it once on the feed (a `gpu_fault` event), so the fault
// outlives the sample that showed it: a tenant moved to another card no
// longer reports the old one, and `factory host gpus` still knows it
// faulted.
//
// What faults a card is judged from the sample's validated figures by the
// coordinator's own table (contract/xid_catalog.hpp), never by the words the
// guest sent; the summary and fix shown with it are the agent's diagnosis,
// as the health sample's reader left it (bounded, no control characters).
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coordinator/store/store.hpp"

namespace factory::coordinator {

struct CardFault {
  std::string key;  // "<uuid or gpuN>/lost", ".../xid-79", ".../row-remap-failure"
  int gpu_index = 0;
  std::string uuid, serial, name, pci_bus_id;  // pci_bus_id: as the guest sees it
  std::string kind;                            // "lost" | "xid" | "row_remap_failure"
  int xid = 0;                                 // kind xid
  std::string code, summary, fix;              // the agent's diagnosis for it, when it sent one
  std::string seen_at;                         // when the coordinator took in the sample
  // As the record keeps it (status.gpu_faults), and as the feed shows it.
  store::GpuFaultRecord record() const;
  nlohmann::json to_json() const;
};

// The card faults in a tenant's latest health sample.
std::vector<CardFault> card_faults(const store::LatestHealth& health);

// Adds the faults status.gpu_faults does not hold yet (a fault seen again
// keeps its first record); at most kMaxRecords, the oldest going first.
// Returns the ones that were new.
std::vector<CardFault> record_card_faults(store::TenantStatus& status,
                                          const std::vector<CardFault>& faults);
inline constexpr std::size_t kMaxCardFaultRecords = 32;

}  // namespace factory::coordinator
