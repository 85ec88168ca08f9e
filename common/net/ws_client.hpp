#pragma once
// The agent's side of the websocket: wss with the coordinator's CA pinned,
// SNI and host name verification, deadlines on every step, and a frame cap.
// Coroutine API; Beast types stay inside ws_client.cpp.
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "common/error.hpp"
#include "common/net/tls.hpp"
#include "common/net/url.hpp"

namespace factory::net {

struct WsClientOptions {
  std::string url;  // wss://host:port/path
  TlsClientIdentity tls;
  std::chrono::seconds connect_timeout{10};
  std::chrono::seconds idle_timeout{60};  // ping at half; dropped when no pong
  size_t max_frame = 1024 * 1024;
  std::string user_agent = "factory-agent";
};

class WsClient {
 public:
  ~WsClient();
  WsClient(const WsClient&) = delete;
  WsClient& operator=(const WsClient&) = delete;

  // Errors: unavailable (cannot connect; or the server's certificate is from
  // the pinned CA but expired or not yet valid, which its renewal or a clock
  // fixes), timeout, unauthenticated (the server's certificate does not chain
  // to the pinned CA, or names another host).
  static boost::asio::awaitable<Result<std::unique_ptr<WsClient>>> connect(WsClientOptions o);
  boost::asio::awaitable<Result<std::string>> read();
  boost::asio::awaitable<Status> write(std::string text);
  // A close frame (1000), then at most 2 s for the peer's.
  boost::asio::awaitable<void> close();
  // The same with `reason`, which the coordinator shows (an agent that stops
  // on purpose says "stopping" or "rebooting"). Pass a named string that
  // outlives the await: GCC 12 mishandles temporaries in co_await expressions.
  boost::asio::awaitable<void> close(const std::string& reason);
  const std::string& remote() const;

 private:
  struct Impl;
  explicit WsClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace factory::net
