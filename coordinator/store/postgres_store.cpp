// The shared store: PostgreSQL through libpq, for coordinators that share one
// database. The same shape as the embedded store (sqlite_store.cpp): the
// tenants, cursors and counts mirrored in memory so that reads never wait,
// and one writer thread that turns whatever is queued into one transaction.
// What differs is what the database itself must enforce, because another
// coordinator may write to it too: an event is stored once by the database's
// constraints (the cursor row, taken forward only, and a unique key on
// (tenant, agent_id, event_id)), not by this process's memory; counts are
// incremented in the database, not overwritten; and a lost connection is
// reconnected with a backoff, the batch it broke answered with its error and
// rolled back whole, and the memory reloaded from what the database holds.
#include <libpq-fe.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "common/durations.hpp"
#include "common/log.hpp"
#include "coordinator/store/store.hpp"

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

std::string cursor_key(const std::string& tenant, const std::string& agent) {
  return tenant + '\0' + agent;
}

// --- the connection string, never shown whole ------------------------------

// The conninfo's password ("" when none): whatever is said about the
// database has it taken out.
std::string password_of(const std::string& conninfo) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(conninfo.c_str(), &err);
  PQfreemem(err);
  std::string pw;
  for (auto* o = opts; o && o->keyword; ++o)
    if (std::string_view(o->keyword) == "password" && o->val) pw = o->val;
  PQconninfoFree(opts);
  return pw;
}

std::string scrub(std::string text, const std::string& secret) {
  if (secret.empty()) return text;
  for (auto at = text.find(secret); at != std::string::npos; at = text.find(secret, at))
    text.replace(at, secret.size(), "***");
  return text;
}

// Where the store is, for messages: host, port, database and user, nothing
// else of the conninfo (a password, a key file's passphrase).
Result<std::string> describe_conninfo(const std::string& conninfo) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(conninfo.c_str(), &err);
  // libpq's message may quote the string it could not parse: not repeated.
  PQfreemem(err);
  if (!opts)
    return Error(Errc::invalid_argument,
                 "store: the PostgreSQL connection string does not parse (a key=value list or "
                 "a postgres:// URI; it is not repeated here, it may hold a password)");
  std::string out;
  for (auto* o = opts; o->keyword; ++o) {
    std::string_view k = o->keyword;
    if (!o->val || !*o->val) continue;
    if (k == "host" || k == "hostaddr" || k == "port" || k == "dbname" || k == "user")
      out += (out.empty() ? "" : " ") + std::string(k) + "=" + o->val;
  }
  PQconninfoFree(opts);
  return "postgres " + (out.empty() ? std::string("(libpq's defaults)") : out);
}

