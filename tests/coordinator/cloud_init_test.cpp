// The tenant VM's cloud-init user-data: checked by Debian's real
// `cloud-init schema`, read back by PyYAML (the parser cloud-init uses) to
// prove every value survives YAML emission, file modes and contents as the
// guest will get them, and the first-boot install script run for real on a
// directory tree with curl and systemctl stand-ins.
#include "coordinator/tenants/cloud_init.hpp"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "agent/cli/config.hpp"
#include "common/atomic_file.hpp"
#include "coordinator/tenants/embedded_files.hpp"
#include "tests/coordinator/tenant_test_data.hpp"

namespace factory::testing {
namespace {

using nlohmann::json;
using namespace factory::tenants;
namespace fs = std::filesystem;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string sha256_hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EXPECT_EQ(EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr), 1);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

RenderedUserData render_ok(const CloudInitParams& p) {
  auto r = render_user_data(p);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? *r : RenderedUserData{};
}

// Runs `cloud-init schema` and expects a clean pass: valid, and no deprecation
// warnings (cloud-init exits 0 on those, but they become errors later).
void expect_cloud_init_valid(const std::string& text, const TempDir& dir, const std::string& what) {
  auto file = dir / "user-data.yaml";
  write_text(file, text);
  auto r = cloud_init_schema(file);
  EXPECT_TRUE(r.ok()) << what << ": cloud-init schema " << r.describe() << ":\n" << r.output;
  EXPECT_NE(r.output.find("Valid cloud-config"), std::string::npos) << what << ":\n" << r.output;
  EXPECT_EQ(lower(r.output).find("deprecat"), std::string::npos) << what << ":\n" << r.output;
}

// The document as PyYAML (cloud-init's parser) reads it, as JSON.
json read_with_pyyaml(const std::string& text, const TempDir& dir) {
  auto file = dir / "pyyaml-input.yaml";
  write_text(file, text);
  auto r = run({debian_python(), "-c",
                "import json, sys, yaml\n"
                "print(json.dumps(yaml.safe_load(open(sys.argv[1], encoding='utf-8'))))\n",
                file.string()});
  EXPECT_TRUE(r.ok()) << "PyYAML could not read the user-data (" << r.describe() << "):\n"
                      << r.output;
  try {
    return json::parse(r.output);
  } catch (const json::exception& e) {
    ADD_FAILURE() << "PyYAML output is not JSON: " << e.what() << "\n" << r.output;
    return nullptr;
  }
}

json parsed(const std::string& text) {
  auto j = parse_yaml(text, "user-data");
  EXPECT_TRUE(j.ok()) << (j.ok() ? "" : j.error().message);
  return j.ok() ? *j : json();
}

const json& write_file(const json& doc, const std::string& path) {
  static const json none;
  for (const auto& f : doc["write_files"])
    if (f["path"] == path) return f;
  ADD_FAILURE() << "no write_files entry for " << path;
  return none;
}

TEST(CloudInit, RenderedUserDataPassesCloudInitSchema) {
  TempDir dir("ci");
  auto ud = render_ok(sample_cloud_init_params());
  ASSERT_EQ(ud.text.rfind("#cloud-config\n", 0), 0u) << "cloud-init needs the header first";
  EXPECT_FALSE(ud.has_placeholders());
  EXPECT_EQ(ud.text.find("DRY RUN"), std::string::npos);
  expect_cloud_init_valid(ud.text, dir, "tenant-1 user-data");
}

TEST(CloudInit, SchemaCheckIsRealAndCatchesMistakes) {
  // The same check on broken user-data fails: the validator is not a no-op.
  TempDir dir("ci-neg");
  auto file = dir / "bad.yaml";
  write_text(file, "#cloud-config\nwrite_files:\n  - path: /x\n    permissions: 0600\n");
  auto r = cloud_init_schema(file);
  EXPECT_FALSE(r.ok()) << r.output;
  EXPECT_NE(r.output.find("permissions"), std::string::npos) << r.output;
}

TEST(CloudInit, DryRunPlaceholdersAreMarkedAndStillValid) {
  TempDir dir("ci-dry");
  auto p = sample_cloud_init_params();
  p.bootstrap_token = std::string(kBootstrapTokenPlaceholder);
  p.password = std::string(kPasswordPlaceholder);
  p.ca_pem = std::string(kCaPemPlaceholder);
  p.agent_sha256 = std::string(kAgentSha256Placeholder);
  auto ud = render_ok(p);
  EXPECT_EQ(ud.placeholders,
            (std::vector<std::string>{"password", "bootstrap_token", "ca_pem", "agent_sha256"}));
  // Marked twice: by the values themselves, and in a comment at the top.
  EXPECT_NE(ud.text.find("# DRY RUN: placeholders stand in for password, bootstrap_token, ca_pem, "
                         "agent_sha256"),
            std::string::npos)
      << ud.text;
  json doc = parsed(ud.text);
  EXPECT_EQ(write_file(doc, kGuestTokenFile)["content"], kBootstrapTokenPlaceholder);
  EXPECT_EQ(doc["chpasswd"]["users"][0]["password"], kPasswordPlaceholder);
  expect_cloud_init_valid(ud.text, dir, "dry-run user-data");

  // Only the exact placeholder is accepted in place of a token.
  p.bootstrap_token = "<bootstrap token>";
  auto bad = render_user_data(p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("bootstrap token"), std::string::npos);
}

TEST(CloudInit, FarUnderTheSecretLimit) {
  auto ud = render_ok(sample_cloud_init_params());
  EXPECT_LT(ud.text.size(), 64u * 1024) << "user-data must stay far under a Secret's 1 MiB";
  EXPECT_LT(ud.text.size(), 16u * 1024) << "the agent binary must not be embedded";

  // Absurd input is refused, not shipped.
  auto p = sample_cloud_init_params();
  p.ssh_authorized_keys.assign(200, kTestRsaKey);
  auto r = render_user_data(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("bytes, over the 65536 allowed"), std::string::npos)
      << r.error().message;
}

TEST(CloudInit, FilesHaveTheRightModesAndContents) {
  auto p = sample_cloud_init_params();
  p.agent_sha256 = "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08";
  auto ud = render_ok(p);
  json doc = parsed(ud.text);

  std::map<std::string, std::string> modes;
  for (const auto& f : doc["write_files"]) {
    modes[f["path"]] = f["permissions"];
    EXPECT_EQ(f["owner"], "root:root") << f["path"];
  }
  EXPECT_EQ(modes, (std::map<std::string, std::string>{
                       {"/etc/factory/agent.yaml", "0644"},
                       {"/etc/factory/ca.crt", "0644"},
                       {"/etc/factory/bootstrap-token", "0600"},
                       {"/etc/factory/agent.sha256", "0644"},
                       {"/etc/systemd/system/factory-agent.service", "0644"},
                       {"/usr/local/lib/factory/install-agent.sh", "0755"}}));

  EXPECT_EQ(write_file(doc, kGuestCaFile)["content"], kTestCaPem);
  EXPECT_EQ(write_file(doc, kGuestTokenFile)["content"], p.bootstrap_token);
  EXPECT_EQ(write_file(doc, kGuestAgentSha256File)["content"],
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  "
            "/usr/local/bin/factory-agent\n")
      << "lower-case, in `sha256sum -c` form";
  EXPECT_EQ(write_file(doc, kGuestAgentUnit)["content"],
            slurp(source_dir() / "deploy" / "factory-agent.service"));

  auto agent_yaml = parse_yaml(write_file(doc, kGuestAgentConfig)["content"], "agent.yaml");
  ASSERT_TRUE(agent_yaml.ok());
  EXPECT_EQ(*agent_yaml, json({{"coordinator_url", "wss://factory.example:8443"},
                               {"ca_file", "/etc/factory/ca.crt"},
                               {"token_file", "/etc/factory/bootstrap-token"},
                               {"state_dir", "/var/lib/factory-agent"}}));

  // The login setup of the runbook.
  EXPECT_EQ(doc["ssh_pwauth"], true);
  EXPECT_EQ(doc["hostname"], "tenant-1");
  EXPECT_EQ(doc["chpasswd"], json::parse(R"({"expire": false, "users": [
      {"name": "ubuntu", "password": "Xq7mR2pLk9vT4wZs8nHc", "type": "text"}]})"));
  ASSERT_EQ(doc["users"].size(), 1u);
  const auto& u = doc["users"][0];
  EXPECT_EQ(u["name"], "ubuntu");
  EXPECT_EQ(u["sudo"], "ALL=(ALL) NOPASSWD:ALL");
  EXPECT_EQ(u["shell"], "/bin/bash");
  EXPECT_EQ(u["lock_passwd"], false);
  EXPECT_EQ(u["ssh_authorized_keys"], json({kTestEd25519Key, kTestRsaKey}));

