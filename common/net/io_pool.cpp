#include "common/net/io_pool.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

namespace factory::net {

namespace asio = boost::asio;

// An io_context whose shutdown() (protected in execution_context) the pool
// may call.
struct IoPool::Context : asio::io_context {
  Context() : asio::io_context(1) {}
  using asio::io_context::shutdown;
};

IoPool::IoPool(std::size_t threads) {
  if (threads == 0) threads = 1;
  for (std::size_t i = 0; i < threads; ++i) contexts_.push_back(std::make_unique<Context>());
}

asio::io_context& IoPool::at(std::size_t i) {
  return *contexts_.at(i);
}

asio::io_context& IoPool::main() {
  return *contexts_.front();
}

IoPool::~IoPool() {
  stop();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  // Every context's pending handlers are destroyed before any context is: a
  // handler queued on one may hold the last reference to objects of another
  // (a connection holds its server, whose acceptor and sweep timers belong to
  // other contexts), and those must go while their context still exists.
  // AddressSanitizer found the acceptor destroyed after its context, in
  // ServerTest.ConnectionsAreSpreadOverTheIoThreads.
  for (auto& c : contexts_) c->shutdown();
}

asio::io_context& IoPool::next() {
  return *contexts_[next_.fetch_add(1, std::memory_order_relaxed) % contexts_.size()];
}

void IoPool::run() {
  // Each context is kept alive by a guard until stop(): a thread with no
  // connection yet must not return.
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards;
  for (auto& c : contexts_) guards.push_back(asio::make_work_guard(*c));
  for (std::size_t i = 1; i < contexts_.size(); ++i)
    threads_.emplace_back([c = contexts_[i].get()] { c->run(); });
  contexts_.front()->run();
  for (auto& c : contexts_) c->stop();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

void IoPool::stop() {
  for (auto& c : contexts_) c->stop();
}
}  // namespace factory::net
