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
//
// Replicas: several coordinators on one database (issue 26). A batch that
// changed tenants NOTIFYs `factory_store` in its transaction (delivered only
// if it commits) with this store's replica id and the tenants' names; a
// listener thread on a connection of its own LISTENs and has the writer
// reload what another replica changed. The records a batch changes are read
// FOR UPDATE in its transaction (lock_records), so two replicas changing one
// record serialize on its row.
#include <libpq-fe.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "common/durations.hpp"
#include "common/log.hpp"
#include "coordinator/store/batching_store.hpp"
#include "coordinator/store/feed_log.hpp"
#include "coordinator/store/postgres_conninfo.hpp"

namespace factory::store {

namespace {

constexpr int kSchemaVersion = 1;
// pg_advisory_xact_lock's key for creating the schema: two coordinators
// starting together would otherwise race CREATE TABLE IF NOT EXISTS (it is
// not atomic against itself in PostgreSQL). "Factory" in ASCII.
constexpr const char* kSchemaLock = "SELECT pg_advisory_xact_lock(19793809657049465)";
constexpr const char* kStoreChannel = "factory_store";
// PostgreSQL refuses a NOTIFY payload of 8000 bytes or more: past this, the
// payload says "everything" instead of naming the tenants.
constexpr std::size_t kMaxPayload = 7900;

// The same tables and columns as the embedded store, so that what a test or
// an operator writes about one reads the same on the other. Bodies are text,
// not jsonb: jsonb reorders keys and rewrites numbers, and a record or a
// health sample must read back as it was written. feed_log is the status
// feed's, shared by the replicas (feed_log.hpp); added without a new schema
// version, as a coordinator that predates it never reads it.
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
CREATE TABLE IF NOT EXISTS feed_log (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  origin text NOT NULL,
  origin_seq bigint NOT NULL,
  type text NOT NULL,
  tenant text NOT NULL,
  data text NOT NULL,
  appended_unix bigint NOT NULL,
  CONSTRAINT feed_log_once UNIQUE (origin, origin_seq));
CREATE INDEX IF NOT EXISTS feed_log_by_age ON feed_log (appended_unix);
CREATE TABLE IF NOT EXISTS usage_archive (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant text NOT NULL,
  deleted_unix bigint NOT NULL,
  body text NOT NULL);
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
    {"archive_usage",
     "INSERT INTO usage_archive(tenant, deleted_unix, body) VALUES ($1, $2::bigint, $3)"},
    {"archived_usage", "SELECT body FROM usage_archive ORDER BY id"},
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
    // Locked in name order (the rows are locked as the sort returns them),
    // so two replicas' batches never wait on each other in a cycle here.
    {"lock_records",
     "SELECT name, record FROM tenants WHERE name = ANY($1::text[]) ORDER BY name FOR UPDATE"},
    {"some_tenants", "SELECT name, record FROM tenants WHERE name = ANY($1::text[])"},
    {"some_cursors",
     "SELECT tenant, agent_id, last_id FROM cursors WHERE tenant = ANY($1::text[])"},
    {"some_counts", "SELECT tenant, n FROM event_counts WHERE tenant = ANY($1::text[])"},
    {"some_health", "SELECT tenant, sample FROM health WHERE tenant = ANY($1::text[])"},
    {"notify", "SELECT pg_notify($1, $2)"},
};

// A text[] parameter in PostgreSQL's array syntax: every element quoted,
// its quotes and backslashes escaped.
std::string text_array(const std::vector<std::string>& items) {
  std::string out = "{";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += ',';
    out += '"';
    for (char ch : items[i]) {
      if (ch == '"' || ch == '\\') out += '\\';
      out += ch;
    }
    out += '"';
  }
  out += '}';
  return out;
}

