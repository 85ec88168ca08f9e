#include "common/net/tls_tickets.hpp"

#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <system_error>

#include "common/atomic_file.hpp"
#include "common/durations.hpp"

namespace factory::net {

namespace {

using nlohmann::json;
using SysClock = std::chrono::system_clock;

template <std::size_t N>
std::string to_hex(const std::array<unsigned char, N>& a) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(N * 2);
  for (unsigned char c : a) {
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
}

template <std::size_t N>
bool from_hex(const std::string& s, std::array<unsigned char, N>& out) {
  if (s.size() != N * 2) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < N; ++i) {
    int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

Result<TicketKey> new_key(SysClock::time_point now) {
  TicketKey k;
  if (RAND_bytes(k.name.data(), k.name.size()) != 1 ||
      RAND_bytes(k.aes.data(), k.aes.size()) != 1 || RAND_bytes(k.hmac.data(), k.hmac.size()) != 1)
    return Error(Errc::internal, "no random bytes for a session ticket key");
  k.created = std::chrono::time_point_cast<std::chrono::seconds>(now);
  return k;
}

// |a - b|, so a clock set back keeps a key for no longer than forward.
std::chrono::seconds distance(SysClock::time_point a, SysClock::time_point b) {
  return std::chrono::duration_cast<std::chrono::seconds>(a > b ? a - b : b - a);
}

}  // namespace

bool TicketKeys::seals(const TicketKey& k, SysClock::time_point now) const {
  return distance(now, k.created) < policy_.rotate_every;
}

bool TicketKeys::opens(const TicketKey& k, SysClock::time_point now) const {
  return distance(now, k.created) < policy_.rotate_every + policy_.ticket_lifetime;
}

Status TicketKeys::save(const std::vector<TicketKey>& keys) const {
  json arr = json::array();
  for (const auto& k : keys)
    arr.push_back({{"name", to_hex(k.name)},
                   {"aes", to_hex(k.aes)},
                   {"hmac", to_hex(k.hmac)},
                   {"created", format_rfc3339(k.created)}});
  json doc = {{"version", 1}, {"keys", std::move(arr)}};
  if (auto st = write_file_atomic(path_, doc.dump() + "\n", 0600); !st.ok())
    return st.error().with_context("session ticket keys " + path_.string());
  return {};
}

Result<std::shared_ptr<TicketKeys>> TicketKeys::open(const std::filesystem::path& path,
                                                     TicketKeyPolicy policy, Now now) {
  std::shared_ptr<TicketKeys> t(new TicketKeys(path, policy, std::move(now)));
  const auto at = t->now_();
  std::vector<TicketKey> kept;
  bool changed = false;
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    auto text = read_file(path);
    if (!text) return text.error().with_context("session ticket keys");
    const std::string where = "session ticket keys " + path.string();
    json doc = json::parse(*text, nullptr, false);
    if (doc.is_discarded() || !doc.is_object() || !doc.contains("keys") || !doc["keys"].is_array())
      return Error(Errc::invalid_argument, where + ": not a key file of this version");
    for (const auto& e : doc["keys"]) {
      TicketKey k;
      if (!e.is_object() || !from_hex(e.value("name", std::string()), k.name) ||
          !from_hex(e.value("aes", std::string()), k.aes) ||
          !from_hex(e.value("hmac", std::string()), k.hmac))
        return Error(Errc::invalid_argument, where + ": a key is not 16+32+32 hex bytes");
      auto created = parse_rfc3339(e.value("created", std::string()));
      if (!created) return created.error().with_context(where + ": created");
      k.created = *created;
      if (t->opens(k, at))
        kept.push_back(k);
      else
        changed = true;
    }
  } else {
    changed = true;
  }
  std::sort(kept.begin(), kept.end(),
            [](const TicketKey& a, const TicketKey& b) { return a.created < b.created; });
  if (kept.empty() || !t->seals(kept.back(), at)) {
    auto k = new_key(at);
    if (!k) return k.error();
    kept.push_back(*k);
    changed = true;
  }
  if (changed)
    if (auto st = t->save(kept); !st.ok()) return st.error();
  t->keys_ = std::move(kept);
  return t;
}

Result<bool> TicketKeys::rotate_if_due() {
  const auto at = now_();
  std::vector<TicketKey> next;
  bool forgot = false;
  {
    std::lock_guard lk(mu_);
    for (const auto& k : keys_)
      if (opens(k, at)) next.push_back(k);
    forgot = next.size() != keys_.size();
  }
  const bool rotate = next.empty() || !seals(next.back(), at);
  if (!rotate && !forgot) return false;
  if (rotate) {
    auto k = new_key(at);
    if (!k) return k.error();
    next.push_back(*k);
  }
  // On disk first: a key that seals tickets must survive a restart.
  if (auto st = save(next); !st.ok()) return st.error();
  std::lock_guard lk(mu_);
  keys_ = std::move(next);
  return rotate;
}

std::optional<TicketKey> TicketKeys::sealing_key() const {
  const auto at = now_();
  std::lock_guard lk(mu_);
  // The newest key seals until the next rotation, also when that is a
  // little late (the check runs every few seconds): a ticket it seals then
  // is honoured for less than its lifetime at worst, never for more.
  if (keys_.empty() || !opens(keys_.back(), at)) return std::nullopt;
  return keys_.back();
}

std::optional<TicketKeys::Opening> TicketKeys::opening_key(const unsigned char name[16]) const {
  const auto at = now_();
  std::lock_guard lk(mu_);
  for (std::size_t i = 0; i < keys_.size(); ++i) {
    const auto& k = keys_[i];
    if (std::memcmp(k.name.data(), name, k.name.size()) != 0) continue;
    if (!opens(k, at)) return std::nullopt;
    return Opening{k, i + 1 == keys_.size()};
  }
  return std::nullopt;
}

std::size_t TicketKeys::key_count() const {
  std::lock_guard lk(mu_);
  return keys_.size();
}

}  // namespace factory::net
