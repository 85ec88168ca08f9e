#pragma once
// The io threads a server runs on: one io_context per thread, so that a
// connection, once dealt to a thread, has all its handlers run there one at
// a time, without a strand or a lock.
#include <atomic>
#include <cstddef>
#include <memory>
#include <thread>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace factory::net {

class IoPool {
 public:
  explicit IoPool(std::size_t threads);
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  std::size_t size() const { return contexts_.size(); }
  boost::asio::io_context& at(std::size_t i);
  // The one that runs on the thread calling run(): timers and signals go here.
  boost::asio::io_context& main();
  // Round robin, for spreading connections.
  boost::asio::io_context& next();

  // Runs every context (all but the first on threads of their own) until stop().
  void run();
  // Thread-safe; run() returns once every thread has stopped.
  void stop();

 private:
  struct Context;
  std::vector<std::unique_ptr<Context>> contexts_;
  std::vector<std::thread> threads_;
  std::atomic<std::size_t> next_{0};
};

}  // namespace factory::net
