#pragma once
// Where the guest is. Every path the agent touches is root / <absolute path>,
// and every command goes through PATH, so tests run the agent on a simulated
// guest.
#include <filesystem>
#include <string>

namespace factory::agent {

struct GuestEnv {
  std::filesystem::path root = "/";
  std::string ollama_url = "http://127.0.0.1:11434";
  std::filesystem::path state_dir = "/var/lib/factory-agent";  // NOT under root: given as-is

  // path("/sys/bus/pci/devices") -> <root>/sys/bus/pci/devices
  std::filesystem::path path(const std::string& absolute) const {
    std::string rel = absolute;
    while (!rel.empty() && rel.front() == '/') rel.erase(0, 1);
    return root / rel;
  }
};

}  // namespace factory::agent
