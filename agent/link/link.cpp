#include "agent/link/link.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "agent/link/identity.hpp"
#include "agent/link/version.hpp"
#include "common/atomic_file.hpp"
#include "common/backoff.hpp"
#include "common/net/ws_client.hpp"
#include "common/pki.hpp"
#include "contract/protocol.hpp"

namespace factory::agent {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using asio::awaitable;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

namespace {

std::string hostname() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

// The coordinator refused this agent's identity (its certificate revoked,
// its tenant deleted, or expired past the renewal grace): only a new token
// brings it back.
struct IdentityRefused {
  std::string message;
};

bool refuses_identity(const std::string& code) {
  return code == "unauthenticated" || code == "permission_denied";
}

// Whether a session that got as far as the coordinator's welcome starts the
// reconnect backoff over: only when the coordinator sent no error in it. One
// that did (store_failed: its disk is full; over_quota) was refused as much
// as a hello turned away, and the next attempt waits longer, not the base
// delay: reset at every welcome, the agent came back several times a second
// for as long as the disk stayed full.
bool session_resets_backoff(const std::string& coordinator_error_code) {
  return coordinator_error_code.empty();
}

}  // namespace

int startup_exit_status(const Error& e) {
  switch (e.code) {
    case Errc::not_found:            // no bootstrap token: an admin writes one
    case Errc::failed_precondition:  // an identity file that is not one
    case Errc::invalid_argument:     // ... or holds no usable certificate
      return kExitNeedsAdmin;
    default:
      // A read that failed (EMFILE, EIO): not a refusal, and the next start
      // may well succeed.
      return 1;
  }
}

struct AgentLink::Impl : std::enable_shared_from_this<Impl> {
  LinkOptions cfg;
  EventSpool& spool;
  LinkCallbacks cb;
  asio::io_context ioc{1};
  asio::steady_timer wake_timer{ioc};
  asio::steady_timer sleep_timer{ioc};
  asio::steady_timer stop_deadline{ioc};
  std::atomic<bool> stopping{false};
  // What the close frame of a planned stop says: "stopping" or "rebooting".
  std::string stop_reason = "stopping";
  // The coordinator said this session's certificate has expired (the
  // agent's clock is behind): renew before the next session.
  bool renew_first = false;
  int exit_code = 0;
  std::optional<AgentIdentity> identity;
  // The coordinator's latest session ticket: a reconnect resumes instead of
  // a full handshake (common/net/tls_tickets.hpp). Keyed by the identity
  // shown, so a renewed certificate starts a new session.
  std::shared_ptr<net::TlsSessionCache> tls_sessions = std::make_shared<net::TlsSessionCache>();
  std::string pending_key;  // key of a renewal in flight
  std::mutex health_mu;
  std::optional<nlohmann::json> health_latest;  // guarded by health_mu
  bool health_unsent = false;                   // guarded by health_mu

  // The latest sample, if one is waiting to be sent (it stays the latest).
  std::optional<nlohmann::json> take_health() {
    std::lock_guard lk(health_mu);
    if (!health_unsent || !health_latest) return std::nullopt;
    health_unsent = false;
    return health_latest;
  }
  void resend_health() {
    std::lock_guard lk(health_mu);
    if (health_latest) health_unsent = true;
  }
  // offer_request's frames, by type; guarded by health_mu too.
  std::map<std::string, nlohmann::json> requests;
  std::set<std::string> requests_unsent;
  std::vector<std::pair<std::string, nlohmann::json>> take_requests() {
    std::lock_guard lk(health_mu);
    std::vector<std::pair<std::string, nlohmann::json>> out;
    for (const auto& t : requests_unsent)
      if (auto it = requests.find(t); it != requests.end()) out.emplace_back(t, it->second);
    requests_unsent.clear();
    return out;
  }
  void resend_requests() {
    std::lock_guard lk(health_mu);
    for (const auto& [t, b] : requests) requests_unsent.insert(t);
  }

