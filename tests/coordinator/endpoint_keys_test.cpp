// A model endpoint's named keys on the coordinator (issue 28,
// coordinator/tenants/endpoint_keys.hpp), over a real SQLite store and an
// agent stand-in that records what it was told: the key answered once and
// stored as its hash, names and limits checked, the default key neither
// created nor revoked, the connected agent told of every change, and a
// dry run changing nothing.
#include "coordinator/tenants/endpoint_keys.hpp"

#include <gtest/gtest.h>

#include "common/pki.hpp"
#include "tests/support/test_support.hpp"

namespace factory::tenants {
namespace {

using factory::testing::TempDir;
using nlohmann::json;

class RecordingAgents : public AgentControl {
 public:
  Status revoke(const std::string&) override { return {}; }
  bool send_command(const std::string&, const json&) override { return false; }
  bool push_endpoint(const std::string& tenant) override {
    pushed.push_back(tenant);
    return connected;
  }
  std::optional<std::vector<std::string>> agent_features(const std::string&) override {
    return std::nullopt;
  }
  std::vector<std::string> pushed;
  bool connected = true;
};

class EndpointKeysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = store::open_sqlite_store(dir_.path().string());
    ASSERT_TRUE(s.ok()) << s.error().message;
    store_ = std::move(*s);
    store::TenantRecord t5;
    t5.name = "t5";
    t5.tier = "model-endpoint";
    t5.created_at = "2026-12-01T00:00:00Z";
    t5.endpoint.emplace();
    t5.endpoint->key_sha256 = pki::sha256_hex("fmk-default");
    ASSERT_TRUE(store_->put_tenant(t5).ok());
    store::TenantRecord vm;
    vm.name = "tenant-1";
    vm.tier = "gpu-vm";
    ASSERT_TRUE(store_->put_tenant(vm).ok());
    keys_ = std::make_unique<EndpointKeys>(*store_, agents_);
  }
  void TearDown() override {
    keys_.reset();
    if (store_) store_->close();
  }
  KeyRequest req(const std::string& name) {
    KeyRequest r;
    r.tenant = "t5";
    r.name = name;
    return r;
  }

  TempDir dir_{"endpoint-keys"};
  std::unique_ptr<store::Store> store_;
  RecordingAgents agents_;
  std::unique_ptr<EndpointKeys> keys_;
};

TEST_F(EndpointKeysTest, ACreatedKeyIsAnsweredOnceAndStoredAsItsHash) {
  auto r = req("ci");
  r.rpm = 60;
  r.tpm = 20000;
  auto made = keys_->create(r);
  ASSERT_TRUE(made.ok()) << made.error().message;
  const std::string key = made->value("api_key", "");
  ASSERT_EQ(key.rfind("fmk-", 0), 0u) << made->dump();
  EXPECT_EQ((*made)["guest_told"], true);
  EXPECT_EQ(agents_.pushed, (std::vector<std::string>{"t5"}));
  auto rec = store_->get_tenant("t5");
  ASSERT_TRUE(rec->endpoint->keys);
  ASSERT_EQ(rec->endpoint->keys->size(), 1u);
  const auto& k = rec->endpoint->keys->front();
  EXPECT_EQ(k.name, "ci");
  EXPECT_EQ(k.sha256, pki::sha256_hex(key));
  EXPECT_EQ(k.rpm, 60);
  EXPECT_EQ(k.tpm, 20000);
  EXPECT_EQ(rec->to_json().dump().find(key), std::string::npos) << "the key itself is kept nowhere";
  // The list: default first, then ci with its limits; no key, no hash.
  auto l = keys_->list("t5");
  ASSERT_TRUE(l.ok());
  ASSERT_EQ((*l)["keys"].size(), 2u);
  EXPECT_EQ((*l)["keys"][0]["name"], "default");
  EXPECT_EQ((*l)["keys"][1]["name"], "ci");
  EXPECT_EQ((*l)["keys"][1]["rpm"], 60);
  EXPECT_EQ(l->dump().find(pki::sha256_hex(key)), std::string::npos);
  // The same name again: refused, nothing changed.
  auto again = keys_->create(req("ci"));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, Errc::already_exists);
  EXPECT_EQ(store_->get_tenant("t5")->endpoint->keys->size(), 1u);
}

