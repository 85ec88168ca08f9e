#include "coordinator/tenants/cloud_init.hpp"

#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <optional>

#include "common/yaml_json.hpp"
#include "coordinator/enroll/tenant_name.hpp"
#include "coordinator/tenants/embedded_files.hpp"
#include "coordinator/tenants/k8s_names.hpp"

namespace factory::tenants {

using nlohmann::json;

namespace {

Error invalid_cloud_init(std::string message) {
  return Error(Errc::invalid_argument, std::move(message));
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

bool is_control(char c) {
  return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() &&
         (s.front() == ' ' || s.front() == '\t' || s.front() == '\r' || s.front() == '\n'))
    s.remove_prefix(1);
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n'))
    s.remove_suffix(1);
  return s;
}

// A text file's content as a YAML literal block round-trips it exactly: no
// leading blank space, no carriage returns, exactly one final newline.
std::string as_text_file(std::string_view s) {
  std::string out;
  for (char c : trim(s))
    if (c != '\r') out += c;
  out += '\n';
  return out;
}

// scheme://host[...]: the scheme wanted, a host, no blanks or control bytes.
Status validate_url(std::string_view what, std::string_view url, std::string_view scheme,
                    std::string_view example) {
  std::string shown = url.size() <= 200 ? std::string(url) : std::string(url.substr(0, 200)) + "…";
  for (char c : shown)
    if (is_control(c)) shown = "(not printable)";
  if (!starts_with(url, scheme))
    return invalid_cloud_init(std::string(what) + " '" + shown + "' must start with " +
                              std::string(scheme) + " (e.g. " + std::string(example) + ")");
  std::string_view rest = url.substr(scheme.size());
  if (rest.empty() || rest.front() == '/' || rest.front() == ':')
    return invalid_cloud_init(std::string(what) + " '" + shown + "' has no host");
  for (char c : url)
    if (is_control(c) || c == ' ')
      return invalid_cloud_init(std::string(what) + " contains a space or a control character");
  return {};
}

bool is_hex64(std::string_view s) {
  if (s.size() != 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  });
}

std::optional<std::string> base64_decode(std::string_view in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (in.empty() || in.size() % 4 != 0) return std::nullopt;
  size_t pad = 0;
  while (pad < 2 && !in.empty() && in[in.size() - 1 - pad] == '=') ++pad;
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < in.size() - pad; ++i) {
    int v = value(in[i]);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

// Key types OpenSSH on Ubuntu 24.04 accepts for login. ssh-dss is left out on
// purpose: OpenSSH disables it, so such a key would be written and then fail.
constexpr std::array<std::string_view, 7> kKeyTypes = {"ssh-ed25519",
                                                       "ssh-rsa",
                                                       "ecdsa-sha2-nistp256",
                                                       "ecdsa-sha2-nistp384",
                                                       "ecdsa-sha2-nistp521",
                                                       "sk-ssh-ed25519@openssh.com",
                                                       "sk-ecdsa-sha2-nistp256@openssh.com"};

bool is_placeholder(std::string_view value, std::string_view placeholder) {
  return value == placeholder;
}

// Replaces whole-scalar "{{ name }}" placeholders in `node`, recording which
// names were used. A "{{" anywhere else is a template mistake, not text.
Status substitute(json& node, const std::map<std::string, json>& values,
                  std::map<std::string, int>& used, const std::string& where) {
  if (node.is_object()) {
    for (auto& [k, v] : node.items())
      if (auto st = substitute(v, values, used, where + "." + k); !st.ok()) return st;
  } else if (node.is_array()) {
    for (size_t i = 0; i < node.size(); ++i)
      if (auto st = substitute(node[i], values, used, where + "[" + std::to_string(i) + "]");
          !st.ok())
        return st;
  } else if (node.is_string()) {
    std::string_view s = node.get_ref<const std::string&>();
    if (s.find("{{") == std::string_view::npos && s.find("}}") == std::string_view::npos) return {};
    std::string_view t = trim(s);
    if (!starts_with(t, "{{") || t.size() < 4 || t.substr(t.size() - 2) != "}}")
      return Error(Errc::internal,
                   "user-data template: " + where +
                       ": a placeholder must be the whole value, as \"{{ name }}\"");
    std::string name(trim(t.substr(2, t.size() - 4)));
    auto it = values.find(name);
    if (it == values.end())
      return Error(Errc::internal,
                   "user-data template: " + where + ": no value for placeholder '" + name + "'");
    ++used[name];
    node = it->second;
  }
  return {};
}

}  // namespace

Status validate_ssh_public_key(std::string_view key) {
  if (key.find("PRIVATE KEY") != std::string_view::npos)
    return invalid_cloud_init("that is a private key: give the public key (the .pub file)");
  for (char c : key)
    if (is_control(c) && c != '\t')
      return invalid_cloud_init("an SSH public key must be one line of printable text");
  std::string_view k = trim(key);
  size_t sp = k.find_first_of(" \t");
  std::string_view type = k.substr(0, sp);
  if (std::find(kKeyTypes.begin(), kKeyTypes.end(), type) == kKeyTypes.end()) {
    std::string shown = type.size() <= 40 ? std::string(type) : std::string(type.substr(0, 40));
    if (type == "ssh-dss")
      return invalid_cloud_init(
          "DSA SSH keys are refused by OpenSSH on Ubuntu 24.04: use an ed25519 key");
    return invalid_cloud_init("not an OpenSSH public key (it starts with '" + shown +
                              "', not a key type such as ssh-ed25519 or ssh-rsa; authorized_keys "
                              "options are not supported)");
  }
  if (sp == std::string_view::npos)
    return invalid_cloud_init("SSH public key has no key data after its type");
  std::string_view rest = trim(k.substr(sp));
  std::string_view blob = rest.substr(0, rest.find_first_of(" \t"));
  auto raw = base64_decode(blob);
  // The blob is the SSH wire form: length-prefixed fields that use it up
  // exactly, the first naming the type again. Anything else is a truncated
  // or mangled paste, which would be written and then never let anyone in.
  std::vector<std::string_view> fields;
  bool well_formed = raw.has_value();
  if (raw) {
    std::string_view b = *raw;
    while (well_formed && !b.empty()) {
      if (b.size() < 4) {
        well_formed = false;
        break;
      }
      uint32_t len = (static_cast<uint32_t>(static_cast<unsigned char>(b[0])) << 24) |
                     (static_cast<uint32_t>(static_cast<unsigned char>(b[1])) << 16) |
                     (static_cast<uint32_t>(static_cast<unsigned char>(b[2])) << 8) |
                     static_cast<uint32_t>(static_cast<unsigned char>(b[3]));
      if (len > b.size() - 4) {
        well_formed = false;
        break;
      }
      fields.push_back(b.substr(4, len));
      b.remove_prefix(4 + len);
    }
  }
  // Fields after the type: ed25519 the 32-byte key; RSA e and n; ECDSA the
  // curve and the point; security keys add the application.
  size_t want = type == "ssh-ed25519"           ? 2
                : starts_with(type, "sk-ecdsa") ? 4
                : starts_with(type, "sk-ssh-ed25519") || starts_with(type, "ssh-rsa") ||
                        starts_with(type, "ecdsa")
                    ? 3
                    : 0;
  well_formed = well_formed && want > 0 && fields.size() == want && fields[0] == type;
  if (well_formed && (type == "ssh-ed25519" || type == "sk-ssh-ed25519@openssh.com"))
    well_formed = fields[1].size() == 32;
  if (!well_formed)
    return invalid_cloud_init(
        "SSH public key of type " + std::string(type) +
        " has key data that is not valid for that type (truncated or mangled?)");
  return {};
}

Result<std::vector<std::string>> parse_ssh_public_keys(std::string_view text,
                                                       std::string_view source) {
  std::vector<std::string> keys;
  if (text.find("PRIVATE KEY") != std::string_view::npos)
    return invalid_cloud_init(std::string(source) +
                              ": that is a private key: give the public key (.pub)");
  size_t line_no = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    std::string_view line =
        text.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start);
    ++line_no;
    std::string_view t = trim(line);
    if (!t.empty() && t.front() != '#') {
      if (auto st = validate_ssh_public_key(t); !st.ok())
        return st.error().with_context(std::string(source) + " line " + std::to_string(line_no));
      keys.emplace_back(t);
    }
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  if (keys.empty()) return invalid_cloud_init(std::string(source) + ": no SSH public key in it");
  return keys;
}

