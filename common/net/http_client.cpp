// Synchronous HTTP/1.1 over Beast. All Beast/Asio template use lives in this
// file (asio/beast themselves are compiled once in asio_beast.cpp), so the rest
// of the project includes only the small interface in http_client.hpp.
//
// One connection per request, closed afterwards ("Connection: close"): the
// callers (admin CLI, Kubernetes client, Ollama probes) make few requests, and
// a fresh connection never inherits a half-read response from an earlier one.
#include "common/net/http_client.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/version.hpp>
#include <cctype>
#include <optional>

#include "common/net/url.hpp"

namespace factory::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// A response body larger than this is refused: nothing Factory talks to sends
// more (a Kubernetes list of every object it owns is far smaller), and an
// unbounded buffer is how a confused peer takes the process down.
constexpr std::uint64_t kMaxBody = 64ull << 20;
constexpr std::uint32_t kMaxHeader = 64u << 10;

bool is_ip_literal(const std::string& host) {
  boost::system::error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

// This client speaks HTTP only; wss:// belongs to the agent link.
Result<Url> parse_http_url(const std::string& s) {
  auto u = parse_url(s);
  if (u && u->scheme != "http" && u->scheme != "https")
    return Error(Errc::invalid_argument, "URL '" + s + "' must start with http:// or https://");
  return u;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// System messages arrive capitalised ("Connection refused"); our errors read
// as one lower-case sentence after the "where:" prefix.
std::string reason(const boost::system::error_code& ec) {
  std::string m = ec.message();
  if (!m.empty() && std::isupper(static_cast<unsigned char>(m[0])) &&
      !(m.size() > 1 && std::isupper(static_cast<unsigned char>(m[1]))))
    m[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(m[0])));
  return m;
}

std::string seconds_text(std::chrono::milliseconds d) {
  auto ms = d.count();
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

// The most recent OpenSSL error as text, for PEM/key problems where the
// error_code's message is only "asio.ssl error".
std::string openssl_reason(const boost::system::error_code& ec) {
  if (ec.category() == asio::error::get_ssl_category()) {
    const char* r = ERR_reason_error_string(static_cast<unsigned long>(ec.value()));
    if (r) return r;
  }
  return reason(ec);
}

// The server's alert about our certificate (absent, unknown CA, expired...).
// With TLS 1.3 it arrives after the client's handshake has completed, on the
// first read, so it is recognised wherever it shows up.
bool refused_client_certificate(const boost::system::error_code& ec) {
  if (ec.category() != asio::error::get_ssl_category()) return false;
  switch (ERR_GET_REASON(static_cast<unsigned long>(ec.value()))) {
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
      return true;
    default:
      return false;
  }
}

// Asio says it could not make a resource (a descriptor for its reactor's
// eventfd or epoll instance) by throwing. Here that is one request's error,
// like any other: a process out of descriptors fails a request, it does not
// abort (an uncaught throw on a worker thread did, under a connection flood).
Error resource_error(const Url& url, const boost::system::system_error& e) {
  return Error(Errc::unavailable, url.origin() + ": " + e.what());
}

// The connection: plain TCP, or TLS over TCP. Both carry the deadline on the
// tcp_stream underneath, which is what expires_at acts on.
class Connection {
 public:
  Connection(const Url& url, const TlsClientOptions& tls, const HttpRequest& req)
      : url_(url),
        tls_opts_(tls),
        timeout_(req.timeout),
        idle_timeout_(req.idle_timeout.count() > 0 ? req.idle_timeout : req.timeout),
        deadline_(Clock::now() + req.timeout),
        cancel_(req.cancel) {}
  ~Connection() {
    // After this no cancel() posts to ioc_, which goes with this object.
    if (cancel_) cancel_->disarm();
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  Status open() {
    if (url_.tls) {
      auto st = make_tls_context();
      if (!st) return st;
      tls_.emplace(ioc_, *ctx_);
    } else {
      plain_.emplace(ioc_);
    }
    // From here a cancel() on another thread cuts whatever waits: run on
    // this io_context, the socket's operations end with operation_aborted.
    if (cancel_ && !cancel_->arm([this] { asio::post(ioc_, [this] { lowest().cancel(); }); }))
      return cancelled();
    tcp::resolver resolver(ioc_);
    boost::system::error_code ec;
    tcp::resolver::results_type endpoints;
    bool resolved = false;
    resolver.async_resolve(url_.host, url_.port,
                           [&](boost::system::error_code e, tcp::resolver::results_type r) {
                             ec = e;
                             endpoints = std::move(r);
                             resolved = true;
                           });
    ioc_.restart();
    ioc_.run_until(deadline_);
    if (!resolved) {
      resolver.cancel();
      ioc_.restart();
      ioc_.run();
      return io_error("resolving the host name", beast::error::timeout);
    }
    if (ec)
      return Error(Errc::unavailable,
                   url_.origin() + ": cannot resolve host '" + url_.host + "': " + reason(ec));
    arm();
    ec = await([&](auto handler) { lowest().async_connect(endpoints, handler); });
    if (ec) return io_error("connect", ec);
    // A request goes out as a head and a body (and TLS records): with Nagle
    // on, the second small segment waits for the peer's delayed ACK, 40 ms
    // a request on Linux (the model endpoint's proxy measured it).
    boost::system::error_code nodelay_ec;
    lowest().socket().set_option(tcp::no_delay(true), nodelay_ec);
    if (url_.tls) return handshake();
    return {};
  }

  // Runs one asynchronous operation to completion. Beast's deadlines act
  // only on asynchronous operations (the timer closes the socket), so every
  // "synchronous" step here is an async one waited for on our own io_context.
  template <class Initiate>
  boost::system::error_code await(Initiate&& initiate) {
    // A cancel() that came between two steps: the next one does not start.
    if (cancel_ && cancel_->cancelled()) return asio::error::operation_aborted;
    boost::system::error_code out;
    initiate([&out](boost::system::error_code ec, auto&&...) { out = ec; });
    ioc_.restart();
    ioc_.run();
    return out;
  }

  template <class Fn>
  auto with_stream(Fn&& fn) {
    if (tls_) return fn(*tls_);
    return fn(*plain_);
  }

  // The deadline covers the whole exchange; streaming callers move it along
  // as data arrives (an idle timeout).
  void arm() { lowest().expires_at(deadline_); }
  void extend() {
    deadline_ = Clock::now() + idle_timeout_;
    extended_ = true;
    arm();
  }

  Error cancelled() const { return Error(Errc::unavailable, url_.origin() + ": cancelled"); }

  Error io_error(const std::string& what, const boost::system::error_code& ec) const {
    if (cancel_ && cancel_->cancelled()) return cancelled();
    if (ec == beast::error::timeout)
      return Error(Errc::timeout, url_.origin() + ": " + what + " timed out after " +
                                      seconds_text(extended_ ? idle_timeout_ : timeout_));
    if (ec == asio::error::connection_refused || ec == asio::error::host_unreachable ||
        ec == asio::error::network_unreachable)
      return Error(Errc::unavailable, url_.origin() + ": " + reason(ec));
    if (refused_client_certificate(ec))
      return Error(Errc::unauthenticated, url_.origin() +
                                              ": the server refused our client certificate (" +
                                              openssl_reason(ec) + ")");
    if (ec.category() == asio::error::get_ssl_category() || ec == ssl::error::stream_truncated)
      return Error(Errc::protocol, url_.origin() + ": TLS " + what + ": " + openssl_reason(ec));
    return Error(Errc::unavailable, url_.origin() + ": " + what + ": " + reason(ec));
  }

  // A TLS 1.3 server that rejects our client certificate says so in an alert
  // sent after our side of the handshake completed, then closes; our request
  // write can then fail with a reset. The alert is usually still in the
  // receive queue: read it, so the user learns the real cause.
  template <class Stream>
  Error write_error(Stream& stream, const boost::system::error_code& ec) {
    if (tls_) {
      beast::flat_buffer buf;
      http::response_parser<http::empty_body> p;
      lowest().expires_after(std::chrono::milliseconds(500));
      auto rec = await([&](auto h) { http::async_read_header(stream, buf, p, h); });
      if (refused_client_certificate(rec)) return io_error("sending the request", rec);
    }
    return io_error("sending the request", ec);
  }

  // A clean goodbye: TLS close_notify (bounded: a peer that never answers it
  // must not hold us for the whole deadline), then the socket.
  void close(bool graceful) {
    boost::system::error_code ec;
    if (tls_ && graceful) {
      lowest().expires_after(std::chrono::milliseconds(500));
      ec = await([&](auto handler) { tls_->async_shutdown(handler); });
      (void)ec;  // eof / stream_truncated / timeout here are all a normal goodbye
    }
    lowest().socket().shutdown(tcp::socket::shutdown_both, ec);
    lowest().close();
  }

 private:
  beast::tcp_stream& lowest() { return tls_ ? beast::get_lowest_layer(*tls_) : *plain_; }

  Status make_tls_context() {
    ctx_.emplace(ssl::context::tls_client);
    SSL_CTX* native = ctx_->native_handle();
    // TLS 1.2 is the floor: the Kubernetes API server and our coordinator
    // both speak 1.3, and older versions have known weaknesses.
    SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
    ctx_->set_options(ssl::context::default_workarounds | ssl::context::no_compression);
    boost::system::error_code ec;
    if (!tls_opts_.ca_pem.empty()) {
      ctx_->add_certificate_authority(asio::buffer(tls_opts_.ca_pem), ec);
      if (ec)
        return Error(Errc::invalid_argument,
                     "CA certificate is not valid PEM: " + openssl_reason(ec));
    } else {
      ctx_->set_default_verify_paths(ec);
      if (ec)
        return Error(Errc::internal, "cannot load the system CA store: " + openssl_reason(ec));
    }
    if (!tls_opts_.client_cert_pem.empty() || !tls_opts_.client_key_pem.empty()) {
      if (tls_opts_.client_cert_pem.empty() || tls_opts_.client_key_pem.empty())
        return Error(Errc::invalid_argument,
                     "a client certificate needs both the certificate and its key");
      ctx_->use_certificate_chain(asio::buffer(tls_opts_.client_cert_pem), ec);
      if (ec)
        return Error(Errc::invalid_argument,
                     "client certificate is not valid PEM: " + openssl_reason(ec));
      ctx_->use_private_key(asio::buffer(tls_opts_.client_key_pem), ssl::context::pem, ec);
      if (ec)
        return Error(Errc::invalid_argument,
                     "client key is not a valid PEM private key: " + openssl_reason(ec));
      if (SSL_CTX_check_private_key(native) != 1)
        return Error(Errc::invalid_argument, "client key does not match the client certificate");
    }
    ctx_->set_verify_mode(tls_opts_.insecure_skip_verify ? ssl::verify_none : ssl::verify_peer);
    return {};
  }

  Status handshake() {
    SSL* ssl = tls_->native_handle();
    const std::string& name = tls_opts_.server_name.empty() ? url_.host : tls_opts_.server_name;
    bool name_is_ip = tls_opts_.server_name.empty() ? url_.host_is_ip : is_ip_literal(name);
    // SNI carries host names only (RFC 6066 forbids IP literals there).
    if (!name_is_ip && SSL_set_tlsext_host_name(ssl, name.c_str()) != 1)
      return Error(Errc::invalid_argument, "cannot use '" + name + "' as the TLS server name");
    if (!tls_opts_.insecure_skip_verify) {
      // The chain alone proves nothing about *which* server answered: check
      // the certificate names this host (DNS SAN) or this address (IP SAN).
      int ok = name_is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name.c_str())
                          : SSL_set1_host(ssl, name.c_str());
      if (ok != 1)
        return Error(Errc::invalid_argument, "cannot verify against host name '" + name + "'");
    }
    auto ec =
        await([&](auto handler) { tls_->async_handshake(ssl::stream_base::client, handler); });
    if (!ec) return {};
    long verify = SSL_get_verify_result(ssl);
    if (!tls_opts_.insecure_skip_verify && verify != X509_V_OK) {
      std::string why = X509_verify_cert_error_string(verify);
      if (verify == X509_V_ERR_HOSTNAME_MISMATCH || verify == X509_V_ERR_IP_ADDRESS_MISMATCH)
        why = "the server's certificate is not valid for '" + name + "'";
      return Error(Errc::unauthenticated,
                   url_.origin() + ": TLS certificate verification failed: " + why);
    }
    return io_error("TLS handshake", ec);
  }

  const Url& url_;
  const TlsClientOptions& tls_opts_;
  std::chrono::milliseconds timeout_, idle_timeout_;
  Clock::time_point deadline_;
  bool extended_ = false;  // past the head: waits are bounded by idle_timeout_
  std::shared_ptr<HttpCancel> cancel_;
  asio::io_context ioc_;
  std::optional<ssl::context> ctx_;
  std::optional<beast::tcp_stream> plain_;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_;
};

http::request<http::string_body> build_request(const Url& url, const HttpRequest& req) {
  http::request<http::string_body> r;
  http::verb v = http::string_to_verb(req.method);
  if (v == http::verb::unknown)
    r.method_string(req.method);
  else
    r.method(v);
  r.target(url.target);
  r.version(11);
  r.set(http::field::host, url.host_header());
  r.set(http::field::user_agent, "factory/" FACTORY_VERSION);
  r.keep_alive(false);
  for (const auto& [k, val] : req.headers) r.set(k, val);
  r.body() = req.body;
  if (!req.body.empty() || v == http::verb::post || v == http::verb::put || v == http::verb::patch)
    r.prepare_payload();
  return r;
}

template <class Fields>
std::map<std::string, std::string> header_map(const Fields& f) {
  std::map<std::string, std::string> out;
  for (const auto& field : f) {
    std::string k = lower(std::string(field.name_string()));
    std::string v(field.value());
    auto [it, inserted] = out.emplace(k, v);
    if (!inserted) it->second += ", " + v;
  }
  return out;
}

// A TLS peer that closes without close_notify ends a read-until-close body
// with stream_truncated; the body is still complete as far as HTTP can tell.
bool is_truncation(const boost::system::error_code& ec) {
  return ec == ssl::error::stream_truncated || ec == http::error::end_of_stream ||
         ec == asio::error::eof;
}

// One request on a connection of its own (HttpClient::request).
Result<HttpResponse> request_on(const Url& url, const TlsClientOptions& tls,
                                const HttpRequest& req) {
  Connection conn(url, tls, req);
  if (auto st = conn.open(); !st) return st.error();

  auto out = build_request(url, req);
  return conn.with_stream([&](auto& stream) -> Result<HttpResponse> {
    auto ec = conn.await([&](auto h) { http::async_write(stream, out, h); });
    if (ec) return conn.write_error(stream, ec);

    beast::flat_buffer buf;
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxBody);
    parser.header_limit(kMaxHeader);
    if (out.method() == http::verb::head) parser.skip(true);
    ec = conn.await([&](auto h) { http::async_read(stream, buf, parser, h); });
    if (ec && is_truncation(ec) && parser.is_header_done() && !parser.is_done()) {
      boost::system::error_code eof_ec;
      parser.put_eof(eof_ec);  // completes a body delimited by the close
      if (!eof_ec) ec = {};
    }
    if (ec == http::error::body_limit)
      return Error(Errc::protocol, url.origin() + ": response body larger than 64 MiB");
    if (ec) return conn.io_error("reading the response", ec);
    conn.close(true);

    auto& msg = parser.get();
    HttpResponse resp;
    resp.status = static_cast<int>(msg.result_int());
    resp.headers = header_map(msg.base());
    resp.body = std::move(msg.body());
    return resp;
  });
}

// One streamed request on a connection of its own (HttpClient::stream).
Result<int> stream_on(const Url& url, const TlsClientOptions& tls, const HttpRequest& req,
                      const std::function<bool(std::string_view chunk)>& on_data,
                      const std::function<bool(const HttpResponse& head)>& on_head) {
  Connection conn(url, tls, req);
  if (auto st = conn.open(); !st) return st.error();

  auto out = build_request(url, req);
  return conn.with_stream([&](auto& stream) -> Result<int> {
    auto ec = conn.await([&](auto h) { http::async_write(stream, out, h); });
    if (ec) return conn.write_error(stream, ec);

    beast::flat_buffer buf;
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(boost::none);  // a watch runs for as long as the caller wants
    parser.header_limit(kMaxHeader);
    ec = conn.await([&](auto h) { http::async_read_header(stream, buf, parser, h); });
    if (ec) return conn.io_error("reading the response", ec);
    int status = static_cast<int>(parser.get().result_int());
    if (on_head) {
      HttpResponse head;
      head.status = status;
      head.headers = header_map(parser.get().base());
      if (!on_head(head)) {
        conn.close(false);
        return status;
      }
    }

    std::array<char, 16 * 1024> chunk;
    while (!parser.is_done()) {
      conn.extend();
      parser.get().body().data = chunk.data();
      parser.get().body().size = chunk.size();
      // read_some, not read: a watch event must reach the caller when it
      // arrives, not when 16 KiB of them have piled up.
      ec = conn.await([&](auto h) { http::async_read_some(stream, buf, parser, h); });
      if (ec == http::error::need_buffer) ec = {};
      if (ec && is_truncation(ec) && !parser.is_done()) {
        boost::system::error_code eof_ec;
        parser.put_eof(eof_ec);
        if (!eof_ec)
          ec = {};
        else
          return Error(Errc::unavailable,
                       url.origin() + ": the server closed the stream mid-response");
      }
      if (ec) return conn.io_error("reading the response", ec);
      size_t n = chunk.size() - parser.get().body().size;
      if (n > 0 && !on_data(std::string_view(chunk.data(), n))) {
        conn.close(false);
        return status;
      }
    }
    conn.close(true);
    return status;
  });
}

}  // namespace