  // One argv entry: cloud-init quotes each element, no shell parses the URL.
  EXPECT_EQ(doc["runcmd"], json::parse(R"([["/bin/sh", "/usr/local/lib/factory/install-agent.sh",
                                            "https://factory.example:8443/v1/agent/binary"]])"));
}

TEST(CloudInit, AgentConfigIsReadByTheAgentsOwnLoader) {
  TempDir dir("ci-agentcfg");
  json doc = parsed(render_ok(sample_cloud_init_params()).text);
  auto file = dir / "agent.yaml";
  write_text(file, write_file(doc, kGuestAgentConfig)["content"].get<std::string>());
  agent::AgentConfig cfg;
  auto st = agent::load_agent_config_file(file.string(), cfg);
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_TRUE(agent::validate(cfg).ok());
  EXPECT_EQ(cfg.coordinator_url, "wss://factory.example:8443");
  EXPECT_EQ(cfg.ca_file, kGuestCaFile);
  EXPECT_EQ(cfg.token_file, kGuestTokenFile);
  EXPECT_EQ(cfg.state_dir, kGuestAgentStateDir);
}

TEST(CloudInit, AwkwardValuesSurviveYamlAsCloudInitReadsIt) {
  // Values that YAML would retype, cut or misread if pasted into the text.
  TempDir dir("ci-escape");
  auto p = sample_cloud_init_params();
  const std::vector<std::string> passwords = {"yes",
                                              "null",
                                              "0644",
                                              "- item",
                                              "key: value",
                                              "#not a comment",
                                              " leading",
                                              "trailing ",
                                              "quote\"s and 'single'",
                                              "back\\slash",
                                              "{{ hostname }}",
                                              "пароль-ünï",
                                              "a: b # c",
                                              "*alias",
                                              "!tag",
                                              "%percent",
                                              "@at",
                                              "`tick`",
                                              "[x]",
                                              "{y: z}",
                                              "~",
                                              "..."};
  for (const auto& pw : passwords) {
    p.password = pw;
    auto ud = render_user_data(p);
    ASSERT_TRUE(ud.ok()) << pw << ": " << ud.error().message;
    json ours = parsed(ud->text);
    json theirs = read_with_pyyaml(ud->text, dir);
    EXPECT_EQ(theirs["chpasswd"]["users"][0]["password"], pw) << ud->text;
    EXPECT_EQ(theirs, ours) << "PyYAML and yaml-cpp disagree for password '" << pw
                            << "': " << json::diff(ours, theirs).dump();
  }
  p.password = "a: b # c";
  expect_cloud_init_valid(render_ok(p).text, dir, "awkward password");
}

