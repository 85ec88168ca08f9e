#include "agent/endpoint/named_keys.hpp"

#include "common/pki.hpp"

namespace factory::agent::endpoint {

void KeyRing::set_default(const std::string& sha256) {
  std::lock_guard lk(mu_);
  default_sha_ = sha256;
}

void KeyRing::set_named(std::vector<NamedKey> keys) {
  std::lock_guard lk(mu_);
  named_ = std::move(keys);
  named_until_.reset();
}

void KeyRing::link_lost(SteadyClock::time_point at) {
  std::lock_guard lk(mu_);
  if (!named_until_) named_until_ = at + grace_;
}

std::optional<NamedKey> KeyRing::match(const std::string& sha256,
                                       SteadyClock::time_point now) const {
  std::lock_guard lk(mu_);
  if (!default_sha_.empty() && pki::secure_equals(sha256, default_sha_))
    return NamedKey{kDefaultKey, default_sha_, std::nullopt, std::nullopt};
  if (named_until_ && now >= *named_until_) return std::nullopt;
  // Every key compared, whichever matches: the time taken says nothing of which.
  std::optional<NamedKey> found;
  for (const auto& k : named_)
    if (pki::secure_equals(sha256, k.sha256) && !found) found = k;
  return found;
}

std::vector<NamedKey> KeyRing::named() const {
  std::lock_guard lk(mu_);
  return named_;
}

bool KeyRing::knows(const std::string& name) const {
  std::lock_guard lk(mu_);
  if (name == kDefaultKey) return true;
  for (const auto& k : named_)
    if (k.name == name) return true;
  return false;
}

}  // namespace factory::agent::endpoint
