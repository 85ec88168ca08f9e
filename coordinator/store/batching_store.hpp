#pragma once
// What the two backends of store.hpp share, written once: the queue and its
// one writer thread, the tenants, cursors, counts and latest health kept in
// memory, a batch's overlay (published only once it is committed), the
// retention rules, the health flush and every public method. A backend
// (sqlite_store.cpp, postgres_store.cpp) is only its SQL and its
// connections, behind StoreBackend.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/durations.hpp"
#include "common/log.hpp"
#include "coordinator/store/store.hpp"

namespace factory::store {

// The key of an agent's cursor in memory: the tenant's name, a NUL, the
// agent's id (a name holds no NUL, so a tenant's cursors share its prefix).
std::string cursor_key(const std::string& tenant, const std::string& agent);

// What a start (or a reconnection) loads: every tenant, cursor, count and
// latest health; never the history itself.
struct Snapshot {
  std::map<std::string, TenantRecord> tenants;
  std::unordered_map<std::string, std::uint64_t> cursors;
  std::map<std::string, std::size_t> counts;
  std::map<std::string, std::shared_ptr<const LatestHealth>> health;
};

// An event's insertion, as the database answered it.
struct Inserted {
  bool stored = false;    // false: the database held it already (another coordinator's)
  std::uint64_t seq = 0;  // when stored
  // When not stored: the agent's cursor as the database has it, if any.
  std::optional<std::uint64_t> cursor;
};

// What another replica changed, as its notification said: these tenants,
// or everything (a payload too long to name them, or notifications that may
// have been missed while the listener was reconnecting).
struct Invalidation {
  bool all = false;
  std::set<std::string> tenants;
  void merge(const Invalidation& other) {
    all = all || other.all;
    if (!all) tenants.insert(other.tenants.begin(), other.tenants.end());
  }
};

// A database, as the writer uses it. Every method but recent_events() and
// close() runs on the writer thread only, between begin() and commit() or
// rollback(); an error is the statement's, and fails the whole batch.
class StoreBackend {
 public:
  virtual ~StoreBackend() = default;

  // Worker threads, any number at once: the backend keeps its own reading
  // connection.
  virtual std::vector<StoredEvent> recent_events(const std::string& tenant,
                                                 std::size_t max) const = 0;

  // Before each batch: a backend whose connection can be lost makes it
  // again here, and sets `reloaded` to what the database holds then (it
  // replaces memory's tenants, cursors and counts). An error fails the batch.
  // The archived usage rows' bodies (ArchivedUsage's JSON), oldest first.
  virtual std::vector<std::string> archived_usage() const = 0;
  virtual Status reconnect_if_lost(std::optional<Snapshot>& reloaded) = 0;
  virtual Status begin() = 0;
  virtual Status commit() = 0;
  // After an error in the transaction; best effort.
  virtual void rollback() = 0;

  virtual Status write_record(const TenantRecord& rec) = 0;
  // The event and the agent's cursor, moved to e.id. The caller has checked
  // memory's cursor already: this answers a duplicate only when the database
  // knows better than memory (another coordinator stored it).
  virtual Result<Inserted> insert_event(const std::string& tenant, const StoredEvent& e,
                                        std::int64_t received_unix) = 0;
  // Moves the tenant's event count by delta (never below 0) and answers the
  // count now. `current` is memory's figure: the only writer of a database
  // may simply write current + delta; one shared with other coordinators
  // moves the database's own figure instead.
  virtual Result<std::int64_t> add_count(const std::string& tenant, std::int64_t delta,
                                         std::int64_t current) = 0;
  virtual Status put_health(const std::string& tenant, const std::string& sample) = 0;
  // The record, its events, cursors, count and health.
  virtual Status delete_tenant(const std::string& name) = 0;
  // In the delete's transaction: a deleted tenant's usage (ArchivedUsage's JSON).
  virtual Status archive_usage(const std::string& tenant, std::int64_t deleted_unix,
                               const std::string& body) = 0;
  // Deletes the tenant's oldest events beyond the newest `keep`; how many.
  virtual Result<std::int64_t> trim_tenant(const std::string& tenant, std::int64_t keep) = 0;
  // Deletes every event received before `before_unix`; how many, per tenant.
  virtual Result<std::map<std::string, std::int64_t>> expire_before(std::int64_t before_unix) = 0;

  // Once the writer has stopped: lets the database go.
  virtual void close() = 0;

