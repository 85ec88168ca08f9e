// What a stranger on the agent port sends to enroll: the enroll body
// (coordinator/agents/messages.hpp decode_enroll) and, once a token would
// have matched, its CSR through the CA's checks (coordinator/enroll/ca.hpp
// sign_agent_csr: PEM, self-signature, EC P-256 key). The input is the
// enroll frame's JSON body; a second pass takes the raw bytes as the CSR
// itself, so the PEM and DER parsers see arbitrary bytes too. Nothing may
// throw or crash, and a refusal is an error, never a certificate.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "coordinator/agents/messages.hpp"
#include "coordinator/enroll/ca.hpp"
#include "fuzz/scratch.hpp"

namespace {
const factory::enroll::CertificateAuthority& ca() {
  static factory::fuzz::ScratchDir dir("enroll");
  static auto loaded = factory::enroll::CertificateAuthority::load_or_create(dir.path() / "ca");
  if (!loaded) std::abort();
  return *loaded;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace factory;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  auto body = nlohmann::json::parse(bytes, nullptr, false);
  if (!body.is_discarded()) {
    auto d = coordinator::decode_enroll(body);
    if (d.value) (void)ca().sign_agent_csr(d.value->csr, "fuzz", std::chrono::hours(24));
  }
  (void)ca().sign_agent_csr(bytes, "fuzz", std::chrono::hours(24));
  return 0;
}
