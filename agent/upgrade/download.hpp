#pragma once
// The new binary fetched from the coordinator as install-agent.sh fetches
// the first one (cloud-init): HTTPS trusting only the coordinator's CA, then
// its size and SHA-256 against the order before it may become anything but
// a temp file. Never more than the order's size is written to disk: a
// server that sends more is cut off at that point.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "common/error.hpp"
#include "common/net/http_client.hpp"

namespace factory::agent {

struct DownloadSpec {
  std::string url;  // https://
  std::uint64_t size = 0;
  std::string sha256;
  std::string ca_pem;  // the coordinator's CA: the only one trusted
  // Until the answer's head, then each wait for more of its body.
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
  std::shared_ptr<net::HttpCancel> cancel;  // the agent stopping
};

// Downloads into a temp file in `dir` and returns its path once the size and
// the hash match the spec (the caller renames or removes it). On any
// failure nothing is left in `dir`, and the error says what was wrong in
// one line: "https://...: HTTP 404", "got 1000 bytes, the order says 2000",
// "SHA-256 is ab12..., the order says cd34...".
Result<std::filesystem::path> download_checked(const DownloadSpec& spec,
                                               const std::filesystem::path& dir);

}  // namespace factory::agent
