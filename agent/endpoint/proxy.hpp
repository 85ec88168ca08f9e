#pragma once
// The model endpoint's authenticating proxy, in the guest (docs/model-endpoint.md
// says why here and not in the coordinator): HTTPS on `listen` with a
// certificate from the coordinator's endpoint CA, every request carrying
// `Authorization: Bearer <key>` checked against the SHA-256 of the tenant's
// API key (the guest never holds the key itself), and only inference paths
// passed through to Ollama on loopback, streaming included:
//   GET  /v1/models, /v1/models/{model}, /api/tags, /api/version, /api/ps
//   POST /v1/chat/completions, /v1/completions, /v1/embeddings,
//        /api/generate, /api/chat, /api/embed, /api/embeddings, /api/show
// Anything else (model management: /api/pull, /api/delete, /api/create, ...)
// is refused with 404 before Ollama sees it; a missing or wrong key is 401
// with `WWW-Authenticate: Bearer`, checked before the path so the allowlist
// itself is not probed without a key.
//
// Strangers (anyone who reaches the port): the key and the path are judged
// on the request's head, before a byte of its body is read; a refusal is
// answered at once and the connection closed, so a request without the key
// never has its body buffered. A connection that has not sent a keyed head
// lives at most the handshake's 10 s, 30 s before its head begins and 30 s
// for the head, and sends at most a head's 16 KiB. Connections are capped in
// all and per source address (max_connections, max_connections_per_address:
// past either a newcomer is closed at once), so one address's flood leaves
// the others served, and no flood takes the agent's file descriptors.
//
// Threads: the server's own io thread accepts and checks; each admitted
// request is answered from a worker (at most max_concurrent at once, 503
// beyond), which streams Ollama's answer chunk by chunk to the client. A
// client that leaves ends the worker's wait on Ollama at once, whatever it
// waits for (the answer's head or its next chunk), and frees its place.
//
// What passes: the method, the allowed path itself (no query string; the
// {model} segment percent-encoded again), Content-Type and the body; never
// the client's Authorization or any other header. Back come Ollama's status
// and Content-Type, and its body: collected and sent whole when Ollama gave
// a Content-Length (up to 8 MiB), else streamed (chunked) as it arrives.
// A client falling 1 MiB behind stops the reading of Ollama at its next
// chunk; one that hangs up stops it at once. An Ollama that has not begun
// its answer within upstream_first_byte_timeout is given up (504), one that
// then says nothing for upstream_idle_timeout too (502). A stream Ollama cuts
// short ends with an error in the stream's own format: `data:
// {"error":{...}}` for text/event-stream, an Ollama `{"error": "..."}` line
// otherwise; there is no [DONE] / done.
//
// The proxy's own errors (agent/endpoint/routes.hpp, error_body) have
// OpenAI's shape, which the customer's OpenAI clients read:
//   {"error":{"message":..., "type":..., "param":null, "code":...}}
//   401 invalid_request_error/invalid_api_key (+ WWW-Authenticate: Bearer)
//   404 invalid_request_error/unknown_url     405 .../method_not_allowed
//   503 server_error/busy                     502 server_error/upstream_unavailable
//   504 server_error/upstream_timeout
// A body over max_request_body is refused by the server before the proxy
// sees it: 413 {"error":{"code":"too_large","message":...}} (not counted).
// Nothing logs a key: a refused request is counted, not logged.
//
// Keys (issue 28): the tenant's own (the Credentials' hash, "default") and
// the named keys of the endpoint frame (named_keys.hpp), each request
// counted under the key it came with (usage.hpp: requests, errors, and the
// tokens Ollama's answer counts). A named key may have limits per minute
// (key_limits.hpp): past one, 429 rate_limit_exceeded with Retry-After.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/endpoint/named_keys.hpp"
#include "agent/endpoint/usage.hpp"
#include "common/error.hpp"

