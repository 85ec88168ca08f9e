#include "coordinator/enroll/tokens.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/atomic_file.hpp"
#include "common/pki.hpp"
#include "coordinator/enroll/tenant_name.hpp"

namespace factory::enroll {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kFormatVersion = 1;

bool token_chars(std::string_view s, size_t len) {
  return s.size() == len && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
         });
}

bool lower_hex(std::string_view s, size_t len) {
  return s.size() == len && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= 'a' && c <= 'f') || (c >= '0' && c <= '9');
         });
}

// Timestamps are stored to the second (RFC 3339), so keep them that way in
// memory too: a reloaded book then equals the one that was saved.
Clock::time_point floor_seconds(Clock::time_point t) {
  return std::chrono::floor<std::chrono::seconds>(t);
}

std::string_view trim(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

json to_json(const TokenRecord& t) {
  json j = {{"id", t.id},
            {"tenant", t.tenant},
            {"secret_sha256", t.secret_sha256},
            {"created_at", format_rfc3339(t.created_at)},
            {"expires_at", format_rfc3339(t.expires_at)}};
  if (t.used_at) j["used_at"] = format_rfc3339(*t.used_at);
  if (t.revoked) j["revoked"] = true;
  return j;
}

Result<Clock::time_point> time_field(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_string())
    return Error(Errc::invalid_argument, std::string("missing or non-string '") + key + "'");
  auto t = parse_rfc3339(j[key].get<std::string>());
  if (!t.ok()) return t.error().with_context(key);
  return *t;
}

Result<TokenRecord> from_json(const json& j) {
  if (!j.is_object()) return Error(Errc::invalid_argument, "a token entry is not an object");
  TokenRecord t;
  for (const char* key : {"id", "tenant", "secret_sha256"})
    if (!j.contains(key) || !j[key].is_string())
      return Error(Errc::invalid_argument, std::string("missing or non-string '") + key + "'");
  t.id = j["id"].get<std::string>();
  t.tenant = j["tenant"].get<std::string>();
  t.secret_sha256 = j["secret_sha256"].get<std::string>();
  if (!token_chars(t.id, kTokenIdLength))
    return Error(Errc::invalid_argument, "bad token id '" + t.id + "'");
  if (auto st = validate_tenant_name(t.tenant); !st.ok())
    return st.error().with_context("token " + t.id);
  if (!lower_hex(t.secret_sha256, 64))
    return Error(Errc::invalid_argument, "token " + t.id + ": secret_sha256 is not 64 hex digits");
  auto created = time_field(j, "created_at");
  if (!created.ok()) return created.error().with_context("token " + t.id);
  auto expires = time_field(j, "expires_at");
  if (!expires.ok()) return expires.error().with_context("token " + t.id);
  t.created_at = *created;
  t.expires_at = *expires;
  if (j.contains("used_at")) {
    auto used = time_field(j, "used_at");
    if (!used.ok()) return used.error().with_context("token " + t.id);
    t.used_at = *used;
  }
  if (j.contains("revoked")) {
    if (!j["revoked"].is_boolean())
      return Error(Errc::invalid_argument, "token " + t.id + ": 'revoked' is not a boolean");
    t.revoked = j["revoked"].get<bool>();
  }
  return t;
}

Error unauthenticated(const std::string& why) {
  return Error(Errc::unauthenticated, why);
}

}  // namespace

std::string token_state(const TokenRecord& t, Clock::time_point now) {
  if (t.revoked) return "revoked";
  if (t.used_at) return "used";
  if (now >= t.expires_at) return "expired";
  return "active";
}

Result<TokenBook> TokenBook::load(const fs::path& path) {
  TokenBook book(path);
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    if (ec) return Error(Errc::io, "token book " + path.string() + ": " + ec.message());
    return book;
  }
  auto text = read_file(path);
  if (!text.ok()) return text.error().with_context("load token book");
  auto corrupt = [&](const std::string& why) {
    return Error(
        Errc::failed_precondition,
        "token book " + path.string() + " is corrupt (" + why +
            "); repair it, or remove it to start empty (outstanding tokens then stop working)");
  };
  json doc = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return corrupt("not valid JSON");
  if (!doc.is_object() || !doc.contains("tokens") || !doc["tokens"].is_array())
    return corrupt("no 'tokens' array");
  if (!doc.contains("version") || doc["version"] != kFormatVersion)
    return corrupt("unsupported format version, expected " + std::to_string(kFormatVersion));
  for (const json& entry : doc["tokens"]) {
    auto t = from_json(entry);
    if (!t.ok()) return corrupt(t.error().message);
    for (const TokenRecord& other : book.tokens_)
      if (other.id == t->id) return corrupt("token id " + t->id + " appears twice");
    book.tokens_.push_back(std::move(*t));
  }
  return book;
}

