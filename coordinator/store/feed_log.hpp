#pragma once
// The status feed's log, for coordinator replicas that share one PostgreSQL
// store (issue 26): every replica appends the events of its live feed
// (feed/event_bus.hpp) to one table, and every replica reads them all back,
// in the order of the table's ids, to stream them on its GET /v1/events. The
// database numbers the events, so an id means the same event on every
// replica and a reader that reconnects to another one resumes with
// Last-Event-ID.
//
// Threads. append() only queues (an io thread may call it); a writer thread
// of the log's own inserts what is queued, a batch per transaction, and
// NOTIFYs the other replicas. A listener thread of its own LISTENs, and on
// each notification (and after each reconnection) reads the rows past the
// last one it delivered, in id order, and hands them to the callback given to
// start(). Each row is delivered once: the appends of all replicas commit in
// id order (an advisory lock held from before their ids are drawn until
// their commit), so a row with a smaller id is never committed after one
// with a larger id was read.
//
// Bounded: at most queue_limit records wait for the writer (past that a
// record is dropped and counted: the feed is a view, the store keeps the
// agents' events); the table keeps the newest keep_rows rows and none older
// than max_age, pruned by every replica's writer now and then (harmless when
// several do it).
//
// The embedded store (SQLite) has no log: its one process is the only
// writer, and the bus numbers its own events (Store::feed_log() is null).
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace factory::store {

// One event of the feed as the log holds it.
struct FeedRecord {
  std::uint64_t id = 0;  // the log's; 0 until appended
  std::string origin;    // the replica that appended it (its FeedLog::origin())
  std::string type;      // agent | phase | progress | ... (the bus's types)
  std::string tenant;
  std::string data;  // one line of JSON, as the bus streams it
};

struct FeedLogOptions {
  std::size_t queue_limit = 10000;                       // records waiting for the writer
  std::size_t max_batch = 512;                           // records in one transaction
  std::size_t keep_rows = 100000;                        // the table's newest rows kept ...
  std::chrono::seconds max_age{std::chrono::hours(24)};  // ... none older than this
  std::chrono::seconds prune_every{std::chrono::seconds(60)};
  std::size_t read_batch = 1000;  // rows the listener reads in one query
};

struct FeedLogStats {
  std::uint64_t appended = 0;    // records committed by this replica's writer
  std::uint64_t dropped = 0;     // records refused: the queue was full, or the log closed
  std::uint64_t failures = 0;    // batches that failed (tried again)
  std::uint64_t delivered = 0;   // records handed to the callback, every replica's
  std::uint64_t pruned = 0;      // rows deleted by this replica's pruning
  std::uint64_t reconnects = 0;  // of the listener
};

class FeedLog {
 public:
  virtual ~FeedLog() = default;

  // This replica's name in the log (random, per open): the `origin` of what
  // it appends.
  virtual const std::string& origin() const = 0;

  // Queues the record (its id and origin are the log's to set). Never waits.
  virtual void append(FeedRecord r) = 0;

  // The records as they come back, every replica's, in id order, each once;
  // on the listener thread, never two calls at once. The first call is the
  // initial read, `live` false, made even when it has no record: the
  // `backfill` newest rows already in the log at start (an event bus fills
  // its Last-Event-ID ring with them). Then only calls with records.
  using Delivery = std::function<void(std::vector<FeedRecord> records, bool live)>;
  // Starts the listener; once.
  virtual void start(std::size_t backfill, Delivery deliver) = 0;

  virtual FeedLogStats stats() const = 0;

  // Writes what is queued (one try), stops both threads; the callback is
  // not called once this returns. Idempotent.
  virtual void close() = 0;
};

// The log of a PostgreSQL database whose schema (the feed_log table) the
// store has made (postgres_store.cpp). `where` is the conninfo without its
// secrets, for messages. Connects lazily: a database away at start is
// reached when it is back.
std::unique_ptr<FeedLog> open_postgres_feed_log(const std::string& conninfo,
                                                const std::string& where, FeedLogOptions opts = {});

}  // namespace factory::store