Status validate_cloud_init_params(const CloudInitParams& p) {
  if (auto st = enroll::validate_tenant_name(p.tenant); !st.ok()) return st;
  if (!is_dns1123_label(p.hostname))
    return invalid_cloud_init("invalid hostname '" + p.hostname.substr(0, 100) +
                              "': want a DNS-1123 label (normally the tenant's name)");
  if (p.ssh_authorized_keys.empty() && p.login)
    return invalid_cloud_init(
        "no SSH public key for the ubuntu user: pass --ssh-key FILE (a .pub file)");
  for (size_t i = 0; i < p.ssh_authorized_keys.size(); ++i)
    if (auto st = validate_ssh_public_key(p.ssh_authorized_keys[i]); !st.ok())
      return st.error().with_context("SSH key " + std::to_string(i + 1));
  if (!p.login) {
    if (!p.password.empty())
      return invalid_cloud_init(
          "this tier has no login: a password for the ubuntu user cannot be set");
  } else if (p.password.empty()) {
    return invalid_cloud_init("empty password for the ubuntu user");
  }
  if (p.password.size() > 256)
    return invalid_cloud_init("password for the ubuntu user is over 256 bytes");
  if (std::any_of(p.password.begin(), p.password.end(), is_control))
    return invalid_cloud_init("password for the ubuntu user contains a control character");
  if (auto st = validate_url("coordinator URL", p.coordinator_url, "wss://",
                             "wss://factory.example:8443");
      !st.ok())
    return st;
  if (auto st = validate_url("agent binary URL", p.agent_binary_url, "https://",
                             "https://factory.example:8443/v1/agent/binary");
      !st.ok())
    return st;
  if (!is_placeholder(p.ca_pem, kCaPemPlaceholder)) {
    if (p.ca_pem.find("PRIVATE KEY") != std::string::npos)
      return invalid_cloud_init(
          "the coordinator CA given contains a private key: give only the certificate");
    if (p.ca_pem.find("-----BEGIN CERTIFICATE-----") == std::string::npos ||
        p.ca_pem.find("-----END CERTIFICATE-----") == std::string::npos)
      return invalid_cloud_init(
          "the coordinator CA is not a PEM certificate (no BEGIN/END CERTIFICATE)");
    for (char c : p.ca_pem)
      if (is_control(c) && c != '\n' && c != '\r')
        return invalid_cloud_init("the coordinator CA certificate contains a control character");
  }
  if (!is_placeholder(p.bootstrap_token, kBootstrapTokenPlaceholder)) {
    if (p.bootstrap_token.empty()) return invalid_cloud_init("no bootstrap token for the agent");
    if (p.bootstrap_token.size() > 4096)
      return invalid_cloud_init("bootstrap token is over 4096 bytes");
    for (char c : p.bootstrap_token)
      if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f)
        return invalid_cloud_init("bootstrap token contains a blank or a non-ASCII character");
  }
  if (!is_placeholder(p.agent_sha256, kAgentSha256Placeholder) && !is_hex64(p.agent_sha256))
    return invalid_cloud_init(
        "agent SHA-256 must be 64 hex digits (the hash of the agent binary served)");
  return {};
}

