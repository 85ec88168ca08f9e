#include "tests/support/raw_tls_client.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace factory::testing {

namespace {

using Clock = std::chrono::steady_clock;

std::string ssl_error() {
  unsigned long e = ERR_get_error();
  char buf[256] = "unknown TLS error";
  if (e) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return buf;
}

bool load_pem_into(SSL_CTX* ctx, const std::string& cert_pem, const std::string& key_pem) {
  BIO* cb = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  X509* cert = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
  BIO_free(cb);
  BIO* kb = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr);
  BIO_free(kb);
  bool ok = cert && key && SSL_CTX_use_certificate(ctx, cert) == 1 &&
            SSL_CTX_use_PrivateKey(ctx, key) == 1;
  X509_free(cert);
  EVP_PKEY_free(key);
  return ok;
}

bool wait_fd(int fd, short events, Clock::time_point until) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, static_cast<int>(left));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

}  // namespace

Result<std::unique_ptr<RawTlsClient>> RawTlsClient::connect(const RawTlsOptions& o) {
  return connect_resuming(o, "");
}

Result<std::unique_ptr<RawTlsClient>> RawTlsClient::connect_resuming(const RawTlsOptions& o,
                                                                     const std::string& session) {
  // OpenSSL writes with write(2): a write after the server closed (the
  // close_notify of a reader it dropped, say) would kill the whole test
  // binary with SIGPIPE instead of failing that one write.
  ::signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<RawTlsClient> c(new RawTlsClient());
  const auto until = Clock::now() + o.timeout;
  bool v6 = o.host.find(':') != std::string::npos;
  c->fd_ = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (c->fd_ < 0) return errno_error("socket", errno);
  int one = 1;
  ::setsockopt(c->fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (!o.source_address.empty()) {
    sockaddr_in src{};
    src.sin_family = AF_INET;
    if (::inet_pton(AF_INET, o.source_address.c_str(), &src.sin_addr) != 1)
      return Error(Errc::invalid_argument, "bad source address " + o.source_address);
    if (::bind(c->fd_, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0)
      return errno_error("bind " + o.source_address, errno);
  }
  int r;
  if (v6) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(static_cast<uint16_t>(o.port));
    ::inet_pton(AF_INET6, o.host.c_str(), &a.sin6_addr);
    r = ::connect(c->fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(o.port));
    ::inet_pton(AF_INET, o.host.c_str(), &a.sin_addr);
    r = ::connect(c->fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  if (r != 0 && errno != EINPROGRESS) return errno_error("connect", errno);
  if (!wait_fd(c->fd_, POLLOUT, until)) return Error(Errc::timeout, "connect timed out");
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(c->fd_, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err) return errno_error("connect", err);

  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  c->ctx_ = ctx;
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  if (!o.ca_pem.empty()) {
    BIO* b = BIO_new_mem_buf(o.ca_pem.data(), static_cast<int>(o.ca_pem.size()));
    X509* ca = PEM_read_bio_X509(b, nullptr, nullptr, nullptr);
    BIO_free(b);
    if (!ca) return Error(Errc::invalid_argument, "unreadable CA");
    X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), ca);
    X509_free(ca);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  }
  if (!o.cert_pem.empty() && !load_pem_into(ctx, o.cert_pem, o.key_pem))
    return Error(Errc::invalid_argument, "client certificate: " + ssl_error());
  SSL* ssl = SSL_new(ctx);
  c->ssl_ = ssl;
  SSL_set_fd(ssl, c->fd_);
  if (!session.empty()) {
    const auto* p = reinterpret_cast<const unsigned char*>(session.data());
    SSL_SESSION* s = d2i_SSL_SESSION(nullptr, &p, static_cast<long>(session.size()));
    if (s) {
      SSL_set_session(ssl, s);
      SSL_SESSION_free(s);
    }
  }
  for (;;) {
    ERR_clear_error();
    int hr = SSL_connect(ssl);
    if (hr == 1) break;
    int e = SSL_get_error(ssl, hr);
    if (e == SSL_ERROR_WANT_READ) {
      if (!wait_fd(c->fd_, POLLIN, until)) return Error(Errc::timeout, "TLS handshake timed out");
    } else if (e == SSL_ERROR_WANT_WRITE) {
      if (!wait_fd(c->fd_, POLLOUT, until)) return Error(Errc::timeout, "TLS handshake timed out");
    } else {
      return Error(Errc::unavailable, "TLS handshake: " + ssl_error());
    }
  }
  return c;
}

RawTlsClient::~RawTlsClient() {
  if (ssl_) SSL_free(static_cast<SSL*>(ssl_));
  if (ctx_) SSL_CTX_free(static_cast<SSL_CTX*>(ctx_));
  if (fd_ >= 0) ::close(fd_);
}

Status RawTlsClient::write(std::string_view bytes) {
  auto* ssl = static_cast<SSL*>(ssl_);
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (!bytes.empty()) {
    ERR_clear_error();
    int n = SSL_write(ssl, bytes.data(), static_cast<int>(bytes.size()));
    if (n > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    int e = SSL_get_error(ssl, n);
    if (e == SSL_ERROR_WANT_WRITE) {
      if (!wait_fd(fd_, POLLOUT, until)) return Error(Errc::timeout, "write timed out");
    } else if (e == SSL_ERROR_WANT_READ) {
      if (!wait_fd(fd_, POLLIN, until)) return Error(Errc::timeout, "write timed out");
    } else {
      return Error(Errc::unavailable, "write: " + ssl_error());
    }
  }
  return {};
}

Result<std::string> RawTlsClient::read_some(std::chrono::milliseconds timeout) {
  if (!buffer_.empty()) return take_buffered(buffer_.size());
  auto* ssl = static_cast<SSL*>(ssl_);
  const auto until = Clock::now() + timeout;
  char buf[16384];
  for (;;) {
    ERR_clear_error();
    int n = SSL_read(ssl, buf, sizeof buf);
    if (n > 0) return std::string(buf, static_cast<std::size_t>(n));
    int e = SSL_get_error(ssl, n);
    if (e == SSL_ERROR_WANT_READ) {
      if (!wait_fd(fd_, POLLIN, until)) return Error(Errc::timeout, "nothing arrived");
      continue;
    }
    if (e == SSL_ERROR_WANT_WRITE) {
      if (!wait_fd(fd_, POLLOUT, until)) return Error(Errc::timeout, "nothing arrived");
      continue;
    }
    ERR_clear_error();
    return Error(Errc::unavailable, "connection closed");
  }
}

Result<std::string> RawTlsClient::take_buffered(std::size_t n) {
  std::string out = buffer_.substr(0, n);
  buffer_.erase(0, n);
  return out;
}

Result<std::string> RawTlsClient::read_until(std::string_view marker,
                                             std::chrono::milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  for (;;) {
    auto at = buffer_.find(marker);
    if (at != std::string::npos) return take_buffered(at + marker.size());
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left.count() <= 0) return Error(Errc::timeout, "marker never arrived; got: " + buffer_);
    std::string keep = std::move(buffer_);
    buffer_.clear();
    auto more = read_some(left);
    buffer_ = std::move(keep);
    if (!more) return more.error();
    buffer_ += *more;
  }
}

bool RawTlsClient::wait_closed(std::chrono::milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  buffer_.clear();
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left.count() <= 0) return false;
    auto r = read_some(left);
    if (!r && r.error().code == Errc::unavailable) return true;
    if (!r) return false;
  }
}

