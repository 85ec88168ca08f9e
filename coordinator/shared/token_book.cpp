#include "coordinator/shared/token_book.hpp"

#include <spdlog/spdlog.h>

namespace factory::shared {

namespace {

constexpr std::chrono::minutes kPruneEvery{1};

std::int64_t unix_of(Clock::time_point t) {
  return std::chrono::floor<std::chrono::seconds>(t.time_since_epoch()).count();
}
Clock::time_point time_of(std::int64_t unix) {
  return Clock::time_point(std::chrono::seconds(unix));
}
std::int64_t int_of(const std::optional<std::string>& v) {
  return v ? std::strtoll(v->c_str(), nullptr, 10) : 0;
}

// token_get's and token_list's columns: id, tenant, secret_sha256,
// created_unix, expires_unix, used_unix, revoked.
enroll::TokenRecord record_of(const Row& r) {
  enroll::TokenRecord t;
  t.id = r.at(0).value_or("");
  t.tenant = r.at(1).value_or("");
  t.secret_sha256 = r.at(2).value_or("");
  t.created_at = time_of(int_of(r.at(3)));
  t.expires_at = time_of(int_of(r.at(4)));
  if (r.at(5)) t.used_at = time_of(int_of(r.at(5)));
  t.revoked = r.at(6).value_or("f") == "t";
  return t;
}

}  // namespace

void SharedTokenBook::prune(Clock::time_point now) {
  const std::int64_t at = unix_of(now);
  std::int64_t last = last_prune_.load();
  const auto every = std::chrono::seconds(kPruneEvery).count();
  if (at >= last && at - last < every) return;
  if (!last_prune_.compare_exchange_strong(last, at)) return;  // another thread does it
  const auto retention = std::chrono::seconds(enroll::kTokenRetention).count();
  if (auto r = db_->run("token_prune", {std::to_string(at - retention)}); !r)
    spdlog::debug("shared tokens: pruning left for later: {}", r.error().message);
}

Result<std::optional<enroll::TokenRecord>> SharedTokenBook::find(const std::string& id) const {
  auto rows = db_->run("token_get", {id});
  if (!rows) return rows.error();
  if (rows->empty()) return std::optional<enroll::TokenRecord>();
  return std::optional<enroll::TokenRecord>(record_of(rows->front()));
}

Result<enroll::IssuedToken> SharedTokenBook::issue(const std::string& tenant,
                                                   std::chrono::seconds ttl,
                                                   Clock::time_point now) {
  auto made = enroll::make_token(tenant, ttl, now);
  if (!made) return made.error();
  prune(made->record.created_at);
  // 36^6 ids: a clash (with a token of any replica) is rare, and the
  // database's key refuses it; a new id is drawn.
  for (int attempt = 0; attempt < 8; ++attempt) {
    if (attempt > 0) {
      made = enroll::make_token(tenant, ttl, now);
      if (!made) return made.error();
    }
    const enroll::TokenRecord& t = made->record;
    auto rows = db_->run("token_insert",
                         {t.id, t.tenant, t.secret_sha256, std::to_string(unix_of(t.created_at)),
                          std::to_string(unix_of(t.expires_at))});
    if (!rows) return rows.error().with_context("create token");
    if (!rows->empty()) return enroll::IssuedToken{made->token, t.id, t.tenant, t.expires_at};
  }
  return Error(Errc::internal, "create token: no free token id after 8 tries");
}

Result<std::string> SharedTokenBook::check(std::string_view token, Clock::time_point now) const {
  auto parts = enroll::parse_token(token);
  if (!parts) return parts.error();
  auto known = find(parts->id);
  if (!known) return known.error();
  const enroll::TokenRecord* t = *known ? &**known : nullptr;
  if (auto st = enroll::judge_token(t, *parts, std::chrono::floor<std::chrono::seconds>(now));
      !st.ok())
    return st.error();
  return t->tenant;
}

Result<std::string> SharedTokenBook::redeem(std::string_view token, Clock::time_point now) {
  now = std::chrono::floor<std::chrono::seconds>(now);
  auto parts = enroll::parse_token(token);
  if (!parts) return parts.error();
  prune(now);
  auto spent =
      db_->run("token_redeem", {parts->id, parts->secret_sha256, std::to_string(unix_of(now))});
  // Fail closed: the use may have been stored before the answer was lost.
  if (!spent) return enroll::use_not_recorded(parts->id, spent.error());
  if (!spent->empty()) return spent->front().at(0).value_or("");
  // Not this time: the row says why, in the file book's words.
  auto known = find(parts->id);
  if (!known) return known.error();
  const enroll::TokenRecord* t = *known ? &**known : nullptr;
  if (auto st = enroll::judge_token(t, *parts, now); !st.ok()) return st.error();
  // It matched no row a moment ago and reads as good now: it changed in
  // between (no path of this module un-uses or un-revokes a token).
  return Error(Errc::conflict,
               "token '" + parts->id + "' changed while it was redeemed; try again");
}

Result<size_t> SharedTokenBook::revoke_tenant(const std::string& tenant, Clock::time_point now) {
  prune(now);
  auto rows = db_->run("token_revoke_tenant", {tenant});
  if (!rows) return rows.error().with_context("revoke tokens of " + tenant);
  return rows->size();
}

Result<std::vector<enroll::TokenRecord>> SharedTokenBook::records() const {
  auto rows = db_->run("token_list", {});
  if (!rows) return rows.error().with_context("list tokens");
  std::vector<enroll::TokenRecord> out;
  out.reserve(rows->size());
  for (const Row& r : *rows) out.push_back(record_of(r));
  return out;
}

}  // namespace factory::shared