// This store's name among the replicas: random, per open.
std::string new_replica_id() {
  std::random_device rd;
  std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

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

// Rows of (tenant, sample) into `out`. Saved by a coordinator, but a
// guest's words all the same: read back through the sample's own checks.
void read_health(const PGresult* r,
                 std::map<std::string, std::shared_ptr<const LatestHealth>>& out) {
  for (int i = 0; i < PQntuples(r); ++i) {
    auto j = nlohmann::json::parse(cell(r, i, 1), nullptr, false);
    if (auto latest = LatestHealth::from_json(j))
      out[cell(r, i, 0)] = std::make_shared<const LatestHealth>(std::move(*latest));
  }
}

// Rows of (name, record) into `out`; an unreadable record is left out with
// an error (one must not keep every other tenant out).
void read_records(const PGresult* r, std::map<std::string, TenantRecord>& out) {
  for (int i = 0; i < PQntuples(r); ++i) {
    auto j = nlohmann::json::parse(cell(r, i, 1), nullptr, false);
    auto rec = j.is_discarded() ? Result<TenantRecord>(Error(Errc::io, "not JSON"))
                                : TenantRecord::from_json(j);
    if (!rec) {
      spdlog::error("store: the record of tenant '{}' is unreadable ({}); it is left out",
                    cell(r, i, 0), rec.error().message);
      continue;
    }
    out[rec->name] = std::move(*rec);
  }
}

class PostgresBackend final : public StoreBackend {
 public:
  PostgresBackend(std::string conninfo, std::string where)
      : conninfo_(std::move(conninfo)),
        secret_(password_of(conninfo_)),
        where_(std::move(where)),
        wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  ~PostgresBackend() override {
    close();
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }
  PostgresBackend(const PostgresBackend&) = delete;
  PostgresBackend& operator=(const PostgresBackend&) = delete;

  // Connects, makes the tables if absent and answers what the database
  // holds; then opens the feed's log.
  Result<Snapshot> open(const FeedLogOptions& feed);

  std::vector<StoredEvent> recent_events(const std::string& tenant, std::size_t max) const override;
  std::vector<std::string> archived_usage() const override {
    std::vector<std::string> out;
    auto r = read("archived_usage", {});
    if (!r) {
      spdlog::error("{} (archived usage)", r.error().message);
      return out;
    }
    for (int i = 0; i < PQntuples(r->get()); ++i) out.push_back(cell(r->get(), i, 0));
    return out;
  }
  Status archive_usage(const std::string& tenant, std::int64_t deleted_unix,
                       const std::string& body) override {
    return done(run(wconn_, "archive_usage", {tenant, std::to_string(deleted_unix), body}));
  }

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
                  e.received_at, std::to_string(received_unix), e.json});
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
    // The feed's log first: what it still holds is written while the
    // database is there.
    if (feed_log_) feed_log_->close();
    stop_listening();
    // An open that failed half way may hold its connections too.
    disconnect(wconn_);
    disconnect(lconn_);
    std::lock_guard lk(read_mu_);
    disconnect(rconn_);
  }

  // --- replicas ----------------------------------------------------------------
  bool shared() const override { return true; }
  FeedLog* feed_log() override { return feed_log_.get(); }

  Result<std::map<std::string, TenantRecord>> lock_records(
      const std::vector<std::string>& names) override {
    auto r = run(wconn_, "lock_records", {text_array(names)});
    if (!r) return r.error();
    std::map<std::string, TenantRecord> out;
    read_records(r->get(), out);
    return out;
  }

  Result<Snapshot> load_tenants(const Invalidation& what) override;

  Status announce(const std::set<std::string>& tenants) override {
    nlohmann::json note = {{"replica", replica_}, {"tenants", tenants}};
    std::string payload = note.dump();
    if (payload.size() > kMaxPayload)
      payload = nlohmann::json{{"replica", replica_}, {"all", true}}.dump();
    return done(run(wconn_, "notify", {kStoreChannel, payload}));
  }

  void listen(std::function<void(Invalidation)> changed) override {
    if (listener_.joinable()) return;
    changed_ = std::move(changed);
    listen_stop_ = false;
    listener_ = std::thread([this] { listener_loop(); });
  }

  void stop_listening() override {
    if (!listener_.joinable()) return;
    listen_stop_ = true;
    wake();
    listener_.join();
  }

  // Before the listener thread starts (open()): LISTENing before memory is
  // loaded, so no change committed after the load goes unheard.
  Status start_listening() {
    auto c = connect_listener();
    if (!c) return c.error();
    lconn_ = *c;
    return {};
  }

 private:
  // The listener's connection: its own, LISTENing.
  Result<PGconn*> connect_listener() const;
  void listener_loop();
  // What the notifications waiting on the listener's connection say;
  // false when the connection is lost.
  bool drain_notifications(Invalidation& changed);
  void listener_lost(const std::string& why);
  void wake() const {
    const std::uint64_t one = 1;
    if (wake_fd_ < 0) return;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
  }
  // Waits for a wake() or `d`, whichever comes first, and consumes the wake.
  bool wait_wake(std::chrono::milliseconds d) const {
    pollfd p{wake_fd_, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(d.count()));
    if (n > 0) {
      std::uint64_t v;
      [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof v);
      return true;
    }
    return false;
  }
  // A prepared statement on the reading connection, made again once if lost.
  Result<PgResult> read(const char* name, const std::vector<std::string>& params) const;

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
  Result<PGconn*> connect(bool with_statements = true,
                          const char* app = "factory-coordinator") const;
  Status prepare(PGconn* c) const;
  // Runs a prepared statement; an error unless it returned rows or ran.
  Result<PgResult> run(PGconn* c, const char* name, const std::vector<std::string>& params) const;
  Result<PgResult> exec(PGconn* c, const char* sql) const;
  Status create_schema(PGconn* c);
  Result<Snapshot> load(PGconn* c, bool with_health = true) const;

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

  // Replicas.
  const std::string replica_ = new_replica_id();
  PGconn* lconn_ = nullptr;  // the listener's: open() makes it, then its thread's only
  const int wake_fd_;        // an eventfd: wakes the listener's poll (a stop)
  std::atomic<bool> listen_stop_{false};
  std::thread listener_;
  std::function<void(Invalidation)> changed_;
  // A server away for minutes is said once in a while, not every backoff.
  LogThrottle listener_log_{3, std::chrono::seconds(60)};
  LogThrottle listener_back_log_{3, std::chrono::seconds(60)};
  // The status feed's log (made once the schema is): its own connections
  // and threads.
  std::unique_ptr<FeedLog> feed_log_;
};