  Impl(LinkOptions c, EventSpool& s, LinkCallbacks callbacks)
      : cfg(std::move(c)), spool(s), cb(std::move(callbacks)) {}

  std::string agent_url() const {
    std::string u = cfg.coordinator_url;
    while (!u.empty() && u.back() == '/') u.pop_back();
    return u + std::string(proto::kAgentPath);
  }

  awaitable<void> sleep_for(std::chrono::milliseconds d) {
    if (stopping) co_return;  // stop() cancels only a sleep already begun
    sleep_timer.expires_after(d);
    co_await sleep_timer.async_wait(use_tuple);
  }

  void wake() { wake_timer.cancel(); }

  net::TlsClientIdentity bootstrap_trust() const {
    net::TlsClientIdentity t;
    if (!cfg.ca_file.empty()) {
      auto ca = read_file(cfg.ca_file);
      if (ca) t.ca_pem = *ca;
    }
    if (t.ca_pem.empty()) t.pinned_ca_sha256 = cfg.ca_sha256;
    return t;
  }

  // Enrollment: a fresh key made here, a CSR, the one-time token; the answer
  // is a client certificate for the tenant the token was bound to.
  awaitable<Result<AgentIdentity>> enroll(const std::string& token) {
    auto key = pki::generate_private_key();
    if (!key) co_return key.error();
    auto csr = pki::make_csr(*key, hostname());
    if (!csr) co_return csr.error();
    net::WsClientOptions o;
    o.url = agent_url();
    o.tls = bootstrap_trust();
    if (o.tls.ca_pem.empty() && o.tls.pinned_ca_sha256.empty())
      co_return Error(Errc::invalid_argument, "no CA pin (--ca-sha256 or --ca-file)");
    o.max_frame = proto::kMaxPlanFrameBytes;
    o.user_agent = "factory-agent/" + std::string(agent_version());
    // The token is sent only after the TLS handshake proved the server holds
    // a certificate from the pinned CA (connect fails otherwise).
    auto ws = co_await net::WsClient::connect(o);
    if (!ws) co_return ws.error();
    proto::Envelope e;
    e.type = std::string(proto::type::kEnroll);
    e.seq = 1;
    e.body = {{"token", token},
              {"csr", *csr},
              {"agent_version", std::string(agent_version())},
              {"hostname", hostname()}};
    if (auto st = co_await (*ws)->write(proto::serialize(e)); !st.ok()) co_return st.error();
    for (;;) {
      auto msg = co_await (*ws)->read();
      if (!msg) co_return msg.error();
      auto env = proto::parse(*msg);
      if (!env) continue;
      if (env->type == proto::type::kError) {
        co_await (*ws)->close();
        co_return Error(Errc::permission_denied, "the coordinator refused enrollment: " +
                                                     env->body.value("message", "no reason given"));
      }
      if (env->type != proto::type::kEnrolled) continue;
      AgentIdentity id;
      id.tenant = env->body.value("tenant", "");
      id.agent_id = env->body.value("agent_id", "");
      id.cert_pem = env->body.value("certificate", "");
      id.ca_pem = env->body.value("ca", "");
      id.key_pem = *key;
      co_await (*ws)->close();
      // The CA we are told to trust from now on must be the one we pinned.
      if (!cfg.ca_sha256.empty()) {
        auto sha = pki::certificate_sha256(id.ca_pem);
        if (!sha || *sha != cfg.ca_sha256)
          co_return Error(Errc::unauthenticated,
                          "the CA in the enrollment answer does not match the pin");
      }
      if (!pki::key_matches_certificate(id.key_pem, id.cert_pem))
        co_return Error(Errc::protocol, "the issued certificate is not for this agent's key");
      if (auto st = refresh_validity(id); !st.ok()) co_return st.error();
      co_return id;
    }
  }

  awaitable<Status> send_frame(net::WsClient& ws, uint64_t& seq, std::string_view type,
                               nlohmann::json body) {
    proto::Envelope e;
    e.type = std::string(type);
    e.seq = ++seq;
    e.body = std::move(body);
    co_return co_await ws.write(proto::serialize(e));
  }

