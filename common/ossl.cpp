#include "common/ossl.hpp"

#include <openssl/err.h>
#include <openssl/pem.h>

namespace factory::ossl {

namespace {

// Without this callback OpenSSL's default one would read a passphrase from
// the terminal when handed an encrypted key: a server must fail instead.
int no_passphrase(char*, int, int, void*) { return 0; }

BioPtr read_bio(std::string_view pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

Result<std::string> drain(BIO* bio) {
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  if (n < 0 || data == nullptr) return Error(Errc::internal, error_text("read PEM buffer"));
  return std::string(data, static_cast<size_t>(n));
}

}  // namespace

std::string error_text(const std::string& what) {
  std::string reasons;
  unsigned long code;
  while ((code = ERR_get_error()) != 0) {
    char buf[256];
    ERR_error_string_n(code, buf, sizeof buf);
    if (!reasons.empty()) reasons += "; ";
    reasons += buf;
  }
  return reasons.empty() ? what : what + ": " + reasons;
}

void clear_errors() { ERR_clear_error(); }

Result<X509Ptr> load_certificate(std::string_view pem) {
  if (pem.size() > INT32_MAX) return Error(Errc::invalid_argument, "certificate PEM too large");
  BioPtr bio = read_bio(pem);
  if (!bio) return Error(Errc::internal, error_text("allocate BIO"));
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, no_passphrase, nullptr));
  if (!cert) {
    clear_errors();
    return Error(Errc::invalid_argument, "not a PEM certificate");
  }
  return cert;
}

Result<PkeyPtr> load_private_key(std::string_view pem) {
  if (pem.size() > INT32_MAX) return Error(Errc::invalid_argument, "private key PEM too large");
  BioPtr bio = read_bio(pem);
  if (!bio) return Error(Errc::internal, error_text("allocate BIO"));
  PkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr));
  if (!key) {
    clear_errors();
    return Error(Errc::invalid_argument, "not an unencrypted PEM private key");
  }
  return key;
}

Result<X509ReqPtr> load_csr(std::string_view pem) {
  if (pem.size() > INT32_MAX) return Error(Errc::invalid_argument, "CSR PEM too large");
  BioPtr bio = read_bio(pem);
  if (!bio) return Error(Errc::internal, error_text("allocate BIO"));
  X509ReqPtr req(PEM_read_bio_X509_REQ(bio.get(), nullptr, no_passphrase, nullptr));
  if (!req) {
    clear_errors();
    return Error(Errc::invalid_argument, "not a PEM certificate request");
  }
  return req;
}

std::string name_entry(const X509_NAME* name, int nid) {
  if (name == nullptr) return {};
  int idx = X509_NAME_get_index_by_NID(name, nid, -1);
  if (idx < 0) return {};
  const ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, idx));
  unsigned char* utf8 = nullptr;
  int len = ASN1_STRING_to_UTF8(&utf8, data);
  if (len < 0) {
    clear_errors();
    return {};
  }
  std::string out(reinterpret_cast<char*>(utf8), static_cast<size_t>(len));
  OPENSSL_free(utf8);
  return out;
}

Result<std::string> certificate_to_pem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1)
    return Error(Errc::internal, error_text("encode certificate as PEM"));
  return drain(bio.get());
}

Result<std::string> private_key_to_pem(EVP_PKEY* key) {
  // secmem: the buffer that held the key is wiped when freed.
  BioPtr bio(BIO_new(BIO_s_secmem()));
  if (!bio ||
      PEM_write_bio_PKCS8PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1)
    return Error(Errc::internal, error_text("encode private key as PEM"));
  return drain(bio.get());
}

Result<std::string> csr_to_pem(X509_REQ* req) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509_REQ(bio.get(), req) != 1)
    return Error(Errc::internal, error_text("encode CSR as PEM"));
  return drain(bio.get());
}

}  // namespace factory::ossl
