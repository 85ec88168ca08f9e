// The shared store: PostgreSQL through libpq, for coordinators that share one
// database. The writer thread, the batching and the memory are
// BatchingStore's (batching_store.hpp), as for the embedded store; this is
// the SQL and the connections. What differs is what the database itself
// must enforce, because another coordinator may write to it too: an event is
// stored once by the database's constraints (the cursor row, taken forward
// only, and a unique key on (tenant, agent_id, event_id)), not by this
// process's memory; counts are incremented in the database, not
// overwritten; and a lost connection is reconnected with a backoff, the
// batch it broke answered with its error and rolled back whole, and the
// memory reloaded from what the database holds.
#include <libpq-fe.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "common/durations.hpp"
#include "common/log.hpp"
#include "coordinator/store/batching_store.hpp"
#include "coordinator/store/postgres_conninfo.hpp"

namespace factory::store {

namespace {

constexpr int kSchemaVersion = 1;
// pg_advisory_xact_lock's key for creating the schema: two coordinators
// starting together would otherwise race CREATE TABLE IF NOT EXISTS (it is
// not atomic against itself in PostgreSQL). "Factory" in ASCII.
constexpr const char* kSchemaLock = "SELECT pg_advisory_xact_lock(19793809657049465)";

// The same tables and columns as the embedded store, so that what a test or
// an operator writes about one reads the same on the other. Bodies are text,
// not jsonb: jsonb reorders keys and rewrites numbers, and a record or a
// health sample must read back as it was written.
const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE IF NOT EXISTS tenants (name text PRIMARY KEY, record text NOT NULL);
CREATE TABLE IF NOT EXISTS events (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant text NOT NULL,
  agent_id text NOT NULL,
  event_id bigint NOT NULL,
  received_at text NOT NULL,
  received_unix bigint NOT NULL,
  body text NOT NULL,
  CONSTRAINT events_once UNIQUE (tenant, agent_id, event_id));
CREATE INDEX IF NOT EXISTS events_by_tenant ON events (tenant, seq);
CREATE INDEX IF NOT EXISTS events_by_age ON events (received_unix);
CREATE TABLE IF NOT EXISTS cursors (
  tenant text NOT NULL, agent_id text NOT NULL, last_id bigint NOT NULL,
  PRIMARY KEY (tenant, agent_id));
CREATE TABLE IF NOT EXISTS event_counts (tenant text PRIMARY KEY, n bigint NOT NULL);
CREATE TABLE IF NOT EXISTS health (tenant text PRIMARY KEY, sample text NOT NULL);
)sql";

// Every statement with a value in it, prepared on each connection: values
// travel as parameters, never inside the SQL.
struct Prepared {
  const char* name;
  const char* sql;
};
const Prepared kStatements[] = {
    {"put_tenant",
     "INSERT INTO tenants(name, record) VALUES ($1, $2) "
     "ON CONFLICT (name) DO UPDATE SET record = excluded.record"},
    // The event and its cursor in one statement: the cursor row only ever
    // moves forward (its row lock orders two coordinators storing the same
    // agent's events), the event is inserted only when it moved, and the
    // unique key is the last word. No row back: stored before.
    {"append",
     "WITH c AS ("
     "  INSERT INTO cursors AS c (tenant, agent_id, last_id) VALUES ($1::text, $2::text, "
     "$3::bigint) "
     "  ON CONFLICT (tenant, agent_id) DO UPDATE SET last_id = excluded.last_id "
     "  WHERE c.last_id < excluded.last_id RETURNING 1) "
     "INSERT INTO events(tenant, agent_id, event_id, received_at, received_unix, body) "
     "SELECT $1::text, $2::text, $3::bigint, $4::text, $5::bigint, $6::text "
     "WHERE EXISTS (SELECT 1 FROM c) "
     "ON CONFLICT (tenant, agent_id, event_id) DO NOTHING RETURNING seq"},
    {"get_cursor", "SELECT last_id FROM cursors WHERE tenant = $1 AND agent_id = $2"},
    {"add_count",
     "INSERT INTO event_counts(tenant, n) VALUES ($1, $2::bigint) "
     "ON CONFLICT (tenant) DO UPDATE SET n = GREATEST(0, event_counts.n + excluded.n) "
     "RETURNING n"},
    {"put_health",
     "INSERT INTO health(tenant, sample) VALUES ($1, $2) "
     "ON CONFLICT (tenant) DO UPDATE SET sample = excluded.sample"},
    {"del_tenant", "DELETE FROM tenants WHERE name = $1"},
    {"del_events", "DELETE FROM events WHERE tenant = $1"},
    {"del_cursors", "DELETE FROM cursors WHERE tenant = $1"},
    {"del_count", "DELETE FROM event_counts WHERE tenant = $1"},
    {"del_health", "DELETE FROM health WHERE tenant = $1"},
    // The oldest events of a tenant beyond its cap ($2 = how many to keep).
    {"trim_tenant",
     "WITH gone AS (DELETE FROM events WHERE tenant = $1 AND seq <= "
     "(SELECT seq FROM events WHERE tenant = $1 ORDER BY seq DESC LIMIT 1 OFFSET $2::bigint) "
     "RETURNING 1) SELECT count(*) FROM gone"},
    {"expire", "DELETE FROM events WHERE received_unix < $1::bigint RETURNING tenant"},
    {"recent",
     "SELECT seq, agent_id, event_id, received_at, body FROM events "
     "WHERE tenant = $1 ORDER BY seq DESC LIMIT $2::bigint"},
};

// --- results ------------------------------------------------------------------

struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using PgResult = std::unique_ptr<PGresult, ResultDeleter>;

std::string cell(const PGresult* r, int row, int col) {
  return std::string(PQgetvalue(r, row, col), static_cast<std::size_t>(PQgetlength(r, row, col)));
}
std::int64_t cell_int(const PGresult* r, int row, int col) {
  return std::strtoll(PQgetvalue(r, row, col), nullptr, 10);
}

class PostgresBackend final : public StoreBackend {
 public:
  PostgresBackend(std::string conninfo, std::string where)
      : conninfo_(std::move(conninfo)), secret_(password_of(conninfo_)), where_(std::move(where)) {}
  ~PostgresBackend() override { close(); }
  PostgresBackend(const PostgresBackend&) = delete;
  PostgresBackend& operator=(const PostgresBackend&) = delete;

