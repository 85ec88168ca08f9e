#pragma once
// Owning handles for OpenSSL objects and the PEM loaders pki.cpp and the
// enrollment CA share, so no OpenSSL object is ever freed by hand and no
// OpenSSL error queue is left behind for the next, unrelated call to read.
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace factory::ossl {

template <auto FreeFn>
struct Free {
  template <class T>
  void operator()(T* p) const { FreeFn(p); }
};

using X509Ptr = std::unique_ptr<X509, Free<X509_free>>;
using X509ReqPtr = std::unique_ptr<X509_REQ, Free<X509_REQ_free>>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, Free<EVP_PKEY_free>>;
using BioPtr = std::unique_ptr<BIO, Free<BIO_free_all>>;
using BignumPtr = std::unique_ptr<BIGNUM, Free<BN_free>>;
using X509NamePtr = std::unique_ptr<X509_NAME, Free<X509_NAME_free>>;
using X509ExtPtr = std::unique_ptr<X509_EXTENSION, Free<X509_EXTENSION_free>>;
using GeneralNamesPtr = std::unique_ptr<GENERAL_NAMES, Free<GENERAL_NAMES_free>>;
using X509StorePtr = std::unique_ptr<X509_STORE, Free<X509_STORE_free>>;
using X509StoreCtxPtr = std::unique_ptr<X509_STORE_CTX, Free<X509_STORE_CTX_free>>;

// "what: <OpenSSL's reasons>"; drains the thread's OpenSSL error queue.
std::string error_text(const std::string& what);
// Clears the thread's OpenSSL error queue (after a failure we handled).
void clear_errors();

// The first certificate / private key / CSR in a PEM text. Errc::invalid_argument
// when the text holds none. Encrypted keys are refused, never prompted for.
Result<X509Ptr> load_certificate(std::string_view pem);
Result<PkeyPtr> load_private_key(std::string_view pem);
Result<X509ReqPtr> load_csr(std::string_view pem);

// The UTF-8 value of the first `nid` entry (e.g. NID_commonName) of a name;
// "" when there is none.
std::string name_entry(const X509_NAME* name, int nid);

// PEM encodings. Private keys are written as unencrypted PKCS#8.
Result<std::string> certificate_to_pem(X509* cert);
Result<std::string> private_key_to_pem(EVP_PKEY* key);
Result<std::string> csr_to_pem(X509_REQ* req);

}  // namespace factory::ossl