// The first line of libpq's message.
std::string first_line(const char* msg) {
  std::string s = msg ? msg : "";
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s.empty() ? "no message" : s;
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

// What one operation of a batch comes to, told once the batch is committed.
struct Outcome {
  Status status;
  AppendOutcome append;
  std::optional<TenantRecord> record;
};

class PostgresStore final : public Store {
 public:
  PostgresStore(std::string conninfo, std::string where, StoreOptions opts)
      : conninfo_(std::move(conninfo)),
        secret_(password_of(conninfo_)),
        where_(std::move(where)),
        opts_(opts) {}
  ~PostgresStore() override { close(); }

  Status open();

  // --- reads from memory ---------------------------------------------------
  std::vector<TenantRecord> list_tenants() const override {
    std::shared_lock lk(mu_);
    std::vector<TenantRecord> out;
    out.reserve(tenants_.size());
    for (auto& [_, t] : tenants_) out.push_back(t);
    return out;
  }
  std::optional<TenantRecord> get_tenant(const std::string& name) const override {
    std::shared_lock lk(mu_);
    auto it = tenants_.find(name);
    if (it == tenants_.end()) return std::nullopt;
    return it->second;
  }
  std::uint64_t last_event_id(const std::string& tenant, const std::string& agent) const override {
    std::shared_lock lk(mu_);
    auto it = cursors_.find(cursor_key(tenant, agent));
    return it == cursors_.end() ? 0 : it->second;
  }
  std::size_t event_count(const std::string& tenant) const override {
    std::shared_lock lk(mu_);
    auto it = counts_.find(tenant);
    return it == counts_.end() ? 0 : it->second;
  }
  std::shared_ptr<const LatestHealth> get_health(const std::string& tenant) const override {
    std::lock_guard lk(health_mu_);
    auto it = health_.find(tenant);
    return it == health_.end() ? nullptr : it->second.sample;
  }
  StoreStats stats() const override {
    std::lock_guard lk(queue_mu_);
    StoreStats s = stats_;
    s.queued = queue_.size();
    return s;
  }

  std::vector<StoredEvent> recent_events(const std::string& tenant, std::size_t max) const override;

  // --- writes ----------------------------------------------------------------
  Status put_tenant(const TenantRecord& t) override {
    if (auto st = refuse_on_writer("put_tenant"); !st.ok()) return st;
    std::promise<Status> p;
    Op op;
    op.kind = Op::Kind::put;
    op.tenant = t.name;
    op.record = t;
    op.status_done = [&p](Status st) { p.set_value(std::move(st)); };
    enqueue(std::move(op));
    return p.get_future().get();
  }

  Status delete_tenant(const std::string& name) override {
    if (auto st = refuse_on_writer("delete_tenant"); !st.ok()) return st;
    std::promise<Status> p;
    Op op;
    op.kind = Op::Kind::remove;
    op.tenant = name;
    op.status_done = [&p](Status st) { p.set_value(std::move(st)); };
    enqueue(std::move(op));
    return p.get_future().get();
  }

  Result<TenantRecord> update_tenant(const std::string& name,
                                     std::function<Status(TenantRecord&)> change) override {
    if (auto st = refuse_on_writer("update_tenant"); !st.ok()) return st.error();
    std::promise<Result<TenantRecord>> p;
    update_tenant_async(name, std::move(change),
                        [&p](Result<TenantRecord> r) { p.set_value(std::move(r)); });
    return p.get_future().get();
  }

  void update_tenant_async(const std::string& name, std::function<Status(TenantRecord&)> change,
                           std::function<void(Result<TenantRecord>)> done) override {
    Op op;
    op.kind = Op::Kind::update;
    op.tenant = name;
    op.change = std::move(change);
    op.update_done = std::move(done);
    enqueue(std::move(op));
  }

  void append_event(const std::string& tenant, StoredEvent e, Projection project,
                    std::function<void(Result<AppendOutcome>)> done,
                    std::function<bool()> still_wanted) override {
    Op op;
    op.kind = Op::Kind::append;
    op.tenant = tenant;
    op.event = std::move(e);
    op.project = std::move(project);
    op.append_done = std::move(done);
    op.still_wanted = std::move(still_wanted);
    enqueue(std::move(op));
  }

  void put_health(const std::string& tenant, std::shared_ptr<const LatestHealth> sample) override {
    if (!sample) return;
    std::lock_guard lk(health_mu_);
    auto& h = health_[tenant];
    h.sample = std::move(sample);
    h.dirty = true;
  }

  void close() override {
    bool writer_running = false;
    {
      std::lock_guard lk(queue_mu_);
      if (stopping_) return;
      stopping_ = true;
      writer_running = writer_.joinable();
    }
    if (writer_running) {
      queue_cv_.notify_all();
      writer_.join();
    }
    // An open that failed half way never started the writer but may hold
    // its connections.
    disconnect(wconn_);
    std::lock_guard lk(read_mu_);
    disconnect(rconn_);
  }

 private:
  struct Op {
    enum class Kind { append, update, put, remove } kind = Kind::append;
    std::string tenant;
    StoredEvent event;
    Projection project;
    std::function<void(Result<AppendOutcome>)> append_done;
    std::function<bool()> still_wanted;
    std::function<Status(TenantRecord&)> change;
    std::function<void(Result<TenantRecord>)> update_done;
    TenantRecord record;
    std::function<void(Status)> status_done;
  };

  // What one batch changes, published to memory only once it is committed.
  struct Overlay {
    std::map<std::string, std::optional<TenantRecord>> tenants;  // nullopt: deleted
    std::unordered_map<std::string, std::uint64_t> cursors;
    std::map<std::string, std::int64_t> counts;  // absolute values, as the database has them
    std::vector<std::string> deleted;
  };

  struct HealthEntry {
    std::shared_ptr<const LatestHealth> sample;
    bool dirty = false;
  };

  // What load() reads: swapped into memory whole.
  struct Snapshot {
    std::map<std::string, TenantRecord> tenants;
    std::unordered_map<std::string, std::uint64_t> cursors;
    std::map<std::string, std::size_t> counts;
    std::map<std::string, std::shared_ptr<const LatestHealth>> health;
  };

  Status refuse_on_writer(const char* what) const {
    if (std::this_thread::get_id() == writer_id_.load())
      return Error(Errc::internal, std::string("store: ") + what +
                                       " called from a store callback would wait for itself");
    return {};
  }

  void enqueue(Op op) {
    {
      std::lock_guard lk(queue_mu_);
      if (stopping_) {
        fail_op(op, Error(Errc::unavailable, "store: closed"));
        return;
      }
      queue_.push_back(std::move(op));
    }
    queue_cv_.notify_one();
  }

  static void fail_op(Op& op, const Error& e) {
    switch (op.kind) {
      case Op::Kind::append:
        if (op.append_done) op.append_done(e);
        break;
      case Op::Kind::update:
        if (op.update_done) op.update_done(e);
        break;
      case Op::Kind::put:
      case Op::Kind::remove:
        if (op.status_done) op.status_done(e);
        break;
    }
  }

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

  // A connection, its statements prepared (once the schema exists).
  Result<PGconn*> connect(bool with_statements = true) const;
  Status prepare(PGconn* c) const;
  // Runs a prepared statement; an error unless it returned rows or ran.
  Result<PgResult> run(PGconn* c, const char* name, const std::vector<std::string>& params) const;
  Result<PgResult> exec(PGconn* c, const char* sql) const;
  Status create_schema(PGconn* c);
  Result<Snapshot> load(PGconn* c) const;
  void publish(Snapshot snap, bool with_health);
  bool ensure_writer_connection(Error& why);

  void writer_loop();
  void run_batch(std::deque<Op>& batch, bool maintenance_due, bool health_due);
  // Runs the operations of a batch inside its transaction; the first
  // statement that fails ends it with that statement's error.
  Status apply_ops(std::deque<Op>& batch, Overlay& ov, std::vector<Outcome>& outcomes,
                   std::uint64_t& stored, std::uint64_t& duplicates);
  std::optional<TenantRecord> current(const Overlay& ov, const std::string& name) const;
  std::uint64_t current_cursor(const Overlay& ov, const std::string& key) const;
  Status write_record(const TenantRecord& rec);
  Status add_count(Overlay& ov, const std::string& tenant, std::int64_t delta);
  Status apply_retention(Overlay& ov, std::uint64_t& expired);
  Status expire_old(Overlay& ov, Clock::time_point now, std::uint64_t& expired);
  Status flush_health(
      std::vector<std::pair<std::string, std::shared_ptr<const LatestHealth>>>& written);

  const std::string conninfo_;  // holds the password: never logged, never in a message
  const std::string secret_;    // scrubbed from whatever libpq says
  const std::string where_;     // the conninfo without its secrets, for messages
  StoreOptions opts_;
  PGconn* wconn_ = nullptr;          // the writer's
  mutable PGconn* rconn_ = nullptr;  // for reads of the history, under read_mu_
  mutable std::mutex read_mu_;
  // Reconnection of the writer's connection, on the writer thread only.
  std::chrono::milliseconds backoff_{100};
  std::chrono::steady_clock::time_point next_connect_{};
  Error connect_error_;

  mutable std::shared_mutex mu_;
  std::map<std::string, TenantRecord> tenants_;
  std::unordered_map<std::string, std::uint64_t> cursors_;
  std::map<std::string, std::size_t> counts_;

  mutable std::mutex health_mu_;
  std::map<std::string, HealthEntry> health_;

  mutable std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Op> queue_;
  bool stopping_ = false;
  StoreStats stats_;
  std::thread writer_;
  std::atomic<std::thread::id> writer_id_{};
  LogThrottle write_failure_log_{};
};

Result<PGconn*> PostgresStore::connect(bool with_statements) const {
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

Status PostgresStore::prepare(PGconn* c) const {
  for (const auto& p : kStatements) {
    PgResult r(PQprepare(c, p.name, p.sql, 0, nullptr));
    if (PQresultStatus(r.get()) != PGRES_COMMAND_OK)
      return pg_error(c, r.get(), std::string("prepare ") + p.name);
  }
  return {};
}

Result<PgResult> PostgresStore::run(PGconn* c, const char* name,
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

Result<PgResult> PostgresStore::exec(PGconn* c, const char* sql) const {
  PgResult r(PQexec(c, sql));
  auto st = PQresultStatus(r.get());
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
    std::string what(sql, std::min<std::size_t>(std::strlen(sql), 40));
    return pg_error(c, r.get(), first_line(what.c_str()));
  }
  return r;
}

Status PostgresStore::create_schema(PGconn* c) {
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
Result<PostgresStore::Snapshot> PostgresStore::load(PGconn* c) const {
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

// The database's word replaces memory's. Health only at open: after a
// reconnection memory's samples are the newer ones.
void PostgresStore::publish(Snapshot snap, bool with_health) {
  {
    std::unique_lock lk(mu_);
    tenants_ = std::move(snap.tenants);
    cursors_ = std::move(snap.cursors);
    counts_ = std::move(snap.counts);
  }
  if (!with_health) return;
  std::lock_guard lk(health_mu_);
  for (auto& [tenant, h] : snap.health) health_[tenant] = {std::move(h), false};
}

Status PostgresStore::open() {
  auto c = connect(false);
  if (!c) return c.error();
  wconn_ = *c;
  if (auto st = create_schema(wconn_); !st.ok()) return st;
  if (auto st = prepare(wconn_); !st.ok()) return st;
  auto snap = load(wconn_);
  if (!snap) return snap.error().with_context("load");
  publish(std::move(*snap), true);
  auto r = connect();
  if (!r) return r.error();
  rconn_ = *r;
  writer_ = std::thread([this] {
    writer_id_ = std::this_thread::get_id();
    writer_loop();
  });
  return {};
}

std::vector<StoredEvent> PostgresStore::recent_events(const std::string& tenant,
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

std::optional<TenantRecord> PostgresStore::current(const Overlay& ov,
                                                   const std::string& name) const {
  if (auto it = ov.tenants.find(name); it != ov.tenants.end()) return it->second;
  std::shared_lock lk(mu_);
  auto it = tenants_.find(name);
  if (it == tenants_.end()) return std::nullopt;
  return it->second;
}

std::uint64_t PostgresStore::current_cursor(const Overlay& ov, const std::string& key) const {
  if (auto it = ov.cursors.find(key); it != ov.cursors.end()) return it->second;
  std::shared_lock lk(mu_);
  auto it = cursors_.find(key);
  return it == cursors_.end() ? 0 : it->second;
}

Status PostgresStore::write_record(const TenantRecord& rec) {
  auto r = run(wconn_, "put_tenant", {rec.name, rec.to_json().dump()});
  if (!r) return r.error();
  return {};
}

// The count moves by delta in the database, and memory takes the database's
// figure: another coordinator's events count too.
Status PostgresStore::add_count(Overlay& ov, const std::string& tenant, std::int64_t delta) {
  auto r = run(wconn_, "add_count", {tenant, std::to_string(delta)});
  if (!r) return r.error();
  ov.counts[tenant] = cell_int(r->get(), 0, 0);
  return {};
}

// Reconnects the writer's connection when it is lost, no more often than the
// backoff allows (100 ms, doubling to 5 s): false, with why, while it is
// down, and the batch is answered with that.
bool PostgresStore::ensure_writer_connection(Error& why) {
  if (wconn_ && PQstatus(wconn_) == CONNECTION_OK) return true;
  disconnect(wconn_);
  auto now = std::chrono::steady_clock::now();
  if (now < next_connect_) {
    why = connect_error_;
    return false;
  }
  auto c = connect();
  Result<Snapshot> snap = c ? load(*c) : Result<Snapshot>(c.error());
  if (!snap) {
    if (c) PQfinish(*c);
    connect_error_ = snap.error();
    why = connect_error_;
    next_connect_ = now + backoff_;
    backoff_ = std::min<std::chrono::milliseconds>(backoff_ * 2, std::chrono::seconds(5));
    return false;
  }
  wconn_ = *c;
  backoff_ = std::chrono::milliseconds(100);
  // A batch whose COMMIT was sent but not answered may have been stored:
  // what the database holds is the truth, and replays of it read as such.
  publish(std::move(*snap), false);
  spdlog::info("store: reconnected to {}", where_);
  return true;
}

void PostgresStore::writer_loop() {
  auto next_maintenance = std::chrono::steady_clock::now() + opts_.maintenance_every;
  auto next_health = std::chrono::steady_clock::now() + opts_.health_flush;
  for (;;) {
    std::deque<Op> batch;
    bool stopping;
    {
      std::unique_lock lk(queue_mu_);
      queue_cv_.wait_until(lk, std::min(next_maintenance, next_health),
                           [&] { return stopping_ || !queue_.empty(); });
      stopping = stopping_;
      while (!queue_.empty() && batch.size() < opts_.max_batch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    auto now = std::chrono::steady_clock::now();
    bool maintenance = now >= next_maintenance;
    bool health = now >= next_health || stopping;
    if (maintenance) next_maintenance = now + opts_.maintenance_every;
    if (health) next_health = now + opts_.health_flush;
    if (!batch.empty() || maintenance || health) run_batch(batch, maintenance, health);
    if (stopping) {
      std::lock_guard lk(queue_mu_);
      if (queue_.empty()) return;
    }
  }
}

Status PostgresStore::apply_ops(std::deque<Op>& batch, Overlay& ov, std::vector<Outcome>& outcomes,
                                std::uint64_t& stored, std::uint64_t& duplicates) {
  const auto now_unix = std::to_string(unix_seconds(Clock::now()));
  for (std::size_t i = 0; i < batch.size(); ++i) {
    Op& op = batch[i];
    Outcome& out = outcomes[i];
    switch (op.kind) {
      case Op::Kind::append: {
        if (op.still_wanted && !op.still_wanted()) {
          out.status =
              Error(Errc::conflict, "store: cancelled (an earlier event of the session failed)");
          break;
        }
        auto rec = current(ov, op.tenant);
        if (!rec) {
          out.status = Error(Errc::not_found, "store: no tenant " + op.tenant);
          break;
        }
        const std::string key = cursor_key(op.tenant, op.event.agent_id);
        // Memory's cursor answers most replays without a round trip; the
        // database's answers the rest (an event another coordinator stored).
        if (op.event.id <= current_cursor(ov, key)) {
          ++duplicates;
          break;
        }
        const std::string id = std::to_string(static_cast<std::int64_t>(op.event.id));
        auto r = run(wconn_, "append",
                     {op.tenant, op.event.agent_id, id, op.event.received_at, now_unix,
                      op.event.event.dump()});
        if (!r) return r.error();
        if (PQntuples(r->get()) == 0) {
          ++duplicates;
          auto c = run(wconn_, "get_cursor", {op.tenant, op.event.agent_id});
          if (!c) return c.error();
          if (PQntuples(c->get()) > 0)
            ov.cursors[key] = static_cast<std::uint64_t>(cell_int(c->get(), 0, 0));
          break;
        }
        out.append.seq = static_cast<std::uint64_t>(cell_int(r->get(), 0, 0));
        ov.cursors[key] = op.event.id;
        if (auto st = add_count(ov, op.tenant, 1); !st.ok()) return st;
        if (op.project) {
          TenantRecord changed = std::move(*rec);
          bool did = false;
          try {
            did = op.project(changed);
          } catch (const std::exception& e) {
            spdlog::error("store: projection of an event of {} threw: {}", op.tenant, e.what());
          }
          if (did) {
            if (auto st = write_record(changed); !st.ok()) return st;
            ov.tenants[op.tenant] = changed;
            out.append.record = std::move(changed);
          }
        }
        out.append.stored = true;
        ++stored;
        break;
      }
      case Op::Kind::update: {
        auto rec = current(ov, op.tenant);
        if (!rec) {
          out.status = Error(Errc::not_found, "no tenant " + op.tenant);
          break;
        }
        Status st;
        try {
          st = op.change(*rec);
        } catch (const std::exception& e) {
          st = Error(Errc::internal, std::string("store: update threw: ") + e.what());
        }
        if (!st.ok()) {
          out.status = st;
          break;
        }
        if (auto w = write_record(*rec); !w.ok()) return w;
        ov.tenants[op.tenant] = *rec;
        out.record = std::move(*rec);
        break;
      }
      case Op::Kind::put:
        if (auto w = write_record(op.record); !w.ok()) return w;
        ov.tenants[op.tenant] = op.record;
        break;
      case Op::Kind::remove:
        for (const char* stmt :
             {"del_tenant", "del_events", "del_cursors", "del_count", "del_health"})
          if (auto r = run(wconn_, stmt, {op.tenant}); !r) return r.error();
        ov.tenants[op.tenant] = std::nullopt;
        ov.counts.erase(op.tenant);
        for (auto it = ov.cursors.begin(); it != ov.cursors.end();)
          it = it->first.rfind(op.tenant + '\0', 0) == 0 ? ov.cursors.erase(it) : std::next(it);
        ov.deleted.push_back(op.tenant);
        {
          std::lock_guard lk(health_mu_);
          health_.erase(op.tenant);
        }
        break;
    }
  }
  return {};
}

void PostgresStore::run_batch(std::deque<Op>& batch, bool maintenance_due, bool health_due) {
  Overlay ov;
  std::vector<Outcome> outcomes(batch.size());
  std::uint64_t stored = 0, duplicates = 0, expired = 0;
  std::vector<std::pair<std::string, std::shared_ptr<const LatestHealth>>> health_written;
  Error why;
  Status st;
  if (!ensure_writer_connection(why)) {
    st = why;
  } else if (auto b = exec(wconn_, "BEGIN"); !b) {
    st = b.error();
  } else {
    st = apply_ops(batch, ov, outcomes, stored, duplicates);
    // The cap is applied every batch (only tenants over it are touched); the
    // age rule at maintenance.
    if (st.ok() && (maintenance_due || stored > 0)) st = apply_retention(ov, expired);
    if (st.ok() && maintenance_due) st = expire_old(ov, Clock::now(), expired);
    if (st.ok() && health_due) st = flush_health(health_written);
    if (st.ok())
      if (auto c = exec(wconn_, "COMMIT"); !c) st = c.error();
    if (!st.ok() && PQstatus(wconn_) == CONNECTION_OK) PQclear(PQexec(wconn_, "ROLLBACK"));
  }
  if (!st.ok()) {
    const Error& e = st.error();
    if (auto v = write_failure_log_.admit(); v.log) spdlog::error("{}{}", e.message, v.note());
    {
      std::lock_guard lk(queue_mu_);
      ++stats_.write_failures;
    }
    // Health samples that were not written stay dirty for the next try.
    {
      std::lock_guard lk(health_mu_);
      for (auto& [tenant, _] : health_written)
        if (auto it = health_.find(tenant); it != health_.end()) it->second.dirty = true;
    }
    for (auto& op : batch) fail_op(op, e);
    return;
  }
  // Committed: publish, then tell.
  {
    std::unique_lock lk(mu_);
    for (auto& [name, rec] : ov.tenants) {
      if (rec)
        tenants_[name] = std::move(*rec);
      else
        tenants_.erase(name);
    }
    for (auto& name : ov.deleted) {
      for (auto it = cursors_.begin(); it != cursors_.end();)
        it = it->first.rfind(name + '\0', 0) == 0 ? cursors_.erase(it) : std::next(it);
      counts_.erase(name);
    }
    for (auto& [k, v] : ov.cursors) cursors_[k] = v;
    for (auto& [t, n] : ov.counts) counts_[t] = static_cast<std::size_t>(n);
  }
  {
    std::lock_guard lk(queue_mu_);
    stats_.events_stored += stored;
    stats_.events_duplicate += duplicates;
    stats_.events_expired += expired;
    ++stats_.transactions;
  }
  for (std::size_t i = 0; i < batch.size(); ++i) {
    Op& op = batch[i];
    Outcome& out = outcomes[i];
    switch (op.kind) {
      case Op::Kind::append:
        if (!op.append_done) break;
        if (out.status.ok())
          op.append_done(std::move(out.append));
        else
          op.append_done(out.status.error());
        break;
      case Op::Kind::update:
        if (!op.update_done) break;
        if (out.status.ok())
          op.update_done(std::move(*out.record));
        else
          op.update_done(out.status.error());
        break;
      case Op::Kind::put:
      case Op::Kind::remove:
        if (op.status_done) op.status_done(out.status);
        break;
    }
  }
}

// Tenants over their cap lose their oldest events, in the same transaction.
Status PostgresStore::apply_retention(Overlay& ov, std::uint64_t& expired) {
  const auto cap = static_cast<std::int64_t>(opts_.max_events_per_tenant);
  std::vector<std::string> over;
  for (auto& [tenant, n] : ov.counts)
    if (n > cap) over.push_back(tenant);
  for (auto& tenant : over) {
    auto r = run(wconn_, "trim_tenant", {tenant, std::to_string(cap)});
    if (!r) return r.error();
    std::int64_t removed = cell_int(r->get(), 0, 0);
    expired += static_cast<std::uint64_t>(removed);
    if (auto st = add_count(ov, tenant, -removed); !st.ok()) return st;
  }
  return {};
}

Status PostgresStore::expire_old(Overlay& ov, Clock::time_point now, std::uint64_t& expired) {
  auto r = run(wconn_, "expire", {std::to_string(unix_seconds(now) - opts_.max_event_age.count())});
  if (!r) return r.error();
  std::map<std::string, std::int64_t> gone;
  for (int i = 0; i < PQntuples(r->get()); ++i) ++gone[cell(r->get(), i, 0)];
  for (auto& [tenant, k] : gone) {
    if (auto st = add_count(ov, tenant, -k); !st.ok()) return st;
    expired += static_cast<std::uint64_t>(k);
  }
  return {};
}

Status PostgresStore::flush_health(
    std::vector<std::pair<std::string, std::shared_ptr<const LatestHealth>>>& written) {
  {
    std::lock_guard lk(health_mu_);
    for (auto& [tenant, h] : health_) {
      if (!h.dirty) continue;
      written.emplace_back(tenant, h.sample);
      h.dirty = false;
    }
  }
  for (auto& [tenant, sample] : written)
    if (auto r = run(wconn_, "put_health", {tenant, sample->to_json().dump()}); !r)
      return r.error();
  return {};
}

}  // namespace

Result<std::unique_ptr<Store>> open_postgres_store(const std::string& conninfo, StoreOptions opts) {
  auto where = describe_conninfo(conninfo);
  if (!where) return where.error();
  auto s = std::make_unique<PostgresStore>(conninfo, *where, opts);
  if (auto st = s->open(); !st.ok()) return st.error();
  return std::unique_ptr<Store>(std::move(s));
}

}  // namespace factory::store