TEST(CloudInit, WholeDocumentReadsTheSameWithPyYaml) {
  TempDir dir("ci-pyyaml");
  auto ud = render_ok(sample_cloud_init_params());
  json theirs = read_with_pyyaml(ud.text, dir);
  EXPECT_EQ(theirs, parsed(ud.text)) << json::diff(parsed(ud.text), theirs).dump(2);
}

TEST(CloudInit, BadParametersGetOneClearLine) {
  auto expect_invalid = [](CloudInitParams p, const std::string& needle) {
    auto r = render_user_data(p);
    ASSERT_FALSE(r.ok()) << "accepted: " << needle;
    EXPECT_EQ(r.error().code, Errc::invalid_argument) << r.error().message;
    EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
    EXPECT_EQ(r.error().message.find('\n'), std::string::npos) << r.error().message;
  };
  auto p = sample_cloud_init_params();
  p.tenant = "Tenant 1";
  expect_invalid(p, "invalid tenant name");
  p = sample_cloud_init_params();
  p.hostname = "host_1";
  expect_invalid(p, "invalid hostname");
  p = sample_cloud_init_params();
  p.ssh_authorized_keys.clear();
  expect_invalid(p, "--ssh-key");
  p = sample_cloud_init_params();
  p.ssh_authorized_keys = {"-----BEGIN OPENSSH PRIVATE KEY-----"};
  expect_invalid(p, "private key");
  p = sample_cloud_init_params();
  p.ssh_authorized_keys = {std::string(kTestEd25519Key).substr(0, 40)};
  expect_invalid(p, "truncated or mangled");
  p = sample_cloud_init_params();
  p.ssh_authorized_keys = {"ssh-dss AAAAB3NzaC1kc3MAAACBAP x"};
  expect_invalid(p, "DSA");
  p = sample_cloud_init_params();
  p.ssh_authorized_keys = {"ssh-rsa " + std::string(kTestEd25519Key).substr(12)};
  expect_invalid(p, "not valid for that type");
  p = sample_cloud_init_params();
  p.password = "two\nlines";
  expect_invalid(p, "control character");
  p = sample_cloud_init_params();
  p.password = "";
  expect_invalid(p, "empty password");
  p = sample_cloud_init_params();
  p.coordinator_url = "https://factory.example:8443";
  expect_invalid(p, "must start with wss://");
  p = sample_cloud_init_params();
  p.coordinator_url = "wss://";
  expect_invalid(p, "has no host");
  p = sample_cloud_init_params();
  p.agent_binary_url = "http://factory.example/v1/agent/binary";
  expect_invalid(p, "must start with https://");
  p = sample_cloud_init_params();
  p.agent_binary_url = "https://factory.example/v1/agent binary";
  expect_invalid(p, "space");
  p = sample_cloud_init_params();
  p.ca_pem =
      std::string(kTestCaPem) + "-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----\n";
  expect_invalid(p, "private key");
  p = sample_cloud_init_params();
  p.ca_pem = "not a certificate";
  expect_invalid(p, "not a PEM certificate");
  p = sample_cloud_init_params();
  p.bootstrap_token = "two words";
  expect_invalid(p, "bootstrap token");
  p = sample_cloud_init_params();
  p.bootstrap_token = "";
  expect_invalid(p, "no bootstrap token");
  p = sample_cloud_init_params();
  p.agent_sha256 = "abc";
  expect_invalid(p, "64 hex digits");
}

