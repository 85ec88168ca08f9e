#include "agent/endpoint/proxy.hpp"

#include <spdlog/spdlog.h>

#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/endpoint/key_limits.hpp"
#include "agent/endpoint/routes.hpp"
#include "common/atomic_file.hpp"
#include "common/durations.hpp"
#include "common/net/http_client.hpp"
#include "common/net/server.hpp"
#include "common/net/tls.hpp"
#include "common/pki.hpp"
#include "common/worker_pool.hpp"

namespace factory::agent::endpoint {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr const char* kCertFile = "endpoint.crt";
constexpr const char* kKeyFile = "endpoint.key";
constexpr const char* kHashFile = "api-key.sha256";
// An upstream answer with a Content-Length up to this is collected and sent
// whole (the client gets a Content-Length too); anything else is streamed.
constexpr std::size_t kBufferedLimit = 8 << 20;

net::HttpResponseOut error_response(int status, const std::string& type, const std::string& code,
                                    const std::string& message) {
  return net::HttpResponseOut::json(status, error_body(type, code, message));
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.erase(0, 1);
  return s;
}

// The certificate's notAfter, or the reason it is no use: the one check
// both apply() and load_saved() make.
Result<std::int64_t> validate(const Credentials& c) {
  if (pki::split_pem_certificates(c.certificate_pem).empty())
    return Error(Errc::invalid_argument, "the endpoint certificate is not a PEM certificate");
  auto info = pki::inspect_certificate(c.certificate_pem);
  if (!info) return info.error().with_context("endpoint certificate");
  if (!pki::key_matches_certificate(c.private_key_pem, c.certificate_pem))
    return Error(
        Errc::invalid_argument,
        "the endpoint certificate is not for this guest's key (serial " + info->serial_hex + ")");
  if (!pki::is_sha256_hex(c.key_sha256))
    return Error(Errc::invalid_argument,
                 "the API key hash is not 64 lower-case hex characters (SHA-256)");
  return unix_seconds(info->not_after);
}

// "3m", or "250 ms" below a second.
std::string duration_text(std::chrono::milliseconds d) {
  if (d < std::chrono::seconds(1)) return std::to_string(d.count()) + " ms";
  return format_duration(std::chrono::duration_cast<std::chrono::seconds>(d));
}

// Where the stream's format lets a late error be said: Ollama's own NDJSON
// error line, or an SSE event with the OpenAI error object.
std::string stream_error_chunk(const std::string& content_type, const std::string& message) {
  if (content_type.find("text/event-stream") != std::string::npos)
    return "data: " + error_body("server_error", "upstream_cut", message) + "\n\n";
  return Json{{"error", message}}.dump() + "\n";
}

}  // namespace

struct Proxy::Impl {
  explicit Impl(ProxyOptions o) : opts(std::move(o)), keys(opts.named_key_grace) {
    while (!opts.upstream.empty() && opts.upstream.back() == '/') opts.upstream.pop_back();
    if (opts.max_concurrent == 0) opts.max_concurrent = 1;
  }

  ProxyOptions opts;

  // apply / load_saved / stop, one at a time.
  std::mutex life_mu;
  Credentials creds;
  bool have_creds = false;
  std::unique_ptr<net::IoPool> io;
  std::unique_ptr<net::Server> server;
  std::unique_ptr<WorkerPool> workers;
  std::thread io_thread;
  std::atomic<bool> serving{false};
  std::atomic<int> port{0};
  std::atomic<std::int64_t> not_after{0};

  // The keys every request is checked against (read on the io thread),
  // their limits, and what each used.
  KeyRing keys;
  KeyLimits limits;
  UsageTally usage;

  std::atomic<std::uint64_t> requests{0}, served{0}, unauthorized{0}, refused_paths{0}, busy{0},
      upstream_errors{0}, in_flight{0}, rate_limited{0};

  // The key a request came with, when one serves.
  std::optional<NamedKey> key_of(const net::HttpRequestIn& req) const {
    auto key = net::bearer_token(req.header("authorization"));
    if (!key) return std::nullopt;
    return keys.match(pki::sha256_hex(*key));
  }

  static net::HttpResponseOut unauthorized_response() {
    auto r = error_response(401, "invalid_request_error", "invalid_api_key",
                            "missing or invalid API key (Authorization: Bearer <key>)");
    r.headers["WWW-Authenticate"] = "Bearer";
    return r;
  }

