#include "common/net/tls.hpp"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <boost/asio/ssl/context.hpp>

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
    static const unsigned char kSessionContext[] = "factory-agents";
    SSL_CTX_set_session_id_context(ctx->native_handle(), kSessionContext,
                                   sizeof kSessionContext - 1);
    STACK_OF(X509_NAME)* names = sk_X509_NAME_new_null();
    for (auto& pem : pki::split_pem_certificates(o.client_ca_pem)) {
      auto c = parse_cert(pem);
      if (c) sk_X509_NAME_push(names, X509_NAME_dup(X509_get_subject_name(c.get())));
    }
    SSL_CTX_set_client_CA_list(ctx->native_handle(), names);
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
  return ctx;
}

std::string verify_failure_reason(void* ssl_handle) {
  long r = SSL_get_verify_result(static_cast<SSL*>(ssl_handle));
  if (r == X509_V_OK) return "";
  return X509_verify_cert_error_string(r);
}

}  // namespace factory::net
