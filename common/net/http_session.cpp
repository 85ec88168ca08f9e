// The HTTP session of a connection: requests parsed by Beast's parser, a
// head judged before its body is read, one request answered at a time
// (an Exchange the handler answers from any thread), streamed answers, and
// the public helpers of server.hpp's HTTP types.
#include <openssl/err.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/http/status.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/net/connection.hpp"
#include "common/net/url.hpp"

namespace factory::net {

namespace asio = boost::asio;
namespace http = boost::beast::http;

// --- server.hpp's HTTP helpers ------------------------------------------------

HttpResponseOut HttpResponseOut::error(int status, const std::string& code,
                                       const std::string& message) {
  nlohmann::json j = {{"error", {{"code", code}, {"message", message}}}};
  return json(status, j.dump());
}

HttpHandler immediate(std::function<HttpResponseOut(const HttpRequestIn&, const PeerInfo&)> f) {
  return [f = std::move(f)](std::shared_ptr<HttpExchange> x) {
    x->respond(f(x->request(), x->peer()));
  };
}

std::optional<std::string> bearer_token(std::string_view h) {
  auto blank = [](char c) { return c == ' ' || c == '\t'; };
  while (!h.empty() && blank(h.front())) h.remove_prefix(1);
  constexpr std::string_view kScheme = "bearer";
  if (h.size() <= kScheme.size()) return std::nullopt;
  for (std::size_t i = 0; i < kScheme.size(); i++) {
    char c = h[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != kScheme[i]) return std::nullopt;
  }
  h.remove_prefix(kScheme.size());
  if (!blank(h.front())) return std::nullopt;
  while (!h.empty() && blank(h.front())) h.remove_prefix(1);
  while (!h.empty() && blank(h.back())) h.remove_suffix(1);
  if (h.empty() || std::find_if(h.begin(), h.end(), blank) != h.end()) return std::nullopt;
  return std::string(h);
}

HttpRequestIn to_request_in(const http::request<http::string_body>& req) {
  HttpRequestIn in;
  in.method = std::string(req.method_string());
  in.target = std::string(req.target());
  auto q = in.target.find('?');
  in.path = percent_decode(std::string_view(in.target).substr(0, q), false);
  if (q != std::string::npos) {
    std::string_view qs = std::string_view(in.target).substr(q + 1);
    std::size_t pos = 0;
    while (pos <= qs.size()) {
      std::size_t amp = qs.find('&', pos);
      std::string_view kv =
          qs.substr(pos, amp == std::string_view::npos ? std::string_view::npos : amp - pos);
      auto eq = kv.find('=');
      if (!kv.empty())
        in.query[percent_decode(kv.substr(0, eq), true)] =
            eq == std::string_view::npos ? "" : percent_decode(kv.substr(eq + 1), true);
      if (amp == std::string_view::npos) break;
      pos = amp + 1;
    }
  }
  for (auto& f : req) {
    std::string k(f.name_string());
    for (auto& c : k) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    in.headers[k] = std::string(f.value());
  }
  in.body = req.body();
  return in;
}

bool header_has_token(const std::string& value, std::string_view token) {
  std::string v = value;
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::size_t pos = 0;
  while (pos < v.size()) {
    std::size_t comma = v.find(',', pos);
    std::string_view part = std::string_view(v).substr(
        pos, comma == std::string::npos ? std::string::npos : comma - pos);
    while (!part.empty() && (part.front() == ' ' || part.front() == '\t')) part.remove_prefix(1);
    while (!part.empty() && (part.back() == ' ' || part.back() == '\t')) part.remove_suffix(1);
    if (part == token) return true;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return false;
}

std::string status_line(int status) {
  auto reason = http::obsolete_reason(static_cast<http::status>(status));
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) + "\r\n";
}

namespace {
// A chunk's size line, as chunked transfer coding frames it.
std::string chunk_size_line(std::size_t n) {
  char line[24];
  int len = std::snprintf(line, sizeof line, "%zx\r\n", n);
  return std::string(line, static_cast<std::size_t>(len));
}
}  // namespace

// --- the session ----------------------------------------------------------------

void Conn::start_http_request() {
  state_ = State::http_read;
  auto* h = http();
  h->parser = std::make_unique<http::request_parser<http::string_body>>();
  h->parser->header_limit(static_cast<std::uint32_t>(srv_->opts.max_request_header));
  h->parser->body_limit(stranger_limited() ? srv_->opts.strangers.max_request_body
                                           : srv_->opts.max_request_body);
  h->head_checked = false;
}

void Conn::on_http_bytes(std::string_view data) {
  auto* h = http();
  if (state_ != State::http_read) {
    // Pipelined bytes of the next request: kept, within the limits of one.
    if (h->held_in.size() + data.size() >
        srv_->opts.max_request_header + srv_->opts.max_request_body)
      return fail(CloseReason::too_much_pipelined);
    h->held_in.append(data);
    return;
  }
  if (!h->request_started) {
    h->request_started = true;
    set_deadline(Clock::now() + srv_->opts.request_timeout);
  }
  std::string_view buf = data;
  if (!h->held_in.empty()) {
    h->held_in.append(data);
    buf = h->held_in;
  }
  auto& parser = *h->parser;
  std::size_t used = 0;
  boost::beast::error_code ec;
  while (used < buf.size() && !parser.is_done()) {
    // Not eager: the parser stops at the end of the head, so the head is
    // judged before a byte of the body is taken.
    std::size_t n = parser.put(asio::buffer(buf.data() + used, buf.size() - used), ec);
    used += n;
    const bool need_more = ec == http::error::need_more;
    if (need_more) ec = {};
    if (ec) break;
    if (!h->head_checked && parser.is_header_done()) {
      h->head_checked = true;
      if (auto early = check_head()) {
        // Answered on its head: the body (if any) is never read; what comes
        // of it is dropped as it arrives while the answer goes out, and the
        // connection then closes.
        std::string().swap(h->held_in);
        h->parser.reset();
        h->request_started = false;
        return respond_now(std::move(*early), false);
      }
    }
    if (need_more || n == 0) break;
  }
  // Keep what the parser did not take (a header not yet whole, or the next request).
  std::string rest(buf.substr(used));
  h->held_in = std::move(rest);
  if (h->held_in.capacity() > 4096 && h->held_in.empty()) std::string().swap(h->held_in);
  if (ec) {
    bool too_big = ec == http::error::body_limit || ec == http::error::header_limit;
    if (too_big) srv_->counters.oversize_closes++;
    int status = ec == http::error::body_limit ? 413 : ec == http::error::header_limit ? 431 : 400;
    spdlog::debug("{}: bad request from {}: {}", srv_->opts.name, peer_.remote, ec.message());
    respond_now(HttpResponseOut::error(status, status == 400 ? "bad_request" : "too_large",
                                       status == 400 ? "malformed HTTP request: " + ec.message()
                                                     : "request too large"),
                false);
    return;
  }
  if (parser.is_done()) handle_request();
}

// What a request's head alone decides, before any of its body is read.
std::optional<HttpResponseOut> Conn::check_head() {
  const auto& head = http()->parser->get();
  // RFC 9112 6.3: a request whose last transfer coding is not chunked has no
  // length a server can tell, and must be refused; taken as "no body" (which
  // Beast does), what follows would be read as the next request.
  if (head.count(http::field::transfer_encoding) > 0 && !http()->parser->chunked()) {
    spdlog::debug("{}: bad request from {}: Transfer-Encoding '{}'", srv_->opts.name, peer_.remote,
                  std::string(head[http::field::transfer_encoding]));
    return HttpResponseOut::error(
        400, "bad_request", "malformed HTTP request: the last Transfer-Encoding must be chunked");
  }
  if (!srv_->head_handler) return std::nullopt;
  try {
    return srv_->head_handler(to_request_in(head), peer_);
  } catch (const std::exception& e) {
    spdlog::error("{}: head handler for {} threw: {}", srv_->opts.name, peer_.remote, e.what());
    return HttpResponseOut::error(500, "internal", "internal error");
  }
}

// A client that hangs up (close_notify, a FIN, a reset) while its answer is
// prepared is noticed now, so the handler's on_gone can stop what it waits
// on, rather than when the answer is written. SSL_peek takes nothing away:
// bytes the client sent meanwhile (its next request) stay for their turn.
void Conn::watch_departure() {
  ERR_clear_error();
  char byte = 0;
  int n = SSL_peek(ssl_, &byte, 1);
  if (n > 0) {
    // It talks, so it is there; reading waits for the answer to be out.
    http()->departure_watch_over = true;
    return;
  }
  if (wait_as_tls_asks(n)) return;
  ERR_clear_error();
  fail(CloseReason::left_before_answer);
}

void Conn::set_on_gone(std::function<void()> f) {
  // An exchange of an earlier request may outlive it: a connection since
  // upgraded to a websocket has no answer to watch for.
  auto* h = http();
  if (!h) return;
  h->on_gone = std::move(f);
  // The watch starts now (a handler registers while its answer is prepared).
  if (state_ == State::http_wait) pump();
}

void Conn::handle_request() {
  auto* h = http();
  auto req = h->parser->release();
  h->parser.reset();
  h->request_started = false;
  HttpRequestIn in = to_request_in(req);
  const bool v11 = req.version() >= 11;
  h->keep_alive = req.keep_alive();
  if (header_has_token(in.header("upgrade"), "websocket")) return upgrade(std::move(in), v11);
  if (!srv_->http_handler) {
    return respond_now(HttpResponseOut::error(404, "not_found", "no such path: " + in.path),
                       h->keep_alive);
  }
  state_ = State::http_wait;
  // The handler owns the time it takes (a Kubernetes call has its own
  // deadline); only a stranger's overall deadline still applies.
  set_deadline(Clock::time_point::max());
  auto x = std::make_shared<Exchange>(shared_from_this(), std::move(in), peer_, h->keep_alive);
  h->exchange = x;
  try {
    srv_->http_handler(std::move(x));
  } catch (const std::exception& e) {
    spdlog::error("{}: handler for {} threw: {}", srv_->opts.name, peer_.remote, e.what());
  }
}

void Conn::respond_now(HttpResponseOut r, bool keep_alive) {
  state_ = State::http_wait;
  deliver_response(std::move(r), keep_alive);
}

void Conn::deliver_response(HttpResponseOut r, bool keep_alive) {
  if (state_ != State::http_wait) return;
  if (srv_->stopped) keep_alive = false;
  std::string head = status_line(r.status);
  head += "Server: factory\r\nContent-Type: " + r.content_type + "\r\n";
  const std::size_t len = r.shared_body ? r.shared_body->size() : r.body.size();
  head += "Content-Length: " + std::to_string(len) + "\r\n";
  for (auto& [k, v] : r.headers) head += k + ": " + v + "\r\n";
  if (!keep_alive) head += "Connection: close\r\n";
  head += "\r\n";
  {
    std::lock_guard lk(out_mu_);
    out_.push_back(owned(std::move(head)));
    if (r.shared_body)
      out_.push_back({std::move(r.shared_body), 0});
    else if (!r.body.empty())
      out_.push_back(owned(std::move(r.body)));
  }
  http()->keep_alive = keep_alive;
  state_ = State::http_write;
  // A large body is given time in proportion to it: 1 MiB a second at least.
  set_deadline(Clock::now() + srv_->opts.request_timeout + std::chrono::seconds(len >> 20));
  pump();
}

void Conn::answer_written() {
  auto* h = http();
  if (!h->keep_alive) return start_closing();
  start_http_request();
  // The answered request's hook is done with: the next request's client
  // leaving is not news to it.
  h->on_gone = nullptr;
  h->departure_watch_over = false;
  set_deadline(Clock::now() + srv_->opts.keepalive_timeout);
  // The next request may already sit decrypted inside SSL, where no
  // socket readiness will announce it: read again.
  pump_again_ = true;
  if (!h->held_in.empty()) {
    std::string early = std::move(h->held_in);
    std::string().swap(h->held_in);
    on_http_bytes(early);
  }
}

void Conn::queue_stream_head(int status, const std::string& content_type,
                             const std::map<std::string, std::string>& headers) {
  std::string head = status_line(status);
  head += "Server: factory\r\nContent-Type: " + content_type +
          "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
  for (auto& [k, v] : headers) head += k + ": " + v + "\r\n";
  head += "\r\n";
  enqueue_raw(std::move(head));
}

void Conn::begin_stream() {
  if (state_ != State::http_wait) return;
  state_ = State::streaming;
  set_deadline(Clock::time_point::max());
  pump();
}

bool Conn::queue_stream_chunk(std::string chunk, bool past_limit) {
  if (chunk.empty()) return true;
  std::string framed = chunk_size_line(chunk.size());
  framed += chunk;
  framed += "\r\n";
  const std::size_t bytes = framed.size();
  OutItem item = owned(std::move(framed));
  return enqueue_posted(&item, 1, bytes, past_limit ? 0 : srv_->opts.max_stream_queue);
}

bool Conn::queue_stream_chunk(std::shared_ptr<const std::string> chunk) {
  if (chunk->empty()) return true;
  std::string size_line = chunk_size_line(chunk->size());
  const std::size_t bytes = size_line.size() + chunk->size() + 2;
  static const auto kCrlf = std::make_shared<const std::string>("\r\n");
  OutItem items[] = {owned(std::move(size_line)), {std::move(chunk), 0}, {kCrlf, 0}};
  return enqueue_posted(items, 3, bytes, srv_->opts.max_stream_queue,
                        srv_->opts.stream_flush_delay);
}

void Conn::finish_stream(bool keep_alive) {
  if (state_ != State::streaming) return;
  enqueue_raw("0\r\n\r\n");
  state_ = State::http_write;
  http()->keep_alive = keep_alive && !srv_->stopped;
  set_deadline(Clock::now() + srv_->opts.request_timeout);
  pump();
}

// --- the exchange ---------------------------------------------------------------

Exchange::~Exchange() {
  // A handler that dropped its exchange without answering: the client
  // still gets an answer and the connection goes on.
  if (!answered_.exchange(true)) {
    asio::post(conn_->io(), [c = conn_, keep = keep_alive_] {
      c->deliver_response(HttpResponseOut::error(500, "internal", "the request got no answer"),
                          keep);
    });
  } else if (streaming_ && !ended_.exchange(true)) {
    asio::post(conn_->io(), [c = conn_, keep = keep_alive_] { c->finish_stream(keep); });
  }
}

void Exchange::respond(HttpResponseOut r) {
  if (answered_.exchange(true)) return;
  asio::post(conn_->io(), [c = conn_, r = std::move(r), keep = keep_alive_]() mutable {
    c->deliver_response(std::move(r), keep);
  });
}

void Exchange::start_stream(int status, std::string content_type,
                            std::map<std::string, std::string> headers) {
  if (answered_.exchange(true)) return;
  // The head is queued now, so every chunk written after this call goes
  // out after it, whichever thread writes.
  conn_->queue_stream_head(status, content_type, headers);
  streaming_ = true;
  asio::post(conn_->io(), [c = conn_] { c->begin_stream(); });
}

bool Exchange::write(std::string chunk) {
  if (!streaming_ || ended_) return false;
  return conn_->queue_stream_chunk(std::move(chunk));
}

bool Exchange::write_shared(std::shared_ptr<const std::string> chunk) {
  if (!streaming_ || ended_ || !chunk) return false;
  return conn_->queue_stream_chunk(std::move(chunk));
}

void Exchange::end() {
  if (!streaming_ || ended_.exchange(true)) return;
  asio::post(conn_->io(), [c = conn_, keep = keep_alive_] { c->finish_stream(keep); });
}

void Exchange::end_with(std::string last) {
  if (!streaming_ || ended_.exchange(true)) return;
  conn_->queue_stream_chunk(std::move(last), true);
  asio::post(conn_->io(), [c = conn_] { c->finish_stream(false); });
}

void Exchange::on_gone(std::function<void()> f) {
  asio::dispatch(conn_->io(), [c = conn_, f = std::move(f)]() mutable {
    if (c->gone())
      f();
    else
      c->set_on_gone(std::move(f));
  });
}

}  // namespace factory::net
