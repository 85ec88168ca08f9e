#pragma once
// A diagnosis is a known failure with a name, what it means and the fix, so
// the admin reads "the VM never received the card: ..." instead of a stack of
// apt output. Codes are stable identifiers (monitoring keys on them).
#include <nlohmann/json.hpp>
#include <string>

namespace factory::agent {

struct Diagnosis {
  std::string code;     // e.g. "gpu_not_on_pci_bus", "driver_reboot_pending"
  std::string summary;  // what is wrong, one line
  std::string fix;      // what to do, one line
  nlohmann::json details = nlohmann::json::object();

  nlohmann::json to_json() const {
    return {{"code", code}, {"summary", summary}, {"fix", fix}, {"details", details}};
  }
};

}  // namespace factory::agent