  net::WsClientOptions session_options() const {
    net::WsClientOptions o;
    o.url = agent_url();
    o.tls.ca_pem = identity->ca_pem;
    // The leaf alone: the coordinator trusts its own CA already, and every
    // certificate presented is held parsed on its side for the connection's
    // life (docs/scale.md, memory per idle agent).
    auto chain = pki::split_pem_certificates(identity->cert_pem);
    o.tls.client_cert_pem = chain.empty() ? identity->cert_pem : chain.front();
    o.tls.client_key_pem = identity->key_pem;
    o.tls.sessions = tls_sessions;
    o.idle_timeout = std::chrono::duration_cast<std::chrono::seconds>(cfg.heartbeat * 4);
    if (o.idle_timeout < std::chrono::seconds(4)) o.idle_timeout = std::chrono::seconds(4);
    o.max_frame = proto::kMaxPlanFrameBytes;
    o.user_agent = "factory-agent/" + std::string(agent_version());
    return o;
  }

  // The certificate a renewal answer carries, with the key made for it:
  // checked, saved (atomically, 0600), then used.
  Status adopt_renewed(const std::string& cert_pem, const std::string& key_pem) {
    AgentIdentity next = *identity;
    next.cert_pem = cert_pem;
    next.key_pem = key_pem;
    if (!pki::key_matches_certificate(next.key_pem, next.cert_pem) || !refresh_validity(next).ok())
      return Error(Errc::protocol, "the renewed certificate does not match the renewal key");
    if (auto st = save_identity(cfg.state_dir, next); !st.ok())
      return st.error().with_context("could not save the renewed certificate");
    identity = next;
    return {};
  }

  // The agent was off (or cut off) longer than its certificate's life: a
  // connection with the expired certificate that renews it and does nothing
  // else, which the coordinator allows within agents.renewal_grace while the
  // certificate's serial is still on its tenant's record.
  awaitable<Status> renew_expired() {
    spdlog::info("link: the certificate expired at {}; renewing it before anything else",
                 format_rfc3339(identity->not_after));
    auto key = pki::generate_private_key();
    if (!key) co_return key.error();
    auto csr = pki::make_csr(*key, hostname());
    if (!csr) co_return csr.error();
    auto o = session_options();  // named: GCC 12 mishandles temporaries in co_await
    auto conn = co_await net::WsClient::connect(o);
    if (!conn) co_return conn.error();
    std::shared_ptr<net::WsClient> ws = std::move(*conn);
    uint64_t seq = 0;
    nlohmann::json renew = {{"csr", *csr}};
    if (auto st = co_await send_frame(*ws, seq, proto::type::kRenew, std::move(renew)); !st.ok())
      co_return st;
    for (;;) {
      auto msg = co_await ws->read();
      if (!msg) co_return msg.error();
      auto env = proto::parse(*msg);
      if (!env) continue;
      if (env->type == proto::type::kError) {
        std::string code = env->body.value("code", "");
        std::string m = env->body.value("message", "");
        co_await ws->close();
        if (refuses_identity(code)) throw IdentityRefused{m};
        co_return Error(Errc::unavailable, "renewal: coordinator error: " + m);
      }
      if (env->type != proto::type::kCertificate) continue;
      auto st = adopt_renewed(env->body.value("certificate", ""), *key);
      co_await ws->close();
      if (!st.ok()) co_return st;
      renew_first = false;
      spdlog::info("link: certificate renewed, valid until {}",
                   format_rfc3339(identity->not_after));
      co_return Status{};
    }
  }

