#pragma once
// A real PostgreSQL server for a test binary (Debian's `postgresql`,
// installed by `make test-deps`): initdb into a directory under /tmp, then
// `postgres` on a free loopback port, as `nobody` when the tests run as
// root (initdb refuses root). One server per test binary, started on first
// use and stopped at exit; if the binary dies first, the server gets SIGKILL
// from the kernel (PR_SET_PDEATHSIG). Each test asks for a database of its
// own, so tests stay independent.
//
// Where the PostgreSQL binaries are missing, the first use throws
// SetupFailed saying to run `make test-deps`: the test fails, never skips.
#include <filesystem>
#include <string>

namespace factory::testing {

class PostgresServer {
 public:
  // The binary's server, started on the first call. Call it from the main
  // thread (a test body or fixture): the kernel's signal on the parent's
  // death follows the thread that started the server.
  static PostgresServer& instance();

  // A new, empty database; its libpq conninfo (loopback, the superuser,
  // trust authentication).
  std::string create_database();
  std::string conninfo(const std::string& dbname) const;
  // Runs SQL on a database through psql, as the superuser: what it printed
  // (unaligned, tuples only). A failure fails the test (SetupFailed).
  std::string sql(const std::string& dbname, const std::string& query) const;
  int port() const { return port_; }

  ~PostgresServer();
  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;

 private:
  PostgresServer();
  void init_cluster();
  bool start_once();
  void stop();

  std::filesystem::path bindir_;
  std::filesystem::path root_;  // under /tmp: data/, the socket, server.log
  int port_ = 0;
  int pid_ = -1;
  int databases_ = 0;
};

}  // namespace factory::testing