  // --- a database other coordinators share (PostgreSQL) ---------------------
  // Whether other coordinators (replicas) may write to the database too.
  // False (SQLite): memory is the truth, and nothing below is called.
  virtual bool shared() const { return false; }
  // In the transaction: the records of `names` as the database has them,
  // each row locked until the transaction ends, in name order (two replicas
  // locking the same rows never deadlock). A name without a (readable)
  // record is absent from the answer.
  virtual Result<std::map<std::string, TenantRecord>> lock_records(
      const std::vector<std::string>& /*names*/) {
    return Error(Errc::internal, "store: not a shared database");
  }
  // In the transaction: the records, cursors, counts and latest health of
  // these tenants (every tenant when `what.all`).
  virtual Result<Snapshot> load_tenants(const Invalidation& /*what*/) {
    return Error(Errc::internal, "store: not a shared database");
  }
  // In the transaction: tells the other replicas, once it commits, that
  // these tenants changed.
  virtual Status announce(const std::set<std::string>& /*tenants*/) { return {}; }
  // Starts the listener thread: `changed` is called on it with what another
  // replica changed (everything after the listener's own reconnection).
  virtual void listen(std::function<void(Invalidation)> /*changed*/) {}
  // Stops it, before the writer stops.
  virtual void stop_listening() {}
  // The status feed's log (feed_log.hpp), the backend's; null when there
  // is none (SQLite). Closed by close().
  virtual FeedLog* feed_log() { return nullptr; }
};

// The Store of both backends: memory, the queue and the writer; the backend
// only for what touches the database.
class BatchingStore final : public Store {
 public:
  // Takes what the backend loaded at open as memory's truth, health
  // included, and starts the writer.
  BatchingStore(std::unique_ptr<StoreBackend> backend, Snapshot loaded, StoreOptions opts);
  ~BatchingStore() override;
  BatchingStore(const BatchingStore&) = delete;
  BatchingStore& operator=(const BatchingStore&) = delete;

  std::vector<TenantRecord> list_tenants() const override;
  std::vector<TenantRecord> tenants_where(
      const std::function<bool(const TenantRecord&)>& keep) const override;
  std::optional<TenantRecord> get_tenant(const std::string& name) const override;
  std::uint64_t last_event_id(const std::string& tenant, const std::string& agent) const override;
  std::size_t event_count(const std::string& tenant) const override;
  std::shared_ptr<const LatestHealth> get_health(const std::string& tenant) const override;
  StoreStats stats() const override;

  std::vector<StoredEvent> recent_events(const std::string& tenant, std::size_t max) const override;
  std::vector<ArchivedUsage> archived_usage() const override;

  Status put_tenant(const TenantRecord& t) override;
  Status delete_tenant(const std::string& name) override;
  Result<TenantRecord> update_tenant(const std::string& name,
                                     std::function<Status(TenantRecord&)> change) override;
  void update_tenant_async(const std::string& name, std::function<Status(TenantRecord&)> change,
                           std::function<void(Result<TenantRecord>)> done) override;
  void append_event(const std::string& tenant, StoredEvent e, Projection project,
                    std::function<void(Result<AppendOutcome>)> done,
                    std::function<bool()> still_wanted) override;
  void put_health(const std::string& tenant, std::shared_ptr<const LatestHealth> sample) override;
  FeedLog* feed_log() override { return backend_->feed_log(); }

  // What another replica changed: reloaded from the database by the writer,
  // in order with this store's own batches, so a reload never publishes a
  // value older than one this store committed. The listener's thread.
  void reload(Invalidation what);

  void close() override;

 private:
  struct Op {
    enum class Kind { append, update, put, remove, reload } kind = Kind::append;
    std::string tenant;
    StoredEvent event;
    Projection project;
    std::function<void(Result<AppendOutcome>)> append_done;
    std::function<bool()> still_wanted;
    std::function<Status(TenantRecord&)> change;
    std::function<void(Result<TenantRecord>)> update_done;
    // A put's record; behind a pointer, so that the thousands of events'
    // operations do not each make and destroy an empty TenantRecord.
    std::unique_ptr<TenantRecord> record;
    std::function<void(Status)> status_done;
    Invalidation reload;
  };

  // What one batch changes, published to memory only once it is committed.
  struct Overlay {
    std::map<std::string, std::optional<TenantRecord>> tenants;  // nullopt: deleted
    std::unordered_map<std::string, std::uint64_t> cursors;
    std::map<std::string, std::int64_t> counts;  // absolute values, as the database has them
    // Their cursors and count are replaced (deleted, or reloaded).
    std::vector<std::string> deleted;
    // Shared database only: what this batch changed in the database (the
    // other replicas are told).
    std::set<std::string> changed;
    // The events' share, coalesced per tenant and written once at the end
    // of the batch's operations (finish_appends): the count's moves, the
    // records their projections changed in place (in `tenants`), and the
    // outcomes that get the record as committed.
    std::map<std::string, std::int64_t> count_moves;
    std::set<std::string> projected;
    std::map<std::string, std::vector<AppendOutcome*>> record_wanted;
    std::uint64_t records_written = 0;
  };

  // What one operation of a batch comes to, told once the batch is committed.
  struct Outcome {
    Status status;
    AppendOutcome append;
    std::optional<TenantRecord> record;
  };

