#pragma once
// What `factory serve` makes sure of before it touches its state directory:
// that no other coordinator uses the same state (two would issue
// certificates from one CA and write one database), and that both its
// listeners can bind, so a port already taken leaves nothing behind (no CA,
// no admin token, no database created for a server that never ran).
#include <string>

#include "common/error.hpp"

namespace factory::cli {

inline constexpr const char* kServeLockFile = "serve.lock";

// An exclusive flock(2) on <state_dir>/serve.lock, holding the pid of the
// process that took it. The kernel lets go when the process ends, however
// it ends, so a crash leaves no stale lock to clean up.
class StateDirLock {
 public:
  // Takes the lock when the lock file already exists, creating nothing
  // (nullopt-like: held() false when there is no lock file yet). Another
  // process holding it is an error naming that process's pid.
  static Result<StateDirLock> take_existing(const std::string& state_dir);
  // Creates the state directory (0700) and the lock file (0600) as needed
  // and takes the lock; records this process's pid in it.
  static Result<StateDirLock> take(const std::string& state_dir);

  StateDirLock(StateDirLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  StateDirLock& operator=(StateDirLock&& o) noexcept;
  StateDirLock(const StateDirLock&) = delete;
  StateDirLock& operator=(const StateDirLock&) = delete;
  ~StateDirLock();

  bool held() const { return fd_ >= 0; }

 private:
  explicit StateDirLock(int fd) : fd_(fd) {}
  static Result<StateDirLock> lock(int fd, const std::string& path);
  int fd_ = -1;
};

// Binds (and at once closes) a socket on a "host:port" listen address the
// way the server will (SO_REUSEADDR, "localhost" as 127.0.0.1), so a port
// in use or an address this host does not have is found before anything is
// created. `what` names the listener in the message ("agents.listen").
Status check_can_listen(const std::string& listen, const std::string& what);

}  // namespace factory::cli