  // On the io thread, on a request's head, before a byte of its body is
  // read: the key, then the path. What is refused here is answered at once
  // and its connection closed (net::HeadHandler), so a caller without the
  // key never has a body buffered.
  std::optional<net::HttpResponseOut> check_head(const net::HttpRequestIn& head) {
    requests++;
    auto key = key_of(head);
    if (!key) {
      unauthorized++;
      return unauthorized_response();
    }
    auto route = match_route(head.method, head.path);
    if (route.verdict != RouteVerdict::pass) usage.request(key->name, true, std::nullopt);
    if (route.verdict == RouteVerdict::not_found) {
      refused_paths++;
      return error_response(404, "invalid_request_error", "unknown_url",
                            "no such endpoint: " + head.method + " " + head.path);
    }
    if (route.verdict == RouteVerdict::wrong_method) {
      auto r = error_response(405, "invalid_request_error", "method_not_allowed",
                              head.method + " is not allowed on " + head.path);
      r.headers["Allow"] = route.allow;
      return r;
    }
    // A request the limits refuse counts as one of the key's, and an error.
    auto v = limits.admit(key->name, key->rpm, key->tpm);
    if (!v.allowed) {
      rate_limited++;
      usage.request(key->name, true, std::nullopt);
      auto r = error_response(
          429, v.which, "rate_limit_exceeded",
          "key " + key->name + " is past its limit of " +
              std::to_string(std::string_view(v.which) == "requests" ? key->rpm.value_or(0)
                                                                     : key->tpm.value_or(0)) +
              " " + v.which + " per minute; retry after " + std::to_string(v.retry_after_s) + " s");
      r.headers["Retry-After"] = std::to_string(v.retry_after_s);
      return r;
    }
    return std::nullopt;
  }

  // On the io thread, with the body read (check_head passed its head): a
  // place among max_concurrent, then a worker.
  void handle(const std::shared_ptr<net::HttpExchange>& x) {
    const auto& req = x->request();
    // Again, with the body read: a key revoked in between is refused here.
    auto key = key_of(req);
    if (!key) {
      unauthorized++;
      return x->respond(unauthorized_response());
    }
    auto route = match_route(req.method, req.path);
    if (route.verdict != RouteVerdict::pass) {
      // check_head refused these; a key rotated in between lands here.
      return x->respond(error_response(404, "invalid_request_error", "unknown_url",
                                       "no such endpoint: " + req.method + " " + req.path));
    }
    if (in_flight.fetch_add(1) >= opts.max_concurrent) {
      in_flight--;
      busy++;
      usage.request(key->name, true, std::nullopt);
      return x->respond(error_response(503, "server_error", "busy",
                                       "the endpoint is at its limit of " +
                                           std::to_string(opts.max_concurrent) +
                                           " requests at once; retry shortly"));
    }
    std::string target = route.upstream_target;
    // The client hanging up ends the worker's wait on Ollama at once (the
    // server watches the connection from here on), not at Ollama's next
    // chunk, which a silent Ollama may never send.
    auto cancel = std::make_shared<net::HttpCancel>();
    x->on_gone([cancel] { cancel->cancel(); });
    if (!workers->post(
            [this, x, target, cancel, name = key->name] { pass(*x, target, cancel, name); })) {
      in_flight--;
      usage.request(key->name, true, std::nullopt);
      x->respond(error_response(503, "server_error", "stopping", "the endpoint is stopping"));
    }
  }

  // Gives back the place handle() took, however pass() ends.
  struct InFlight {
    std::atomic<std::uint64_t>& count;
    ~InFlight() { count--; }
  };