  // Connects, makes the tables if absent and answers what the database holds.
  Result<Snapshot> open();

  std::vector<StoredEvent> recent_events(const std::string& tenant, std::size_t max) const override;

  Status reconnect_if_lost(std::optional<Snapshot>& reloaded) override;
  Status begin() override { return done(exec(wconn_, "BEGIN")); }
  Status commit() override { return done(exec(wconn_, "COMMIT")); }
  void rollback() override {
    if (PQstatus(wconn_) == CONNECTION_OK) PQclear(PQexec(wconn_, "ROLLBACK"));
  }

  Status write_record(const TenantRecord& rec) override {
    return done(run(wconn_, "put_tenant", {rec.name, rec.to_json().dump()}));
  }

  Result<Inserted> insert_event(const std::string& tenant, const StoredEvent& e,
                                std::int64_t received_unix) override {
    auto r = run(wconn_, "append",
                 {tenant, e.agent_id, std::to_string(static_cast<std::int64_t>(e.id)),
                  e.received_at, std::to_string(received_unix), e.event.dump()});
    if (!r) return r.error();
    Inserted out;
    if (PQntuples(r->get()) > 0) {
      out.stored = true;
      out.seq = static_cast<std::uint64_t>(cell_int(r->get(), 0, 0));
      return out;
    }
    // Stored before, by another coordinator: memory takes the database's cursor.
    auto c = run(wconn_, "get_cursor", {tenant, e.agent_id});
    if (!c) return c.error();
    if (PQntuples(c->get()) > 0) out.cursor = static_cast<std::uint64_t>(cell_int(c->get(), 0, 0));
    return out;
  }

  // Incremented in the database, whatever memory says: another
  // coordinator's events count too.
  Result<std::int64_t> add_count(const std::string& tenant, std::int64_t delta,
                                 std::int64_t /*current*/) override {
    auto r = run(wconn_, "add_count", {tenant, std::to_string(delta)});
    if (!r) return r.error();
    return cell_int(r->get(), 0, 0);
  }

  Status put_health(const std::string& tenant, const std::string& sample) override {
    return done(run(wconn_, "put_health", {tenant, sample}));
  }

