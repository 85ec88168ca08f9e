#include "common/net/tls.hpp"

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <boost/asio/ssl/context.hpp>
#include <cstring>
#include <ctime>

#include "common/net/tls_tickets.hpp"
#include "common/pki.hpp"

namespace factory::net {
namespace ssl = boost::asio::ssl;

namespace {

std::string openssl_error() {
  unsigned long e = ERR_get_error();
  if (!e) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return buf;
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;

X509Ptr parse_cert(const std::string& pem) {
  std::unique_ptr<BIO, BioDeleter> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return X509Ptr(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

std::string der_sha256(X509* cert) {
  unsigned char* der = nullptr;
  int len = i2d_X509(cert, &der);
  if (len <= 0) return "";
  std::string s = pki::sha256_hex(std::string_view(reinterpret_cast<char*>(der), len));
  OPENSSL_free(der);
  return s;
}

// Trust exactly the certificate, among those the server presents, whose
// SHA-256 equals the pin: the agent's bootstrap trust, as kubeadm's
// --discovery-token-ca-cert-hash. Chain and host name are still verified.
int verify_against_pin(X509_STORE_CTX* ctx, void* arg) {
  const auto* pin = static_cast<const std::string*>(arg);
  STACK_OF(X509)* presented = X509_STORE_CTX_get0_untrusted(ctx);
  X509* leaf = X509_STORE_CTX_get0_cert(ctx);
  X509* anchor = nullptr;
  if (leaf && der_sha256(leaf) == *pin) anchor = leaf;
  for (int i = 0; !anchor && presented && i < sk_X509_num(presented); ++i) {
    X509* c = sk_X509_value(presented, i);
    if (der_sha256(c) == *pin) anchor = c;
  }
  if (!anchor) {
    X509_STORE_CTX_set_error(ctx, X509_V_ERR_CERT_UNTRUSTED);
    return 0;
  }
  STACK_OF(X509)* trusted = sk_X509_new_null();
  X509_up_ref(anchor);
  sk_X509_push(trusted, anchor);
  X509_STORE_CTX_set0_trusted_stack(ctx, trusted);
  int ok = X509_verify_cert(ctx);
  // The context keeps a pointer to the stack only for this verification.
  X509_STORE_CTX_set0_trusted_stack(ctx, nullptr);
  sk_X509_pop_free(trusted, X509_free);
  return ok;
}

int pin_ex_index() {
  static const int idx = SSL_CTX_get_ex_new_index(
      0, nullptr, nullptr, nullptr, [](void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
        delete static_cast<std::string*>(ptr);
      });
  return idx;
}

// Lets a leaf certificate through that fails only for being expired; every
// other verification error (and an expired CA) still ends the handshake.
int verify_allowing_expired_leaf(int ok, X509_STORE_CTX* ctx) {
  if (ok) return 1;
  return X509_STORE_CTX_get_error(ctx) == X509_V_ERR_CERT_HAS_EXPIRED &&
                 X509_STORE_CTX_get_error_depth(ctx) == 0
             ? 1
             : 0;
}

Status add_ca(ssl::context& ctx, const std::string& ca_pem) {
  X509_STORE* store = SSL_CTX_get_cert_store(ctx.native_handle());
  auto certs = pki::split_pem_certificates(ca_pem);
  if (certs.empty()) return Error(Errc::invalid_argument, "no certificate in the CA PEM");
  for (auto& pem : certs) {
    auto c = parse_cert(pem);
    if (!c) return Error(Errc::invalid_argument, "unreadable CA certificate: " + openssl_error());
    if (X509_STORE_add_cert(store, c.get()) != 1)
      return Error(Errc::invalid_argument, "cannot trust CA: " + openssl_error());
  }
  return {};
}

Status use_cert_and_key(ssl::context& ctx, const std::string& chain, const std::string& key) {
  boost::system::error_code ec;
  ctx.use_certificate_chain(boost::asio::buffer(chain), ec);
  if (ec) return Error(Errc::invalid_argument, "certificate chain: " + ec.message());
  ctx.use_private_key(boost::asio::buffer(key), ssl::context::pem, ec);
  if (ec) return Error(Errc::invalid_argument, "private key: " + ec.message());
  if (SSL_CTX_check_private_key(ctx.native_handle()) != 1)
    return Error(Errc::invalid_argument, "private key does not match the certificate");
  return {};
}

// The server's ticket keys, held by its SSL_CTX (freed with it).
int ticket_keys_ex_index() {
  static const int idx = SSL_CTX_get_ex_new_index(
      0, nullptr, nullptr, nullptr, [](void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
        delete static_cast<std::shared_ptr<TicketKeys>*>(ptr);
      });
  return idx;
}

bool set_ticket_mac_key(EVP_MAC_CTX* hctx, const TicketKey& k) {
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_KEY,
                                        const_cast<unsigned char*>(k.hmac.data()), k.hmac.size()),
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_end()};
  return EVP_MAC_CTX_set_params(hctx, params) == 1;
}

// OpenSSL's ticket key callback: seal (enc 1) with the current key, open
// (enc 0) with the key the ticket names. 1: sealed; 2: opened, and a fresh
// ticket is to follow; 0: no key (sealing: an empty ticket; opening: a full
// handshake); -1: a failure, which ends the handshake.
// Memory only: it runs on an io thread.
int ticket_key_callback(SSL* ssl, unsigned char key_name[16], unsigned char iv[EVP_MAX_IV_LENGTH],
                        EVP_CIPHER_CTX* cctx, EVP_MAC_CTX* hctx, int enc) {
  auto* keys = static_cast<std::shared_ptr<TicketKeys>*>(
      SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), ticket_keys_ex_index()));
  if (!keys || !*keys) return enc ? -1 : 0;
  if (enc) {
    auto k = (*keys)->sealing_key();
    if (!k) return 0;  // an empty ticket this time, rather than one under a stale key
    std::memcpy(key_name, k->name.data(), k->name.size());
    if (RAND_bytes(iv, EVP_CIPHER_get_iv_length(EVP_aes_256_cbc())) != 1) return -1;
    if (EVP_EncryptInit_ex(cctx, EVP_aes_256_cbc(), nullptr, k->aes.data(), iv) != 1) return -1;
    return set_ticket_mac_key(hctx, *k) ? 1 : -1;
  }
  auto o = (*keys)->opening_key(key_name);
  if (!o) return 0;
  if (EVP_DecryptInit_ex(cctx, EVP_aes_256_cbc(), nullptr, o->key.aes.data(), iv) != 1) return -1;
  if (!set_ticket_mac_key(hctx, o->key)) return -1;
  // 2: always a fresh ticket for the next time. TLS 1.3 sends none after
  // a resumption otherwise, and OpenSSL's client does not offer a used one
  // again: each ticket is used once (RFC 8446 section 8.1 / C.4).
  return 2;
}

// A client context's resumption: where its sessions go and for whom.
struct ClientResumption {
  std::shared_ptr<TlsSessionCache> cache;
  std::string identity;
};

int resumption_ex_index() {
  static const int idx = SSL_CTX_get_ex_new_index(
      0, nullptr, nullptr, nullptr, [](void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
        delete static_cast<ClientResumption*>(ptr);
      });
  return idx;
}

// A ticket arrived (after the handshake, in TLS 1.3): keep it. 1: the
// cache owns the session now.
int keep_new_session(SSL* ssl, SSL_SESSION* session) {
  auto* r = static_cast<ClientResumption*>(
      SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), resumption_ex_index()));
  if (!r || !r->cache || SSL_SESSION_is_resumable(session) != 1) return 0;
  r->cache->put(r->identity, session);
  return 1;
}