  // On a worker: the request to Ollama, its answer back as it comes.
  void pass(net::HttpExchange& x, const std::string& target,
            const std::shared_ptr<net::HttpCancel>& cancel, const std::string& key) {
    InFlight place{in_flight};
    const auto& req = x.request();
    // The OpenAI-compatible paths count tokens in a usage chunk that a
    // stream has only when asked for: asked here, and kept from a client
    // that did not ask (filter below).
    std::optional<std::string> asked_usage;
    if (req.method == "POST" && (target == "/v1/chat/completions" || target == "/v1/completions"))
      asked_usage = with_usage_requested(req.body);
    UsageScanner scanner;
    std::optional<UsageChunkFilter> filter;
    net::HttpRequest up;
    up.method = req.method;
    up.url = opts.upstream + target;
    up.timeout = opts.upstream_first_byte_timeout;
    up.idle_timeout = opts.upstream_idle_timeout;
    up.cancel = cancel;
    up.body = asked_usage ? *asked_usage : req.body;
    // Only what Ollama needs: never the customer's Authorization.
    if (auto ct = req.header("content-type"); !ct.empty()) up.headers["Content-Type"] = ct;

    bool buffered = false, started = false, client_gone = false;
    int status = 0;
    std::string content_type = "application/json";
    std::string body;
    net::HttpClient client;
    auto on_head = [&](const net::HttpResponse& head) {
      status = head.status;
      served++;
      if (auto it = head.headers.find("content-type"); it != head.headers.end())
        content_type = it->second;
      auto cl = head.headers.find("content-length");
      if (cl != head.headers.end()) {
        char* end = nullptr;
        unsigned long long n = std::strtoull(cl->second.c_str(), &end, 10);
        buffered = end != cl->second.c_str() && *end == '\0' && n <= kBufferedLimit;
      }
      if (!buffered) {
        if (asked_usage && content_type.find("text/event-stream") != std::string::npos)
          filter.emplace();
        x.start_stream(status, content_type);
        started = true;
      }
      return !x.gone();
    };
    auto on_data = [&](std::string_view chunk) {
      if (x.gone()) {
        client_gone = true;
        return false;
      }
      if (status == 200) scanner.feed(chunk);
      if (buffered) {
        body.append(chunk);
        return true;
      }
      std::string out = filter ? filter->pass(chunk) : std::string(chunk);
      if (out.empty()) return true;
      // False: the client left, or is a full stream queue behind: either
      // way nobody reads what Ollama would go on generating.
      if (!x.write(std::move(out))) {
        client_gone = true;
        return false;
      }
      return true;
    };
    auto r = client.stream(up, on_data, on_head);
    if (cancel->cancelled()) client_gone = true;

    if (!r && !client_gone) {
      upstream_errors++;
      spdlog::warn("endpoint: {} {}: upstream: {}", req.method, target, r.error().message);
      if (started) {
        x.end_with(stream_error_chunk(content_type, "the model server cut the answer short"));
      } else if (status == 0 && r.error().code == Errc::timeout) {
        x.respond(error_response(504, "server_error", "upstream_timeout",
                                 "the model server did not begin its answer within " +
                                     duration_text(opts.upstream_first_byte_timeout) +
                                     "; retry, or stream the answer"));
      } else {
        x.respond(error_response(502, "server_error", "upstream_unavailable",
                                 "the model server did not answer: " + r.error().message));
      }
    } else if (!r) {
      // The client left: nobody to answer, and Ollama is no longer read.
    } else if (started) {
      if (filter)
        if (auto rest = filter->finish(); !rest.empty()) (void)x.write(std::move(rest));
      x.end();
    } else if (!client_gone) {
      net::HttpResponseOut out;
      out.status = status;
      out.content_type = content_type;
      out.body = std::move(body);
      x.respond(std::move(out));
    }
    // The key's count: an error when Ollama failed or answered 4xx/5xx; the
    // tokens Ollama counted when it answered 200 (a client that left
    // mid-answer has the tokens of the count it got, usually none).
    std::optional<TokenCounts> tokens;
    if (status == 200) {
      scanner.finish();
      tokens = scanner.counts();
    }
    const bool failed = (!r && !client_gone) || status >= 400 || (status == 0 && !client_gone);
    usage.request(key, failed, tokens);
    if (tokens) limits.add_tokens(key, tokens->prompt + tokens->completion);
    spdlog::debug("endpoint: {} {} -> {}{}", req.method, target, status,
                  client_gone ? " (client gone)" : "");
  }

  Status save(const Credentials& c) {
    if (auto st = ensure_dir(opts.state_dir, 0700); !st) return st;
    // The key first, the hash last: a crash in between leaves a set that
    // load_saved finds not whole (and the coordinator sends it again), never
    // a certificate served with the wrong key.
    if (auto st = write_file_atomic(opts.state_dir / kKeyFile, c.private_key_pem, 0600); !st)
      return st;
    if (auto st = write_file_atomic(opts.state_dir / kCertFile, c.certificate_pem, 0600); !st)
      return st;
    return write_file_atomic(opts.state_dir / kHashFile, c.key_sha256 + "\n", 0600);
  }

  net::TlsServerOptions tls_of(const Credentials& c) const {
    net::TlsServerOptions t;
    t.cert_chain_pem = c.certificate_pem;
    t.key_pem = c.private_key_pem;
    return t;
  }

