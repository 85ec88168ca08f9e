#pragma once
// Enrollment and renewal: an agent's identity. A new agent trades its
// one-time bootstrap token and a CSR (its key never leaves the guest) for a
// client certificate naming its tenant; an enrolled one renews before
// expiry; the tenant's record lists the serials that are valid now, so a
// revoked or replaced certificate stops working at once. An agent that was
// off longer than its certificate's life comes back on its own: within the
// renewal grace its expired certificate may still renew (and do nothing else),
// as long as its serial is on the record; past the grace it must re-enroll.
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "common/net/server.hpp"
#include "coordinator/agents/messages.hpp"
#include "coordinator/agents/refusal.hpp"
#include "coordinator/enroll/ca.hpp"
#include "coordinator/enroll/tokens.hpp"
#include "coordinator/feed/feed_state.hpp"
#include "coordinator/store/store.hpp"

namespace factory::coordinator {

class Enrollment {
 public:
  Enrollment(store::Store& store, const enroll::CertificateAuthority& ca, enroll::Tokens& tokens,
             feed::AgentCounters& counters, std::chrono::seconds cert_ttl,
             std::chrono::seconds renewal_grace)
      : store_(store),
        ca_(ca),
        tokens_(tokens),
        counters_(counters),
        cert_ttl_(cert_ttl),
        renewal_grace_(renewal_grace) {}

  // Why a connection with this client certificate may not speak for the
  // tenant it names; "" when it may. A revoked serial or a deleted tenant is
  // refused whatever the certificate's dates; an expired one (PeerInfo::
  // client_cert_expired) is refused past the renewal grace, and otherwise
  // left to the session, which lets it renew and nothing else.
  std::string certificate_refusal(const net::PeerInfo& peer) const;

  // A decoded enroll frame (messages.hpp) from an agent at `remote`: the
  // "enrolled" reply's body, with the certificate. The token is checked
  // before anything is signed, and spent only once the CSR proved good. May
  // wait (signing, the token book, the store): workers only.
  Answer<nlohmann::json> enroll(const EnrollRequest& req, const std::string& remote);

  // A decoded renew frame from the tenant's agent, on a connection
  // that authenticated with certificate `session_serial`: the "certificate"
  // reply's body. Valid afterwards: exactly that serial and the new one, so
  // a reply lost on its way never locks the agent out (it still holds the
  // certificate it connected with). Workers only.
  Answer<nlohmann::json> renew(const std::string& tenant, const std::string& session_serial,
                               const RenewRequest& req);

  // Voids the tenant's certificates and unused tokens (the caller closes its
  // connection).
  Status revoke(const std::string& tenant);

 private:
  store::Store& store_;
  const enroll::CertificateAuthority& ca_;
  enroll::Tokens& tokens_;
  feed::AgentCounters& counters_;
  std::chrono::seconds cert_ttl_;
  std::chrono::seconds renewal_grace_;
};

// What an admin does for an agent whose identity is gone (revoked, tenant
// deleted, expired past the grace): the sentence every such refusal ends with.
std::string reenroll_hint(const std::string& tenant);

}  // namespace factory::coordinator
