// Issue 15, the runbook's third customer: `factory tenant create t5 --tier
// model-endpoint` against the Kubernetes API test double
// (tests/fakes/kube_apiserver.py, checking every object against the real
// schemas) reaches ready on the simulated guest (tests/guestsim/vm_runner.py
// boots it from the VM's real user-data; its Ollama is the stand-in
// tests/fakes/ollama_server.py, answering with Ollama's own shapes). The
// agent's proxy, the real factory-agent's, listens where the fake's NodePort
// would forward (127.0.0.1:<nodePort>), with a certificate from the
// coordinator's endpoint CA; the calls are the real curl's over TLS.
#include <gtest/gtest.h>

#include <sstream>

#include "common/pki.hpp"
#include "tests/integration/tenant_fixture.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Reply {
  int status = 0;
  std::string body;
  std::string headers;  // as curl -D wrote them
};

// One call through the endpoint with the real curl; the key, when given,
// goes in a header file (as a careful caller keeps it off the command line).
Reply call(const fs::path& dir, const std::string& ca_file, const std::string& url,
           const std::string& key, const std::string& method = "GET",
           const std::string& body = "") {
  std::vector<std::string> argv = {"/usr/bin/curl",
                                   "-sS",
                                   "--max-time",
                                   "20",
                                   "--cacert",
                                   ca_file,
                                   "-o",
                                   (dir / "reply.body").string(),
                                   "-D",
                                   (dir / "reply.headers").string(),
                                   "-w",
                                   "%{http_code}",
                                   "-X",
                                   method};
  if (!key.empty()) {
    write_text(dir / "auth.header", "Authorization: Bearer " + key + "\n");
    fs::permissions(dir / "auth.header", fs::perms::owner_read | fs::perms::owner_write);
    argv.insert(argv.end(), {"-H", "@" + (dir / "auth.header").string()});
  }
  if (!body.empty())
    argv.insert(argv.end(), {"-H", "Content-Type: application/json", "--data-binary", body});
  argv.push_back(url);
  auto r = run(argv, 30s);
  Reply out;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  try {
    out.status = std::stoi(r.output.substr(r.output.size() >= 3 ? r.output.size() - 3 : 0));
  } catch (...) {
    ADD_FAILURE() << "curl printed no status: " << r.output;
  }
  out.body = slurp(dir / "reply.body");
  out.headers = slurp(dir / "reply.headers");
  return out;
}

// The tokens the stand-in counted in one answer, as its answer says them:
// the final object of /api/generate and /api/chat, the usage object of
// /v1/chat/completions (streamed: its usage chunk, asked for).
std::pair<std::uint64_t, std::uint64_t> tokens_in(const std::string& answer) {
  std::pair<std::uint64_t, std::uint64_t> c{0, 0};
  std::istringstream in(answer);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) == 0) line = line.substr(6);
    auto j = json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    if (j.contains("usage") && j["usage"].is_object())
      c = {j["usage"].value("prompt_tokens", 0u), j["usage"].value("completion_tokens", 0u)};
    else if (j.value("done", false))
      c = {j.value("prompt_eval_count", 0u), j.value("eval_count", 0u)};
  }
  return c;
}

const char* kChat =
    R"({"model":"llama3.2:1b","messages":[{"role":"user","content":"Say hello."}]})";

}  // namespace

