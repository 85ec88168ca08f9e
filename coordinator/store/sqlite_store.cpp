// The embedded store: SQLite in WAL mode with synchronous=FULL (a commit is
// on the disk when it returns), one writer thread that turns whatever is
// queued into one transaction, and the tenants, cursors and counts mirrored
// in memory so that reads never touch the disk.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "common/atomic_file.hpp"
#include "common/durations.hpp"
#include "common/log.hpp"
#include "coordinator/store/store.hpp"

namespace factory::store {
namespace fs = std::filesystem;

namespace {

constexpr int kSchemaVersion = 1;

const char* kSchema = R"sql(
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
)sql";

std::string cursor_key(const std::string& tenant, const std::string& agent) {
  return tenant + '\0' + agent;
}

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

class SqliteStore final : public Store {
 public:
  SqliteStore(fs::path dir, StoreOptions opts) : dir_(std::move(dir)), opts_(opts) {}
  ~SqliteStore() override { close(); }

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
      e.event = nlohmann::json::parse(q.text(4), nullptr, false);
      out.push_back(std::move(e));
    }
    q.reset();
    std::reverse(out.begin(), out.end());
    return out;
  }

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
    // An open that failed half way (a newer schema, say) never started the
    // writer but holds the database: it is closed here too (LeakSanitizer
    // found the handle of every refused database left open).
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
    std::map<std::string, std::int64_t> counts;  // absolute values
    std::vector<std::string> deleted;
  };

  struct Statements {
    Stmt begin, commit, rollback, put_tenant, insert_event, put_cursor, put_count, put_health,
        del_tenant, del_events, del_cursors, del_count, del_health, trim_tenant, expire;
  };

  // Shared and immutable, so the writer's flush copies a pointer under
  // health_mu_, not a sample: put_health (on an io thread) never waits on
  // the copying of ten thousand samples.
  struct HealthEntry {
    std::shared_ptr<const LatestHealth> sample;
    bool dirty = false;
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

  void writer_loop();
  void run_batch(std::deque<Op>& batch, bool maintenance_due, bool health_due);
  std::optional<TenantRecord> current(const Overlay& ov, const std::string& name) const;
  std::uint64_t current_cursor(const Overlay& ov, const std::string& key) const;
  std::int64_t current_count(const Overlay& ov, const std::string& tenant) const;
  bool write_record(const TenantRecord& rec);
  bool apply_retention(Overlay& ov, std::uint64_t& expired);
  bool expire_old(Overlay& ov, Clock::time_point now, std::uint64_t& expired);
  bool flush_health(
      std::vector<std::pair<std::string, std::shared_ptr<const LatestHealth>>>& written);
  Status load();
  Status import_file_store();

  fs::path dir_;
  StoreOptions opts_;
  sqlite3* db_ = nullptr;   // the writer's
  sqlite3* rdb_ = nullptr;  // for reads from the disk
  std::unique_ptr<Statements> stmts_;
  mutable Stmt recent_stmt_;
  mutable std::mutex read_mu_;

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
  // Set by the writer as it starts, read by every caller (refuse_on_writer):
  // atomic, or the first calls race the writer's start (ThreadSanitizer, in
  // make ci-sanitizers, on every store test that reopened a store).
  std::atomic<std::thread::id> writer_id_{};
  // A full disk fails every batch; the log says so a few times, then how often.
  LogThrottle write_failure_log_{};
};

