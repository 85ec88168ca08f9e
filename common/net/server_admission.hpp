#pragma once
// Who may take the server's time: the bookkeeping of admission, apart from
// any connection. Three bounds, each with its reason:
// - connections per source address (ServerOptions::max_connections_per_address);
// - TLS handshakes under way (max_handshakes): a few thousand at once on two
//   cores all miss their deadline together (a restart storm stalled 35 s
//   that way), a few hundred finish in well under a second;
// - the stranger pool (StrangerLimits): connections still in their
//   handshake, or done with it without a certificate. When it is full the
//   acceptor stops taking connections (they wait in the kernel's listen
//   queue) instead of closing them: a closed connection doubles a returning
//   agent's backoff, and after a restart every agent of the fleet returns
//   at once. An address over its share waits in a bounded queue of accepted
//   sockets (no TLS state yet) for one of its own slots; only past that
//   bound is it refused.
//
// Thread-safe: the acceptor (on the main io thread) takes, connections
// (on their own io threads) give back. It decides; the server acts on what
// it returns (starts a connection, closes a socket, resumes accepting).
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/net/server.hpp"

namespace factory::net {

class Admission {
 public:
  using Clock = std::chrono::steady_clock;
  using Socket = boost::asio::ip::tcp::socket;

  // An accepted socket waiting for a stranger's slot of its address.
  struct Waiting {
    Socket sock;
    std::size_t thread;  // the io thread it was dealt to
    Clock::time_point since;
  };
  enum class Slot { granted, waiting, refused };
  // What giving a stranger's slot back set in motion.
  struct Released {
    std::optional<Waiting> next;    // takes the slot over: start it
    std::vector<Socket> expired;    // waited past a stranger's deadline: close them
    bool resume_accepting = false;  // the acceptor was paused and there is room now
  };

  explicit Admission(const ServerOptions& opts)
      : strangers_(opts.strangers),
        max_handshakes_(opts.max_handshakes),
        max_per_address_(opts.max_connections_per_address) {}

  // max_connections_per_address: false when the address has its share
  // already. Held from accept until the socket closes, a wait included.
  bool take_address(const std::string& address);
  void release_address(const std::string& address);

  // Takes a stranger's slot for address, or queues sock to wait for one
  // (then sock is moved from), or refuses.
  Slot take_stranger_slot(const std::string& address, Socket& sock, std::size_t thread);
  // The slot passes to the next one waiting at that address that has not
  // waited past a stranger's deadline (its client has given up), or goes
  // back to the pool. stopping: nobody takes it over.
  Released release_stranger_slot(const std::string& address, bool stopping);

  // Before each accept, when strangers are bounded: false when the pool or
  // the handshakes are full; the acceptor then pauses until a release or a
  // handshake's end says resume_accepting.
  bool room_or_pause();
  void handshake_started();
  // True when the acceptor was paused and may resume.
  bool handshake_ended();

  // Every waiting socket, taken out (at stop: the caller closes them and
  // gives their addresses back).
  std::unordered_map<std::string, std::deque<Waiting>> take_all_waiting();

  std::size_t strangers_open() const;
  std::size_t strangers_waiting() const;

 private:
  bool room_locked() const {
    return strangers_total_ < strangers_.max_total && handshaking_ < max_handshakes_;
  }
  // When a slot or a handshake ended: true when the acceptor was paused and
  // there is room again.
  bool unpause_locked() {
    if (!accept_paused_ || !room_locked()) return false;
    accept_paused_ = false;
    return true;
  }

  const StrangerLimits strangers_;
  const std::size_t max_handshakes_;
  const std::size_t max_per_address_;

  mutable std::mutex mu_;  // the stranger pool and the handshakes
  std::unordered_map<std::string, std::size_t> strangers_by_address_;
  std::unordered_map<std::string, std::deque<Waiting>> waiting_by_address_;
  std::size_t strangers_total_ = 0;
  std::size_t waiting_total_ = 0;
  std::size_t handshaking_ = 0;
  bool accept_paused_ = false;

  std::mutex addresses_mu_;
  std::unordered_map<std::string, std::size_t> open_by_address_;
};

}  // namespace factory::net