Result<PGconn*> PostgresBackend::connect(bool with_statements, const char* app) const {
  auto opened = open_connection(conninfo_, app, "store", where_, secret_);
  if (!opened) return opened.error();
  PGconn* c = *opened;
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
Result<Snapshot> PostgresBackend::load(PGconn* c, bool with_health) const {
  Snapshot s;
  auto t = exec(c, "SELECT name, record FROM tenants");
  if (!t) return t.error();
  read_records(t->get(), s.tenants);
  auto cur = exec(c, "SELECT tenant, agent_id, last_id FROM cursors");
  if (!cur) return cur.error();
  for (int i = 0; i < PQntuples(cur->get()); ++i)
    s.cursors[cursor_key(cell(cur->get(), i, 0), cell(cur->get(), i, 1))] =
        static_cast<std::uint64_t>(cell_int(cur->get(), i, 2));
  auto n = exec(c, "SELECT tenant, n FROM event_counts");
  if (!n) return n.error();
  for (int i = 0; i < PQntuples(n->get()); ++i)
    s.counts[cell(n->get(), i, 0)] = static_cast<std::size_t>(cell_int(n->get(), i, 1));
  if (!with_health) return s;
  auto h = exec(c, "SELECT tenant, sample FROM health");
  if (!h) return h.error();
  read_health(h->get(), s.health);
  return s;
}

Result<Snapshot> PostgresBackend::open(const FeedLogOptions& feed) {
  auto c = connect(false);
  if (!c) return c.error();
  wconn_ = *c;
  if (auto st = create_schema(wconn_); !st.ok()) return st.error();
  if (auto st = prepare(wconn_); !st.ok()) return st.error();
  if (auto st = start_listening(); !st.ok()) return st.error();
  auto snap = load(wconn_);
  if (!snap) return snap.error().with_context("load");
  auto r = connect();
  if (!r) return r.error();
  rconn_ = *r;
  feed_log_ = open_postgres_feed_log(conninfo_, where_, feed);
  return snap;
}

Result<PgResult> PostgresBackend::read(const char* name,
                                       const std::vector<std::string>& params) const {
  std::lock_guard lk(read_mu_);
  Result<PgResult> r = Error(Errc::unavailable, "store: not connected");
  // A connection lost since the last read is made again, once.
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!rconn_ || PQstatus(rconn_) != CONNECTION_OK) {
      disconnect(rconn_);
      auto c = connect();
      if (!c) return c.error();
      rconn_ = *c;
    }
    r = run(rconn_, name, params);
    if (r || r.error().code != Errc::unavailable) break;
  }
  return r;
}

