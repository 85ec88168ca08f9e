#pragma once
// TLS 1.3 session tickets for a server: the keys that seal and open them.
//
// A ticket is the server's session state, sealed (AES-256-CBC + HMAC-SHA256,
// the construction OpenSSL's own default keys use) with a key only the
// server holds, and kept by the client. A client that shows it back resumes:
// no certificate is sent, signed or verified again, which is most of a
// handshake's cost (docs/scale.md measures it). OpenSSL's default keys live
// in the process, so a restarted coordinator could resume nobody; these are
// persisted (a JSON file, 0600, written atomically) so the agents it knew
// resume after a restart.
//
// Lifetimes (TicketKeyPolicy): a key seals new tickets for `rotate_every`,
// then only opens the tickets it sealed for `ticket_lifetime` more, then is
// forgotten; a ticket itself is honoured for at most `ticket_lifetime`
// (SSL_CTX_set_timeout). A client that was away longer makes a full
// handshake, as on its first day. Every resumption is answered with a fresh
// ticket under the current key: a ticket is used once.
//
// What resumption does not skip is judged again on every connection by
// whoever reads the peer (tls_connection.cpp): the client certificate's
// notAfter against the clock now, and the application's own checks of the
// identity. The session id context names the client CA, so a coordinator
// given another CA resumes no session of the old one.
//
// Threads: the TLS callback reads the keys from memory only (io threads
// never wait on the disk); open() and rotate_if_due() write the file, from
// the coordinator's start and a worker.
#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "common/error.hpp"

namespace factory::net {

struct TicketKeyPolicy {
  std::chrono::seconds rotate_every{std::chrono::hours(12)};
  std::chrono::seconds ticket_lifetime{std::chrono::hours(12)};
};

struct TicketKey {
  std::array<unsigned char, 16> name{};  // sent in the clear with the ticket
  std::array<unsigned char, 32> aes{};
  std::array<unsigned char, 32> hmac{};
  std::chrono::system_clock::time_point created;
};

class TicketKeys {
 public:
  using Now = std::function<std::chrono::system_clock::time_point()>;

  // Reads the keys at `path` (none yet is fine), forgets those past their
  // life, adds a current one when none seals any more, and writes the file
  // when that changed anything. A file that is not ours to read (bad JSON,
  // a key of the wrong size) is an error naming it: the caller decides
  // (the coordinator starts with fresh keys and says so).
  static Result<std::shared_ptr<TicketKeys>> open(const std::filesystem::path& path,
                                                  TicketKeyPolicy policy = {},
                                                  Now now = std::chrono::system_clock::now);

  // Adds a new sealing key when the current one is older than rotate_every,
  // forgets those past their life; writes the file when it changed. true
  // when it rotated.
  Result<bool> rotate_if_due();

  // For the TLS callback: memory only.
  // The key that seals now: the newest, until rotate_if_due() adds the
  // next; nullopt when even that one is past its life (no ticket is issued:
  // a full handshake next time, never a ticket under a forgotten key).
  std::optional<TicketKey> sealing_key() const;
  // The key of this name that may still open a ticket, and whether it is
  // the current one.
  struct Opening {
    TicketKey key;
    bool current = false;
  };
  std::optional<Opening> opening_key(const unsigned char name[16]) const;

  const TicketKeyPolicy& policy() const { return policy_; }
  std::size_t key_count() const;

 private:
  TicketKeys(std::filesystem::path path, TicketKeyPolicy policy, Now now)
      : path_(std::move(path)), policy_(policy), now_(std::move(now)) {}
  bool seals(const TicketKey& k, std::chrono::system_clock::time_point now) const;
  bool opens(const TicketKey& k, std::chrono::system_clock::time_point now) const;
  Status save(const std::vector<TicketKey>& keys) const;

  std::filesystem::path path_;
  TicketKeyPolicy policy_;
  Now now_;
  mutable std::mutex mu_;
  std::vector<TicketKey> keys_;  // oldest first
};

}  // namespace factory::net