  Status delete_tenant(const std::string& name) override {
    for (const char* stmt : {"del_tenant", "del_events", "del_cursors", "del_count", "del_health"})
      if (auto r = run(wconn_, stmt, {name}); !r) return r.error();
    return {};
  }

  Result<std::int64_t> trim_tenant(const std::string& tenant, std::int64_t keep) override {
    auto r = run(wconn_, "trim_tenant", {tenant, std::to_string(keep)});
    if (!r) return r.error();
    return cell_int(r->get(), 0, 0);
  }

  Result<std::map<std::string, std::int64_t>> expire_before(std::int64_t before_unix) override {
    auto r = run(wconn_, "expire", {std::to_string(before_unix)});
    if (!r) return r.error();
    std::map<std::string, std::int64_t> gone;
    for (int i = 0; i < PQntuples(r->get()); ++i) ++gone[cell(r->get(), i, 0)];
    return gone;
  }

  void close() override {
    // An open that failed half way may hold its connections too.
    disconnect(wconn_);
    std::lock_guard lk(read_mu_);
    disconnect(rconn_);
  }

 private:
  static void disconnect(PGconn*& c) {
    if (c) PQfinish(c);
    c = nullptr;
  }

  // The error of a statement (or of the connection when r is null), typed:
  // a lost connection or a server going away is `unavailable` (another try
  // may work), a deadlock or serialization failure against another
  // coordinator `conflict`, the rest `io`.
  Error pg_error(PGconn* c, const PGresult* r, const std::string& what) const {
    const char* state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
    std::string_view code = state ? state : "";
    Errc errc = Errc::io;
    if (!c || PQstatus(c) == CONNECTION_BAD || code.starts_with("08") || code.starts_with("57P"))
      errc = Errc::unavailable;
    else if (code == "40001" || code == "40P01")
      errc = Errc::conflict;
    std::string msg = first_line(r ? PQresultErrorMessage(r) : PQerrorMessage(c));
    if (r && msg == "no message") msg = first_line(PQerrorMessage(c));
    return Error(errc, scrub("store: " + where_ + ": " + what + ": " + msg, secret_));
  }

  static Status done(const Result<PgResult>& r) {
    if (!r) return r.error();
    return {};
  }

  // A connection, its statements prepared (once the schema exists).
  Result<PGconn*> connect(bool with_statements = true) const;
  Status prepare(PGconn* c) const;
  // Runs a prepared statement; an error unless it returned rows or ran.
  Result<PgResult> run(PGconn* c, const char* name, const std::vector<std::string>& params) const;
  Result<PgResult> exec(PGconn* c, const char* sql) const;
  Status create_schema(PGconn* c);
  Result<Snapshot> load(PGconn* c) const;

  const std::string conninfo_;       // holds the password: never logged, never in a message
  const std::string secret_;         // scrubbed from whatever libpq says
  const std::string where_;          // the conninfo without its secrets, for messages
  PGconn* wconn_ = nullptr;          // the writer's
  mutable PGconn* rconn_ = nullptr;  // for reads of the history, under read_mu_
  mutable std::mutex read_mu_;
  // Reconnection of the writer's connection, on the writer thread only.
  std::chrono::milliseconds backoff_{100};
  std::chrono::steady_clock::time_point next_connect_{};
  Error connect_error_;
};

Result<PGconn*> PostgresBackend::connect(bool with_statements) const {
  // Defaults first: the conninfo (expanded from "dbname") overrides them.
  // Keepalives so that a peer gone without a word (a node lost) is noticed
  // in about half a minute rather than at the kernel's two hours.
  const char* keys[] = {"connect_timeout",
                        "application_name",
                        "keepalives_idle",
                        "keepalives_interval",
                        "keepalives_count",
                        "dbname",
                        nullptr};
  const char* vals[] = {"10", "factory-coordinator", "10", "5", "3", conninfo_.c_str(), nullptr};
  PGconn* c = PQconnectdbParams(keys, vals, 1);
  if (!c) return Error(Errc::internal, "store: " + where_ + ": libpq is out of memory");
  if (PQstatus(c) != CONNECTION_OK) {
    Error e(Errc::unavailable,
            scrub("store: cannot connect to " + where_ + ": " + first_line(PQerrorMessage(c)),
                  secret_));
    PQfinish(c);
    return e;
  }
  // Messages from the server (NOTICE: relation already exists) are not ours to print.
  PQsetNoticeProcessor(
      c, [](void*, const char*) {}, nullptr);
  if (!with_statements) return c;
  if (auto st = prepare(c); !st.ok()) {
    PQfinish(c);
    return st.error();
  }
  return c;
}

Status PostgresBackend::prepare(PGconn* c) const {
  for (const auto& p : kStatements) {
    PgResult r(PQprepare(c, p.name, p.sql, 0, nullptr));
    if (PQresultStatus(r.get()) != PGRES_COMMAND_OK)
      return pg_error(c, r.get(), std::string("prepare ") + p.name);
  }
  return {};
}

Result<PgResult> PostgresBackend::run(PGconn* c, const char* name,
                                      const std::vector<std::string>& params) const {
  std::vector<const char*> values;
  values.reserve(params.size());
  for (auto& p : params) values.push_back(p.c_str());
  PgResult r(
      PQexecPrepared(c, name, static_cast<int>(values.size()), values.data(), nullptr, nullptr, 0));
  auto st = PQresultStatus(r.get());
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) return pg_error(c, r.get(), name);
  return r;
}