TEST_F(Tenants, AModelEndpointIsReadyKeyedAndItsKeyRotates) {
  allowlist();
  auto& h = coordinator();
  fs::path guests = dir_.path() / "guests";
  Process runner(
      {"/usr/bin/python3", (source_dir() / "tests/guestsim/vm_runner.py").string(), "--kubeconfig",
       kube_.kubeconfig(), "--work", guests.string(), "--agent-arg=--heartbeat", "--agent-arg=1",
       "--agent-arg=--health-interval", "--agent-arg=1"},
      dir_.path() / "vm-runner.log");

  // No --ssh-key: a tier without login takes none by default.
  auto r = h.factory(
      {"tenant", "create", "t5", "--tier", "model-endpoint", "--wait", "--timeout", "3m"});
  ASSERT_EQ(r.exit_code, 0) << r.output << "\n"
                            << slurp(guests / "t5" / "agent.log") << slurp(dir_ / "vm-runner.log");
  EXPECT_NE(r.output.find("API key of t5's endpoint"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("password of ubuntu"), std::string::npos) << "no login, no password";

  // What Kubernetes holds: the endpoint's Service and the key's Secret, no SSH Service.
  auto objects = objects_of(kube_, "tenants", "t5");
  auto has = [&](const std::string& o) {
    return std::find(objects.begin(), objects.end(), o) != objects.end();
  };
  EXPECT_TRUE(has("services/t5-endpoint")) << ::testing::PrintToString(objects);
  EXPECT_TRUE(has("secrets/t5-endpoint-key")) << ::testing::PrintToString(objects);
  EXPECT_FALSE(has("services/t5-ssh")) << "no NodePort for SSH";

  // No customer login in the user-data the VM booted with.
  json ud = live_user_data(kube_, "t5");
  EXPECT_FALSE(ud.contains("chpasswd")) << ud.dump(2);
  EXPECT_EQ(ud.value("ssh_pwauth", true), false) << ud.dump(2);
  ASSERT_EQ(ud["users"].size(), 1u) << ud.dump(2);
  EXPECT_EQ(ud["users"][0]["shell"], "/usr/sbin/nologin") << "nobody to log in as";
  EXPECT_FALSE(ud["users"][0].contains("ssh_authorized_keys"));
  EXPECT_EQ(ud.dump().find("password"), std::string::npos) << ud.dump(2);
  write_text(dir_ / "t5-userdata.yaml", "#cloud-config\n" + factory::to_yaml(ud));
  auto ci = cloud_init_schema(dir_ / "t5-userdata.yaml");
  EXPECT_EQ(ci.exit_code, 0) << ci.output;

  auto creds_r = h.factory({"tenant", "credentials", "t5", "-o", "json"});
  ASSERT_EQ(creds_r.exit_code, 0) << creds_r.output;
  json creds = json::parse(creds_r.output);
  const std::string url = creds.value("url", "");
  const std::string key = creds.value("api_key", "");
  ASSERT_EQ(url.rfind("https://127.0.0.1:", 0), 0u) << creds.dump(2);
  ASSERT_EQ(key.rfind("fmk-", 0), 0u) << "the key, and only in the answer";
  const std::string ca = (dir_ / "endpoint-ca.crt").string();
  write_text(ca, creds.value("ca", ""));
  // The key is in the Secret and nowhere in the coordinator's log.
  json secret = kube_.get("/api/v1/namespaces/tenants/secrets/t5-endpoint-key");
  EXPECT_EQ(b64decode(secret["data"].value("api-key", "")), key);
  EXPECT_EQ(h.log().find(key), std::string::npos) << "the API key reached the coordinator's log";
  EXPECT_EQ(slurp(guests / "t5" / "agent.log").find(key), std::string::npos);

  // The right key: a chat completion from the stand-in, as OpenAI's shape.
  auto ok = call(dir_.path(), ca, url + "/v1/chat/completions", key, "POST", kChat);
  ASSERT_EQ(ok.status, 200) << ok.body;
  json completion = json::parse(ok.body, nullptr, false);
  EXPECT_EQ(completion.value("object", ""), "chat.completion") << ok.body;
  EXPECT_FALSE(completion["choices"][0]["message"].value("content", "").empty()) << ok.body;
  // Streaming passes through as Server-Sent Events, to the end.
  auto streamed =
      call(dir_.path(), ca, url + "/v1/chat/completions", key, "POST",
           R"({"model":"llama3.2:1b","stream":true,"messages":[{"role":"user","content":"Hi"}]})");
  EXPECT_EQ(streamed.status, 200);
  EXPECT_NE(streamed.body.find("chat.completion.chunk"), std::string::npos) << streamed.body;
  EXPECT_NE(streamed.body.find("data: [DONE]"), std::string::npos) << streamed.body;
  EXPECT_EQ(call(dir_.path(), ca, url + "/v1/models", key).status, 200);
  EXPECT_EQ(call(dir_.path(), ca, url + "/api/generate", key, "POST",
                 R"({"model":"llama3.2:1b","prompt":"Hi"})")
                .status,
            200);
  // No key, a wrong key: 401. A path outside the allowlist, with the key: refused.
  EXPECT_EQ(call(dir_.path(), ca, url + "/v1/chat/completions", "", "POST", kChat).status, 401);
  EXPECT_EQ(call(dir_.path(), ca, url + "/v1/models", "fmk-" + std::string(40, 'x')).status, 401);
  EXPECT_EQ(
      call(dir_.path(), ca, url + "/api/pull", key, "POST", R"({"model":"qwen2.5:0.5b"})").status,
      404);
  EXPECT_EQ(call(dir_.path(), ca, url + "/api/delete", key, "DELETE", R"({"model":"x"})").status,
            404);

  // tenant show says where the endpoint is and that it answers.
  auto t = show("t5");
  EXPECT_EQ(t["phase"], "ready");
  EXPECT_EQ(t["endpoint"]["url"], url) << t["endpoint"].dump(2);
  EXPECT_EQ(t["endpoint"]["answers"], true) << t["endpoint"].dump(2);
  auto table = h.factory({"tenant", "show", "t5"});
  EXPECT_NE(table.output.find("Endpoint:  " + url + " (answers"), std::string::npos)
      << table.output;
  // Health carries the endpoint's view: it serves, and counted what it refused.
  bool counted = eventually(
      [&] {
        json e = show("t5").value("/health/endpoint"_json_pointer, json::object());
        return e.value("serving", false) && e.value("unauthorized", 0) >= 2 &&
               e.value("refused_paths", 0) >= 2 && e.value("served", 0) >= 4;
      },
      30s, 500ms);
  EXPECT_TRUE(counted) << show("t5")["health"].dump(2);
  // And the probe's time to first token, 30 s after the agent started (then
  // every 5 minutes, as the catalog says).
  bool probed = eventually(
      [&] {
        json p = show("t5").value("/health/endpoint/probe"_json_pointer, json());
        return p.is_object() && p.value("ok", false) && p.value("ttft_ms", 0.0) > 0 &&
               p.value("ttft_ms", 0.0) <= p.value("total_ms", 0.0) &&
               p.value("model", "") == "llama3.2:1b";
      },
      90s, 1s);
  EXPECT_TRUE(probed) << show("t5")["health"].dump(2);

  // Rotation: the old key is refused as soon as the guest is told, the new one works.
  auto rot = h.factory({"tenant", "credentials", "t5", "--rotate", "-o", "json"});
  ASSERT_EQ(rot.exit_code, 0) << rot.output;
  json rotated = json::parse(rot.output);
  EXPECT_EQ(rotated["rotated"], true);
  EXPECT_EQ(rotated["guest_told"], true) << "the agent is connected";
  const std::string key2 = rotated.value("api_key", "");
  ASSERT_NE(key2, key);
  const auto told = std::chrono::steady_clock::now();
  bool refused = eventually(
      [&] { return call(dir_.path(), ca, url + "/v1/models", key).status == 401; }, 5s, 20ms);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - told)
          .count();
  EXPECT_TRUE(refused) << "the old key still works after the rotation";
  std::cout << "old key refused " << ms << " ms after `credentials --rotate` returned\n";
  EXPECT_EQ(call(dir_.path(), ca, url + "/v1/chat/completions", key2, "POST", kChat).status, 200);
  EXPECT_EQ(b64decode(kube_.get("/api/v1/namespaces/tenants/secrets/t5-endpoint-key")["data"].value(
                "api-key", "")),
            key2);

  // The guest's own files: the proxy keeps the key's hash, never the key.
  const fs::path state = guests / "t5" / "root" / "var/lib/factory-agent/endpoint";
  for (const char* f : {"endpoint.crt", "endpoint.key", "api-key.sha256"}) {
    ASSERT_TRUE(fs::exists(state / f)) << state / f;
    EXPECT_EQ(fs::status(state / f).permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write)
        << f;
    EXPECT_EQ(slurp(state / f).find(key2), std::string::npos) << f << " holds the key itself";
  }

  runner.stop();
  auto del = h.factory({"tenant", "delete", "t5"});
  EXPECT_EQ(del.exit_code, 0) << del.output;
  EXPECT_TRUE(objects_of(kube_, "tenants", "t5").empty())
      << ::testing::PrintToString(objects_of(kube_, "tenants", "t5"));
  EXPECT_EQ(slurp(guests / "t5" / "root" / ".guestsim" / "log" / "guarded.log"), "");
}

