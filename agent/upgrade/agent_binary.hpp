#pragma once
// Agent binaries as files: their SHA-256 (computed as the bytes go by), the
// version their mark says, the slots they are kept in, and the one switch
// that matters: binary_path made a symbolic link to a slot in one rename, so
// systemd's next ExecStart runs either the old binary or the new one, never
// a half-written one or nothing.
#include <openssl/evp.h>

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace factory::agent {

// SHA-256 over bytes given in pieces (a download, a copy).
class Sha256 {
 public:
  Sha256();
  void update(std::string_view bytes);
  std::string hex();  // 64 lower-case hex digits; once

 private:
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx_;
};

Result<std::string> file_sha256(const std::filesystem::path& file);
// The version the file's mark says (contract/agent_upgrade.hpp's
// agent_binary_version over its bytes, mapped, not read into memory).
Result<std::string> file_agent_version(const std::filesystem::path& file);

// factory-agent-<the first 16 hex digits of sha256>
std::string slot_name(const std::string& sha256);

// Makes `tmp` (a file in `dir`, fully written) the executable dir/name:
// fsync, 0755, rename, fsync of the directory.
Status install_executable(const std::filesystem::path& tmp, const std::filesystem::path& dest);

struct Slot {
  std::filesystem::path path;
  std::string sha256;
};
// `source` copied into bin_dir as a slot named by its hash (nothing copied
// when that slot is `source` itself or already holds those bytes).
Result<Slot> keep_in_slot(const std::filesystem::path& source,
                          const std::filesystem::path& bin_dir);

// `link` becomes a symbolic link to `target` in one rename (a link made
// beside it first), whatever it was before: a regular file, another link.
Status point_link_at(const std::filesystem::path& link, const std::filesystem::path& target);

}  // namespace factory::agent
