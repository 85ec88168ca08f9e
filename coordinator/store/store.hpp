#pragma once
// What the coordinator remembers: tenants (spec, agent identity, derived
// status: the typed record of tenant_record.hpp), the events their agents sent (stored exactly
// once, kept within a retention), and each tenant's latest health.
//
// Threads. Reads of tenants, cursors and counts come from memory and never
// wait on the disk: any thread, an io thread included. Writes go through one
// writer thread that batches whatever is queued into one transaction and one
// sync (SQLite in WAL mode, synchronous=FULL; or one PostgreSQL commit): an
// io thread queues an event with append_event() and hears back when it is
// durable; a worker or the CLI may instead wait for
// put_tenant()/update_tenant(). Health is state, not
// history: put_health() replaces the tenant's latest sample in memory, and
// the writer saves the latest of each tenant at most every health_flush.
//
// A Kubernetes backend (a CRD with status, a Lease for leader election) fits
// behind the same interface for coordinators that share a fleet.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "contract/health_sample.hpp"
#include "coordinator/store/feed_log.hpp"
#include "coordinator/store/tenant_record.hpp"

namespace factory::store {

// A tenant's latest health: the sample as its reader kept it (validated,
// bounded, typed) and when the coordinator took it in. Immutable once
// made, and shared (std::shared_ptr<const LatestHealth>) between the
// store, the session that made it and whoever reads it, never copied.
struct LatestHealth {
  proto::HealthSample sample;
  std::string received_at;  // RFC 3339, the coordinator's clock

  // The form of the API, the feed and the database: the sample's JSON
  // with "received_at" beside its keys.
  nlohmann::json to_json() const;
  // That form as bytes, written without a tree (what the store's flush
  // writes and the feed's health event embeds); keys in writing order.
  std::string to_text() const;
  // Back from that form, through the sample's reader (what a database
  // holds came from a guest); nullopt when it is not one.
  static std::optional<LatestHealth> from_json(const nlohmann::json& j);
};

struct StoredEvent {
  std::string agent_id;
  std::uint64_t id = 0;  // the agent's durable event id
  std::string received_at;
  // The event as it is stored: one line of JSON, serialized once where it
  // was validated (the io thread), written and read back as these bytes.
  std::string json;
  std::uint64_t seq = 0;  // the store's own order over every tenant, set when stored
};

struct StoreOptions {
  // Retention: each tenant keeps at most this many events, none older than max_age.
  std::size_t max_events_per_tenant = 10000;
  std::chrono::seconds max_event_age{std::chrono::hours(24 * 90)};
  std::chrono::seconds health_flush{std::chrono::seconds(30)};
  std::chrono::seconds maintenance_every{std::chrono::seconds(60)};
  std::size_t max_batch = 4096;  // operations in one transaction
  // Group commit for a writer that is busy but not flooded (PostgreSQL's
  // commit_delay): when the last transaction ended less than this ago, an
  // operation waits up to this long, counted from its arrival, for others to
  // share its transaction and its sync. 0: every wake commits what it finds.
  // An idle store never waits (nothing committed lately), nor does a flood
  // whose transactions take longer than the delay (its queue waited during
  // the last commit); a full batch ends the wait.
  std::chrono::milliseconds commit_delay{0};
  // The status feed's log, on a database shared by replicas (PostgreSQL).
  FeedLogOptions feed_log;
};

struct StoreStats {
  std::uint64_t events_stored = 0;
  std::uint64_t events_duplicate = 0;
  std::uint64_t events_expired = 0;  // dropped by retention, oldest first
  std::uint64_t transactions = 0;
  // Tenant records written: by the events' projections at most one per
  // tenant per batch, however many of its events the batch holds.
  std::uint64_t records_written = 0;
  std::uint64_t write_failures = 0;
  std::uint64_t queued = 0;  // operations waiting for the writer now
};

// Changes the tenant's record together with an event, in its transaction;
// true when it changed something.
using Projection = std::function<bool(TenantRecord&)>;

struct AppendOutcome {
  bool stored = false;  // false: this agent's id was stored before (a replay)
  // The record as its batch committed it, when this event's projection
  // changed it: one copy per tenant per batch, shared by the batch's events
  // of that tenant (a later event of the same batch may be in it too).
  std::shared_ptr<const TenantRecord> record;
  std::uint64_t seq = 0;
};

class Store {
 public:
  virtual ~Store() = default;

