#include "coordinator/host/resource_name.hpp"

#include <cctype>

#include "coordinator/host/pci.hpp"

namespace factory::host {

std::string kubevirt_device_name(std::string_view pci_ids_name) {
  // strings.TrimSpace + strings.ToUpper. pci.ids names are ASCII in practice;
  // any other byte is dropped by the last pass, as the plugin's regexp does.
  size_t b = 0, e = pci_ids_name.size();
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (b < e && space(pci_ids_name[b])) ++b;
  while (e > b && space(pci_ids_name[e - 1])) --e;
  std::string s;
  for (size_t i = b; i < e; ++i) {
    char c = static_cast<char>(std::toupper(static_cast<unsigned char>(pci_ids_name[i])));
    // "/" and "." become "_" before anything is dropped: "K./520" -> "K__520".
    if (c == '/' || c == '.') c = '_';
    s.push_back(c);
  }
  // regexp \s+ -> "_": a run of white space is one underscore. Go's \s is
  // [\t\n\f\r ] (no \v); anything else non-alphanumeric goes in the next pass.
  auto go_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r';
  };
  std::string runs;
  for (size_t i = 0; i < s.size();) {
    if (go_space(s[i])) {
      runs.push_back('_');
      while (i < s.size() && go_space(s[i])) ++i;
    } else {
      runs.push_back(s[i++]);
    }
  }
  // [^a-zA-Z0-9_.]+ -> "" (no "." is left by now).
  std::string out;
  for (char c : runs)
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') out.push_back(c);
  return out;
}

ResourceName kubevirt_resource_name(const PciIds* ids, uint16_t device_id) {
  ResourceName r;
  const std::string raw = hex4(device_id);
  std::optional<std::string> name;
  if (ids) name = ids->device_name(kNvidiaVendor, device_id);
  std::string derived = name ? kubevirt_device_name(*name) : std::string();
  if (!derived.empty()) {
    r.name = std::string(kResourceNamespace) + "/" + derived;
    r.from_pci_ids = true;
    return r;
  }
  r.name = std::string(kResourceNamespace) + "/" + raw;
  if (!ids)
    r.note = "no pci.ids on this host, so the resource name is the raw device ID " + raw +
             " (the device plugin uses the name from its own pci.ids)";
  else if (!name)
    r.note = "10de:" + raw + " is not in " + ids->describe() +
             ", so the resource name falls back to the raw device ID " + raw;
  else
    r.note = "the pci.ids name \"" + *name +
             "\" leaves no usable characters, so the resource name "
             "falls back to the raw device ID " +
             raw;
  return r;
}

}  // namespace factory::host