  // With life_mu held.
  Status start_locked() {
    net::ServerOptions so;
    so.listen = opts.listen;
    so.tls = tls_of(creds);
    so.name = "endpoint";
    so.max_request_body = opts.max_request_body;
    so.max_connections = opts.max_connections;
    so.max_connections_per_address = opts.max_connections_per_address;
    auto pool = std::make_unique<net::IoPool>(1);
    auto srv = std::make_unique<net::Server>(*pool, so);
    srv->on_head(
        [this](const net::HttpRequestIn& head, const net::PeerInfo&) { return check_head(head); });
    srv->on_http([this](std::shared_ptr<net::HttpExchange> x) { handle(x); });
    if (auto st = srv->start(); !st)
      return st.error().with_context("endpoint: listen " + opts.listen);
    // One thread per request admitted (handle() admits at most
    // max_concurrent), so an admitted request never waits in a queue. No
    // handler runs before the io thread below starts.
    workers = std::make_unique<WorkerPool>(opts.max_concurrent);
    io = std::move(pool);
    server = std::move(srv);
    port = server->port();
    io_thread = std::thread([p = io.get()] { p->run(); });
    serving = true;
    spdlog::info("endpoint: serving on port {} (upstream {})", port.load(), opts.upstream);
    return ok_status();
  }

  // With life_mu held: validated credentials in force, serving.
  Status use_locked(const Credentials& c, std::int64_t cert_not_after) {
    if (serving) {
      if (auto st = server->update_tls(tls_of(c)); !st)
        return st.error().with_context("endpoint: new certificate");
    }
    keys.set_default(c.key_sha256);
    creds = c;
    have_creds = true;
    not_after = cert_not_after;
    if (!serving) return start_locked();
    return ok_status();
  }

  void stop_locked() {
    if (!serving && !server) return;
    // Connections first, so a stream's next write fails and its worker
    // stops reading Ollama; then the workers; the io thread last, since an
    // exchange that ends posts to it.
    server->stop();
    workers->stop();
    io->stop();
    if (io_thread.joinable()) io_thread.join();
    server.reset();
    workers.reset();
    io.reset();
    serving = false;
    port = 0;
  }
};

Proxy::Proxy(ProxyOptions opts) : impl_(std::make_unique<Impl>(std::move(opts))) {}

Proxy::~Proxy() {
  stop();
}

Result<bool> Proxy::load_saved() {
  std::lock_guard lk(impl_->life_mu);
  const auto& dir = impl_->opts.state_dir;
  Credentials c;
  std::string* into[] = {&c.certificate_pem, &c.private_key_pem, &c.key_sha256};
  const char* names[] = {kCertFile, kKeyFile, kHashFile};
  for (int i = 0; i < 3; i++) {
    auto r = read_file(dir / names[i]);
    if (!r) {
      if (r.error().code == Errc::not_found) return false;
      return r.error().with_context("endpoint");
    }
    *into[i] = std::move(*r);
  }
  c.key_sha256 = trim(c.key_sha256);
  auto v = validate(c);
  if (!v) {
    // Not whole (a crash between two writes, a hand edit): the coordinator
    // sends them again; nothing here serves a half.
    spdlog::warn("endpoint: the saved credentials in {} are not usable: {}", dir.string(),
                 v.error().message);
    return false;
  }
  if (auto st = impl_->use_locked(c, *v); !st) return st.error();
  return true;
}

Status Proxy::apply(const Credentials& creds) {
  std::lock_guard lk(impl_->life_mu);
  auto v = validate(creds);
  if (!v) return v.error().with_context("endpoint credentials");
  // The TLS stack's own opinion before anything is written.
  if (auto ctx = net::make_server_context(impl_->tls_of(creds)); !ctx)
    return ctx.error().with_context("endpoint credentials");
  if (auto st = impl_->save(creds); !st) {
    // Put the old set back, so what is on disk is what serves.
    if (impl_->have_creds) (void)impl_->save(impl_->creds);
    return st.error().with_context("endpoint: save credentials");
  }
  return impl_->use_locked(creds, *v);
}

bool Proxy::serving() const {
  return impl_->serving.load();
}

int Proxy::port() const {
  return impl_->port.load();
}

void Proxy::set_named_keys(std::vector<NamedKey> keys) {
  impl_->keys.set_named(std::move(keys));
  impl_->limits.forget_except([this](const std::string& name) { return impl_->keys.knows(name); });
}

