#include "coordinator/shared/database.hpp"

#include <libpq-fe.h>

#include <cstring>
#include <string_view>

#include "coordinator/store/postgres_conninfo.hpp"

namespace factory::shared {

namespace {

constexpr int kSchemaVersion = 1;
// pg_advisory_xact_lock's key for making the tables: replicas starting
// together would otherwise race CREATE TABLE IF NOT EXISTS, which is not
// atomic against itself. The store's key (postgres_store.cpp) plus one.
constexpr const char* kSchemaLock = "SELECT pg_advisory_xact_lock(19793809657049466)";

// Times of the tokens are unix seconds, as the file book keeps them to the
// second. Bodies are text: what is written reads back byte for byte.
const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS shared_meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE IF NOT EXISTS shared_secrets (
  name text PRIMARY KEY, value text NOT NULL, created_at text NOT NULL);
CREATE TABLE IF NOT EXISTS bootstrap_tokens (
  id text PRIMARY KEY,
  tenant text NOT NULL,
  secret_sha256 text NOT NULL,
  created_unix bigint NOT NULL,
  expires_unix bigint NOT NULL,
  used_unix bigint,
  revoked boolean NOT NULL DEFAULT false);
CREATE INDEX IF NOT EXISTS bootstrap_tokens_by_tenant ON bootstrap_tokens (tenant);
CREATE TABLE IF NOT EXISTS api_tokens (
  id text PRIMARY KEY, sha256 text NOT NULL, created_at text NOT NULL);
)sql";

struct Prepared {
  const char* name;
  const char* sql;
};
// Every statement of the module. Each may run twice (Database::run retries
// on a connection it found lost): a read, an insert that does nothing the
// second time, or an update whose second run finds the first one's effect.
const Prepared kStatements[] = {
    // Readiness (GET /readyz): the database answers at all.
    {"ping", "SELECT 1"},
    // Shared secrets: the first writer wins, every replica reads its value.
    {"secret_get", "SELECT value FROM shared_secrets WHERE name = $1"},
    {"secret_put",
     "INSERT INTO shared_secrets(name, value, created_at) VALUES ($1, $2, $3) "
     "ON CONFLICT (name) DO NOTHING"},
    // Bootstrap tokens. An id already taken inserts nothing and answers no row.
    {"token_insert",
     "INSERT INTO bootstrap_tokens(id, tenant, secret_sha256, created_unix, expires_unix) "
     "VALUES ($1, $2, $3, $4::bigint, $5::bigint) ON CONFLICT (id) DO NOTHING RETURNING id"},
    {"token_get",
     "SELECT id, tenant, secret_sha256, created_unix, expires_unix, used_unix, revoked "
     "FROM bootstrap_tokens WHERE id = $1"},
    // The redemption is this one statement: the row's lock orders replicas
    // racing one token, and only the first finds it unused. The secret's
    // hash is compared here too (a hash: its timing tells nothing of the
    // secret); why a token that matched no row is refused is read after.
    {"token_redeem",
     "UPDATE bootstrap_tokens SET used_unix = $3::bigint "
     "WHERE id = $1 AND secret_sha256 = $2 AND used_unix IS NULL AND NOT revoked "
     "AND expires_unix > $3::bigint RETURNING tenant"},
    {"token_revoke_tenant",
     "UPDATE bootstrap_tokens SET revoked = true "
     "WHERE tenant = $1 AND used_unix IS NULL AND NOT revoked RETURNING id"},
    {"token_list",
     "SELECT id, tenant, secret_sha256, created_unix, expires_unix, used_unix, revoked "
     "FROM bootstrap_tokens ORDER BY created_unix, id"},
    // Past their retention ($1 = now - retention), as the file book prunes.
    {"token_prune",
     "DELETE FROM bootstrap_tokens WHERE expires_unix < $1::bigint OR used_unix < $1::bigint"},
    // Read-only API tokens.
    {"api_token_add", "INSERT INTO api_tokens(id, sha256, created_at) VALUES ($1, $2, $3)"},
    {"api_token_all", "SELECT id, sha256, created_at FROM api_tokens ORDER BY created_at, id"},
};

struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using PgResult = std::unique_ptr<PGresult, ResultDeleter>;

bool lost(PGconn* c) {
  return c == nullptr || PQstatus(c) != CONNECTION_OK;
}

}  // namespace

Database::Database(std::string conninfo, std::string where, std::size_t max_connections)
    : conninfo_(std::move(conninfo)),
      secret_(store::password_of(conninfo_)),
      where_(std::move(where)),
      max_connections_(max_connections == 0 ? 1 : max_connections) {}

Database::~Database() {
  std::lock_guard lk(mu_);
  for (PGconn* c : idle_) PQfinish(c);
  idle_.clear();
}

namespace {

// The error of a statement (or of the connection when r is null), typed as
// the store types them.
Error pg_error(PGconn* c, const PGresult* r, const std::string& what, const std::string& where,
               const std::string& secret) {
  const char* state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
  std::string_view code = state ? state : "";
  Errc errc = Errc::io;
  if (lost(c) || code.starts_with("08") || code.starts_with("57P"))
    errc = Errc::unavailable;
  else if (code == "40001" || code == "40P01")
    errc = Errc::conflict;
  std::string msg = store::first_line(r ? PQresultErrorMessage(r) : PQerrorMessage(c));
  if (r && msg == "no message") msg = store::first_line(PQerrorMessage(c));
  return Error(errc, store::scrub("shared state: " + where + ": " + what + ": " + msg, secret));
}

}  // namespace