std::vector<StoredEvent> PostgresBackend::recent_events(const std::string& tenant,
                                                        std::size_t max) const {
  std::vector<StoredEvent> out;
  auto r = read("recent", {tenant, std::to_string(max)});
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
    e.json = cell(res, i, 4);
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

Result<Snapshot> PostgresBackend::load_tenants(const Invalidation& what) {
  if (what.all) return load(wconn_);
  Snapshot s;
  const std::string names = text_array({what.tenants.begin(), what.tenants.end()});
  auto t = run(wconn_, "some_tenants", {names});
  if (!t) return t.error();
  read_records(t->get(), s.tenants);
  auto cur = run(wconn_, "some_cursors", {names});
  if (!cur) return cur.error();
  for (int i = 0; i < PQntuples(cur->get()); ++i)
    s.cursors[cursor_key(cell(cur->get(), i, 0), cell(cur->get(), i, 1))] =
        static_cast<std::uint64_t>(cell_int(cur->get(), i, 2));
  auto n = run(wconn_, "some_counts", {names});
  if (!n) return n.error();
  for (int i = 0; i < PQntuples(n->get()); ++i)
    s.counts[cell(n->get(), i, 0)] = static_cast<std::size_t>(cell_int(n->get(), i, 1));
  auto h = run(wconn_, "some_health", {names});
  if (!h) return h.error();
  read_health(h->get(), s.health);
  return s;
}

Result<PGconn*> PostgresBackend::connect_listener() const {
  auto c = connect(true, "factory-coordinator-listener");
  if (!c) return c.error();
  const std::string sql = std::string("LISTEN ") + kStoreChannel;
  if (auto r = exec(*c, sql.c_str()); !r) {
    PQfinish(*c);
    return r.error();
  }
  return c;
}

void PostgresBackend::listener_lost(const std::string& why) {
  if (auto v = listener_log_.admit(); v.log)
    spdlog::warn("store: the listener's connection to {} was lost ({}); reconnecting{}", where_,
                 scrub(why, secret_), v.note());
  disconnect(lconn_);
}

bool PostgresBackend::drain_notifications(Invalidation& changed) {
  if (!PQconsumeInput(lconn_) || PQstatus(lconn_) == CONNECTION_BAD) return false;
  while (PGnotify* note = PQnotifies(lconn_)) {
    const std::string channel = note->relname ? note->relname : "";
    const std::string payload = note->extra ? note->extra : "";
    PQfreemem(note);
    if (channel != kStoreChannel) continue;
    auto j = nlohmann::json::parse(payload, nullptr, false);
    if (!j.is_object()) {
      changed.all = true;  // not ours to read: everything, to be sure
      continue;
    }
    if (j.value("replica", "") == replica_) continue;  // this store's own batch
    if (j.value("all", false)) changed.all = true;
    if (auto t = j.find("tenants"); t != j.end() && t->is_array() && !changed.all)
      for (const auto& name : *t)
        if (name.is_string()) changed.tenants.insert(name.get<std::string>());
  }
  return true;
}

// The listener: waits on its connection's socket (and the wake eventfd, so
// close() stops it at once) and hands what another replica changed to the
// writer. A lost connection is made again with a backoff (100 ms to 5 s);
// notifications sent meanwhile are lost, so everything is reloaded once it
// is back.
void PostgresBackend::listener_loop() {
  using namespace std::chrono;
  auto backoff = milliseconds(100);
  while (!listen_stop_) {
    if (!lconn_) {
      auto c = connect_listener();
      if (!c) {
        if (auto v = listener_log_.admit(); v.log)
          spdlog::warn("{} (the store's listener; trying again){}", c.error().message, v.note());
        wait_wake(backoff);
        backoff = std::min<milliseconds>(backoff * 2, seconds(5));
        continue;
      }
      lconn_ = *c;
      backoff = milliseconds(100);
      if (auto v = listener_back_log_.admit(); v.log)
        spdlog::info("store: the listener is back on {}; every tenant is reloaded{}", where_,
                     v.note());
      if (changed_) changed_(Invalidation{true, {}});
    }
    pollfd fds[2] = {{PQsocket(lconn_), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    ::poll(fds, 2, -1);
    if (listen_stop_) break;
    if (fds[1].revents & POLLIN) {
      std::uint64_t v;
      [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof v);
    }
    Invalidation changed;
    if (!drain_notifications(changed)) {
      listener_lost(first_line(PQerrorMessage(lconn_)));
      continue;
    }
    if (changed_ && (changed.all || !changed.tenants.empty())) changed_(std::move(changed));
  }
}

}  // namespace

Result<std::unique_ptr<Store>> open_postgres_store(const std::string& conninfo, StoreOptions opts) {
  auto where = describe_conninfo(conninfo);
  if (!where) return where.error();
  auto backend = std::make_unique<PostgresBackend>(conninfo, *where);
  auto loaded = backend->open(opts.feed_log);
  if (!loaded) return loaded.error();
  return std::unique_ptr<Store>(
      std::make_unique<BatchingStore>(std::move(backend), std::move(*loaded), opts));
}

}  // namespace factory::store