Status SqliteStore::open() {
  if (auto st = ensure_dir(dir_, 0700); !st.ok()) return st;
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
      !exec(db_, "PRAGMA foreign_keys=OFF;", &err) || !exec(db_, kSchema, &err))
    return Error(Errc::io,
                 "store: " + path.string() + ": " + err +
                     " (is it a Factory database? restore it from a backup or move it away)");
  {
    Stmt v(db_, "SELECT value FROM meta WHERE key='schema'");
    if (v.step() == SQLITE_ROW && std::stoi(v.text(0)) > kSchemaVersion)
      return Error(Errc::failed_precondition,
                   "store: " + path.string() + " was written by a newer Factory (schema " +
                       v.text(0) + "); run that version, or restore a backup");
    v.reset();
    exec(db_, ("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema', '" +
               std::to_string(kSchemaVersion) + "')")
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

  if (auto st = load(); !st.ok()) return st;
  if (auto st = import_file_store(); !st.ok()) return st;

  if (sqlite3_open_v2(path.c_str(), &rdb_, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr) !=
      SQLITE_OK)
    return db_error(rdb_, "open for reading");
  sqlite3_busy_timeout(rdb_, 5000);
  recent_stmt_ = Stmt(rdb_,
                      "SELECT seq, agent_id, event_id, received_at, body FROM events "
                      "WHERE tenant = ?1 ORDER BY seq DESC LIMIT ?2");
  writer_ = std::thread([this] {
    writer_id_ = std::this_thread::get_id();
    writer_loop();
  });
  return {};
}

// What a start needs: every tenant, cursor, count and latest health; never
// the history itself.
Status SqliteStore::load() {
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
    tenants_[rec->name] = std::move(*rec);
  }
  if (!t.ok()) return db_error(db_, "read tenants");
  Stmt c(db_, "SELECT tenant, agent_id, last_id FROM cursors");
  while (c.step() == SQLITE_ROW)
    cursors_[cursor_key(c.text(0), c.text(1))] = static_cast<std::uint64_t>(c.int64(2));
  Stmt n(db_, "SELECT tenant, n FROM event_counts");
  while (n.step() == SQLITE_ROW) counts_[n.text(0)] = static_cast<std::size_t>(n.int64(1));
  Stmt h(db_, "SELECT tenant, sample FROM health");
  while (h.step() == SQLITE_ROW) {
    // Saved by this store, but a guest's words all the same: read back
    // through the sample's own checks.
    auto j = nlohmann::json::parse(h.text(1), nullptr, false);
    if (auto latest = LatestHealth::from_json(j))
      health_[h.text(0)] = {std::make_shared<const LatestHealth>(std::move(*latest)), false};
  }
  return {};
}

// The file store of earlier versions: tenants/<name>.json and
// events/<name>.jsonl. Imported once, in one transaction; a record that does
// not parse is skipped with a warning naming its file and offset, never used
// to cut off the records after it.
Status SqliteStore::import_file_store() {
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
      tenants_[rec->name] = std::move(*rec);
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
          auto& cur = cursors_[cursor_key(tenant, agent)];
          cur = std::max(cur, id);
          ++counts_[tenant];
          ++events;
        }
        if (nl == std::string::npos) break;
        pos = nl + 1;
      }
    }
  }
  for (auto& [key, last] : cursors_) {
    auto zero = key.find('\0');
    if (!s.put_cursor.bind(1, key.substr(0, zero))
             .bind(2, key.substr(zero + 1))
             .bind(3, static_cast<std::int64_t>(last))
             .run())
      return db_error(db_, "import cursors");
  }
  for (auto& [tenant, n] : counts_)
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

std::optional<TenantRecord> SqliteStore::current(const Overlay& ov, const std::string& name) const {
  if (auto it = ov.tenants.find(name); it != ov.tenants.end()) return it->second;
  std::shared_lock lk(mu_);
  auto it = tenants_.find(name);
  if (it == tenants_.end()) return std::nullopt;
  return it->second;
}

std::uint64_t SqliteStore::current_cursor(const Overlay& ov, const std::string& key) const {
  if (auto it = ov.cursors.find(key); it != ov.cursors.end()) return it->second;
  std::shared_lock lk(mu_);
  auto it = cursors_.find(key);
  return it == cursors_.end() ? 0 : it->second;
}

std::int64_t SqliteStore::current_count(const Overlay& ov, const std::string& tenant) const {
  if (auto it = ov.counts.find(tenant); it != ov.counts.end()) return it->second;
  std::shared_lock lk(mu_);
  auto it = counts_.find(tenant);
  return it == counts_.end() ? 0 : static_cast<std::int64_t>(it->second);
}

bool SqliteStore::write_record(const TenantRecord& rec) {
  return stmts_->put_tenant.bind(1, rec.name).bind(2, rec.to_json().dump()).run();
}