// Issue 28: several keys on one endpoint, each shown once and stored as its
// hash; a revoked one refused within 5 s (measured); a key's rate limit
// answering 429 with Retry-After; and the tokens per key, reported by the
// agent as durable events, equal to the sum of Ollama's own counts, on
// /metrics as promtool accepts it.
TEST_F(Tenants, SeveralKeysPerEndpointWorkAndARevokedOneIsRefusedWithinFiveSeconds) {
  allowlist();
  auto& h = coordinator();
  fs::path guests = dir_.path() / "guests";
  Process runner({"/usr/bin/python3", (source_dir() / "tests/guestsim/vm_runner.py").string(),
                  "--kubeconfig", kube_.kubeconfig(), "--work", guests.string(),
                  "--agent-arg=--heartbeat", "--agent-arg=1", "--agent-arg=--health-interval",
                  "--agent-arg=1", "--agent-arg=--endpoint-usage-interval", "--agent-arg=1"},
                 dir_.path() / "vm-runner.log");
  auto r = h.factory(
      {"tenant", "create", "t5", "--tier", "model-endpoint", "--wait", "--timeout", "3m"});
  ASSERT_EQ(r.exit_code, 0) << r.output << "\n" << slurp(guests / "t5" / "agent.log");
  json creds = json::parse(h.factory({"tenant", "credentials", "t5", "-o", "json"}).output);
  const std::string url = creds.value("url", ""), own = creds.value("api_key", "");
  const std::string ca = (dir_ / "endpoint-ca.crt").string();
  write_text(ca, creds.value("ca", ""));

  // A dry run makes nothing; each create shows its key once.
  auto dry = h.factory({"tenant", "keys", "create", "t5", "--key-name", "ci", "--dry-run"});
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("nothing changed"), std::string::npos) << dry.output;
  auto made = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"tenant", "keys", "create", "t5", "-o", "json"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto c = h.factory(args);
    EXPECT_EQ(c.exit_code, 0) << c.output;
    json j = json::parse(c.output, nullptr, false);
    EXPECT_EQ(j.value("guest_told", false), true) << c.output;
    return j.value("api_key", "");
  };
  const std::string ci = made({"--key-name", "ci"});
  const std::string app = made({"--key-name", "app", "--rpm", "3"});
  ASSERT_EQ(ci.rfind("fmk-", 0), 0u);
  ASSERT_NE(ci, app);
  auto again = h.factory({"tenant", "keys", "create", "t5", "--key-name", "ci"});
  expect_one_line_failure(again, "has a key named ci already");
  auto def = h.factory({"tenant", "keys", "revoke", "t5", "--key-name", "default"});
  expect_one_line_failure(def, "tenant credentials t5 --rotate");
  // Only hashes: the keys are in no record, log or guest file.
  const std::string record = h.stored_record("t5").value_or(json()).dump();
  EXPECT_NE(record.find(factory::pki::sha256_hex(ci)), std::string::npos) << record;
  for (const auto& k : {ci, app}) {
    EXPECT_EQ(h.log().find(k), std::string::npos);
    EXPECT_EQ(slurp(guests / "t5" / "agent.log").find(k), std::string::npos);
    EXPECT_EQ(record.find(k), std::string::npos) << "a named key in the stored record";
  }

  // Each key works, on each path that counts tokens, streamed and not.
  const std::string chat_stream_usage =
      R"({"model":"llama3.2:1b","stream":true,"stream_options":{"include_usage":true},)"
      R"("messages":[{"role":"user","content":"count my tokens please"}]})";
  const std::vector<std::pair<std::string, std::string>> calls = {
      {"/api/generate", R"({"model":"llama3.2:1b","prompt":"why is the sky blue","stream":false})"},
      {"/api/generate", R"({"model":"llama3.2:1b","prompt":"tell me a story"})"},
      {"/api/chat",
       R"({"model":"llama3.2:1b","messages":[{"role":"user","content":"hello there you"}]})"},
      {"/api/chat",
       R"({"model":"llama3.2:1b","stream":false,"messages":[{"role":"user","content":"hi"}]})"},
      {"/v1/chat/completions", kChat},
      {"/v1/chat/completions", chat_stream_usage},
  };
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> want;
  for (const auto& [name, key] :
       std::vector<std::pair<std::string, std::string>>{{"default", own}, {"ci", ci}}) {
    for (const auto& [path, body] : calls) {
      auto rep = call(dir_.path(), ca, url + path, key, "POST", body);
      ASSERT_EQ(rep.status, 200) << name << " " << path << ": " << rep.body;
      auto [p, c] = tokens_in(rep.body);
      EXPECT_GT(c, 0u) << path << ": " << rep.body;
      want[name].first += p;
      want[name].second += c;
    }
  }
  // app: 3 requests a minute, the 4th is 429 with Retry-After.
  for (int i = 0; i < 3; i++) EXPECT_EQ(call(dir_.path(), ca, url + "/v1/models", app).status, 200);
  auto limited = call(dir_.path(), ca, url + "/v1/models", app);
  EXPECT_EQ(limited.status, 429) << limited.body;
  EXPECT_NE(limited.headers.find("Retry-After: "), std::string::npos) << limited.headers;
  EXPECT_NE(limited.body.find("rate_limit_exceeded"), std::string::npos) << limited.body;

  // Revoked: refused within 5 s of the command's return (measured).
  auto rv = h.factory({"tenant", "keys", "revoke", "t5", "--key-name", "ci"});
  ASSERT_EQ(rv.exit_code, 0) << rv.output;
  const auto revoked = std::chrono::steady_clock::now();
  bool refused = eventually(
      [&] { return call(dir_.path(), ca, url + "/v1/models", ci).status == 401; }, 5s, 20ms);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - revoked)
                      .count();
  EXPECT_TRUE(refused) << "the revoked key still works 5 s later";
  std::cout << "revoked key refused " << ms << " ms after `tenant keys revoke` returned\n";
  EXPECT_LT(ms, 5000);
  EXPECT_EQ(call(dir_.path(), ca, url + "/v1/models", own).status, 200) << "the others serve";

  // Usage per key, from the agent's events (every second here): the tokens
  // are exactly the sums of the answers' counts.
  json list;
  bool reported = eventually(
      [&] {
        auto l = h.factory({"tenant", "keys", "list", "t5", "-o", "json"});
        list = json::parse(l.output, nullptr, false);
        if (!list.is_object()) return false;
        std::map<std::string, json> by;
        for (const auto& k : list["keys"]) by[k.value("name", "")] = k.value("usage", json());
        auto tokens_are = [&](const std::string& k) {
          return by[k].is_object() && by[k].value("prompt_tokens", 0u) == want[k].first &&
                 by[k].value("completion_tokens", 0u) == want[k].second;
        };
        return tokens_are("default") && by["app"].is_object() &&
               by["app"].value("requests", 0u) == 4 && by["app"].value("errors", 0u) == 1;
      },
      30s, 500ms);
  EXPECT_TRUE(reported) << list.dump(2) << "\nwant default " << want["default"].first << "/"
                        << want["default"].second;
  // The revoked key's list entry is gone; its counts stay on /metrics.
  std::string m;
  bool on_metrics = eventually(
      [&] {
        m = h.metrics();
        return m.find(
                   "factory_endpoint_tokens_total{tenant=\"t5\",key=\"ci\",direction=\"prompt\"} " +
                   std::to_string(want["ci"].first) + "\n") != std::string::npos &&
               m.find(
                   "factory_endpoint_tokens_total{tenant=\"t5\",key=\"ci\",direction="
                   "\"completion\"} " +
                   std::to_string(want["ci"].second) + "\n") != std::string::npos;
      },
      30s, 500ms);
  EXPECT_TRUE(on_metrics) << m;
  // (ci's ok count may pass 6: a request made while its revocation travels.)
  EXPECT_NE(
      m.find("factory_endpoint_key_requests_total{tenant=\"t5\",key=\"ci\",outcome=\"error\"} 0\n"),
      std::string::npos)
      << m;
  EXPECT_NE(
      m.find(
          "factory_endpoint_key_requests_total{tenant=\"t5\",key=\"app\",outcome=\"error\"} 1\n"),
      std::string::npos)
      << m;
  EXPECT_EQ(promtool_complaints(m), "") << m;

  // Without the coordinator a revocation could go unheard: named keys are
  // refused 3 s after the agent's session ends, the tenant's own key keeps
  // serving, and the next session brings the named keys back.
  const std::string ops = made({"--key-name", "ops"});
  EXPECT_EQ(call(dir_.path(), ca, url + "/v1/models", ops).status, 200);
  const auto down = std::chrono::steady_clock::now();  // the session ends after this
  h.stop();
  bool closed = eventually(
      [&] { return call(dir_.path(), ca, url + "/v1/models", ops).status == 401; }, 10s, 100ms);
  const auto closed_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - down)
          .count();
  EXPECT_TRUE(closed) << "a named key still served 10 s into the outage";
  EXPECT_GE(closed_ms, 2900) << "refused before the 3 s grace";
  std::cout << "named key refused " << closed_ms << " ms after the coordinator stopped\n";
  EXPECT_EQ(call(dir_.path(), ca, url + "/v1/models", own).status, 200)
      << "the default key serves through the outage";
  h.start();
  EXPECT_TRUE(eventually(
      [&] { return call(dir_.path(), ca, url + "/v1/models", ops).status == 200; }, 30s, 200ms))
      << "the named key is back with the next session";
  runner.stop();
}

