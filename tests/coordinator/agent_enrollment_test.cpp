// Enrollment (coordinator/agents/enrollment.hpp) against a real CA, token
// book and store in a temp dir: a stranger's enroll costs a token check
// before it can cost a signature, and what it claims about itself is only
// kept once decoded.
#include <gtest/gtest.h>

#include "common/pki.hpp"
#include "coordinator/agents/enrollment.hpp"
#include "tests/support/test_support.hpp"

namespace factory::coordinator {
namespace {

using factory::testing::TempDir;

struct Rig {
  TempDir dir{"enrollment"};
  std::unique_ptr<enroll::CertificateAuthority> ca;
  std::unique_ptr<enroll::TokenBook> tokens;
  std::unique_ptr<store::Store> store;
  feed::AgentCounters counters;
  std::unique_ptr<Enrollment> enrollment;

  Rig() {
    auto c = enroll::CertificateAuthority::load_or_create(dir.path());
    EXPECT_TRUE(c.ok());
    ca = std::make_unique<enroll::CertificateAuthority>(std::move(*c));
    auto t = enroll::TokenBook::load(dir / "tokens.json");
    EXPECT_TRUE(t.ok());
    tokens = std::make_unique<enroll::TokenBook>(std::move(*t));
    auto s = store::open_sqlite_store((dir / "store").string());
    EXPECT_TRUE(s.ok());
    store = std::move(*s);
    enrollment = std::make_unique<Enrollment>(*store, *ca, *tokens, counters, std::chrono::hours(1),
                                              std::chrono::hours(24 * 90));
  }
  ~Rig() { store->close(); }
};

std::string refusal_of(const Answer<nlohmann::json>& a) {
  auto* r = std::get_if<Refusal>(&a);
  return r ? r->code + ": " + r->message : "";
}

TEST(AgentEnrollment, TheTokenIsCheckedBeforeTheCsrIsEvenRead) {
  Rig rig;
  // A made-up token with a CSR that is not one: refused for the token. Had
  // the CSR been looked at (let alone signed), it would be refused for that.
  EnrollRequest r{"abcdef.0123456789abcdef0123456789abcdef", "not a CSR", "", ""};
  EXPECT_EQ(refusal_of(rig.enrollment->enroll(r, "127.0.0.1:1")),
            "enrollment_refused: unknown token 'abcdef'");
  r.token = "not even the shape of a token";
  EXPECT_NE(refusal_of(rig.enrollment->enroll(r, "127.0.0.1:1")).find("token malformed"),
            std::string::npos);
  EXPECT_EQ(rig.counters.enrollments_refused.load(), 2u);
  EXPECT_EQ(rig.counters.enrollments_accepted.load(), 0u);

  // A good token with a bad CSR keeps the token for the next try.
  auto issued = rig.tokens->issue("t1", std::chrono::minutes(5));
  ASSERT_TRUE(issued.ok());
  r.token = issued->token;
  EXPECT_NE(refusal_of(rig.enrollment->enroll(r, "127.0.0.1:1")).find("enrollment_refused"),
            std::string::npos);
  auto key = pki::generate_private_key();
  ASSERT_TRUE(key.ok());
  auto csr = pki::make_csr(*key, "whatever-it-asks");
  ASSERT_TRUE(csr.ok());
  r.csr = *csr;
  r.hostname = "guest-1";
  r.agent_version = "0.1.0";
  auto ok = rig.enrollment->enroll(r, "127.0.0.1:1");
  ASSERT_EQ(refusal_of(ok), "");
  auto rec = rig.store->get_tenant("t1");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->agent.hostname.value_or(""), "guest-1");
  EXPECT_EQ(rec->agent.version.value_or(""), "0.1.0");
}

}  // namespace
}  // namespace factory::coordinator