  // One mTLS session: hello, welcome, then replay + live events, heartbeats
  // and renewal until the connection drops. The backoff starts over once it
  // has ended well (session_resets_backoff).
  awaitable<Status> session(Backoff& backoff) {
    auto o = session_options();  // named: GCC 12 mishandles temporaries in co_await
    auto conn = co_await net::WsClient::connect(o);
    if (!conn) co_return conn.error();
    std::shared_ptr<net::WsClient> ws = std::move(*conn);
    uint64_t seq = 0;
    // (Braced JSON is built outside co_await: GCC 12 miscompiles
    // initializer lists inside co_await expressions.)
    nlohmann::json hello = {{"agent_id", identity->agent_id},
                            {"agent_version", std::string(agent_version())},
                            {"hostname", hostname()}};
    // What this build understands beyond the first protocol (a tier
    // upgrade's order): the coordinator sends no such order to an agent
    // that does not say so.
    nlohmann::json features = nlohmann::json::array();
    for (auto f : proto::kAgentFeatures) features.push_back(std::string(f));
    hello["features"] = std::move(features);
    if (auto st = co_await send_frame(*ws, seq, proto::type::kHello, std::move(hello)); !st.ok())
      co_return st;
    // Until welcome arrives nothing else is sent.
    uint64_t server_has = 0;
    for (;;) {
      auto msg = co_await ws->read();
      if (!msg) co_return msg.error();
      auto env = proto::parse(*msg);
      if (!env) continue;
      if (env->type == proto::type::kError) {
        std::string code = env->body.value("code", "");
        std::string m = env->body.value("message", "");
        if (refuses_identity(code)) throw IdentityRefused{m};
        if (code == "certificate_expired") renew_first = true;
        co_return Error(Errc::unavailable, "coordinator error: " + m);
      }
      if (env->type == proto::type::kWelcome) {
        server_has = env->body.value("last_event_id", uint64_t{0});
        break;
      }
    }
    spdlog::info("link: connected to {} as tenant {}", ws->remote(), identity->tenant);
    // The coordinator stored everything up to server_has: those are delivered.
    if (auto st = spool.ack_through(server_has); !st.ok())
      spdlog::warn("link: spool: {}", st.error().message);
    uint64_t last_sent = spool.acked();
    // What the coordinator knew of this guest's health went with the last
    // session: it hears the latest at once.
    resend_health();
    resend_requests();

    auto rs = std::make_shared<ReaderState>(ioc);
    asio::co_spawn(ioc, reader_loop(ws, rs), asio::detached);

    auto next_heartbeat = std::chrono::steady_clock::now();
    double tokens = static_cast<double>(cfg.replay_rate_per_second);
    auto last_refill = std::chrono::steady_clock::now();
    const size_t window = 64;
    bool renew_sent = false;
    Status result;
    while (rs->open && !stopping) {
      auto now = std::chrono::steady_clock::now();
      if (spool.acked() > last_sent) last_sent = spool.acked();
      if (now >= next_heartbeat) {
        nlohmann::json hb = {{"pending_events", spool.pending()},
                             {"dropped_events", spool.dropped()}};
        if (cb.heartbeat_fields) {
          // Named, not iterated as a temporary: items() only refers to it.
          nlohmann::json extra = cb.heartbeat_fields();
          for (auto& [k, v] : extra.items()) hb[k] = v;
        }
        if (auto st = co_await send_frame(*ws, seq, proto::type::kHeartbeat, hb); !st.ok()) {
          result = st;
          break;
        }
        next_heartbeat = now + cfg.heartbeat;
      }
      if (auto h = take_health()) {
        if (auto st = co_await send_frame(*ws, seq, proto::type::kHealth, std::move(*h));
            !st.ok()) {
          result = st;
          break;
        }
        if (cb.on_health_sent) cb.on_health_sent();
      }
      bool request_failed = false;
      // Named, not a temporary, across the co_await (GCC 12's coroutines).
      std::vector<std::pair<std::string, nlohmann::json>> requests_now = take_requests();
      for (auto& request : requests_now) {
        if (auto st = co_await send_frame(*ws, seq, request.first, std::move(request.second));
            !st.ok()) {
          result = st;
          request_failed = true;
          break;
        }
      }
      if (request_failed) break;
      if (!renew_sent && identity->renewal_due()) {
        auto key = pki::generate_private_key();
        auto csr = key ? pki::make_csr(*key, hostname()) : Result<std::string>(key.error());
        if (csr) {
          pending_key = *key;
          nlohmann::json renew = {{"csr", *csr}};
          if (auto st = co_await send_frame(*ws, seq, proto::type::kRenew, std::move(renew));
              !st.ok()) {
            result = st;
            break;
          }
          renew_sent = true;
          spdlog::info("link: certificate expires {}; renewing",
                       format_rfc3339(identity->not_after));
        }
      }
      // Replay and live events: a bounded window in flight, at a bounded rate
      // so a long outage's backlog does not flood the coordinator on return.
      double elapsed = std::chrono::duration<double>(now - last_refill).count();
      last_refill = now;
      tokens = std::min<double>(tokens + elapsed * cfg.replay_rate_per_second,
                                std::max<double>(cfg.replay_rate_per_second, 1));
      size_t in_flight = last_sent - std::min(last_sent, spool.acked());
      size_t can =
          std::min<size_t>(window - std::min(window, in_flight), static_cast<size_t>(tokens));
      bool sent_any = false;
      if (can > 0) {
        for (auto& ev : spool.pending_after(last_sent, can)) {
          if (auto st = co_await send_frame(*ws, seq, proto::type::kEvent, ev.body); !st.ok()) {
            result = st;
            rs->open = false;
            break;
          }
          last_sent = ev.id;
          tokens -= 1;
          sent_any = true;
        }
      }
      if (!rs->open) break;
      if (sent_any) continue;
      // stop() cancels only a wait under way; one about to begin sees the flag.
      if (stopping) break;
      auto wait_until = next_heartbeat;
      if (spool.pending_after(last_sent, 1).size() > 0 && tokens < 1)
        wait_until = std::min(wait_until, now + std::chrono::milliseconds(20));
      wake_timer.expires_at(wait_until);
      co_await wake_timer.async_wait(use_tuple);
    }
    // A planned stop says so, so the coordinator shows "stopped" or
    // "rebooting" rather than a lost connection.
    const std::string why = stopping ? stop_reason : std::string();
    co_await ws->close(why);
    if (!rs->finished) co_await rs->done.async_wait(use_tuple);
    if (!rs->fatal.empty()) throw IdentityRefused{rs->fatal};
    if (session_resets_backoff(rs->coordinator_error)) backoff.reset();
    if (!result.ok()) co_return result;
    if (stopping) co_return Status{};
    co_return rs->error;
  }

