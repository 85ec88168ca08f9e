#pragma once
// The Xids Factory names, with what each means for the card and what the
// customer (root in the guest) and the admin (the host) do about it. Both
// binaries read it: the agent turns an Xid into a diagnosis with its fix
// (agent/diagnose/gpu_faults.hpp), the coordinator decides from it whether a
// card is faulted (an Xid a guest reports is a number it could have made up,
// so the coordinator judges the number by this table, never by the guest's
// words). docs/gpu-faults.md is the same table for people; a test keeps the
// two equal.
//
// Source: NVIDIA's Xid catalog for Ampere and newer GPUs ("Analyzing Xid
// Errors with the Xid Catalog", docs.nvidia.com/deploy/xid-errors/
// analyzing-xid-catalog.html): the mnemonic, the description and the
// resolution bucket of the immediate action are NVIDIA's; the two actions
// are ours, written from that bucket and the catalog's trigger conditions
// for a card passed through to a tenant's VM.
#include <span>
#include <string_view>

namespace factory::gpu {

// What an Xid means for the card, which decides the card's state.
enum class XidImpact {
  application,  // the program that hit it must restart; the card is healthy
  watch,        // the card works; the admin resets it when convenient or watches a counter
  card,         // the card needs the admin (reset, reboot, service): it is faulted
};

struct XidEntry {
  int xid;
  std::string_view mnemonic;       // NVIDIA's: ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS
  std::string_view description;    // NVIDIA's: "GPU has fallen off the bus"
  std::string_view nvidia_action;  // the catalog's immediate-action bucket: RESTART_BM
  XidImpact impact;
  std::string_view customer;  // what the tenant does, inside its VM
  std::string_view admin;     // what the admin does, on the host
};

// The table, by Xid.
std::span<const XidEntry> xid_catalog();
// The entry for an Xid, or null for one the table does not name.
const XidEntry* find_xid(int xid);
// True when the Xid faults the card (XidImpact::card).
bool xid_faults_card(int xid);
std::string_view impact_name(XidImpact impact);  // "application" | "watch" | "card"

}  // namespace factory::gpu
