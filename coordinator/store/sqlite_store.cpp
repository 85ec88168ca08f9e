// The embedded store: SQLite in WAL mode with synchronous=FULL (a commit is
// on the disk when it returns). The writer thread, the batching and the
// memory are BatchingStore's (batching_store.hpp); this is the SQL, the file
// (0600, its WAL beside it) and the import of the earlier file store. One
// process is the only writer of the file, so memory's cursors and counts are
// the truth and are written as they are.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>

#include "common/atomic_file.hpp"
#include "common/durations.hpp"
#include "common/log.hpp"
#include "coordinator/store/batching_store.hpp"

namespace factory::store {
namespace fs = std::filesystem;

namespace {

constexpr int kSqliteSchemaVersion = 1;

const char* kSqliteSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tenants (name TEXT PRIMARY KEY, record TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  tenant TEXT NOT NULL,
  agent_id TEXT NOT NULL,
  event_id INTEGER NOT NULL,
  received_at TEXT NOT NULL,
  received_unix INTEGER NOT NULL,
  body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_by_tenant ON events (tenant, seq);
CREATE INDEX IF NOT EXISTS events_by_age ON events (received_unix);
CREATE TABLE IF NOT EXISTS cursors (
  tenant TEXT NOT NULL, agent_id TEXT NOT NULL, last_id INTEGER NOT NULL,
  PRIMARY KEY (tenant, agent_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS event_counts (tenant TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS health (tenant TEXT PRIMARY KEY, sample TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS usage_archive (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  tenant TEXT NOT NULL,
  deleted_unix INTEGER NOT NULL,
  body TEXT NOT NULL);
)sql";

Error db_error(sqlite3* db, const std::string& what) {
  return Error(Errc::io, "store: " + what + ": " + sqlite3_errmsg(db));
}

// A prepared statement, reset after each use.
class Stmt {
 public:
  Stmt() = default;
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &s_, nullptr) != SQLITE_OK) {
      spdlog::critical("store: cannot prepare '{}': {}", sql, sqlite3_errmsg(db));
      s_ = nullptr;
    }
  }
  ~Stmt() {
    if (s_) sqlite3_finalize(s_);
  }
  Stmt(Stmt&& o) noexcept : db_(o.db_), s_(o.s_) { o.s_ = nullptr; }
  Stmt& operator=(Stmt&& o) noexcept {
    std::swap(db_, o.db_);
    std::swap(s_, o.s_);
    return *this;
  }
  Stmt& bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& bind(int i, std::int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  // SQLITE_ROW or SQLITE_DONE; anything else is an error (in ok()).
  int step() {
    rc_ = sqlite3_step(s_);
    return rc_;
  }
  bool ok() const { return rc_ == SQLITE_ROW || rc_ == SQLITE_DONE; }
  std::string text(int col) const {
    const auto* p = sqlite3_column_text(s_, col);
    return p ? std::string(reinterpret_cast<const char*>(p),
                           static_cast<std::size_t>(sqlite3_column_bytes(s_, col)))
             : std::string();
  }
  std::int64_t int64(int col) const { return sqlite3_column_int64(s_, col); }
  // Runs to completion; false on an error.
  bool run() {
    step();
    bool good = ok() && rc_ == SQLITE_DONE;
    reset();
    return good;
  }
  void reset() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  bool valid() const { return s_ != nullptr; }

 private:
  sqlite3* db_ = nullptr;
  sqlite3_stmt* s_ = nullptr;
  int rc_ = SQLITE_OK;
};

bool exec(sqlite3* db, const char* sql, std::string* err = nullptr) {
  char* msg = nullptr;
  int rc = sqlite3_exec(db, sql, nullptr, nullptr, &msg);
  if (rc != SQLITE_OK && err) *err = msg ? msg : sqlite3_errstr(rc);
  sqlite3_free(msg);
  return rc == SQLITE_OK;
}

class SqliteBackend final : public StoreBackend {
 public:
  explicit SqliteBackend(fs::path dir) : dir_(std::move(dir)) {}
  ~SqliteBackend() override { close(); }
  SqliteBackend(const SqliteBackend&) = delete;
  SqliteBackend& operator=(const SqliteBackend&) = delete;

  // Opens (or makes) the file and answers what it holds, the file store of
  // earlier versions imported first.
  Result<Snapshot> open();

  std::vector<StoredEvent> recent_events(const std::string& tenant,
                                         std::size_t max) const override {
    std::lock_guard lk(read_mu_);
    std::vector<StoredEvent> out;
    auto& q = recent_stmt_;
    q.bind(1, tenant).bind(2, static_cast<std::int64_t>(max));
    while (q.step() == SQLITE_ROW) {
      StoredEvent e;
      e.seq = static_cast<std::uint64_t>(q.int64(0));
      e.agent_id = q.text(1);
      e.id = static_cast<std::uint64_t>(q.int64(2));
      e.received_at = q.text(3);
      e.json = q.text(4);
      out.push_back(std::move(e));
    }
    q.reset();
    std::reverse(out.begin(), out.end());
    return out;
  }

  std::vector<std::string> archived_usage() const override {
    std::lock_guard lk(read_mu_);
    std::vector<std::string> out;
    Stmt q(rdb_, "SELECT body FROM usage_archive ORDER BY id");
    while (q.step() == SQLITE_ROW) out.push_back(q.text(0));
    return out;
  }

  Status archive_usage(const std::string& tenant, std::int64_t deleted_unix,
                       const std::string& body) override {
    return written(stmts_->archive_usage.bind(1, tenant).bind(2, deleted_unix).bind(3, body).run());
  }

  // A file is never lost the way a connection is.
  Status reconnect_if_lost(std::optional<Snapshot>& /*reloaded*/) override { return {}; }
  Status begin() override {
    cursor_moves_.clear();
    return written(stmts_->begin.run());
  }
  // The agents' cursors, one upsert per agent per transaction however many
  // of its events it holds: they only ever move with the events, in the
  // same transaction.
  Status commit() override {
    auto& put = stmts_->put_cursor;
    for (const auto& [who, id] : cursor_moves_)
      if (!put.bind(1, who.first).bind(2, who.second).bind(3, id).run()) return write_error();
    cursor_moves_.clear();
    return written(stmts_->commit.run());
  }
  void rollback() override {
    cursor_moves_.clear();
    stmts_->rollback.run();
  }

  Status write_record(const TenantRecord& rec) override {
    return written(stmts_->put_tenant.bind(1, rec.name).bind(2, rec.to_json().dump()).run());
  }

  Result<Inserted> insert_event(const std::string& tenant, const StoredEvent& e,
                                std::int64_t received_unix) override {
    auto& s = *stmts_;
    s.insert_event.bind(1, tenant)
        .bind(2, e.agent_id)
        .bind(3, static_cast<std::int64_t>(e.id))
        .bind(4, e.received_at)
        .bind(5, received_unix)
        .bind(6, e.json);
    if (!s.insert_event.run()) return write_error();
    Inserted out;
    out.stored = true;
    out.seq = static_cast<std::uint64_t>(sqlite3_last_insert_rowid(db_));
    auto& moved = cursor_moves_[{tenant, e.agent_id}];
    moved = std::max(moved, static_cast<std::int64_t>(e.id));
    return out;
  }

  Result<std::int64_t> add_count(const std::string& tenant, std::int64_t delta,
                                 std::int64_t current) override {
    const std::int64_t n = std::max<std::int64_t>(0, current + delta);
    if (!stmts_->put_count.bind(1, tenant).bind(2, n).run()) return write_error();
    return n;
  }

  Status put_health(const std::string& tenant, const std::string& sample) override {
    return written(stmts_->put_health.bind(1, tenant).bind(2, sample).run());
  }

  Status delete_tenant(const std::string& name) override {
    // Its cursors go with it, the ones this transaction moved too.
    std::erase_if(cursor_moves_, [&](const auto& m) { return m.first.first == name; });
    auto& s = *stmts_;
    return written(s.del_tenant.bind(1, name).run() && s.del_events.bind(1, name).run() &&
                   s.del_cursors.bind(1, name).run() && s.del_count.bind(1, name).run() &&
                   s.del_health.bind(1, name).run());
  }

  Result<std::int64_t> trim_tenant(const std::string& tenant, std::int64_t keep) override {
    if (!stmts_->trim_tenant.bind(1, tenant).bind(2, keep).run()) return write_error();
    return static_cast<std::int64_t>(sqlite3_changes(db_));
  }

  Result<std::map<std::string, std::int64_t>> expire_before(std::int64_t before_unix) override {
    auto& q = stmts_->expire;
    q.bind(1, before_unix);
    std::map<std::string, std::int64_t> gone;
    while (q.step() == SQLITE_ROW) ++gone[q.text(0)];
    const bool good = q.ok();
    q.reset();
    if (!good) return write_error();
    return gone;
  }

  void close() override {
    // An open that failed half way (a newer schema, say) holds the database
    // too: it is closed here (LeakSanitizer found the handle of every
    // refused database left open).
    if (db_) {
      // Statements first: sqlite3_close refuses a database with live statements.
      stmts_.reset();
      recent_stmt_ = Stmt();
      sqlite3_close(db_);
      db_ = nullptr;
    }
    if (rdb_) {
      sqlite3_close(rdb_);
      rdb_ = nullptr;
    }
  }

 private:
  // Cursors moved by this transaction's events, written at its commit.
  std::map<std::pair<std::string, std::string>, std::int64_t> cursor_moves_;

  struct Statements {
    Stmt begin, commit, rollback, put_tenant, insert_event, put_cursor, put_count, put_health,
        del_tenant, del_events, del_cursors, del_count, del_health, trim_tenant, expire,
        archive_usage;
  };

  Error write_error() const { return db_error(db_, "write"); }
  Status written(bool good) const {
    if (!good) return write_error();
    return {};
  }

  Status load(Snapshot& snap);
  Status import_file_store(Snapshot& snap);

  fs::path dir_;
  sqlite3* db_ = nullptr;   // the writer's
  sqlite3* rdb_ = nullptr;  // for reads from the disk
  std::unique_ptr<Statements> stmts_;
  mutable Stmt recent_stmt_;
  mutable std::mutex read_mu_;
};

Result<Snapshot> SqliteBackend::open() {
  if (auto st = ensure_dir(dir_, 0700); !st.ok()) return st.error();
  const fs::path path = dir_ / "factory.db";
  // SQLite gives its WAL and shared-memory files the database file's mode:
  // creating it 0600 first keeps all three private.
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return errno_error("store: create " + path.string(), errno);
  ::fchmod(fd, 0600);
  ::close(fd);
  if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr) !=
      SQLITE_OK)
    return db_error(db_, "open " + path.string());
  sqlite3_busy_timeout(db_, 5000);
  std::string err;
  if (!exec(db_, "PRAGMA journal_mode=WAL;", &err) ||
      !exec(db_, "PRAGMA synchronous=FULL;", &err) ||
      !exec(db_, "PRAGMA foreign_keys=OFF;", &err) || !exec(db_, kSqliteSchema, &err))
    return Error(Errc::io,
                 "store: " + path.string() + ": " + err +
                     " (is it a Factory database? restore it from a backup or move it away)");
  {
    Stmt v(db_, "SELECT value FROM meta WHERE key='schema'");
    if (v.step() == SQLITE_ROW && std::stoi(v.text(0)) > kSqliteSchemaVersion)
      return Error(Errc::failed_precondition,
                   "store: " + path.string() + " was written by a newer Factory (schema " +
                       v.text(0) + "); run that version, or restore a backup");
    v.reset();
    exec(db_, ("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema', '" +
               std::to_string(kSqliteSchemaVersion) + "')")
                  .c_str());
  }
  stmts_ = std::make_unique<Statements>();
  auto& s = *stmts_;
  s.begin = Stmt(db_, "BEGIN IMMEDIATE");
  s.commit = Stmt(db_, "COMMIT");
  s.rollback = Stmt(db_, "ROLLBACK");
  s.put_tenant = Stmt(db_,
                      "INSERT INTO tenants(name, record) VALUES (?1, ?2) "
                      "ON CONFLICT(name) DO UPDATE SET record = excluded.record");
  s.insert_event =
      Stmt(db_,
           "INSERT INTO events(tenant, agent_id, event_id, received_at, received_unix, body) "
           "VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
  s.put_cursor = Stmt(db_,
                      "INSERT INTO cursors(tenant, agent_id, last_id) VALUES (?1, ?2, ?3) "
                      "ON CONFLICT(tenant, agent_id) DO UPDATE SET last_id = excluded.last_id");
  s.put_count = Stmt(db_,
                     "INSERT INTO event_counts(tenant, n) VALUES (?1, ?2) "
                     "ON CONFLICT(tenant) DO UPDATE SET n = excluded.n");
  s.put_health = Stmt(db_,
                      "INSERT INTO health(tenant, sample) VALUES (?1, ?2) "
                      "ON CONFLICT(tenant) DO UPDATE SET sample = excluded.sample");
  s.del_tenant = Stmt(db_, "DELETE FROM tenants WHERE name = ?1");
  s.del_events = Stmt(db_, "DELETE FROM events WHERE tenant = ?1");
  s.del_cursors = Stmt(db_, "DELETE FROM cursors WHERE tenant = ?1");
  s.del_count = Stmt(db_, "DELETE FROM event_counts WHERE tenant = ?1");
  s.del_health = Stmt(db_, "DELETE FROM health WHERE tenant = ?1");
  // The oldest events of a tenant beyond its cap (?2 = how many to keep).
  s.trim_tenant =
      Stmt(db_,
           "DELETE FROM events WHERE tenant = ?1 AND seq <= "
           "(SELECT seq FROM events WHERE tenant = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2)");
  s.expire = Stmt(db_, "DELETE FROM events WHERE received_unix < ?1 RETURNING tenant");
  s.archive_usage =
      Stmt(db_, "INSERT INTO usage_archive(tenant, deleted_unix, body) VALUES (?1, ?2, ?3)");

  Snapshot snap;
  if (auto st = load(snap); !st.ok()) return st.error();
  if (auto st = import_file_store(snap); !st.ok()) return st.error();

  if (sqlite3_open_v2(path.c_str(), &rdb_, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr) !=
      SQLITE_OK)
    return db_error(rdb_, "open for reading");
  sqlite3_busy_timeout(rdb_, 5000);
  recent_stmt_ = Stmt(rdb_,
                      "SELECT seq, agent_id, event_id, received_at, body FROM events "
                      "WHERE tenant = ?1 ORDER BY seq DESC LIMIT ?2");
  return snap;
}

// What a start needs: every tenant, cursor, count and latest health; never
// the history itself.
Status SqliteBackend::load(Snapshot& snap) {
  Stmt t(db_, "SELECT name, record FROM tenants");
  while (t.step() == SQLITE_ROW) {
    auto j = nlohmann::json::parse(t.text(1), nullptr, false);
    auto rec = j.is_discarded() ? Result<TenantRecord>(Error(Errc::io, "not JSON"))
                                : TenantRecord::from_json(j);
    if (!rec) {
      // One unreadable record must not keep every other tenant out.
      spdlog::error("store: the record of tenant '{}' is unreadable ({}); it is left out",
                    t.text(0), rec.error().message);
      continue;
    }
    snap.tenants[rec->name] = std::move(*rec);
  }
  if (!t.ok()) return db_error(db_, "read tenants");
  Stmt c(db_, "SELECT tenant, agent_id, last_id FROM cursors");
  while (c.step() == SQLITE_ROW)
    snap.cursors[cursor_key(c.text(0), c.text(1))] = static_cast<std::uint64_t>(c.int64(2));
  Stmt n(db_, "SELECT tenant, n FROM event_counts");
  while (n.step() == SQLITE_ROW) snap.counts[n.text(0)] = static_cast<std::size_t>(n.int64(1));
  Stmt h(db_, "SELECT tenant, sample FROM health");
  while (h.step() == SQLITE_ROW) {
    // Saved by this store, but a guest's words all the same: read back
    // through the sample's own checks.
    auto j = nlohmann::json::parse(h.text(1), nullptr, false);
    if (auto latest = LatestHealth::from_json(j))
      snap.health[h.text(0)] = std::make_shared<const LatestHealth>(std::move(*latest));
  }
  return {};
}

// The file store of earlier versions: tenants/<name>.json and
// events/<name>.jsonl. Imported once, in one transaction; a record that does
// not parse is skipped with a warning naming its file and offset, never used
// to cut off the records after it.
Status SqliteBackend::import_file_store(Snapshot& snap) {
  const fs::path tdir = dir_ / "tenants", edir = dir_ / "events";
  std::error_code ec;
  if (!fs::is_directory(tdir, ec) && !fs::is_directory(edir, ec)) return {};
  spdlog::info("store: importing the file store of {} into {}", dir_.string(),
               (dir_ / "factory.db").string());
  if (!exec(db_, "BEGIN IMMEDIATE")) return db_error(db_, "import");
  auto& s = *stmts_;
  std::size_t tenants = 0, events = 0, skipped = 0;
  if (fs::is_directory(tdir, ec)) {
    for (auto& entry : fs::directory_iterator(tdir)) {
      if (entry.path().extension() != ".json") continue;
      auto text = read_file(entry.path());
      auto j = text ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
      auto rec = (text && !j.is_discarded()) ? TenantRecord::from_json(j)
                                             : Result<TenantRecord>(Error(Errc::io, "unreadable"));
      if (!rec) {
        spdlog::warn("store: import: {} skipped: {}", entry.path().string(), rec.error().message);
        ++skipped;
        continue;
      }
      if (!s.put_tenant.bind(1, rec->name).bind(2, rec->to_json().dump()).run())
        return db_error(db_, "import " + entry.path().string());
      snap.tenants[rec->name] = std::move(*rec);
      ++tenants;
    }
  }
  if (fs::is_directory(edir, ec)) {
    for (auto& entry : fs::directory_iterator(edir)) {
      if (entry.path().extension() != ".jsonl") continue;
      const std::string tenant = entry.path().stem().string();
      auto text = read_file(entry.path());
      if (!text) continue;
      std::size_t pos = 0;
      while (pos < text->size()) {
        std::size_t nl = text->find('\n', pos);
        std::size_t end = nl == std::string::npos ? text->size() : nl;
        auto j =
            nlohmann::json::parse(std::string_view(*text).substr(pos, end - pos), nullptr, false);
        if (j.is_discarded() || !j.is_object() || !j.contains("id") ||
            !j["id"].is_number_unsigned()) {
          if (end > pos) {
            spdlog::warn("store: import: {} at offset {}: a record that does not parse, skipped",
                         entry.path().string(), pos);
            ++skipped;
          }
        } else {
          std::string agent = j.value("agent_id", "");
          auto id = j["id"].get<std::uint64_t>();
          std::string at = j.value("received_at", "");
          auto when = parse_rfc3339(at);
          s.insert_event.bind(1, tenant)
              .bind(2, agent)
              .bind(3, static_cast<std::int64_t>(id))
              .bind(4, at);
          s.insert_event.bind(5, when ? unix_seconds(*when) : unix_seconds(Clock::now()));
          s.insert_event.bind(6, j.value("event", nlohmann::json::object()).dump());
          if (!s.insert_event.run()) return db_error(db_, "import " + entry.path().string());
          auto& cur = snap.cursors[cursor_key(tenant, agent)];
          cur = std::max(cur, id);
          ++snap.counts[tenant];
          ++events;
        }
        if (nl == std::string::npos) break;
        pos = nl + 1;
      }
    }
  }
  for (auto& [key, last] : snap.cursors) {
    auto zero = key.find('\0');
    if (!s.put_cursor.bind(1, key.substr(0, zero))
             .bind(2, key.substr(zero + 1))
             .bind(3, static_cast<std::int64_t>(last))
             .run())
      return db_error(db_, "import cursors");
  }
  for (auto& [tenant, n] : snap.counts)
    if (!s.put_count.bind(1, tenant).bind(2, static_cast<std::int64_t>(n)).run())
      return db_error(db_, "import counts");
  if (!exec(db_, "COMMIT")) return db_error(db_, "import");
  for (auto& d : {tdir, edir}) {
    if (!fs::exists(d, ec)) continue;
    fs::rename(d, fs::path(d.string() + ".imported"), ec);
    if (ec) spdlog::warn("store: could not rename {}: {}", d.string(), ec.message());
  }
  spdlog::info("store: imported {} tenants and {} events ({} unreadable records skipped)", tenants,
               events, skipped);
  return {};
}

}  // namespace

Result<std::unique_ptr<Store>> open_sqlite_store(const std::string& dir, StoreOptions opts) {
  auto backend = std::make_unique<SqliteBackend>(dir);
  auto loaded = backend->open();
  if (!loaded) return loaded.error();
  return std::unique_ptr<Store>(
      std::make_unique<BatchingStore>(std::move(backend), std::move(*loaded), opts));
}

}  // namespace factory::store