void SqliteStore::writer_loop() {
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

void SqliteStore::run_batch(std::deque<Op>& batch, bool maintenance_due, bool health_due) {
  auto& s = *stmts_;
  Overlay ov;
  struct Outcome {
    Status status;
    AppendOutcome append;
    std::optional<TenantRecord> record;
  };
  std::vector<Outcome> outcomes(batch.size());
  std::uint64_t stored = 0, duplicates = 0;
  bool good = s.begin.run();
  const auto now_sys = Clock::now();
  for (std::size_t i = 0; good && i < batch.size(); ++i) {
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
        if (op.event.id <= current_cursor(ov, key)) {
          out.append.stored = false;
          ++duplicates;
          break;
        }
        s.insert_event.bind(1, op.tenant)
            .bind(2, op.event.agent_id)
            .bind(3, static_cast<std::int64_t>(op.event.id))
            .bind(4, op.event.received_at)
            .bind(5, unix_seconds(now_sys))
            .bind(6, op.event.event.dump());
        if (!s.insert_event.run()) {
          good = false;
          break;
        }
        out.append.seq = static_cast<std::uint64_t>(sqlite3_last_insert_rowid(db_));
        ov.cursors[key] = op.event.id;
        std::int64_t n = current_count(ov, op.tenant) + 1;
        ov.counts[op.tenant] = n;
        good = s.put_cursor.bind(1, op.tenant)
                   .bind(2, op.event.agent_id)
                   .bind(3, static_cast<std::int64_t>(op.event.id))
                   .run() &&
               s.put_count.bind(1, op.tenant).bind(2, n).run();
        if (good && op.project) {
          TenantRecord changed = std::move(*rec);
          bool did = false;
          try {
            did = op.project(changed);
          } catch (const std::exception& e) {
            spdlog::error("store: projection of an event of {} threw: {}", op.tenant, e.what());
          }
          if (did) {
            good = write_record(changed);
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
        good = write_record(*rec);
        ov.tenants[op.tenant] = *rec;
        out.record = std::move(*rec);
        break;
      }
      case Op::Kind::put:
        good = write_record(op.record);
        ov.tenants[op.tenant] = op.record;
        break;
      case Op::Kind::remove:
        good = s.del_tenant.bind(1, op.tenant).run() && s.del_events.bind(1, op.tenant).run() &&
               s.del_cursors.bind(1, op.tenant).run() && s.del_count.bind(1, op.tenant).run() &&
               s.del_health.bind(1, op.tenant).run();
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
  std::uint64_t expired = 0;
  // The cap is applied every batch (only tenants over it are touched); the
  // age rule at maintenance.
  if (good && (maintenance_due || stored > 0)) good = apply_retention(ov, expired);
  if (good && maintenance_due) good = expire_old(ov, now_sys, expired);
  std::vector<std::pair<std::string, std::shared_ptr<const LatestHealth>>> health_written;
  if (good && health_due) good = flush_health(health_written);
  if (good) good = s.commit.run();
  if (!good) {
    Error e = db_error(db_, "write");
    if (auto v = write_failure_log_.admit(); v.log) spdlog::error("{}{}", e.message, v.note());
    s.rollback.run();
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
bool SqliteStore::apply_retention(Overlay& ov, std::uint64_t& expired) {
  auto& s = *stmts_;
  const auto cap = static_cast<std::int64_t>(opts_.max_events_per_tenant);
  std::vector<std::string> over;
  for (auto& [tenant, n] : ov.counts)
    if (n > cap) over.push_back(tenant);
  for (auto& tenant : over) {
    if (!s.trim_tenant.bind(1, tenant).bind(2, cap).run()) return false;
    auto removed = sqlite3_changes(db_);
    ov.counts[tenant] = std::max<std::int64_t>(0, ov.counts[tenant] - removed);
    expired += static_cast<std::uint64_t>(removed);
    if (!s.put_count.bind(1, tenant).bind(2, ov.counts[tenant]).run()) return false;
  }
  return true;
}

bool SqliteStore::expire_old(Overlay& ov, Clock::time_point now, std::uint64_t& expired) {
  auto& s = *stmts_;
  s.expire.bind(1, unix_seconds(now) - opts_.max_event_age.count());
  std::map<std::string, std::int64_t> gone;
  while (s.expire.step() == SQLITE_ROW) ++gone[s.expire.text(0)];
  bool ok = s.expire.ok();
  s.expire.reset();
  for (auto& [tenant, k] : gone) {
    std::int64_t n = std::max<std::int64_t>(0, current_count(ov, tenant) - k);
    ov.counts[tenant] = n;
    ok = ok && s.put_count.bind(1, tenant).bind(2, n).run();
    expired += static_cast<std::uint64_t>(k);
  }
  return ok;
}

bool SqliteStore::flush_health(
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
    if (!stmts_->put_health.bind(1, tenant).bind(2, sample->to_json().dump()).run()) return false;
  return true;
}

}  // namespace

Result<std::unique_ptr<Store>> open_sqlite_store(const std::string& dir, StoreOptions opts) {
  auto s = std::make_unique<SqliteStore>(dir, opts);
  if (auto st = s->open(); !st.ok()) return st.error();
  return std::unique_ptr<Store>(std::move(s));
}

}  // namespace factory::store
