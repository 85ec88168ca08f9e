#include "coordinator/api/auth.hpp"

#include <nlohmann/json.hpp>

#include "common/atomic_file.hpp"
#include "common/durations.hpp"
#include "common/pki.hpp"

namespace factory::coordinator {

const char* access_name(Access a) {
  switch (a) {
    case Access::admin:
      return "admin";
    case Access::read_only:
      return "read-only";
    case Access::none:
      break;
  }
  return "none";
}

Status ApiAuth::load(std::string path) {
  std::lock_guard lk(mu_);
  path_ = std::move(path);
  tokens_.clear();
  std::error_code ec;
  if (!std::filesystem::exists(path_, ec)) return {};
  auto text = read_file(path_);
  if (!text) return text.error();
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.value("tokens", nlohmann::json()).is_array())
    return Error(Errc::invalid_argument, path_ + ": not a token file ({\"tokens\": [...]})");
  for (const auto& t : j["tokens"]) {
    if (!t.is_object() || !t.value("sha256", nlohmann::json()).is_string())
      return Error(Errc::invalid_argument, path_ + ": a token without its sha256");
    tokens_.push_back(
        {t.value("id", ""), t["sha256"].get<std::string>(), t.value("created_at", "")});
  }
  return {};
}

Status ApiAuth::save_locked() const {
  if (path_.empty()) return {};
  nlohmann::json list = nlohmann::json::array();
  for (const auto& t : tokens_)
    list.push_back({{"id", t.id},
                    {"sha256", t.sha256},
                    {"access", "read-only"},
                    {"created_at", t.created_at}});
  return write_file_atomic(path_, nlohmann::json{{"tokens", list}}.dump(2) + "\n", 0600);
}

Status ApiAuth::use_store(std::shared_ptr<ApiTokenStore> store) {
  {
    std::lock_guard lk(store_mu_);
    store_ = std::move(store);
  }
  return refresh();
}

Status ApiAuth::refresh() {
  std::lock_guard slk(store_mu_);
  if (!store_) return {};
  // Read with no lock a check takes: a slow database delays no request.
  auto all = store_->all();
  if (!all) return all.error().with_context("reading the read-only API tokens");
  std::lock_guard lk(mu_);
  tokens_ = std::move(*all);
  return {};
}

Result<IssuedToken> ApiAuth::create_read_only_token() {
  IssuedToken out;
  out.id = "ro-" + pki::random_token_chars(8);
  // A prefix says what the token is when it turns up in a file or a paste.
  out.token = "factory-ro-" + pki::random_token_chars(40);
  out.created_at = format_rfc3339(Clock::now());
  StoredApiToken kept{out.id, pki::sha256_hex(out.token), out.created_at};
  {
    std::lock_guard slk(store_mu_);
    if (store_) {
      if (auto st = store_->add(kept); !st.ok())
        return st.error().with_context("saving the read-only token");
      std::lock_guard lk(mu_);
      tokens_.push_back(std::move(kept));
      return out;
    }
  }
  std::lock_guard lk(mu_);
  tokens_.push_back(std::move(kept));
  if (auto st = save_locked(); !st.ok()) {
    tokens_.pop_back();
    return st.error().with_context("saving the read-only token");
  }
  return out;
}

std::vector<ReadOnlyToken> ApiAuth::read_only_tokens() const {
  std::lock_guard lk(mu_);
  std::vector<ReadOnlyToken> out;
  for (const auto& t : tokens_) out.push_back({t.id, t.created_at});
  return out;
}

Caller ApiAuth::lookup(std::string_view token) const {
  if (token.empty()) return {};
  if (pki::secure_equals(token, admin_)) return {Access::admin, kAdminPrincipal, false};
  const std::string h = pki::sha256_hex(token);
  std::lock_guard lk(mu_);
  for (const auto& t : tokens_)
    if (pki::secure_equals(h, t.sha256)) return {Access::read_only, "read-only:" + t.id, false};
  return {};
}

Access ApiAuth::bearer(std::string_view token) const {
  return lookup(token).access;
}

