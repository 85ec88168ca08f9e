#include "agent/upgrade/agent_binary.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <random>

#include "common/atomic_file.hpp"
#include "contract/agent_upgrade.hpp"

namespace factory::agent {

namespace fs = std::filesystem;

namespace {

// A name beside `dest` that no other writer picks: the temp file of a copy
// or a link, renamed over the real name once complete.
fs::path temp_beside(const fs::path& dest) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return dest.parent_path() / ("." + dest.filename().string() + ".tmp-" + std::to_string(rng()));
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

Status write_all(int fd, std::string_view bytes, const fs::path& what) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_error("write " + what.string(), errno);
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

// Reads `file` in pieces, giving each to `sink`.
template <class Sink>
Status read_in_pieces(const fs::path& file, Sink&& sink) {
  Fd in(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) return errno_error("open " + file.string(), errno);
  std::string buf(1 << 16, '\0');
  for (;;) {
    ssize_t n = ::read(in.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_error("read " + file.string(), errno);
    if (n == 0) return {};
    if (auto st = sink(std::string_view(buf.data(), static_cast<std::size_t>(n))); !st.ok())
      return st;
  }
}

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
  EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr);
}

void Sha256::update(std::string_view bytes) {
  EVP_DigestUpdate(ctx_.get(), bytes.data(), bytes.size());
}

std::string Sha256::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_.get(), md, &len);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(len * 2);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 0xf]);
  }
  return out;
}

Result<std::string> file_sha256(const fs::path& file) {
  Sha256 sha;
  auto st = read_in_pieces(file, [&](std::string_view piece) -> Status {
    sha.update(piece);
    return {};
  });
  if (!st.ok()) return st.error();
  return sha.hex();
}

Result<std::string> file_agent_version(const fs::path& file) {
  Fd in(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) return errno_error("open " + file.string(), errno);
  struct stat st {};
  if (::fstat(in.get(), &st) != 0) return errno_error("stat " + file.string(), errno);
  if (st.st_size == 0) return Error(Errc::not_found, file.string() + " is empty");
  const auto size = static_cast<std::size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, in.get(), 0);
  if (p == MAP_FAILED) return errno_error("map " + file.string(), errno);
  auto v = proto::agent_binary_version(std::string_view(static_cast<const char*>(p), size));
  ::munmap(p, size);
  return v;
}

std::string slot_name(const std::string& sha256) {
  return "factory-agent-" + sha256.substr(0, 16);
}

Status install_executable(const fs::path& tmp, const fs::path& dest) {
  {
    Fd f(::open(tmp.c_str(), O_RDONLY | O_CLOEXEC));
    if (f.get() < 0) return errno_error("open " + tmp.string(), errno);
    if (::fsync(f.get()) != 0) return errno_error("fsync " + tmp.string(), errno);
  }
  if (::chmod(tmp.c_str(), 0755) != 0) return errno_error("chmod " + tmp.string(), errno);
  if (::rename(tmp.c_str(), dest.c_str()) != 0)
    return errno_error("rename to " + dest.string(), errno);
  return fsync_dir(dest.parent_path());
}

Result<Slot> keep_in_slot(const fs::path& source, const fs::path& bin_dir) {
  if (auto st = ensure_dir(bin_dir, 0700); !st.ok()) return st.error();
  std::error_code ec;
  // Already a slot (binary_path a link to one, after an earlier upgrade):
  // hashed where it is, as long as its bytes still match its name.
  if (fs::equivalent(source.parent_path(), bin_dir, ec)) {
    auto sha = file_sha256(source);
    if (!sha) return sha.error();
    if (source.filename() == slot_name(*sha)) return Slot{source, *sha};
  }
  // Copied to a temp slot while hashed, then renamed to its hash's name: one
  // read of the source, and a source replaced meanwhile is named for what
  // was actually copied.
  const fs::path tmp = temp_beside(bin_dir / "factory-agent");
  Sha256 sha;
  {
    Fd out(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (out.get() < 0) return errno_error("create " + tmp.string(), errno);
    auto st = read_in_pieces(source, [&](std::string_view piece) {
      sha.update(piece);
      return write_all(out.get(), piece, tmp);
    });
    if (!st.ok()) {
      fs::remove(tmp, ec);
      return st.error();
    }
  }
  Slot slot;
  slot.sha256 = sha.hex();
  slot.path = bin_dir / slot_name(slot.sha256);
  if (fs::exists(slot.path, ec)) {
    auto there = file_sha256(slot.path);
    if (there && *there == slot.sha256) {
      fs::remove(tmp, ec);
      return slot;
    }
  }
  if (auto st = install_executable(tmp, slot.path); !st.ok()) {
    fs::remove(tmp, ec);
    return st.error();
  }
  return slot;
}

Status point_link_at(const fs::path& link, const fs::path& target) {
  const fs::path tmp = temp_beside(link);
  if (::symlink(target.c_str(), tmp.c_str()) != 0)
    return errno_error("symlink " + tmp.string(), errno);
  if (::rename(tmp.c_str(), link.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return errno_error("rename to " + link.string(), err);
  }
  return fsync_dir(link.parent_path());
}

}  // namespace factory::agent