  // From memory; any thread.
  virtual std::vector<TenantRecord> list_tenants() const = 0;
  // The records `keep` says yes to, copied; the others are only looked at.
  // For the passes that look at every tenant and act on a few (drains,
  // agent rollouts, usage), which copied every record every few seconds.
  // `keep` runs under the store's read lock: it must be quick and must not
  // call the store.
  virtual std::vector<TenantRecord> tenants_where(
      const std::function<bool(const TenantRecord&)>& keep) const = 0;
  virtual std::optional<TenantRecord> get_tenant(const std::string& name) const = 0;
  virtual std::uint64_t last_event_id(const std::string& tenant,
                                      const std::string& agent_id) const = 0;
  virtual std::size_t event_count(const std::string& tenant) const = 0;
  virtual std::shared_ptr<const LatestHealth> get_health(const std::string& tenant) const = 0;
  virtual StoreStats stats() const = 0;

  // From the disk: workers only.
  virtual std::vector<StoredEvent> recent_events(const std::string& tenant,
                                                 std::size_t max) const = 0;
  // The GPU usage of every deleted tenant (gpu_usage.hpp), archived in the
  // transaction that deleted its record, so a delete neither loses a
  // tenant's usage nor, half done, counts it twice.
  virtual std::vector<ArchivedUsage> archived_usage() const = 0;

  // Durable when they return: workers and the CLI, never an io thread.
  virtual Status put_tenant(const TenantRecord& t) = 0;
  // Deletes the record, its events and its health; archives its GPU usage.
  virtual Status delete_tenant(const std::string& name) = 0;
  // Read-modify-write of one record on the writer thread, so it never loses
  // a change made at the same time by an event's projection. not_found when
  // there is no such tenant; an error from `change` aborts it.
  virtual Result<TenantRecord> update_tenant(const std::string& name,
                                             std::function<Status(TenantRecord&)> change) = 0;

  // For io threads. Queued to the writer; `done` runs on the writer thread
  // once the event (and the projection's change) is durable, or with the
  // error that kept it from being. A tenant's events are stored, and their
  // `done` called, in the order they were queued. `still_wanted`, when set,
  // is asked on the writer thread just before the event is stored: false
  // answers it `cancelled` unstored (a session whose earlier event failed
  // must not have a later one stored, or the replay of the failed one would
  // read as a duplicate).
  virtual void append_event(const std::string& tenant, StoredEvent e, Projection project,
                            std::function<void(Result<AppendOutcome>)> done,
                            std::function<bool()> still_wanted = nullptr) = 0;
  // The same for a record change without an event (an agent's hello).
  virtual void update_tenant_async(const std::string& name,
                                   std::function<Status(TenantRecord&)> change,
                                   std::function<void(Result<TenantRecord>)> done) = 0;
  // The tenant's latest health (null: ignored); saved coalesced, not per
  // sample.
  virtual void put_health(const std::string& tenant,
                          std::shared_ptr<const LatestHealth> health) = 0;

  // The status feed's log, shared by the coordinators on one database
  // (feed_log.hpp): null when this store's process is its only writer
  // (SQLite), where the event bus numbers its own events. Owned by the
  // store, valid until it is destroyed; close() closes it too.
  virtual FeedLog* feed_log() { return nullptr; }

  // Writes what is pending (health included) and stops the writer.
  virtual void close() = 0;
};

// <dir>/factory.db (0600), with its WAL beside it. A state directory of the
// earlier file store (<dir>/tenants/*.json, <dir>/events/*.jsonl) is
// imported on first open and left as <dir>/*.imported.
Result<std::unique_ptr<Store>> open_sqlite_store(const std::string& dir, StoreOptions opts = {});

// A PostgreSQL database, for coordinators that share one: libpq's conninfo
// ("host=… dbname=… user=…" or a postgres:// URI). The same semantics, with
// the database's constraints keeping an event once whichever coordinator
// stores it; tables are made if absent. A lost connection fails the batch
// it broke (rolled back whole) and is made again with a backoff. The
// password is never logged nor put in an error.
//
// Replicas (several coordinators on one database) stay coherent: a batch
// that changed tenants NOTIFYs the others, whose listener thread has their
// writer reload those tenants (everything after its own reconnection); a
// record is changed as the database has it, locked (SELECT … FOR UPDATE) in
// the batch's transaction, never as memory had it. The status feed is shared
// through its feed_log() (feed_log.hpp).
Result<std::unique_ptr<Store>> open_postgres_store(const std::string& conninfo,
                                                   StoreOptions opts = {});

}  // namespace factory::store