  // What the reader coroutine tells the session's writer loop.
  struct ReaderState {
    explicit ReaderState(asio::io_context& io) : done(io) {
      done.expires_at(asio::steady_timer::time_point::max());
    }
    bool open = true;
    bool finished = false;
    std::string fatal;
    std::string coordinator_error;  // the code of the latest error frame
    Error error{Errc::unavailable, "connection closed"};
    asio::steady_timer done;
  };

  awaitable<void> reader_loop(std::shared_ptr<net::WsClient> ws, std::shared_ptr<ReaderState> rs) {
    auto self = shared_from_this();
    for (;;) {
      auto msg = co_await ws->read();
      if (!msg) {
        rs->error = msg.error();
        break;
      }
      auto env = proto::parse(*msg);
      if (!env) {
        spdlog::warn("link: ignoring a bad frame: {}", env.error().message);
        continue;
      }
      handle(*env, *rs);
      if (!rs->fatal.empty()) break;
    }
    rs->open = false;
    rs->finished = true;
    rs->done.cancel();
    wake();
  }

  void handle(const proto::Envelope& env, ReaderState& rs) {
    const auto& t = env.type;
    if (t == proto::type::kAck) {
      if (env.body.contains("event_id")) {
        if (auto st = spool.ack_through(env.body["event_id"].get<uint64_t>()); !st.ok())
          spdlog::warn("link: spool: {}", st.error().message);
        wake();
      }
    } else if (t == proto::type::kPlan) {
      if (cb.on_plan) cb.on_plan(env.body);
    } else if (t == proto::type::kCommand) {
      if (cb.on_command) cb.on_command(env.body);
    } else if (t == proto::type::kEndpoint) {
      if (cb.on_endpoint) cb.on_endpoint(env.body);
    } else if (t == proto::type::kCertificate) {
      if (auto st = adopt_renewed(env.body.value("certificate", ""), pending_key); !st.ok()) {
        spdlog::warn("link: {}; keeping the old certificate", st.error().message);
        return;
      }
      pending_key.clear();
      spdlog::info("link: certificate renewed, valid until {}",
                   format_rfc3339(identity->not_after));
    } else if (t == proto::type::kError) {
      std::string code = env.body.value("code", "");
      std::string msg = env.body.value("message", "");
      spdlog::warn("link: coordinator says {}: {}", code, msg);
      rs.coordinator_error = code.empty() ? "error" : code;
      if (refuses_identity(code)) rs.fatal = msg;
    } else if (t == proto::type::kWelcome) {
    } else {
      spdlog::warn("link: ignoring frame of unknown type '{}'", t);
    }
  }