TEST(CloudInit, SshKeysFromAPubFile) {
  std::string text =
      std::string("# the admin's keys\n\n") + kTestEd25519Key + "\r\n  " + kTestRsaKey + "  \n";
  auto keys = parse_ssh_public_keys(text, "keys.pub");
  ASSERT_TRUE(keys.ok()) << keys.error().message;
  EXPECT_EQ(*keys, (std::vector<std::string>{kTestEd25519Key, kTestRsaKey}));

  auto none = parse_ssh_public_keys("# nothing\n\n", "empty.pub");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("empty.pub: no SSH public key"), std::string::npos);

  auto bad = parse_ssh_public_keys(std::string(kTestEd25519Key) + "\nnot-a-key AAAA\n", "k.pub");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("k.pub line 2"), std::string::npos) << bad.error().message;

  auto priv = parse_ssh_public_keys(
      "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----\n", "id");
  ASSERT_FALSE(priv.ok());
  EXPECT_NE(priv.error().message.find("private key"), std::string::npos);
}

TEST(CloudInit, GeneratedPasswordsAreRandomFromTheUnambiguousAlphabet) {
  std::set<std::string> seen;
  for (int i = 0; i < 50; ++i) {
    auto pw = generate_password();
    ASSERT_TRUE(pw.ok()) << pw.error().message;
    EXPECT_EQ(pw->size(), 20u);
    for (char c : *pw) {
      EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << *pw;
      EXPECT_EQ(std::string("0O1lI").find(c), std::string::npos) << "look-alike in " << *pw;
    }
    seen.insert(*pw);
  }
  EXPECT_EQ(seen.size(), 50u);
  auto longer = generate_password(64);
  ASSERT_TRUE(longer.ok());
  EXPECT_EQ(longer->size(), 64u);
}