Result<std::string> render_template(std::string_view tmpl,
                                    const std::map<std::string, json>& values,
                                    const std::vector<std::string>& header_comment,
                                    const std::function<void(json&)>& edit) {
  static constexpr std::string_view kHeader = "#cloud-config\n";
  // cloud-init picks the user-data format by its first line.
  if (!starts_with(tmpl, kHeader))
    return Error(Errc::internal, "user-data template does not start with \"#cloud-config\"");
  auto doc = parse_yaml(std::string(tmpl), "user-data template");
  if (!doc) return Error(Errc::internal, doc.error().message);
  if (!doc->is_object()) return Error(Errc::internal, "user-data template is not a YAML mapping");

  std::map<std::string, int> used;
  if (auto st = substitute(*doc, values, used, "user-data"); !st.ok()) return st.error();
  for (const auto& [name, v] : values)
    if (!used.count(name))
      return Error(Errc::internal, "user-data template has no placeholder \"{{ " + name +
                                       " }}\"; it is out of date");
  if (edit) edit(*doc);

  std::string text(kHeader);
  for (const auto& line : header_comment) {
    for (char c : line)
      if (c == '\n' || c == '\r')
        return Error(Errc::internal, "user-data header comment spans lines");
    text += "# " + line + "\n";
  }
  text += to_yaml(*doc);

  // The emitter is trusted only as far as it is checked: the text must read
  // back as the document we built, or a value was mangled on the way out.
  auto back = parse_yaml(text, "rendered user-data");
  if (!back || *back != *doc)
    return Error(Errc::internal,
                 "rendered user-data does not read back as the document built from the template; "
                 "a value did not survive YAML emission");
  return text;
}