  // The identity was refused for good. With a bootstrap token at token_file
  // (the admin put a new one there) the agent sets the identity aside and
  // enrolls afresh; without one it stops, saying what brings it back.
  bool drop_refused_identity(const std::string& why) {
    std::error_code ec;
    if (!fs::exists(cfg.token_file, ec)) {
      spdlog::error(
          "link: the coordinator refused this agent: {}. To bring it back, write a new "
          "bootstrap token (`factory token create --tenant {}` on the coordinator) to {} "
          "and restart factory-agent: it then enrolls afresh",
          why, identity ? identity->tenant : std::string("NAME"), cfg.token_file);
      exit_code = kExitNeedsAdmin;
      return false;
    }
    fs::path id_file = fs::path(cfg.state_dir) / kIdentityFile;
    fs::path kept = fs::path(cfg.state_dir) / "identity.refused.json";
    fs::rename(id_file, kept, ec);
    if (ec) {
      spdlog::error("link: cannot set the refused identity aside ({}): {}", id_file.string(),
                    ec.message());
      exit_code = 1;
      return false;
    }
    spdlog::warn(
        "link: the coordinator refused this agent ({}); a bootstrap token is at {}: "
        "enrolling afresh (the old identity is kept as {})",
        why, cfg.token_file, kept.string());
    identity.reset();
    return true;
  }