Result<PGconn*> Database::connect(bool with_statements) const {
  auto opened =
      store::open_connection(conninfo_, "factory-shared", "shared state", where_, secret_);
  if (!opened) return opened.error();
  PGconn* c = *opened;
  if (with_statements) {
    for (const auto& p : kStatements) {
      PgResult r(PQprepare(c, p.name, p.sql, 0, nullptr));
      if (PQresultStatus(r.get()) != PGRES_COMMAND_OK) {
        Error e = pg_error(c, r.get(), std::string("prepare ") + p.name, where_, secret_);
        PQfinish(c);
        return e;
      }
    }
  }
  return c;
}

Status Database::create_schema(PGconn* c) const {
  auto exec = [&](const char* sql) -> Status {
    PgResult r(PQexec(c, sql));
    auto st = PQresultStatus(r.get());
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK)
      return pg_error(c, r.get(), "schema", where_, secret_);
    return {};
  };
  auto fail = [&](Error e) -> Status {
    PQclear(PQexec(c, "ROLLBACK"));
    return e;
  };
  if (auto st = exec("BEGIN"); !st.ok()) return st;
  if (auto st = exec(kSchemaLock); !st.ok()) return fail(st.error());
  if (auto st = exec(kSchema); !st.ok()) return fail(st.error());
  PgResult v(PQexec(c, "SELECT value FROM shared_meta WHERE key = 'schema'"));
  if (PQresultStatus(v.get()) != PGRES_TUPLES_OK)
    return fail(pg_error(c, v.get(), "schema version", where_, secret_));
  if (PQntuples(v.get()) > 0 && std::atoi(PQgetvalue(v.get(), 0, 0)) > kSchemaVersion)
    return fail(Error(Errc::failed_precondition,
                      "shared state: " + where_ + " was written by a newer Factory (schema " +
                          PQgetvalue(v.get(), 0, 0) + "); run that version, or restore a backup"));
  const std::string version = std::to_string(kSchemaVersion);
  const char* values[] = {version.c_str()};
  PgResult put(PQexecParams(c,
                            "INSERT INTO shared_meta(key, value) VALUES ('schema', $1) "
                            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                            1, nullptr, values, nullptr, nullptr, 0));
  if (PQresultStatus(put.get()) != PGRES_COMMAND_OK)
    return fail(pg_error(c, put.get(), "schema version", where_, secret_));
  if (auto st = exec("COMMIT"); !st.ok()) return fail(st.error());
  return {};
}

Result<std::shared_ptr<Database>> Database::open(const std::string& conninfo,
                                                 std::size_t max_connections) {
  auto where = store::describe_conninfo(conninfo);
  if (!where) return Error(where.error().code, "shared state: " + where.error().message);
  std::shared_ptr<Database> db(new Database(conninfo, *where, max_connections));
  auto c = db->connect(false);
  if (!c) return c.error();
  if (auto st = db->create_schema(*c); !st.ok()) {
    PQfinish(*c);
    return st.error();
  }
  PQfinish(*c);
  // The first connection of the pool, made now: a database that takes the
  // schema but not the statements is found at start, not at the first token.
  auto first = db->connect(true);
  if (!first) return first.error();
  std::lock_guard lk(db->mu_);
  db->idle_.push_back(*first);
  db->open_ = 1;
  return db;
}

Result<PGconn*> Database::take() const {
  std::unique_lock lk(mu_);
  freed_.wait(lk, [&] { return !idle_.empty() || open_ < max_connections_; });
  if (!idle_.empty()) {
    PGconn* c = idle_.back();
    idle_.pop_back();
    return c;
  }
  ++open_;
  lk.unlock();
  auto c = connect(true);
  if (!c) {
    lk.lock();
    --open_;
    freed_.notify_one();
  }
  return c;
}

void Database::give_back(PGconn* c) const {
  std::lock_guard lk(mu_);
  if (lost(c)) {
    PQfinish(c);
    --open_;
  } else {
    idle_.push_back(c);
  }
  freed_.notify_one();
}

Result<std::vector<Row>> Database::run(const char* name,
                                       const std::vector<std::string>& params) const {
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p.c_str());
  Error failed(Errc::unavailable, "shared state: " + where_ + ": not connected");
  // A connection lost since its last use (a database restarted, a node
  // gone) fails its next statement at once: that one is tried again, once,
  // on a connection made anew.
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto c = take();
    if (!c) return c.error();
    PgResult r(PQexecPrepared(*c, name, static_cast<int>(values.size()), values.data(), nullptr,
                              nullptr, 0));
    auto st = PQresultStatus(r.get());
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) {
      std::vector<Row> rows;
      const int n = PQntuples(r.get()), cols = PQnfields(r.get());
      rows.reserve(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) {
        Row row;
        row.reserve(static_cast<std::size_t>(cols));
        for (int j = 0; j < cols; ++j) {
          if (PQgetisnull(r.get(), i, j))
            row.emplace_back(std::nullopt);
          else
            row.emplace_back(std::string(PQgetvalue(r.get(), i, j),
                                         static_cast<std::size_t>(PQgetlength(r.get(), i, j))));
        }
        rows.push_back(std::move(row));
      }
      give_back(*c);
      return rows;
    }
    failed = pg_error(*c, r.get(), name, where_, secret_);
    const bool was_lost = lost(*c);
    give_back(*c);
    if (!was_lost) break;
  }
  return failed;
}

}  // namespace factory::shared