Result<std::string> RawTlsClient::ws_upgrade(const std::string& path, const std::string& extra) {
  unsigned char nonce[16];
  RAND_bytes(nonce, sizeof nonce);
  unsigned char key[32];
  int n = EVP_EncodeBlock(key, nonce, sizeof nonce);
  std::string req = "GET " + path +
                    " HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
                    "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " +
                    std::string(reinterpret_cast<char*>(key), static_cast<std::size_t>(n)) +
                    "\r\n" + extra + "\r\n";
  if (auto st = write(req); !st.ok()) return st.error();
  auto head = read_until("\r\n\r\n", std::chrono::seconds(5));
  if (!head) return head.error();
  if (head->rfind("HTTP/1.1 101", 0) != 0) return Error(Errc::failed_precondition, *head);
  return *head;
}

Status RawTlsClient::ws_send(net::ws::Opcode op, std::string_view payload, bool fin) {
  std::uint8_t mask[4];
  RAND_bytes(mask, 4);
  return write(net::ws::encode_client_frame(op, payload, mask, fin));
}

Result<ServerFrame> RawTlsClient::ws_read(std::chrono::milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  for (;;) {
    if (buffer_.size() >= 2) {
      auto b0 = static_cast<std::uint8_t>(buffer_[0]);
      auto b1 = static_cast<std::uint8_t>(buffer_[1]);
      std::uint64_t len = b1 & 0x7F;
      std::size_t header = 2;
      bool have = true;
      if (len == 126) {
        have = buffer_.size() >= 4;
        if (have)
          len =
              (static_cast<std::uint8_t>(buffer_[2]) << 8) | static_cast<std::uint8_t>(buffer_[3]);
        header = 4;
      } else if (len == 127) {
        have = buffer_.size() >= 10;
        if (have) {
          len = 0;
          for (int i = 0; i < 8; ++i) len = (len << 8) | static_cast<std::uint8_t>(buffer_[2 + i]);
        }
        header = 10;
      }
      if (have && buffer_.size() >= header + len) {
        ServerFrame f;
        f.fin = (b0 & 0x80) != 0;
        f.op = static_cast<net::ws::Opcode>(b0 & 0x0F);
        f.payload = buffer_.substr(header, static_cast<std::size_t>(len));
        buffer_.erase(0, header + static_cast<std::size_t>(len));
        if (f.op == net::ws::Opcode::close && f.payload.size() >= 2) {
          f.close_code = static_cast<std::uint16_t>((static_cast<std::uint8_t>(f.payload[0]) << 8) |
                                                    static_cast<std::uint8_t>(f.payload[1]));
          f.payload.erase(0, 2);
        }
        return f;
      }
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left.count() <= 0) return Error(Errc::timeout, "no frame arrived");
    std::string keep = std::move(buffer_);
    buffer_.clear();
    auto more = read_some(left);
    buffer_ = std::move(keep);
    if (!more) return more.error();
    buffer_ += *more;
  }
}

bool RawTlsClient::resumed() const {
  return SSL_session_reused(static_cast<SSL*>(ssl_)) == 1;
}

std::string RawTlsClient::session_der() const {
  SSL_SESSION* s = SSL_get1_session(static_cast<SSL*>(ssl_));
  if (!s) return "";
  int len = i2d_SSL_SESSION(s, nullptr);
  std::string out(static_cast<std::size_t>(std::max(len, 0)), '\0');
  auto* p = reinterpret_cast<unsigned char*>(out.data());
  i2d_SSL_SESSION(s, &p);
  SSL_SESSION_free(s);
  return out;
}

}  // namespace factory::testing
