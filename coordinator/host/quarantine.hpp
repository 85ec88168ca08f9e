#pragma once
// Cards the admin took out of the pool after a fault, and the cards the
// platform has learnt to recognise: one file on the GPU node,
// /var/lib/factory/gpu-cards.json (0600, under the HostRoot), per card
// address:
//
//   - quarantine: whether the card is out of the pool now, why, since when,
//     and when it was last released. `factory host quarantine` records it
//     before it takes the card off vfio-pci, so a half-done quarantine still
//     keeps tenants off the card (the QEMU provider skips a quarantined card
//     whatever its driver); `factory host release` forgets it only after the
//     card is back on vfio-pci.
//   - identity: the GPU UUID and board serial a guest's NVML reported for
//     the card, learnt when only one card could be it (a QEMU tenant with
//     one card), so a fault recorded by UUID is still the card's after its
//     tenant moved on.
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "coordinator/host/host_root.hpp"

namespace factory::host {

inline constexpr std::string_view kCardsFile = "/var/lib/factory/gpu-cards.json";

struct CardRecord {
  std::string address;  // "0000:01:00.0"
  bool quarantined = false;
  std::string reason;          // the admin's words, when quarantined
  std::string quarantined_at;  // RFC 3339
  std::string released_at;     // the last release; faults before it are history
  std::string uuid, serial;    // what a guest's NVML said the card is
};

// Every record (none when the file is absent).
Result<std::vector<CardRecord>> read_cards(const HostRoot& root);
Status write_cards(const HostRoot& root, const std::vector<CardRecord>& cards);
// The record for an address, or null.
const CardRecord* find_card(const std::vector<CardRecord>& cards, const std::string& address);
CardRecord& card_record(std::vector<CardRecord>& cards, const std::string& address);

// A quarantine reason as the admin may give it: 1..256 bytes, no control
// characters (it is shown in tables and on the feed).
Status check_reason(const std::string& reason);

}  // namespace factory::host