TEST_F(EndpointKeysTest, NamesLimitsAndTenantsAreChecked) {
  for (const std::string& bad :
       std::vector<std::string>{"", "Bad", "a/b", "-x", "a.b", std::string(64, 'a'), "é"}) {
    auto r = keys_->create(req(bad));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, Errc::invalid_argument) << bad;
  }
  auto def = keys_->create(req("default"));
  ASSERT_FALSE(def.ok());
  EXPECT_NE(def.error().message.find("credentials t5 --rotate"), std::string::npos);
  auto r = req("ci");
  r.rpm = 0;
  EXPECT_EQ(keys_->create(r).error().code, Errc::invalid_argument);
  r.rpm = kMaxKeyLimit + 1;
  EXPECT_EQ(keys_->create(r).error().code, Errc::invalid_argument);
  auto vm = req("ci");
  vm.tenant = "tenant-1";
  EXPECT_EQ(keys_->create(vm).error().code, Errc::failed_precondition) << "no endpoint";
  vm.tenant = "nobody";
  EXPECT_EQ(keys_->create(vm).error().code, Errc::not_found);
  vm.tenant = "t5/../x";
  EXPECT_EQ(keys_->create(vm).error().code, Errc::invalid_argument);
  EXPECT_TRUE(agents_.pushed.empty()) << "nothing changed, nobody told";
  // At most kMaxEndpointKeys.
  for (std::size_t i = 0; i < kMaxEndpointKeys; i++)
    ASSERT_TRUE(keys_->create(req("k" + std::to_string(i))).ok()) << i;
  EXPECT_EQ(keys_->create(req("one-more")).error().code, Errc::failed_precondition);
}

TEST_F(EndpointKeysTest, RevokeRemovesTheHashTellsTheAgentAndADryRunChangesNothing) {
  ASSERT_TRUE(keys_->create(req("ci")).ok());
  ASSERT_TRUE(keys_->create(req("app")).ok());
  agents_.pushed.clear();
  auto dry = keys_->create([&] {
    auto r = req("later");
    r.dry_run = true;
    return r;
  }());
  ASSERT_TRUE(dry.ok());
  EXPECT_FALSE(dry->contains("api_key"));
  auto dry_revoke = keys_->revoke("t5", "ci", true);
  ASSERT_TRUE(dry_revoke.ok());
  EXPECT_EQ((*dry_revoke)["revoked"], false);
  EXPECT_EQ(store_->get_tenant("t5")->endpoint->keys->size(), 2u);
  EXPECT_TRUE(agents_.pushed.empty());

  agents_.connected = false;
  auto out = keys_->revoke("t5", "ci", false);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ((*out)["revoked"], true);
  EXPECT_EQ((*out)["guest_told"], false);
  EXPECT_NE(out->value("note", "").find("3 s"), std::string::npos) << out->dump();
  auto rec = store_->get_tenant("t5");
  ASSERT_EQ(rec->endpoint->keys->size(), 1u);
  EXPECT_EQ(rec->endpoint->keys->front().name, "app");
  // Its name stays in the usage, for its last report.
  EXPECT_TRUE(rec->endpoint->usage->totals_since_creation().contains("ci"));
  EXPECT_EQ(keys_->revoke("t5", "ci", false).error().code, Errc::not_found);
  auto def = keys_->revoke("t5", "default", false);
  ASSERT_FALSE(def.ok());
  EXPECT_NE(def.error().message.find("tenant credentials t5 --rotate"), std::string::npos);
}

}  // namespace
}  // namespace factory::tenants