void harden(ssl::context& ctx) {
  SSL_CTX_set_min_proto_version(ctx.native_handle(), TLS1_3_VERSION);
  // Idle connections give their 34 KiB of read/write buffers back.
  SSL_CTX_set_mode(ctx.native_handle(), SSL_MODE_RELEASE_BUFFERS);
  SSL_CTX_set_options(ctx.native_handle(), SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
  SSL_CTX_set_session_cache_mode(ctx.native_handle(), SSL_SESS_CACHE_OFF);
  SSL_CTX_set_num_tickets(ctx.native_handle(), 0);
}

}  // namespace

Result<std::shared_ptr<ssl::context>> make_server_context(const TlsServerOptions& o) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  harden(*ctx);
  if (auto st = use_cert_and_key(*ctx, o.cert_chain_pem, o.key_pem); !st.ok())
    return st.error().with_context("server TLS");
  if (!o.client_ca_pem.empty()) {
    if (auto st = add_ca(*ctx, o.client_ca_pem); !st.ok()) return st.error();
    // Ask for a client certificate but do not require one: a guest without
    // a certificate yet may only enroll (checked by the agents endpoint).
    SSL_CTX_set_verify(ctx->native_handle(), SSL_VERIFY_PEER,
                       o.accept_expired_client_certs ? verify_allowing_expired_leaf : nullptr);
    // A session resumes only under the CA that verified its certificate:
    // the context names the CA (SHA-256, 32 bytes, OpenSSL's maximum).
    const std::string named = "factory-agents\n" + o.client_ca_pem;
    unsigned char sid_ctx[SHA256_DIGEST_LENGTH];
    static_assert(sizeof sid_ctx <= SSL_MAX_SID_CTX_LENGTH);
    SHA256(reinterpret_cast<const unsigned char*>(named.data()), named.size(), sid_ctx);
    SSL_CTX_set_session_id_context(ctx->native_handle(), sid_ctx, sizeof sid_ctx);
    STACK_OF(X509_NAME)* names = sk_X509_NAME_new_null();
    for (auto& pem : pki::split_pem_certificates(o.client_ca_pem)) {
      auto c = parse_cert(pem);
      if (c) sk_X509_NAME_push(names, X509_NAME_dup(X509_get_subject_name(c.get())));
    }
    SSL_CTX_set_client_CA_list(ctx->native_handle(), names);
  }
  if (o.ticket_keys) {
    // One ticket per handshake: an agent keeps only the latest.
    SSL_CTX_set_num_tickets(ctx->native_handle(), 1);
    SSL_CTX_set_timeout(ctx->native_handle(), o.ticket_keys->policy().ticket_lifetime.count());
    SSL_CTX_set_ex_data(ctx->native_handle(), ticket_keys_ex_index(),
                        new std::shared_ptr<TicketKeys>(o.ticket_keys));
    SSL_CTX_set_tlsext_ticket_key_evp_cb(ctx->native_handle(), ticket_key_callback);
  }
  return ctx;
}