void HttpCancel::cancel() {
  std::lock_guard lk(mu_);
  cancelled_ = true;
  if (stop_) stop_();
}

bool HttpCancel::cancelled() const {
  std::lock_guard lk(mu_);
  return cancelled_;
}

bool HttpCancel::arm(std::function<void()> stop) {
  std::lock_guard lk(mu_);
  if (cancelled_) return false;
  stop_ = std::move(stop);
  return true;
}

void HttpCancel::disarm() {
  std::lock_guard lk(mu_);
  stop_ = nullptr;
}

HttpClient::HttpClient(TlsClientOptions tls) : tls_(std::move(tls)) {}

Result<HttpResponse> HttpClient::request(const HttpRequest& req) {
  auto url = parse_http_url(req.url);
  if (!url) return url.error();
  try {
    return request_on(*url, tls_, req);
  } catch (const boost::system::system_error& e) {
    return resource_error(*url, e);
  }
}

Result<int> HttpClient::stream(const HttpRequest& req,
                               const std::function<bool(std::string_view chunk)>& on_data,
                               const std::function<bool(const HttpResponse& head)>& on_head) {
  auto url = parse_http_url(req.url);
  if (!url) return url.error();
  try {
    return stream_on(*url, tls_, req, on_data, on_head);
  } catch (const boost::system::system_error& e) {
    return resource_error(*url, e);
  }
}

}  // namespace factory::net
