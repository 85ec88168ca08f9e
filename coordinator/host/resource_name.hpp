#pragma once
// The Kubernetes resource name a card is advertised under. NVIDIA's KubeVirt
// GPU device plugin (pkg/device_plugin/device_plugin.go, getDeviceName) looks
// the device ID up under vendor 10de in its pci.ids and turns the name into a
// resource: trim, upper-case, "/" and "." to "_", each run of white space to
// one "_", drop everything outside [A-Za-z0-9_], prefix "nvidia.com/". When the
// ID is not in the list (or the name leaves nothing) it uses the raw device ID.
// The allowlist in the KubeVirt CR and every VM's deviceName must use exactly
// this string, so we derive it the same way instead of asking the admin.
#include <cstdint>
#include <string>
#include <string_view>

#include "coordinator/host/pci_ids.hpp"

namespace factory::host {

inline constexpr std::string_view kResourceNamespace = "nvidia.com";

// "AD104GL [L4]" -> "AD104GL_L4"; "GH100 [H200 SXM 141GB]" -> "GH100_H200_SXM_141GB".
std::string kubevirt_device_name(std::string_view pci_ids_name);

struct ResourceName {
  std::string name;           // "nvidia.com/AD104GL_L4" or, as a fallback, "nvidia.com/2335"
  bool from_pci_ids = false;  // false: the raw device ID, because the list lacks it
  std::string note;           // why it fell back, one line; empty when from_pci_ids
};

// ids may be null (the host has no pci.ids at all).
ResourceName kubevirt_resource_name(const PciIds* ids, uint16_t device_id);

}  // namespace factory::host