Result<RenderedUserData> render_user_data(const CloudInitParams& p) {
  if (auto st = validate_cloud_init_params(p); !st.ok()) return st.error();

  RenderedUserData out;
  if (is_placeholder(p.password, kPasswordPlaceholder)) out.placeholders.push_back("password");
  if (is_placeholder(p.bootstrap_token, kBootstrapTokenPlaceholder))
    out.placeholders.push_back("bootstrap_token");
  if (is_placeholder(p.ca_pem, kCaPemPlaceholder)) out.placeholders.push_back("ca_pem");
  if (is_placeholder(p.agent_sha256, kAgentSha256Placeholder))
    out.placeholders.push_back("agent_sha256");

  // The agent's --config; key names are agent/cli/config.hpp's.
  json agent_config = {{"coordinator_url", p.coordinator_url},
                       {"ca_file", kGuestCaFile},
                       {"token_file", kGuestTokenFile},
                       {"state_dir", kGuestAgentStateDir}};

  json keys = json::array();
  for (const auto& k : p.ssh_authorized_keys) keys.push_back(std::string(trim(k)));

  std::string sha = p.agent_sha256;
  if (!is_placeholder(sha, kAgentSha256Placeholder))
    std::transform(sha.begin(), sha.end(), sha.begin(),
                   [](char c) { return static_cast<char>(std::tolower(c)); });

  std::map<std::string, json> values = {
      {"hostname", p.hostname},
      // Without login the template's chpasswd (the only place it goes) is removed below.
      {"password", p.login ? p.password : std::string("<none: no login>")},
      {"ssh_authorized_keys", keys},
      {"agent_config", to_yaml(agent_config)},
      {"ca_pem", as_text_file(p.ca_pem)},
      // No newline: the agent reads the file whole, and a token is one word.
      {"bootstrap_token", p.bootstrap_token},
      // `sha256sum -c` form: "<hash>  <path>".
      {"agent_sha256", sha + "  " + kGuestAgentBinary + "\n"},
      {"agent_unit", as_text_file(agent_unit_file())},
      {"agent_binary_url", p.agent_binary_url},
  };

  std::vector<std::string> header = {"Factory user-data for tenant " + p.tenant +
                                     ", rendered from cloud-init/user-data.yaml.tmpl."};
  if (out.has_placeholders()) {
    std::string names;
    for (const auto& n : out.placeholders) names += (names.empty() ? "" : ", ") + n;
    header.push_back("DRY RUN: placeholders stand in for " + names +
                     "; this user-data cannot boot an agent as it is.");
  }

  std::function<void(json&)> edit;
  if (!p.login) {
    header.push_back(keys.empty() ? "No login: nobody can log in to this guest."
                                  : "No login but the admin's SSH keys (key only).");
    edit = [has_keys = !keys.empty()](json& doc) {
      doc.erase("chpasswd");
      doc["ssh_pwauth"] = false;
      if (!has_keys) {
        // A users list without "default" keeps cloud-init from making the
        // image's default user (ubuntu, with sudo); an empty list is not
        // valid cloud-config, so the list holds one system account that
        // nobody can log in as: no password, no key, no shell.
        doc["users"] = json::array({json{{"name", "factory"},
                                         {"gecos", "Factory (no login)"},
                                         {"system", true},
                                         {"lock_passwd", true},
                                         {"shell", "/usr/sbin/nologin"}}});
        return;
      }
      for (auto& u : doc["users"]) u["lock_passwd"] = true;
    };
  }
  auto text = render_template(user_data_template(), values, header, edit);
  if (!text) return text.error();
  if (text->size() > kMaxUserDataBytes)
    return invalid_cloud_init(
        "rendered user-data is " + std::to_string(text->size()) + " bytes, over the " +
        std::to_string(kMaxUserDataBytes) +
        " allowed (a Secret holds at most 1 MiB): fewer or shorter SSH keys?");
  out.text = std::move(*text);
  return out;
}

Result<std::string> generate_password(size_t length) {
  static constexpr std::string_view kAlphabet =
      "abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
  // Rejection sampling keeps every character equally likely: bytes at or
  // above the largest multiple of the alphabet size are drawn again.
  const unsigned limit = 256 - (256 % kAlphabet.size());
  std::string out;
  std::array<unsigned char, 64> buf{};
  while (out.size() < length) {
    if (RAND_bytes(buf.data(), static_cast<int>(buf.size())) != 1)
      return Error(Errc::internal, "cannot generate a password: OpenSSL's random generator failed");
    for (unsigned char b : buf) {
      if (b >= limit) continue;
      out += kAlphabet[b % kAlphabet.size()];
      if (out.size() == length) break;
    }
  }
  return out;
}

}  // namespace factory::tenants