TEST(CloudInit, TemplateEngineRefusesDrift) {
  const std::string tmpl = "#cloud-config\nhostname: \"{{ hostname }}\"\nruncmd: [\"{{ cmd }}\"]\n";
  auto ok = render_template(tmpl, {{"hostname", "h1"}, {"cmd", json::array({"a", "b"})}},
                            {"one comment"});
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(
      *ok,
      "#cloud-config\n# one comment\nhostname: \"h1\"\nruncmd:\n  -\n    - \"a\"\n    - \"b\"\n");

  auto missing = render_template(tmpl, {{"hostname", "h1"}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("no value for placeholder 'cmd'"), std::string::npos);

  auto unused = render_template(tmpl, {{"hostname", "h"}, {"cmd", "c"}, {"extra", "x"}});
  ASSERT_FALSE(unused.ok());
  EXPECT_NE(unused.error().message.find("{{ extra }}"), std::string::npos);

  auto partial =
      render_template("#cloud-config\nhostname: \"tenant-{{ name }}\"\n", {{"name", "1"}});
  ASSERT_FALSE(partial.ok());
  EXPECT_NE(partial.error().message.find("whole value"), std::string::npos);

  auto no_header = render_template("hostname: x\n", {});
  ASSERT_FALSE(no_header.ok());
  EXPECT_NE(no_header.error().message.find("#cloud-config"), std::string::npos);
}

TEST(CloudInit, CompiledInFilesMatchTheSourceTree) {
  EXPECT_EQ(user_data_template(), slurp(source_dir() / "cloud-init" / "user-data.yaml.tmpl"))
      << "cloud-init/user-data.yaml.tmpl changed: rebuild (cmake/embed_text.cmake embeds it)";
  EXPECT_EQ(agent_unit_file(), slurp(source_dir() / "deploy" / "factory-agent.service"))
      << "deploy/factory-agent.service changed: rebuild (cmake/embed_text.cmake embeds it)";
}

TEST(CloudInit, AgentUnitPassesSystemdAnalyzeVerify) {
  std::string analyze = which("systemd-analyze");
  ASSERT_FALSE(analyze.empty()) << "systemd-analyze (Debian's systemd package) is missing";
  TempDir dir("ci-unit");
  // verify also checks that ExecStart's binary exists; point it at one that
  // does here, and check the real path separately.
  std::string unit = std::string(agent_unit_file());
  const std::string exec =
      "ExecStart=/usr/local/bin/factory-agent --config /etc/factory/agent.yaml";
  auto at = unit.find(exec);
  ASSERT_NE(at, std::string::npos) << "ExecStart changed: " << unit;
  unit.replace(at, exec.size(), "ExecStart=/bin/true --config /etc/factory/agent.yaml");
  auto file = dir / "factory-agent.service";
  write_text(file, unit);
  auto r = run({analyze, "verify", file.string()});
  EXPECT_TRUE(r.ok()) << r.output;
  EXPECT_EQ(r.output, "") << "systemd-analyze warnings:\n" << r.output;
}

// Runs the install script from the rendered user-data on a directory tree,
// the way cloud-init's runcmd would, with stand-ins for curl and systemctl.
// Its PATH has nothing else of this machine's but the guest simulator's
// listed host tools, then its guards (`guestsim.sh host-tools`): a command
// the script gained that no stand-in answers fails the test at teardown.
class InstallScript : public ::testing::Test {
 protected:
  void SetUp() override {
    bin_ = dir_ / "bin";
    root_ = dir_ / "root";
    fs::create_directories(bin_);
    fs::create_directories(root_ / "etc" / "factory");
    binary_ = "#!/bin/sh\necho factory-agent stand-in\n";
    auto tools = run({(source_dir() / "tests/guestsim/guestsim.sh").string(), "host-tools",
                      (dir_ / "tools").string()});
    if (!tools.ok()) setup_failed("guestsim.sh host-tools: " + tools.output);
    host_path_ = tools.output.substr(0, tools.output.find('\n'));
  }
  void TearDown() override {
    EXPECT_EQ(slurp(dir_ / "tools/log/guarded.log"), "")
        << "the install script ran commands that reached a guard";
  }

  // Renders user-data with `sha` as the agent's hash and lays its files out
  // under root_, as write_files would.
  void lay_out(const std::string& sha) {
    auto p = sample_cloud_init_params();
    p.agent_sha256 = sha;
    lay_out(p);
  }
  void lay_out(const CloudInitParams& p) {
    doc_ = parsed(render_ok(p).text);
    for (const auto& f : doc_["write_files"]) {
      fs::path path = root_ / f["path"].get<std::string>().substr(1);
      fs::create_directories(path.parent_path());
      write_text(path, f["content"].get<std::string>());
      fs::permissions(
          path, static_cast<fs::perms>(std::stoi(f["permissions"].get<std::string>(), nullptr, 8)));
    }
  }

  void fake(const std::string& name, const std::string& body) {
    write_text(bin_ / name, "#!/bin/sh\n" + body);
    fs::permissions(bin_ / name, fs::perms::owner_all);
  }

  // curl: records its argv, and writes the stand-in binary to --output.
  void fake_curl(int exit_code = 0) {
    write_text(dir_ / "payload", binary_);
    fake("curl",
         "echo \"$@\" > '" + (dir_ / "curl.args").string() + "'\n" +
             (exit_code != 0
                  ? "echo 'curl: (22) The requested URL returned error: 503' >&2; exit " +
                        std::to_string(exit_code) + "\n"
                  : "out=''\nwhile [ $# -gt 0 ]; do\n"
                    "  if [ \"$1\" = --output ]; then out=\"$2\"; shift; fi\n  shift\ndone\n"
                    "cp '" +
                        (dir_ / "payload").string() + "' \"$out\"\n"));
    fake("systemctl", "echo \"$@\" >> '" + (dir_ / "systemctl.log").string() + "'\n");
  }

  CommandResult run_script() {
    auto runcmd = doc_["runcmd"][0];
    std::vector<std::string> argv;
    for (const auto& a : runcmd) argv.push_back(a);
    // The script lives at its guest path under root_.
    argv[1] = (root_ / argv[1].substr(1)).string();
    return run(
        argv, std::chrono::seconds(30),
        {{"PATH", bin_.string() + ":" + host_path_}, {"FACTORY_GUEST_ROOT", root_.string()}});
  }

  fs::path installed() const { return root_ / "usr/local/bin/factory-agent"; }

  bool leftovers() const {
    if (!fs::exists(root_ / "usr/local/bin")) return false;
    for (const auto& e : fs::directory_iterator(root_ / "usr/local/bin"))
      if (e.path().filename() != "factory-agent") return true;
    return false;
  }

  TempDir dir_{"install"};
  fs::path bin_, root_;
  std::string host_path_;
  std::string binary_;
  json doc_;
};

TEST_F(InstallScript, InstallsAndStartsTheAgentWhenTheHashMatches) {
  lay_out(sha256_hex(binary_));
  fake_curl();
  auto r = run_script();
  ASSERT_TRUE(r.ok()) << r.describe() << ":\n" << r.output;

  ASSERT_TRUE(fs::exists(installed()));
  EXPECT_EQ(slurp(installed()), binary_);
  EXPECT_EQ(fs::status(installed()).permissions() & fs::perms::mask, static_cast<fs::perms>(0755));
  EXPECT_FALSE(leftovers()) << "temporary download left behind";
  EXPECT_EQ(slurp(dir_ / "systemctl.log"), "daemon-reload\nenable --now factory-agent.service\n");

  // Fetched from the coordinator, trusting only its CA, over HTTPS only, with retries.
  std::string args = slurp(dir_ / "curl.args");
  EXPECT_NE(args.find("--cacert " + (root_ / "etc/factory/ca.crt").string()), std::string::npos)
      << args;
  EXPECT_NE(args.find("--proto =https"), std::string::npos) << args;
  EXPECT_NE(args.find("--fail"), std::string::npos) << args;
  EXPECT_NE(args.find("--retry "), std::string::npos) << args;
  EXPECT_NE(args.find("https://factory.example:8443/v1/agent/binary"), std::string::npos) << args;

  // The files the agent reads are there with their modes.
  EXPECT_EQ(fs::status(root_ / "etc/factory/bootstrap-token").permissions() & fs::perms::mask,
            fs::perms::owner_read | fs::perms::owner_write);
}

TEST_F(InstallScript, RefusesABinaryWhoseHashDoesNotMatch) {
  lay_out(sha256_hex("some other build\n"));
  fake_curl();
  auto r = run_script();
  EXPECT_FALSE(r.ok()) << r.output;
  EXPECT_NE(r.output.find("not installing it"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(installed())) << "a binary with the wrong hash was installed";
  EXPECT_FALSE(leftovers()) << "the rejected download was left behind";
  EXPECT_FALSE(fs::exists(dir_ / "systemctl.log")) << "systemctl ran after a failed check";
}

TEST_F(InstallScript, StopsWhenTheDownloadFails) {
  lay_out(sha256_hex(binary_));
  fake_curl(22);
  auto r = run_script();
  EXPECT_FALSE(r.ok()) << r.output;
  EXPECT_NE(r.output.find("503"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(installed()));
  EXPECT_FALSE(leftovers());
  EXPECT_FALSE(fs::exists(dir_ / "systemctl.log"));
}

// The whole fetch with the real curl against a real TLS server on loopback
// (tests/fakes/http_test_server.py, certificates from testpki.py): the
// download works when the server's certificate chains to the CA in the
// user-data, and nothing is installed when it does not.
class InstallScriptRealCurl : public InstallScript {
 protected:
  void SetUp() override {
    InstallScript::SetUp();
    curl_ = which("curl");
    ASSERT_FALSE(curl_.empty()) << "curl is not installed";
    pki_ = dir_ / "pki";
    fs::create_directories(pki_);
    auto testpki = (source_dir() / "tests/fakes/testpki.py").string();
    for (const auto& argv : std::vector<std::vector<std::string>>{
             {debian_python(), testpki, "ca", pki_.string(), "ca"},
             {debian_python(), testpki, "ca", pki_.string(), "other-ca"},
             {debian_python(), testpki, "cert", pki_.string(), "server", "ca", "127.0.0.1", "--san",
              "IP:127.0.0.1"}}) {
      auto r = run(argv);
      ASSERT_TRUE(r.ok()) << r.output;
    }
    auto port_file = dir_ / "port";
    server_ = Process({debian_python(), (source_dir() / "tests/fakes/http_test_server.py").string(),
                       "--port-file", port_file.string(), "--cert", (pki_ / "server.crt").string(),
                       "--key", (pki_ / "server.key").string()},
                      dir_ / "server.log");
    ASSERT_TRUE(eventually([&] { return fs::exists(port_file); })) << server_.log();
    port_ = slurp(port_file);
    // The real curl, but with no retries: the script's 60 x 10 s are for a
    // guest waiting for its coordinator, not for a test expecting a failure.
    fake("curl", "echo \"$@\" > '" + (dir_ / "curl.args").string() + "'\nexec " + curl_ +
                     " \"$@\" --retry 0\n");
    fake("systemctl", "echo \"$@\" >> '" + (dir_ / "systemctl.log").string() + "'\n");
  }

  CloudInitParams params(const std::string& ca_name, size_t bytes) {
    auto p = sample_cloud_init_params();
    p.ca_pem = slurp(pki_ / (ca_name + ".crt"));
    p.agent_binary_url = "https://127.0.0.1:" + port_ + "/big?bytes=" + std::to_string(bytes);
    p.agent_sha256 = sha256_hex(std::string(bytes, 'x'));  // what /big serves
    return p;
  }

  std::string curl_, port_;
  fs::path pki_;
  Process server_;
};

TEST_F(InstallScriptRealCurl, DownloadsOverTlsPinnedToTheUserDataCa) {
  lay_out(params("ca", 100000));
  auto r = run_script();
  ASSERT_TRUE(r.ok()) << r.describe() << ":\n" << r.output << "\nserver:\n" << server_.log();
  EXPECT_EQ(slurp(installed()), std::string(100000, 'x'));
  EXPECT_EQ(slurp(dir_ / "systemctl.log"), "daemon-reload\nenable --now factory-agent.service\n");
}

TEST_F(InstallScriptRealCurl, RefusesAServerItsCaDidNotSign) {
  lay_out(params("other-ca", 1000));
  auto r = run_script();
  EXPECT_FALSE(r.ok()) << r.output;
  EXPECT_NE(r.output.find("curl: (60)"), std::string::npos) << "want a certificate error:\n"
                                                            << r.output;
  EXPECT_FALSE(fs::exists(installed()));
  EXPECT_FALSE(leftovers());
  EXPECT_FALSE(fs::exists(dir_ / "systemctl.log"));
}

// A tier without login (model-endpoint): no password anywhere, password SSH
// off, no user to log in as; with an admin key, that key only and the password
// locked. Both pass cloud-init's schema; a password is refused outright.
TEST(CloudInit, NoLoginTierHasNoPasswordAndNoUserUnlessAnAdminKey) {
  TempDir dir("ci-nologin");
  auto p = sample_cloud_init_params("t5");
  p.login = false;
  p.ssh_authorized_keys.clear();
  p.password.clear();
  auto ud = render_ok(p);
  expect_cloud_init_valid(ud.text, dir, "no login");
  auto doc = factory::parse_yaml(ud.text, "user-data");
  ASSERT_TRUE(doc.ok());
  EXPECT_FALSE(doc->contains("chpasswd"));
  EXPECT_EQ((*doc)["ssh_pwauth"], false);
  ASSERT_EQ((*doc)["users"].size(), 1u) << "no \"default\": cloud-init makes no ubuntu user";
  const auto& u = (*doc)["users"][0];
  EXPECT_EQ(u["name"], "factory");
  EXPECT_EQ(u["lock_passwd"], true);
  EXPECT_EQ(u["shell"], "/usr/sbin/nologin");
  EXPECT_FALSE(u.contains("ssh_authorized_keys"));
  EXPECT_FALSE(u.contains("sudo"));
  EXPECT_EQ(ud.text.find("password"), std::string::npos) << ud.text;
  EXPECT_EQ(ud.text.find("<none"), std::string::npos) << "the stand-in value never leaves";

  p.ssh_authorized_keys = {kTestEd25519Key};
  auto keyed = render_ok(p);
  expect_cloud_init_valid(keyed.text, dir, "admin key only");
  auto kd = factory::parse_yaml(keyed.text, "user-data");
  ASSERT_TRUE(kd.ok());
  ASSERT_EQ((*kd)["users"].size(), 1u);
  EXPECT_EQ((*kd)["users"][0]["lock_passwd"], true);
  EXPECT_FALSE(kd->contains("chpasswd"));

  p.password = "Xq7mR2pLk9vT4wZs8nHc";
  auto refused = render_user_data(p);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("no login"), std::string::npos) << refused.error().message;
}

}  // namespace
}  // namespace factory::testing