// A tier without login still lets the admin in with a key of their own:
// key-only, no password, and then an SSH Service.
TEST_F(Tenants, AnAdminKeyGivesKeyOnlyLoginToAModelEndpoint) {
  allowlist();
  // The fixture passes --ssh-key; --model serves another model than the tier's.
  auto r = create("t6", "model-endpoint", {"--model", "qwen2.5:0.5b"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("password of ubuntu"), std::string::npos) << r.output;
  json ud = live_user_data(kube_, "t6");
  EXPECT_FALSE(ud.contains("chpasswd"));
  EXPECT_EQ(ud.value("ssh_pwauth", true), false);
  ASSERT_EQ(ud["users"].size(), 1u) << ud.dump(2);
  EXPECT_EQ(ud["users"][0]["lock_passwd"], true);
  EXPECT_EQ(ud["users"][0]["ssh_authorized_keys"].size(), 1u);
  std::vector<std::string> steps;
  const json t6 = show("t6");  // named: a temporary's member would dangle in the loop
  for (const auto& st : t6["plan_steps"]) steps.push_back(st.value("id", ""));
  EXPECT_EQ(steps, (std::vector<std::string>{"gpu-present", "nvidia-driver", "ollama",
                                             "model-qwen2.5:0.5b"}));
  auto objects = objects_of(kube_, "tenants", "t6");
  EXPECT_NE(std::find(objects.begin(), objects.end(), "services/t6-ssh"), objects.end());
  // Its key is there before any guest runs; a tenant without an endpoint has none.
  auto c = coordinator().factory({"tenant", "credentials", "t6", "-o", "json"});
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(json::parse(c.output).value("api_key", "").rfind("fmk-", 0), 0u) << c.output;
  ASSERT_EQ(create("tenant-1", "gpu-vm").exit_code, 0);
  auto none = coordinator().factory({"tenant", "credentials", "tenant-1"});
  expect_one_line_failure(none, "serves no model endpoint");
}

// What --dry-run prints for the tier validates against the real schemas:
// the key Secret, the VirtualMachine, the endpoint Service, and no SSH Service.
TEST(TenantsDryRun, TheModelEndpointTierValidatesAgainstTheRealSchemas) {
  TempDir dir("tenants-dry-endpoint");
  fs::create_directories(dir / "home");
  write_text(dir / "coordinator.yaml",
             "state_dir: " + (dir / "state").string() +
                 "\nexternal_url: wss://factory.example:8443\napi:\n  listen: 127.0.0.1:" +
                 std::to_string(free_loopback_port()) +
                 "\nkube:\n  kubeconfig: " + (dir / "no-such-kubeconfig").string() + "\n");
  auto r = run({factory_bin(), "--config", (dir / "coordinator.yaml").string(), "tenant", "create",
                "t5", "--tier", "model-endpoint", "--dry-run", "-o", "yaml"},
               30s, {{"HOME", (dir / "home").string()}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  write_text(dir / "objects.yaml", r.output);
  auto v = validate_k8s_files({(dir / "objects.yaml").string()});
  EXPECT_EQ(v.exit_code, 0) << v.output;
  EXPECT_NE(v.output.find("(Secret t5-endpoint-key): valid"), std::string::npos) << v.output;
  EXPECT_NE(v.output.find("(VirtualMachine t5): valid"), std::string::npos) << v.output;
  EXPECT_NE(v.output.find("(Service t5-endpoint): valid"), std::string::npos) << v.output;
  EXPECT_EQ(r.output.find("t5-ssh"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("<API key: generated at apply time>"), std::string::npos) << r.output;
}