Result<PgResult> PostgresBackend::exec(PGconn* c, const char* sql) const {
  PgResult r(PQexec(c, sql));
  auto st = PQresultStatus(r.get());
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
    std::string what(sql, std::min<std::size_t>(std::strlen(sql), 40));
    return pg_error(c, r.get(), first_line(what.c_str()));
  }
  return r;
}

Status PostgresBackend::create_schema(PGconn* c) {
  auto fail = [&](Error e) -> Status {
    PQclear(PQexec(c, "ROLLBACK"));
    return e.context("schema");
  };
  if (auto r = exec(c, "BEGIN"); !r) return r.error();
  if (auto r = exec(c, kSchemaLock); !r) return fail(r.error());
  if (auto r = exec(c, kSchema); !r) return fail(r.error());
  auto v = exec(c, "SELECT value FROM meta WHERE key = 'schema'");
  if (!v) return fail(v.error());
  if (PQntuples(v->get()) > 0 && std::atoi(PQgetvalue(v->get(), 0, 0)) > kSchemaVersion)
    return fail(Error(Errc::failed_precondition,
                      "store: " + where_ + " was written by a newer Factory (schema " +
                          cell(v->get(), 0, 0) + "); run that version, or restore a backup"));
  const std::string version = std::to_string(kSchemaVersion);
  const char* values[] = {version.c_str()};
  PgResult put(PQexecParams(c,
                            "INSERT INTO meta(key, value) VALUES ('schema', $1) "
                            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                            1, nullptr, values, nullptr, nullptr, 0));
  if (PQresultStatus(put.get()) != PGRES_COMMAND_OK)
    return fail(pg_error(c, put.get(), "schema version"));
  if (auto r = exec(c, "COMMIT"); !r) return fail(r.error());
  return {};
}

// What a start (or a reconnection) needs: every tenant, cursor, count and
// latest health; never the history itself.
Result<Snapshot> PostgresBackend::load(PGconn* c) const {
  Snapshot s;
  auto t = exec(c, "SELECT name, record FROM tenants");
  if (!t) return t.error();
  for (int i = 0; i < PQntuples(t->get()); ++i) {
    auto j = nlohmann::json::parse(cell(t->get(), i, 1), nullptr, false);
    auto rec = j.is_discarded() ? Result<TenantRecord>(Error(Errc::io, "not JSON"))
                                : TenantRecord::from_json(j);
    if (!rec) {
      // One unreadable record must not keep every other tenant out.
      spdlog::error("store: the record of tenant '{}' is unreadable ({}); it is left out",
                    cell(t->get(), i, 0), rec.error().message);
      continue;
    }
    s.tenants[rec->name] = std::move(*rec);
  }
  auto cur = exec(c, "SELECT tenant, agent_id, last_id FROM cursors");
  if (!cur) return cur.error();
  for (int i = 0; i < PQntuples(cur->get()); ++i)
    s.cursors[cursor_key(cell(cur->get(), i, 0), cell(cur->get(), i, 1))] =
        static_cast<std::uint64_t>(cell_int(cur->get(), i, 2));
  auto n = exec(c, "SELECT tenant, n FROM event_counts");
  if (!n) return n.error();
  for (int i = 0; i < PQntuples(n->get()); ++i)
    s.counts[cell(n->get(), i, 0)] = static_cast<std::size_t>(cell_int(n->get(), i, 1));
  auto h = exec(c, "SELECT tenant, sample FROM health");
  if (!h) return h.error();
  for (int i = 0; i < PQntuples(h->get()); ++i) {
    // Saved by this store, but a guest's words all the same: read back
    // through the sample's own checks.
    auto j = nlohmann::json::parse(cell(h->get(), i, 1), nullptr, false);
    if (auto latest = LatestHealth::from_json(j))
      s.health[cell(h->get(), i, 0)] = std::make_shared<const LatestHealth>(std::move(*latest));
  }
  return s;
}