Result<std::shared_ptr<ssl::context>> make_client_context(const TlsClientIdentity& o) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  harden(*ctx);
  if (!o.ca_pem.empty()) {
    if (auto st = add_ca(*ctx, o.ca_pem); !st.ok()) return st.error().with_context("CA file");
  } else if (!o.pinned_ca_sha256.empty()) {
    // The pin lives as long as the SSL_CTX: ex_data frees it with the context.
    auto* pin = new std::string(o.pinned_ca_sha256);
    for (auto& c : *pin) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    SSL_CTX_set_ex_data(ctx->native_handle(), pin_ex_index(), pin);
    SSL_CTX_set_cert_verify_callback(ctx->native_handle(), verify_against_pin, pin);
  } else {
    return Error(Errc::invalid_argument, "no CA to verify the coordinator against");
  }
  SSL_CTX_set_verify(ctx->native_handle(), SSL_VERIFY_PEER, nullptr);
  if (!o.client_cert_pem.empty()) {
    if (auto st = use_cert_and_key(*ctx, o.client_cert_pem, o.client_key_pem); !st.ok())
      return st.error().with_context("client TLS");
  }
  if (o.sessions) {
    auto* r = new ClientResumption{
        o.sessions, pki::sha256_hex(o.server_name + "\n" + o.ca_pem + "\n" + o.pinned_ca_sha256 +
                                    "\n" + o.client_cert_pem)};
    SSL_CTX_set_ex_data(ctx->native_handle(), resumption_ex_index(), r);
    SSL_CTX_set_session_cache_mode(ctx->native_handle(),
                                   SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(ctx->native_handle(), keep_new_session);
  }
  return ctx;
}

TlsSessionCache::~TlsSessionCache() {
  if (session_) SSL_SESSION_free(session_);
}

void TlsSessionCache::put(const std::string& identity, SSL_SESSION* session) {
  std::lock_guard lk(mu_);
  if (session_) SSL_SESSION_free(session_);
  session_ = session;
  identity_ = identity;
}

SSL_SESSION* TlsSessionCache::get1(const std::string& identity) const {
  std::lock_guard lk(mu_);
  if (!session_ || identity_ != identity) return nullptr;
  SSL_SESSION_up_ref(session_);
  return session_;
}

void TlsSessionCache::clear() {
  std::lock_guard lk(mu_);
  if (session_) SSL_SESSION_free(session_);
  session_ = nullptr;
  identity_.clear();
}

void offer_kept_session(void* ssl_handle) {
  auto* ssl = static_cast<SSL*>(ssl_handle);
  auto* r = static_cast<ClientResumption*>(
      SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), resumption_ex_index()));
  if (!r || !r->cache) return;
  SSL_SESSION* s = r->cache->get1(r->identity);
  if (!s) return;
  // An expired one is not offered: OpenSSL would, and the server refuse it.
  if (SSL_SESSION_get_time(s) + SSL_SESSION_get_timeout(s) > time(nullptr)) SSL_set_session(ssl, s);
  SSL_SESSION_free(s);
}

std::string verify_failure_reason(void* ssl_handle) {
  long r = SSL_get_verify_result(static_cast<SSL*>(ssl_handle));
  if (r == X509_V_OK) return "";
  return X509_verify_cert_error_string(r);
}

}  // namespace factory::net