void Proxy::link_lost() {
  impl_->keys.link_lost();
}

std::map<std::string, KeyUsage> Proxy::take_usage() {
  return impl_->usage.take();
}

ProxyStats Proxy::stats() const {
  ProxyStats s;
  s.requests = impl_->requests;
  s.served = impl_->served;
  s.unauthorized = impl_->unauthorized;
  s.refused_paths = impl_->refused_paths;
  s.busy = impl_->busy;
  s.upstream_errors = impl_->upstream_errors;
  s.rate_limited = impl_->rate_limited;
  s.in_flight = impl_->in_flight;
  return s;
}

std::optional<Credentials> Proxy::saved() const {
  std::lock_guard lk(impl_->life_mu);
  if (!impl_->have_creds) return std::nullopt;
  return impl_->creds;
}

std::int64_t Proxy::certificate_not_after() const {
  return impl_->not_after.load();
}

void Proxy::stop() {
  std::lock_guard lk(impl_->life_mu);
  impl_->stop_locked();
}

Result<KeyAndCsr> make_key_and_csr(const std::string& tenant) {
  auto key = pki::generate_private_key();
  if (!key) return key.error().with_context("endpoint key");
  auto csr = pki::make_csr(*key, tenant);
  if (!csr) return csr.error().with_context("endpoint CSR");
  return KeyAndCsr{std::move(*key), std::move(*csr)};
}

ProbeResult probe(const std::string& upstream, const std::string& model, const std::string& prompt,
                  std::chrono::milliseconds timeout) {
  using SteadyClock = std::chrono::steady_clock;
  ProbeResult out;
  std::string base = upstream;
  while (!base.empty() && base.back() == '/') base.pop_back();
  net::HttpRequest req;
  req.method = "POST";
  req.url = base + "/api/generate";
  req.headers["Content-Type"] = "application/json";
  req.body =
      Json{
          {"model", model}, {"prompt", prompt}, {"stream", true}, {"options", {{"num_predict", 8}}}}
          .dump();
  req.timeout = timeout;

  const auto t0 = SteadyClock::now();
  const auto deadline = t0 + timeout;
  auto ms_since = [&] {
    return std::chrono::duration<double, std::milli>(SteadyClock::now() - t0).count();
  };
  int status = 0;
  std::string pending, error_body_text;
  bool done = false, timed_out = false, have_first = false;
  auto line = [&](std::string_view l) {
    auto j = Json::parse(l, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return;
    if (j.contains("error")) {
      out.error = "model server: " +
                  (j["error"].is_string() ? j["error"].get<std::string>() : j["error"].dump());
      return;
    }
    if (!have_first && j.value("response", std::string()).size() > 0) {
      have_first = true;
      out.ttft_ms = ms_since();
    }
    if (j.value("done", false)) {
      done = true;
      out.total_ms = ms_since();
    }
  };
  auto r = net::HttpClient().stream(
      req,
      [&](std::string_view chunk) {
        if (status != 200) {
          if (error_body_text.size() < 4096) error_body_text.append(chunk);
        } else {
          pending.append(chunk);
          std::size_t nl;
          while ((nl = pending.find('\n')) != std::string::npos && !done && out.error.empty()) {
            line(std::string_view(pending).substr(0, nl));
            pending.erase(0, nl + 1);
          }
        }
        if (done || !out.error.empty()) return false;
        if (SteadyClock::now() > deadline) {
          timed_out = true;
          return false;
        }
        return true;
      },
      [&](const net::HttpResponse& head) {
        status = head.status;
        return true;
      });
  if (!r) {
    out.error = r.error().message;
    return out;
  }
  if (status == 200 && !done && out.error.empty() && !pending.empty()) line(pending);
  if (status != 200) {
    std::string msg = trim(error_body_text);
    auto j = Json::parse(msg, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_string())
      msg = j["error"].get<std::string>();
    out.error = "model server answered HTTP " + std::to_string(status) + (msg.empty() ? "" : ": ") +
                msg.substr(0, 200);
    return out;
  }
  if (timed_out) {
    out.error = "no answer within " + std::to_string(timeout.count()) + " ms";
    return out;
  }
  if (!out.error.empty()) return out;
  if (!done) {
    out.error = "the model server's stream ended before done";
    return out;
  }
  if (!have_first) out.ttft_ms = out.total_ms;  // an empty answer: first token is the end
  out.ok = true;
  return out;
}

}  // namespace factory::agent::endpoint
