#include "common/net/ws_client.hpp"

#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>

namespace factory::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using asio::awaitable;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

struct WsClient::Impl {
  std::shared_ptr<ssl::context> ctx;
  websocket::stream<beast::ssl_stream<beast::tcp_stream>> ws;
  beast::flat_buffer buf;
  std::string remote;
  Impl(asio::any_io_executor ex, std::shared_ptr<ssl::context> c)
      : ctx(std::move(c)), ws(ex, *ctx) {}
};

WsClient::WsClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WsClient::~WsClient() = default;
const std::string& WsClient::remote() const {
  return impl_->remote;
}

awaitable<Result<std::unique_ptr<WsClient>>> WsClient::connect(WsClientOptions o) {
  auto url = parse_url(o.url);
  if (!url) co_return url.error();
  if (url->scheme != "wss")
    co_return Error(Errc::invalid_argument, "coordinator URL must be wss:// (got " + o.url + ")");
  auto ctx = make_client_context(o.tls);
  if (!ctx) co_return ctx.error();
  auto ex = co_await asio::this_coro::executor;
  auto impl = std::make_unique<Impl>(ex, *ctx);
  auto& tls = impl->ws.next_layer();
  auto& tcp_layer = beast::get_lowest_layer(impl->ws);
  std::string where = url->host + ":" + url->port;

  tcp::resolver resolver(ex);
  tcp_layer.expires_after(o.connect_timeout);
  auto [rec, results] = co_await resolver.async_resolve(url->host, url->port, use_tuple);
  if (rec) co_return Error(Errc::unavailable, "cannot resolve " + url->host + ": " + rec.message());
  auto [cec, ep] = co_await tcp_layer.async_connect(results, use_tuple);
  if (cec) {
    co_return Error(cec == beast::error::timeout ? Errc::timeout : Errc::unavailable,
                    "cannot connect to " + where + ": " + cec.message());
  }
  impl->remote = where;
  tcp_layer.socket().set_option(tcp::no_delay(true));

  std::string name = o.tls.server_name.empty() ? url->host : o.tls.server_name;
  boost::system::error_code aec;
  (void)asio::ip::make_address(name, aec);
  if (aec) {
    SSL_set_tlsext_host_name(tls.native_handle(), name.c_str());
    SSL_set1_host(tls.native_handle(), name.c_str());
  } else {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(tls.native_handle()), name.c_str());
  }
  tcp_layer.expires_after(o.connect_timeout);
  offer_kept_session(tls.native_handle());
  auto [hec] = co_await tls.async_handshake(ssl::stream_base::client, use_tuple);
  if (hec) {
    std::string reason = verify_failure_reason(tls.native_handle());
    long vr = SSL_get_verify_result(tls.native_handle());
    if (vr == X509_V_ERR_CERT_HAS_EXPIRED || vr == X509_V_ERR_CERT_NOT_YET_VALID)
      co_return Error(Errc::unavailable,
                      "the certificate of " + where + " failed verification (" + reason +
                          "): the coordinator renews its certificate while it runs, so this "
                          "passes; if it does not, compare this machine's clock with the "
                          "coordinator's");
    if (!reason.empty())
      co_return Error(Errc::unauthenticated,
                      "refusing " + where + ": its certificate failed verification (" + reason +
                          "); it is not the coordinator whose CA this agent pins");
    co_return Error(Errc::unavailable, "TLS handshake with " + where + " failed: " + hec.message());
  }
  tcp_layer.expires_never();
  websocket::stream_base::timeout t{};
  t.handshake_timeout = o.connect_timeout;
  t.idle_timeout = o.idle_timeout;
  t.keep_alive_pings = true;
  impl->ws.set_option(t);
  impl->ws.read_message_max(o.max_frame);
  std::string ua = o.user_agent;
  impl->ws.set_option(websocket::stream_base::decorator(
      [ua](websocket::request_type& req) { req.set(beast::http::field::user_agent, ua); }));
  websocket::response_type res;
  auto [wec] = co_await impl->ws.async_handshake(res, url->host_header(), url->target, use_tuple);
  if (wec) {
    if (res.result_int() != 0 && res.result_int() != 101)
      co_return Error(Errc::unavailable, "websocket upgrade at " + where + url->target +
                                             " refused with HTTP " +
                                             std::to_string(res.result_int()));
    co_return Error(Errc::unavailable,
                    "websocket handshake with " + where + " failed: " + wec.message());
  }
  impl->ws.text(true);
  co_return std::unique_ptr<WsClient>(new WsClient(std::move(impl)));
}

awaitable<Result<std::string>> WsClient::read() {
  auto [ec, n] = co_await impl_->ws.async_read(impl_->buf, use_tuple);
  if (ec) {
    if (ec == websocket::error::closed) {
      auto r = impl_->ws.reason();
      co_return Error(
          Errc::unavailable,
          "coordinator closed the connection" +
              (r.reason.empty() ? std::string()
                                : ": " + std::string(r.reason.data(), r.reason.size())));
    }
    if (ec == beast::error::timeout)
      co_return Error(Errc::timeout, "coordinator stopped answering pings");
    co_return Error(Errc::unavailable, "connection lost: " + ec.message());
  }
  std::string s = beast::buffers_to_string(impl_->buf.data());
  impl_->buf.consume(impl_->buf.size());
  co_return s;
}

awaitable<Status> WsClient::write(std::string text) {
  auto [ec, n] = co_await impl_->ws.async_write(asio::buffer(text), use_tuple);
  if (ec) co_return Error(Errc::unavailable, "send failed: " + ec.message());
  co_return Status{};
}

awaitable<void> WsClient::close() {
  static const std::string none;
  co_await close(none);
}

awaitable<void> WsClient::close(const std::string& reason) {
  if (!impl_->ws.is_open()) co_return;
  beast::get_lowest_layer(impl_->ws).expires_after(std::chrono::seconds(2));
  // A close frame's reason is at most 123 bytes.
  websocket::close_reason cr(websocket::close_code::normal,
                             std::string_view(reason).substr(0, 123));
  co_await impl_->ws.async_close(cr, use_tuple);
}

}  // namespace factory::net