  // Shared and immutable, so the writer's flush copies a pointer under
  // health_mu_, not a sample: put_health (on an io thread) never waits on
  // the copying of ten thousand samples.
  struct HealthEntry {
    std::shared_ptr<const LatestHealth> sample;
    bool dirty = false;
  };

  using HealthWritten = std::vector<std::pair<std::string, std::shared_ptr<const LatestHealth>>>;

  Status refuse_on_writer(const char* what) const;
  void enqueue(Op op);
  static void fail_op(Op& op, const Error& e);
  // The database's word replaces memory's. Health only at open: after a
  // reconnection memory's samples are the newer ones.
  void publish(Snapshot snap, bool with_health);

  void writer_loop();
  // Under queue_mu_ (lk), once the queue holds something: waits for more to
  // share the transaction when opts_.commit_delay says so (store.hpp).
  void wait_for_company(std::unique_lock<std::mutex>& lk,
                        std::chrono::steady_clock::time_point last_commit);
  void run_batch(std::deque<Op>& batch, bool maintenance_due, bool health_due);
  // Runs the operations of a batch inside its transaction; the first
  // statement that fails ends it with that statement's error.
  Status apply_ops(std::deque<Op>& batch, Overlay& ov, std::vector<Outcome>& outcomes,
                   std::int64_t now_unix, std::uint64_t& stored, std::uint64_t& duplicates);
  Status apply_append(Op& op, Overlay& ov, Outcome& out, std::int64_t now_unix,
                      std::uint64_t& stored, std::uint64_t& duplicates);
  // Shared database: the records the batch changes, locked and read from
  // the database into the overlay, and what other replicas changed reloaded.
  Status lock_and_reload(std::deque<Op>& batch, Overlay& ov);
  // One try of a batch: its transaction, committed or rolled back.
  Status try_batch(std::deque<Op>& batch, Overlay& ov, std::vector<Outcome>& outcomes,
                   bool maintenance_due, bool health_due, HealthWritten& health_written,
                   std::uint64_t& stored, std::uint64_t& duplicates, std::uint64_t& expired);
  void publish_batch(Overlay& ov);
  static void tell(std::deque<Op>& batch, std::vector<Outcome>& outcomes);
  std::optional<TenantRecord> current(const Overlay& ov, const std::string& name) const;
  // The batch's own copy of the record, made on first use (nullptr: no such
  // tenant); the events' projections change it in place.
  TenantRecord* batch_record(Overlay& ov, const std::string& name) const;
  // After the last operation: each tenant's count moved and its projected
  // record written, once.
  Status finish_appends(Overlay& ov);
  // A put, update or removal of the record: what the events projected is
  // written with it (or gone with it).
  static void record_replaced(Overlay& ov, const std::string& name, bool removed);
  // A put's or an update's record, written whole and taken as the batch's.
  Status write_whole_record(Overlay& ov, const std::string& name, const TenantRecord& rec);
  std::uint64_t current_cursor(const Overlay& ov, const std::string& key) const;
  std::int64_t current_count(const Overlay& ov, const std::string& tenant) const;
  Status add_count(Overlay& ov, const std::string& tenant, std::int64_t delta);
  Status apply_retention(Overlay& ov, std::uint64_t& expired);
  Status expire_old(Overlay& ov, Clock::time_point now, std::uint64_t& expired);
  Status flush_health(HealthWritten& written);

  const std::unique_ptr<StoreBackend> backend_;
  const StoreOptions opts_;

  mutable std::shared_mutex mu_;
  std::map<std::string, TenantRecord> tenants_;
  std::unordered_map<std::string, std::uint64_t> cursors_;
  std::map<std::string, std::size_t> counts_;

  mutable std::mutex health_mu_;
  std::map<std::string, HealthEntry> health_;

  mutable std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Op> queue_;
  // When the oldest queued operation arrived: the commit delay counts from it.
  std::chrono::steady_clock::time_point queue_since_{};
  bool stopping_ = false;
  StoreStats stats_;
  std::thread writer_;
  // Set by the writer as it starts, read by every caller (refuse_on_writer):
  // atomic, or the first calls race the writer's start (ThreadSanitizer, in
  // make ci-sanitizers, on every store test that reopened a store).
  std::atomic<std::thread::id> writer_id_{};
  // A full disk or a lost server fails every batch; the log says so a few
  // times, then how often.
  LogThrottle write_failure_log_{};
  // Reloads of a batch that failed, tried again with the next one, or on
  // their own at next_reload_retry_ when no batch comes (an idle replica
  // would otherwise miss what another changed until it next wrote): 100 ms,
  // doubling to 5 s. The writer's only.
  std::optional<Invalidation> deferred_reload_;
  std::chrono::steady_clock::time_point next_reload_retry_{};
  std::chrono::milliseconds reload_retry_backoff_{100};
};

}  // namespace factory::store
