#pragma once
// TLS contexts for both tiers: every TLS setting (TLS 1.3 only, buffers
// released when idle, peer verification) is made here. The coordinator's
// server (common/net/server.hpp) runs them on the socket itself; the agent's
// clients (http_client.cpp, ws_client.cpp) through Beast's ssl_stream.
#include <memory>
#include <mutex>
#include <string>

#include "common/error.hpp"

namespace boost::asio::ssl {
class context;
}
struct ssl_session_st;  // OpenSSL's SSL_SESSION

namespace factory::net {

class TicketKeys;  // tls_tickets.hpp

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
  // When set, the server issues TLS 1.3 session tickets sealed with these
  // keys (tls_tickets.hpp), so a client that comes back resumes.
  std::shared_ptr<TicketKeys> ticket_keys;
};

// A client's side of resumption: the latest session ticket a server gave it,
// and to which identity (the server's name, the CA it was verified against,
// the client certificate shown), so a new certificate or another server is
// never offered an old session. One per agent link, in memory: a restarted
// agent makes one full handshake. Thread-safe.
class TlsSessionCache {
 public:
  TlsSessionCache() = default;
  ~TlsSessionCache();
  TlsSessionCache(const TlsSessionCache&) = delete;
  TlsSessionCache& operator=(const TlsSessionCache&) = delete;

  // Takes ownership of `session`, replacing what was kept.
  void put(const std::string& identity, ssl_session_st* session);
  // A new reference the caller frees (SSL_SESSION_free); null when none is
  // kept for this identity.
  ssl_session_st* get1(const std::string& identity) const;
  void clear();

 private:
  mutable std::mutex mu_;
  std::string identity_;
  ssl_session_st* session_ = nullptr;
};

struct TlsClientIdentity {
  // Exactly one of these pins the server: the CA's SHA-256 (bootstrap,
  // before the agent has the CA file) or the CA certificate itself.
  std::string pinned_ca_sha256;
  std::string ca_pem;
  std::string server_name;      // SNI and the name the server cert must carry
  std::string client_cert_pem;  // mTLS after enrollment
  std::string client_key_pem;
  // Where the sessions the server gives are kept and offered back from
  // (resumption); null: every handshake is a full one.
  std::shared_ptr<TlsSessionCache> sessions;
};

// TLS 1.3 only; buffers released when idle.
Result<std::shared_ptr<boost::asio::ssl::context>> make_server_context(const TlsServerOptions& o);
Result<std::shared_ptr<boost::asio::ssl::context>> make_client_context(const TlsClientIdentity& o);

// Offers the session kept for this connection's identity (its context's
// TlsClientIdentity::sessions), before the handshake. Nothing when none.
void offer_kept_session(void* ssl_handle);

// Human-readable reason for the last TLS verification failure on an SSL*.
std::string verify_failure_reason(void* ssl_handle);

}  // namespace factory::net
