#pragma once
// The cloud-init user-data of a tenant VM: the runbook's login setup (the
// `ubuntu` user with the admin's SSH keys and a generated password) plus what
// the guest agent needs to phone home (coordinator URL, CA, one-time token,
// the agent binary's SHA-256), the agent's systemd unit, and a first-boot
// command that fetches the agent from the coordinator, checks its hash, and
// only then installs and starts it.
//
// Rendered from cloud-init/user-data.yaml.tmpl (compiled in, see
// embedded_files.hpp) as data, then emitted with to_yaml(): no value is
// pasted into YAML text. KubeVirt reads it from the Secret built by
// cloud_init_secret() in coordinator/kubevirt/objects.hpp.
#include <cstddef>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace factory::tenants {

// Paths in the guest. The agent reads agent.yaml (its --config); the others
// are named there or by the install script in the template.
inline constexpr const char* kGuestAgentConfig = "/etc/factory/agent.yaml";
inline constexpr const char* kGuestCaFile = "/etc/factory/ca.crt";
inline constexpr const char* kGuestTokenFile = "/etc/factory/bootstrap-token";
inline constexpr const char* kGuestAgentSha256File = "/etc/factory/agent.sha256";
inline constexpr const char* kGuestAgentBinary = "/usr/local/bin/factory-agent";
inline constexpr const char* kGuestAgentUnit = "/etc/systemd/system/factory-agent.service";
inline constexpr const char* kGuestAgentStateDir = "/var/lib/factory-agent";

// `factory tenant create --dry-run` creates no token and may have no CA or
// agent binary yet; it passes these instead. They are accepted only verbatim,
// look like nothing a real value could be, and are listed in
// RenderedUserData::placeholders and in a comment at the top of the document.
inline constexpr std::string_view kBootstrapTokenPlaceholder =
    "<bootstrap token: created at apply time>";
inline constexpr std::string_view kPasswordPlaceholder = "<password: generated at apply time>";
inline constexpr std::string_view kCaPemPlaceholder =
    "<coordinator CA certificate: read at apply time>";
inline constexpr std::string_view kAgentSha256Placeholder =
    "<agent SHA-256: computed at apply time>";

// The rendered user-data must fit a Secret (1 MiB) with a wide margin; in
// practice it is a few KiB (the agent binary is fetched, not embedded).
inline constexpr size_t kMaxUserDataBytes = 64 * 1024;

struct CloudInitParams {
  std::string tenant;                            // the tenant's name (a DNS-1123 label)
  std::string hostname;                          // the guest's hostname, normally the tenant's name
  std::vector<std::string> ssh_authorized_keys;  // OpenSSH public keys, one per entry
  std::string password;                          // for `ubuntu`; see generate_password()
  std::string coordinator_url;                   // wss://host:port the agent connects to
  std::string agent_binary_url;                  // https://host:port/v1/agent/binary
  std::string ca_pem;                            // the coordinator CA certificate (PEM)
  std::string bootstrap_token;                   // one-time enrollment token
  std::string agent_sha256;                      // hex SHA-256 of the agent binary served
  // false (a tier without login): no password and no chpasswd, password SSH
  // off, and the ubuntu user only when an admin key is given (key-only,
  // password locked); with no key, no login user at all (only a system
  // account without password, key or shell, so cloud-init makes no default user).
  bool login = true;
};

struct RenderedUserData {
  std::string text;                       // starts with "#cloud-config\n"
  std::vector<std::string> placeholders;  // params given as dry-run placeholders, by name
  bool has_placeholders() const { return !placeholders.empty(); }
};

// Checks every parameter (one line saying which is wrong and what to give).
Status validate_cloud_init_params(const CloudInitParams& params);

// Validates, renders user_data_template(), and checks the result: it must
// read back as exactly the document that was built, and fit kMaxUserDataBytes.
Result<RenderedUserData> render_user_data(const CloudInitParams& params);

// The engine under render_user_data(): parses `tmpl` (a "#cloud-config"
// document), replaces every scalar that is exactly "{{ name }}" by
// values[name], and emits it with `header_comment` lines after the
// "#cloud-config" line. Every placeholder must have a value and every value
// must be used, so the template and the code cannot drift apart silently.
// `edit`, when given, changes the substituted document before it is emitted.
Result<std::string> render_template(std::string_view tmpl,
                                    const std::map<std::string, nlohmann::json>& values,
                                    const std::vector<std::string>& header_comment = {},
                                    const std::function<void(nlohmann::json&)>& edit = nullptr);

// A random password for `ubuntu`: `length` characters from an alphabet
// without look-alikes (0/O, 1/l/I), about 5.8 bits each (20 → 116 bits).
Result<std::string> generate_password(size_t length = 20);

// OpenSSH public keys from an authorized_keys-style text (a .pub file or
// several): one key per non-empty, non-comment line, each checked (known
// type, its base64 blob naming the same type). `source` names the text in
// messages ("--ssh-key ~/.ssh/id_ed25519.pub"). At least one key.
Result<std::vector<std::string>> parse_ssh_public_keys(std::string_view text,
                                                       std::string_view source);
Status validate_ssh_public_key(std::string_view key);

}  // namespace factory::tenants
