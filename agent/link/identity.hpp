#pragma once
// The agent's identity after enrollment: its private key (made here, never
// sent anywhere), the certificate the coordinator signed for its tenant, and
// the coordinator's CA. One file, 0600, replaced atomically, so a crash during
// renewal never leaves a key that does not match its certificate.
#include <filesystem>
#include <optional>
#include <string>

#include "common/durations.hpp"
#include "common/error.hpp"

namespace factory::agent {

struct AgentIdentity {
  std::string tenant;
  std::string agent_id;
  std::string key_pem;
  std::string cert_pem;
  std::string ca_pem;
  Clock::time_point not_before{}, not_after{};

  // Renew once two thirds of the lifetime have passed.
  bool renewal_due(Clock::time_point now = Clock::now()) const {
    return now >= not_before + (not_after - not_before) * 2 / 3;
  }
};

inline constexpr const char* kIdentityFile = "identity.json";

Result<std::optional<AgentIdentity>> load_identity(const std::filesystem::path& state_dir);
Status save_identity(const std::filesystem::path& state_dir, const AgentIdentity& id);
// Fills not_before/not_after from cert_pem.
Status refresh_validity(AgentIdentity& id);

}  // namespace factory::agent
