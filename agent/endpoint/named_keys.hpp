#pragma once
// The keys a model endpoint's proxy accepts (issue 28): the tenant's own
// (named "default", its hash saved on disk, so it serves after a reboot
// before the coordinator is reachable) and the named keys of `factory
// tenant keys`, which come only in the coordinator's `endpoint` frames and
// are replaced whole by each one (a revoked key is one left out).
//
// Named keys fail closed: once the link to the coordinator drops, they are
// refused after `grace` (3 s) until a new frame comes, so a revocation made
// during an outage is never missed; the default key keeps serving.
//
// Thread-safe: the io thread matches every request head against it while
// the link's thread replaces it.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace factory::agent::endpoint {

inline constexpr const char* kDefaultKey = "default";

struct NamedKey {
  std::string name;
  std::string sha256;  // lower-case hex
  std::optional<std::int64_t> rpm, tpm;
  bool operator==(const NamedKey&) const = default;
};

class KeyRing {
 public:
  using SteadyClock = std::chrono::steady_clock;
  explicit KeyRing(std::chrono::milliseconds grace = std::chrono::seconds(3)) : grace_(grace) {}

  void set_default(const std::string& sha256);
  // The named keys, whole; they serve again if the link had dropped.
  void set_named(std::vector<NamedKey> keys);
  // The link to the coordinator dropped at `at`: named keys stop after grace.
  void link_lost(SteadyClock::time_point at = SteadyClock::now());

  // The key whose hash is `sha256` (compared in constant time with each),
  // nullopt when none serves. The default's name is kDefaultKey.
  std::optional<NamedKey> match(const std::string& sha256,
                                SteadyClock::time_point now = SteadyClock::now()) const;
  std::vector<NamedKey> named() const;
  // A key of this set's, by name (the default too), for usage reports.
  bool knows(const std::string& name) const;

 private:
  std::chrono::milliseconds grace_;
  mutable std::mutex mu_;
  std::string default_sha_;
  std::vector<NamedKey> named_;
  std::optional<SteadyClock::time_point> named_until_;
};

}  // namespace factory::agent::endpoint