Status TokenBook::save(Clock::time_point now) {
  // Old used / expired entries only make the file grow; after a day a retry
  // with such a token reads "unknown token", which is just as much a refusal.
  std::erase_if(tokens_, [&](const TokenRecord& t) {
    return now - t.expires_at > kTokenRetention ||
           (t.used_at && now - *t.used_at > kTokenRetention);
  });
  json doc = {{"version", kFormatVersion}, {"tokens", json::array()}};
  for (const TokenRecord& t : tokens_) doc["tokens"].push_back(to_json(t));
  std::error_code ec;
  fs::path dir = path_.parent_path();
  if (!dir.empty() && !fs::exists(dir, ec)) {
    if (auto st = ensure_dir(dir, 0700); !st.ok()) return st;
  }
  // The file holds no secrets, only their hashes; 0600 anyway, as the hashes
  // and tenant names are nobody else's business.
  return write_file_atomic(path_, doc.dump(2) + "\n", 0600);
}

Result<IssuedToken> TokenBook::issue(const std::string& tenant, std::chrono::seconds ttl,
                                     Clock::time_point now) {
  std::lock_guard lk(*mu_);
  if (auto st = validate_tenant_name(tenant); !st.ok())
    return st.error().with_context("create token");
  if (ttl <= std::chrono::seconds(0))
    return Error(Errc::invalid_argument, "create token: TTL must be positive (e.g. 1h)");
  now = floor_seconds(now);
  TokenRecord rec;
  // 36^6 ids: a clash is rare but would make one of two tokens unusable.
  do {
    rec.id = pki::random_token_chars(kTokenIdLength);
  } while (std::any_of(tokens_.begin(), tokens_.end(),
                       [&](const TokenRecord& t) { return t.id == rec.id; }));
  std::string secret = pki::random_token_chars(kTokenSecretLength);
  rec.tenant = tenant;
  rec.secret_sha256 = pki::sha256_hex(secret);
  rec.created_at = now;
  rec.expires_at = now + ttl;
  tokens_.push_back(rec);
  if (auto st = save(now); !st.ok()) {
    // Never shown, so never usable: take it back out.
    std::erase_if(tokens_, [&](const TokenRecord& t) { return t.id == rec.id; });
    return st.error().with_context("create token");
  }
  return IssuedToken{rec.id + "." + secret, rec.id, rec.tenant, rec.expires_at};
}

Result<std::vector<TokenRecord>::iterator> TokenBook::find_valid(std::string_view token,
                                                                 Clock::time_point now) {
  token = trim(token);
  size_t dot = token.find('.');
  if (dot == std::string_view::npos || !token_chars(token.substr(0, dot), kTokenIdLength) ||
      !token_chars(token.substr(dot + 1), kTokenSecretLength))
    return unauthenticated("token malformed (expected <6 chars>.<32 chars> of a-z0-9)");
  std::string_view id = token.substr(0, dot);
  std::string_view secret = token.substr(dot + 1);

  auto it = std::find_if(tokens_.begin(), tokens_.end(),
                         [&](const TokenRecord& t) { return t.id == id; });
  // Hash, then compare in constant time, so the time taken says nothing about
  // how much of the secret was right.
  if (it == tokens_.end() || !pki::secure_equals(pki::sha256_hex(secret), it->secret_sha256))
    return unauthenticated("unknown token '" + std::string(id) + "'");
  if (it->revoked) return unauthenticated("token revoked");
  if (it->used_at) return unauthenticated("token already used at " + format_rfc3339(*it->used_at));
  if (now >= it->expires_at)
    return unauthenticated("token expired at " + format_rfc3339(it->expires_at));
  return it;
}

Result<std::string> TokenBook::check(std::string_view token, Clock::time_point now) const {
  std::lock_guard lk(*mu_);
  auto it = const_cast<TokenBook*>(this)->find_valid(token, floor_seconds(now));
  if (!it) return it.error();
  return (*it)->tenant;
}

Result<std::string> TokenBook::redeem(std::string_view token, Clock::time_point now) {
  std::lock_guard lk(*mu_);
  now = floor_seconds(now);
  auto found = find_valid(token, now);
  if (!found) return found.error();
  auto it = *found;
  // Fail closed: once we try to record the use, the token stays used in this
  // process even if the write failed (the admin makes a new token).
  it->used_at = now;
  std::string tenant = it->tenant;
  if (auto st = save(now); !st.ok())
    return Error(Errc::unavailable, "could not record token '" + it->id + "' as used (" +
                                        st.error().message +
                                        "); it is refused, create a new token");
  return tenant;
}

std::vector<TokenRecord> TokenBook::list() const {
  std::lock_guard lk(*mu_);
  return tokens_;
}

Result<size_t> TokenBook::revoke_tenant(const std::string& tenant, Clock::time_point now) {
  std::lock_guard lk(*mu_);
  size_t n = 0;
  for (TokenRecord& t : tokens_) {
    if (t.tenant == tenant && !t.used_at && !t.revoked) {
      t.revoked = true;
      ++n;
    }
  }
  if (n == 0) return n;
  if (auto st = save(floor_seconds(now)); !st.ok())
    return st.error().with_context("revoke tokens of " + tenant);
  return n;
}

}  // namespace factory::enroll