Caller ApiAuth::identify(const net::HttpRequestIn& req) const {
  const std::string auth = req.header("authorization");
  if (auto token = net::bearer_token(auth)) return lookup(*token);
  // A wrong or odd Authorization is not rescued by a cookie beside it.
  if (!auth.empty()) return {};
  return session_caller(session_cookie(req)).value_or(Caller{});
}

Result<ApiAuth::Session> ApiAuth::sign_in(std::string_view token) {
  Caller who = lookup(token);
  if (who.access == Access::none)
    return Error(Errc::unauthenticated,
                 "not the admin token or a read-only token of this coordinator");
  Session s{pki::random_token_chars(48), who.access, Clock::now() + kSessionLife, who.principal};
  std::lock_guard lk(mu_);
  const auto now = Clock::now();
  for (auto it = sessions_.begin(); it != sessions_.end();)
    it = it->second.expires_at <= now ? sessions_.erase(it) : std::next(it);
  std::size_t mine = 0, read_only = 0;
  auto my_oldest = sessions_.end();
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->second.principal != kAdminPrincipal) ++read_only;
    if (it->second.principal != who.principal) continue;
    ++mine;
    if (my_oldest == sessions_.end() || it->second.expires_at < my_oldest->second.expires_at)
      my_oldest = it;
  }
  // A token at its own cap makes room with its own oldest session; nobody
  // else's is ever evicted for it.
  if (mine >= kMaxSessionsPerToken) {
    if (my_oldest->second.principal != kAdminPrincipal) --read_only;
    sessions_.erase(my_oldest);
  } else if (who.principal != kAdminPrincipal && read_only >= kMaxReadOnlySessions) {
    return Error(Errc::unavailable, "too many dashboard sessions of read-only tokens (" +
                                        std::to_string(kMaxReadOnlySessions) +
                                        "); try again later, or sign out elsewhere");
  }
  Session kept = s;
  kept.cookie_value.clear();
  sessions_[pki::sha256_hex(s.cookie_value)] = kept;
  return s;
}

std::optional<Caller> ApiAuth::session_caller(std::string_view cookie_value) const {
  if (cookie_value.empty()) return std::nullopt;
  const std::string h = pki::sha256_hex(cookie_value);
  std::lock_guard lk(mu_);
  auto it = sessions_.find(h);
  if (it == sessions_.end() || it->second.expires_at <= Clock::now()) return std::nullopt;
  // A session only reads, whichever token opened it; its limits are that token's.
  return Caller{Access::read_only, it->second.principal, true};
}

Access ApiAuth::session(std::string_view cookie_value) const {
  auto c = session_caller(cookie_value);
  return c ? c->access : Access::none;
}

std::size_t ApiAuth::session_count() const {
  std::lock_guard lk(mu_);
  return sessions_.size();
}

void ApiAuth::sign_out(std::string_view cookie_value) {
  if (cookie_value.empty()) return;
  std::lock_guard lk(mu_);
  sessions_.erase(pki::sha256_hex(cookie_value));
}

std::string session_cookie(const net::HttpRequestIn& req) {
  const std::string c = req.header("cookie");
  const std::string want = std::string(kSessionCookie) + "=";
  std::size_t pos = 0;
  while (pos < c.size()) {
    std::size_t end = c.find(';', pos);
    if (end == std::string::npos) end = c.size();
    std::string_view part(c.data() + pos, end - pos);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    if (part.substr(0, want.size()) == want) return std::string(part.substr(want.size()));
    pos = end + 1;
  }
  return "";
}

std::string session_set_cookie(const ApiAuth::Session& s) {
  return std::string(kSessionCookie) + "=" + s.cookie_value + "; Path=/; Max-Age=" +
         std::to_string(std::chrono::seconds(ApiAuth::kSessionLife).count()) +
         "; HttpOnly; Secure; SameSite=Strict";
}

std::string session_clear_cookie() {
  return std::string(kSessionCookie) + "=; Path=/; Max-Age=0; HttpOnly; Secure; SameSite=Strict";
}

bool same_origin(const net::HttpRequestIn& req) {
  if (req.header("sec-fetch-site") == "cross-site") return false;
  const std::string origin = req.header("origin");
  if (origin.empty()) return true;
  const std::string host = req.header("host");
  return !host.empty() && origin == "https://" + host;
}

}  // namespace factory::coordinator
