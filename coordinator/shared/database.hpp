#pragma once
// The tables coordinator replicas share when their store is PostgreSQL
// (issue 26): what state_dir holds on a single host (the CAs, the admin
// token, the bootstrap tokens, the read-only API tokens) kept once, in the
// database the store uses, so that every replica signs with the same CA and
// honours the same tokens. Its own tables (made if absent, under an advisory
// lock, with the schema version in shared_meta) and its own connections,
// beside the store's: the store's writer thread batches and this does not.
//
// Every statement is one of this module's, prepared on each connection;
// values travel as parameters. Whatever the database fails to do comes back
// typed as the store's do (unavailable: the connection is lost, another try
// may work; conflict: a serialization failure; io: the rest), and the
// conninfo's password is in no message. Every call may wait on the network:
// never from an io thread.
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"

struct pg_conn;

namespace factory::shared {

// One row of an answer, each column as text (nullopt: NULL).
using Row = std::vector<std::optional<std::string>>;

class Database {
 public:
  // Connects (libpq's conninfo, the store's `store:`), and makes the shared
  // tables if they are absent. At most max_connections are open at once;
  // a caller past them waits for one.
  static Result<std::shared_ptr<Database>> open(const std::string& conninfo,
                                                std::size_t max_connections = 4);
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  // Runs the module's prepared statement `name` (database.cpp's list) with
  // `params`; its rows (none for a statement that returns none). A
  // connection found lost is made again, and the statement tried once more
  // on it: every statement of the list may be run twice (each is either a
  // read, idempotent, or one whose second run answers as if the first had
  // won, which is what a lost answer must read as).
  Result<std::vector<Row>> run(const char* name, const std::vector<std::string>& params) const;

  // Where the database is, for messages (never the password).
  const std::string& where() const { return where_; }

 private:
  Database(std::string conninfo, std::string where, std::size_t max_connections);
  Result<pg_conn*> connect(bool with_statements) const;
  Status create_schema(pg_conn* c) const;
  // A connection of the pool, or a new one while fewer than the most are open.
  Result<pg_conn*> take() const;
  void give_back(pg_conn* c) const;

  const std::string conninfo_;  // holds the password: never logged, never in a message
  const std::string secret_;    // scrubbed from whatever libpq says
  const std::string where_;
  const std::size_t max_connections_;
  mutable std::mutex mu_;
  mutable std::condition_variable freed_;
  mutable std::vector<pg_conn*> idle_;
  mutable std::size_t open_ = 0;  // idle and lent out
};

}  // namespace factory::shared
