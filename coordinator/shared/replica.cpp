#include "coordinator/shared/replica.hpp"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "common/atomic_file.hpp"
#include "common/pki.hpp"
#include "coordinator/shared/api_tokens.hpp"
#include "coordinator/shared/secrets.hpp"
#include "coordinator/shared/token_book.hpp"

namespace factory::shared {
namespace fs = std::filesystem;

namespace {

// As a single host makes its admin token (server/coordinator.cpp).
constexpr std::size_t kAdminTokenChars = 48;
constexpr std::size_t kAdminTokenMin = 32;

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

// Writes `text` to `path` unless it holds it already (a restart rewrites nothing).
Status write_copy(const fs::path& path, const std::string& text, mode_t mode) {
  std::error_code ec;
  if (fs::exists(path, ec))
    if (auto now = read_file(path); now && *now == text) return {};
  return write_file_atomic(path, text, mode);
}

// One of the two CAs: the database's, made (or brought from state_dir) by
// the first replica; its certificate copied into state_dir.
Result<enroll::CertificateAuthority> share_ca(const SharedSecrets& secrets, const fs::path& dir,
                                              enroll::CaFiles files, const char* name,
                                              const std::string& label, const std::string& where) {
  auto value = secrets.get_or_create(name, [&]() -> Result<std::string> {
    auto existing = enroll::CertificateAuthority::read_files(dir, files);
    if (!existing) return existing.error();
    enroll::CaPem pem;
    if (*existing) {
      // A single host moving onto the database keeps its CA, so that its
      // enrolled agents keep trusting every replica.
      pem = std::move(**existing);
      if (auto ca = enroll::CertificateAuthority::from_pem(pem, (dir / files.cert).string()); !ca)
        return ca.error();
      spdlog::info("shared state: the {} kept in {} is the one of {}", label, where,
                   (dir / files.cert).string());
    } else {
      auto made = enroll::CertificateAuthority::create_pem(files.common_name);
      if (!made) return made.error();
      pem = std::move(*made);
    }
    return nlohmann::json{{"certificate_pem", pem.certificate_pem},
                          {"private_key_pem", pem.private_key_pem}}
        .dump();
  });
  if (!value) return value.error().with_context(label);
  auto j = nlohmann::json::parse(*value, nullptr, false);
  if (j.is_discarded() || !j.is_object() ||
      !j.value("certificate_pem", nlohmann::json()).is_string() ||
      !j.value("private_key_pem", nlohmann::json()).is_string())
    return Error(Errc::failed_precondition,
                 "the " + label + " kept in " + where + " (shared_secrets '" + name +
                     "') is not a certificate and key; restore it from a backup");
  enroll::CaPem pem{j["certificate_pem"].get<std::string>(),
                    j["private_key_pem"].get<std::string>()};
  auto ca = enroll::CertificateAuthority::from_pem(
      pem, "the " + label + " kept in " + where + " (shared_secrets '" + name + "')");
  if (!ca) return ca.error();
  // A key in state_dir is another CA's when it is not this one's: refused,
  // as a CA pair that does not match is, rather than leaving a ca.crt beside
  // a key it does not belong to.
  const fs::path key_path = dir / files.key;
  std::error_code ec;
  if (fs::exists(key_path, ec)) {
    auto key = read_file(key_path);
    if (!key) return key.error().with_context(label);
    if (!pki::key_matches_certificate(*key, pem.certificate_pem))
      return Error(Errc::failed_precondition,
                   key_path.string() + " is the key of another CA than the " + label +
                       " the replicas share in " + where + " (sha256 " + ca->sha256() + "); move " +
                       files.cert + " and " + files.key +
                       " out of state_dir (with the store on PostgreSQL the CA is the "
                       "database's)");
  }
  if (auto st = write_copy(dir / files.cert, pem.certificate_pem, 0644); !st.ok())
    return st.error().with_context(label);
  return ca;
}

}  // namespace

bool shares_state(const std::string& store) {
  return store.rfind("postgres://", 0) == 0 || store.rfind("postgresql://", 0) == 0;
}

Result<std::unique_ptr<Replica>> Replica::open(const std::string& conninfo,
                                               const fs::path& state_dir,
                                               const fs::path& admin_token_file) {
  if (auto st = ensure_dir(state_dir, 0700); !st.ok()) return st.error();
  auto db = Database::open(conninfo);
  if (!db) return db.error();
  std::unique_ptr<Replica> r(new Replica());
  r->db_ = std::move(*db);
  const std::string& where = r->db_->where();
  SharedSecrets secrets(r->db_);
  auto ca = share_ca(secrets, state_dir, {}, kAgentsCaSecret, "agents' CA", where);
  if (!ca) return ca.error();
  r->ca_ = std::move(*ca);
  auto endpoint_ca = share_ca(secrets, state_dir, enroll::kEndpointCaFiles, kEndpointCaSecret,
                              "model endpoints' CA", where);
  if (!endpoint_ca) return endpoint_ca.error();
  r->endpoint_ca_ = std::move(*endpoint_ca);
  auto admin = secrets.get_or_create(kAdminTokenSecret, [&]() -> Result<std::string> {
    // A single host moving onto the database keeps its admin token.
    std::error_code ec;
    if (fs::exists(admin_token_file, ec)) {
      auto t = read_file(admin_token_file);
      if (!t) return t.error();
      std::string tok = trimmed(*t);
      if (tok.size() < kAdminTokenMin)
        return Error(Errc::invalid_argument, admin_token_file.string() + " holds no valid token");
      return tok;
    }
    return pki::random_token_chars(kAdminTokenChars);
  });
  if (!admin) return admin.error().with_context("admin token");
  r->admin_ = std::move(*admin);
  // The CLI beside this replica reads it here, as on a single host.
  if (auto st = write_copy(admin_token_file, r->admin_ + "\n", 0600); !st.ok())
    return st.error().with_context("admin token");
  spdlog::info(
      "shared state: CA sha256 {}, the admin token, bootstrap and read-only API tokens "
      "are shared through {}",
      r->ca_->sha256(), where);
  return r;
}

Replica::~Replica() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (refresher_.joinable()) refresher_.join();
}

std::unique_ptr<enroll::Tokens> Replica::token_book() const {
  return std::make_unique<SharedTokenBook>(db_);
}

Status Replica::share_api_tokens(coordinator::ApiAuth& auth, std::chrono::milliseconds every) {
  if (auto st = auth.use_store(std::make_shared<SharedApiTokens>(db_)); !st.ok()) return st;
  if (!refresher_.joinable())
    refresher_ = std::thread([this, &auth, every] { refresh_loop(auth, every); });
  return {};
}

void Replica::refresh_loop(coordinator::ApiAuth& auth, std::chrono::milliseconds every) {
  bool failing = false;
  std::unique_lock lk(mu_);
  while (!wake_.wait_for(lk, every, [&] { return stopping_; })) {
    lk.unlock();
    auto st = auth.refresh();
    // Once per outage, not every few seconds.
    if (!st.ok() && !failing)
      spdlog::error(
          "shared state: {}; read-only API tokens created through other replicas are not "
          "accepted here until it answers again",
          st.error().message);
    else if (st.ok() && failing)
      spdlog::info("shared state: the read-only API tokens are read again");
    failing = !st.ok();
    lk.lock();
  }
}

}  // namespace factory::shared
