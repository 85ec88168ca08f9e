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
  // When this certificate arrived. The lifetime counts from here, not from
  // not_before, which the CA back-dates to absorb clock skew.
  Clock::time_point obtained_at{};

  // Renew once two thirds of the lifetime have passed.
  bool renewal_due(Clock::time_point now = Clock::now()) const {
    auto from = obtained_at > not_before ? obtained_at : not_before;
    return now >= from + (not_after - from) * 2 / 3;
  }
};

inline constexpr const char* kIdentityFile = "identity.json";

Result<std::optional<AgentIdentity>> load_identity(const std::filesystem::path& state_dir);
Status save_identity(const std::filesystem::path& state_dir, const AgentIdentity& id);
// Fills not_before/not_after from cert_pem.
Status refresh_validity(AgentIdentity& id);

}  // namespace factory::agent