  awaitable<void> main_loop() {
    auto self = shared_from_this();
    Backoff backoff(cfg.backoff_base, cfg.backoff_cap);
    auto id = load_identity(cfg.state_dir);
    if (!id) {
      spdlog::error("link: {}", id.error().message);
      exit_code = startup_exit_status(id.error());
      co_return;
    }
    identity = *id;
    // A fleet that boots at once should not phone home at once.
    if (!identity) co_await sleep_for(initial_jitter(cfg.first_connect_jitter));
    while (!stopping) {
      try {
        if (!identity) {
          auto token = read_file(cfg.token_file);
          if (!token) {
            // read_file's message names the file: said once.
            exit_code = startup_exit_status(token.error());
            if (exit_code == kExitNeedsAdmin)
              spdlog::error(
                  "link: not enrolled, and no bootstrap token: {}; create one with "
                  "`factory token create --tenant NAME` and write it there",
                  token.error().message);
            else
              spdlog::error("link: not enrolled, and the bootstrap token could not be read: {}",
                            token.error().message);
            co_return;
          }
          std::string tok = *token;
          while (!tok.empty() && (tok.back() == '\n' || tok.back() == '\r' || tok.back() == ' '))
            tok.pop_back();
          auto enrolled = co_await enroll(tok);
          if (!enrolled) {
            // Exit 3 only where waiting cannot help: the token refused, no
            // pin, or a server that is not the pinned coordinator. An
            // expired coordinator certificate (Errc::unavailable) is
            // retried: the coordinator renews it while it runs.
            auto code = enrolled.error().code;
            if (code == Errc::permission_denied || code == Errc::unauthenticated ||
                code == Errc::invalid_argument) {
              spdlog::error("link: {}", enrolled.error().message);
              exit_code = kExitNeedsAdmin;
              co_return;
            }
            auto d = backoff.next();
            spdlog::warn("link: enrollment: {}; retrying in {} ms", enrolled.error().message,
                         d.count());
            co_await sleep_for(d);
            continue;
          }
          if (auto st = save_identity(cfg.state_dir, *enrolled); !st.ok()) {
            spdlog::error("link: cannot save the identity: {}", st.error().message);
            exit_code = 1;
            co_return;
          }
          identity = *enrolled;
          std::error_code ec;
          fs::remove(cfg.token_file, ec);  // one-time: it has done its job
          spdlog::info("link: enrolled as tenant {} (agent {}); certificate valid until {}",
                       identity->tenant, identity->agent_id, format_rfc3339(identity->not_after));
          backoff.reset();
          continue;
        }
        // Enrolled: everything that fails from here on (the coordinator
        // down, its certificate expired or replaced) is retried with
        // backoff; only a refusal of this agent's identity ends the link.
        Status st;
        if (renew_first || Clock::now() >= identity->not_after) {
          st = co_await renew_expired();
          if (st.ok()) {
            backoff.reset();
            continue;
          }
        } else {
          st = co_await session(backoff);
          if (cb.on_session_end) cb.on_session_end();
        }
        if (stopping) break;
        auto d = backoff.next();
        spdlog::warn("link: {}; reconnecting in {} ms",
                     st.ok() ? "disconnected" : st.error().message, d.count());
        co_await sleep_for(d);
      } catch (const IdentityRefused& r) {
        if (!drop_refused_identity(r.message)) co_return;
        backoff.reset();
      }
    }
  }
};

AgentLink::AgentLink(LinkOptions options, EventSpool& spool, LinkCallbacks cb)
    : impl_(std::make_shared<Impl>(std::move(options), spool, std::move(cb))) {}

AgentLink::~AgentLink() = default;

int AgentLink::run() {
  auto impl = impl_;
  impl->spool.set_listener([impl] { asio::post(impl->ioc, [impl] { impl->wake(); }); });
  asio::co_spawn(impl->ioc, impl->main_loop(), [impl](std::exception_ptr e) {
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        spdlog::critical("link: stopped by an unexpected error: {}", x.what());
        impl->exit_code = 1;
      }
    }
    impl->ioc.stop();
  });
  impl->ioc.run();
  impl->spool.set_listener(nullptr);
  return impl->exit_code;
}

void AgentLink::stop(std::string reason) {
  auto impl = impl_;
  asio::post(impl->ioc, [impl, reason = std::move(reason)] {
    if (impl->stopping.exchange(true)) return;
    impl->stop_reason = reason;
    // The session ends its loop, sends the close frame and returns; the
    // main loop then ends and so does run(). Whatever is slower than that
    // (a connect or a close handshake that hangs) is cut off.
    impl->wake_timer.cancel();
    impl->sleep_timer.cancel();
    impl->stop_deadline.expires_after(kStopDeadline);
    impl->stop_deadline.async_wait([impl](const boost::system::error_code& ec) {
      if (!ec) impl->ioc.stop();
    });
  });
}

void AgentLink::wake() {
  auto impl = impl_;
  asio::post(impl->ioc, [impl] { impl->wake(); });
}

void AgentLink::offer_request(std::string type, nlohmann::json body) {
  {
    std::lock_guard lk(impl_->health_mu);
    impl_->requests_unsent.insert(type);
    impl_->requests[std::move(type)] = std::move(body);
  }
  wake();
}

void AgentLink::withdraw_request(const std::string& type) {
  std::lock_guard lk(impl_->health_mu);
  impl_->requests.erase(type);
  impl_->requests_unsent.erase(type);
}

void AgentLink::offer_health(nlohmann::json sample) {
  {
    std::lock_guard lk(impl_->health_mu);
    impl_->health_latest = std::move(sample);
    impl_->health_unsent = true;
  }
  wake();
}

}  // namespace factory::agent