namespace factory::agent::endpoint {

// What the coordinator sends (protocol `endpoint` frame) and the proxy keeps
// in its state directory, every file 0600: the certificate chain it serves,
// the private key it generated (never sent anywhere), and the key's hash.
struct Credentials {
  std::string certificate_pem;  // leaf, then the endpoint CA
  std::string private_key_pem;  // PKCS#8, made in the guest (make_key_and_csr)
  std::string key_sha256;       // lower-case hex SHA-256 of the API key
};

struct ProxyOptions {
  std::string listen = "0.0.0.0:8443";
  std::string upstream = "http://127.0.0.1:11434";  // Ollama
  std::filesystem::path state_dir;                  // endpoint.crt, endpoint.key, api-key.sha256
  std::size_t max_concurrent = 16;
  std::size_t max_request_body = 1 << 20;
  // Connections at once, in all and from one source address; past either a
  // newcomer is closed as soon as it is accepted. Each holds a descriptor:
  // 512 leave half of the default soft limit (1,024) to the rest of the
  // agent should it not raise it; 64 is a client's whole connection pool
  // (httpx keeps up to 100 open but 20 idle), and a NAT's few.
  std::size_t max_connections = 512;
  std::size_t max_connections_per_address = 64;
  // Ollama's answer has not begun (its head) within this: 504. A non-streamed
  // answer is silent until whole: 3 minutes fill Ollama's default 4,096-token
  // context at 25 tokens a second, a slow card's pace.
  std::chrono::milliseconds upstream_first_byte_timeout{std::chrono::minutes(3)};
  // Once it has begun, an upstream that says nothing for this long ends the
  // request (502; a stream already started ends with an error chunk).
  std::chrono::milliseconds upstream_idle_timeout{std::chrono::minutes(5)};
  // Named keys are refused this long after the link to the coordinator
  // drops (link_lost), until its next endpoint frame (named_keys.hpp).
  std::chrono::milliseconds named_key_grace{std::chrono::seconds(3)};
};

// Counters since the proxy started, for health (health_sample's endpoint view).
struct ProxyStats {
  std::uint64_t requests = 0;         // every request received
  std::uint64_t served = 0;           // passed through and answered by Ollama (any status)
  std::uint64_t unauthorized = 0;     // 401
  std::uint64_t refused_paths = 0;    // 404 outside the allowlist
  std::uint64_t busy = 0;             // 503 at max_concurrent
  std::uint64_t upstream_errors = 0;  // Ollama unreachable, cut (502) or too slow to begin (504)
  std::uint64_t rate_limited = 0;     // 429: a named key past its rpm or tpm
  std::uint64_t in_flight = 0;
};

class Proxy {
 public:
  explicit Proxy(ProxyOptions opts);
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // Loads the credentials saved in state_dir, if any. True when they exist
  // and are whole (certificate matches key, hash is 64 hex).
  Result<bool> load_saved();
  // Saves (atomically, 0600) and applies at once: a rotated key's hash
  // replaces the old one for every request checked from now on, a new
  // certificate serves every connection accepted from now on. Starts
  // serving if it was not yet (no credentials: not listening at all).
  Status apply(const Credentials& creds);
  // The named keys (the coordinator's endpoint frame): the whole set,
  // replacing the one before; in force from the next request on.
  void set_named_keys(std::vector<NamedKey> keys);
  // The link to the coordinator dropped: named keys stop after
  // named_key_grace, until set_named_keys again.
  void link_lost();
  // Per key, since the last call: requests, errors, tokens.
  std::map<std::string, KeyUsage> take_usage();
  // Every member is thread-safe; apply, load_saved and stop take turns.
  bool serving() const;
  int port() const;  // the bound port once serving (listen port 0 = any), else 0
  ProxyStats stats() const;
  // The credentials in use (as saved), nullopt when none.
  std::optional<Credentials> saved() const;
  // The saved certificate's notAfter (unix seconds), 0 when none.
  std::int64_t certificate_not_after() const;
  // Closes the listener and every connection, then waits for the requests
  // in flight, which end at once with their clients. apply() may start it
  // again. The destructor stops.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// A new P-256 key and a CSR for it (CN = tenant), for the `endpoint_csr` frame.
struct KeyAndCsr {
  std::string private_key_pem;
  std::string csr_pem;
};
Result<KeyAndCsr> make_key_and_csr(const std::string& tenant);

// The probe health sends every few minutes: a small prompt through Ollama's
// streaming /api/generate; time to first token and to the end.
struct ProbeResult {
  bool ok = false;
  std::string error;  // why not ok (one line)
  double ttft_ms = 0;
  double total_ms = 0;
};
ProbeResult probe(const std::string& upstream, const std::string& model, const std::string& prompt,
                  std::chrono::milliseconds timeout);

}  // namespace factory::agent::endpoint