Result<Snapshot> PostgresBackend::open() {
  auto c = connect(false);
  if (!c) return c.error();
  wconn_ = *c;
  if (auto st = create_schema(wconn_); !st.ok()) return st.error();
  if (auto st = prepare(wconn_); !st.ok()) return st.error();
  auto snap = load(wconn_);
  if (!snap) return snap.error().with_context("load");
  auto r = connect();
  if (!r) return r.error();
  rconn_ = *r;
  return snap;
}

std::vector<StoredEvent> PostgresBackend::recent_events(const std::string& tenant,
                                                        std::size_t max) const {
  std::lock_guard lk(read_mu_);
  std::vector<StoredEvent> out;
  Result<PgResult> r = Error(Errc::unavailable, "store: not connected");
  // A connection lost since the last read is made again, once.
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!rconn_ || PQstatus(rconn_) != CONNECTION_OK) {
      disconnect(rconn_);
      auto c = connect();
      if (!c) {
        r = c.error();
        break;
      }
      rconn_ = *c;
    }
    r = run(rconn_, "recent", {tenant, std::to_string(max)});
    if (r || r.error().code != Errc::unavailable) break;
  }
  if (!r) {
    spdlog::error("{} (recent events of {})", r.error().message, tenant);
    return out;
  }
  const PGresult* res = r->get();
  for (int i = PQntuples(res) - 1; i >= 0; --i) {
    StoredEvent e;
    e.seq = static_cast<std::uint64_t>(cell_int(res, i, 0));
    e.agent_id = cell(res, i, 1);
    e.id = static_cast<std::uint64_t>(cell_int(res, i, 2));
    e.received_at = cell(res, i, 3);
    e.event = nlohmann::json::parse(cell(res, i, 4), nullptr, false);
    out.push_back(std::move(e));
  }
  return out;
}

// Reconnects the writer's connection when it is lost, no more often than the
// backoff allows (100 ms, doubling to 5 s): the error that keeps it down,
// while it is, answers the batch.
Status PostgresBackend::reconnect_if_lost(std::optional<Snapshot>& reloaded) {
  if (wconn_ && PQstatus(wconn_) == CONNECTION_OK) return {};
  disconnect(wconn_);
  auto now = std::chrono::steady_clock::now();
  if (now < next_connect_) return connect_error_;
  auto c = connect();
  Result<Snapshot> snap = c ? load(*c) : Result<Snapshot>(c.error());
  if (!snap) {
    if (c) PQfinish(*c);
    connect_error_ = snap.error();
    next_connect_ = now + backoff_;
    backoff_ = std::min<std::chrono::milliseconds>(backoff_ * 2, std::chrono::seconds(5));
    return connect_error_;
  }
  wconn_ = *c;
  backoff_ = std::chrono::milliseconds(100);
  // What the database holds replaces memory (BatchingStore::run_batch).
  reloaded = std::move(*snap);
  spdlog::info("store: reconnected to {}", where_);
  return {};
}

}  // namespace

Result<std::unique_ptr<Store>> open_postgres_store(const std::string& conninfo, StoreOptions opts) {
  auto where = describe_conninfo(conninfo);
  if (!where) return where.error();
  auto backend = std::make_unique<PostgresBackend>(conninfo, *where);
  auto loaded = backend->open();
  if (!loaded) return loaded.error();
  return std::unique_ptr<Store>(
      std::make_unique<BatchingStore>(std::move(backend), std::move(*loaded), opts));
}

}  // namespace factory::store
