#pragma once
// TLS contexts for both tiers: every TLS setting (TLS 1.3 only, buffers
// released when idle, peer verification) is made here. The coordinator's
// server (common/net/server.hpp) runs them on the socket itself; the agent's
// clients (http_client.cpp, ws_client.cpp) through Beast's ssl_stream.
#include <memory>
#include <string>

#include "common/error.hpp"

namespace boost::asio::ssl {
class context;
}

namespace factory::net {

struct TlsServerOptions {
  std::string cert_chain_pem;  // leaf first, then the CA
  std::string key_pem;
  // When set, clients are asked for a certificate signed by this CA. A client
  // without one still completes the handshake (it may only enroll); a client
  // with a bad one is refused by the handshake.
  std::string client_ca_pem;
  // A client certificate from client_ca_pem that is only past its notAfter
  // still completes the handshake, marked expired (PeerInfo), so the
  // application can allow it the one thing it may do: renew.
  bool accept_expired_client_certs = false;
};

struct TlsClientIdentity {
  // Exactly one of these pins the server: the CA's SHA-256 (bootstrap,
  // before the agent has the CA file) or the CA certificate itself.
  std::string pinned_ca_sha256;
  std::string ca_pem;
  std::string server_name;      // SNI and the name the server cert must carry
  std::string client_cert_pem;  // mTLS after enrollment
  std::string client_key_pem;
};

// TLS 1.3 only; buffers released when idle.
Result<std::shared_ptr<boost::asio::ssl::context>> make_server_context(const TlsServerOptions& o);
Result<std::shared_ptr<boost::asio::ssl::context>> make_client_context(const TlsClientIdentity& o);

// Human-readable reason for the last TLS verification failure on an SSL*.
std::string verify_failure_reason(void* ssl_handle);

}  // namespace factory::net
