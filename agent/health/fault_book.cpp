#include "agent/health/fault_book.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <system_error>

#include "common/atomic_file.hpp"

namespace factory::agent {

using nlohmann::json;

namespace {

// flock on <book>.lock for as long as it lives; the lock file itself is
// never removed (removing it would let two holders lock two files).
class BookLock {
 public:
  explicit BookLock(const std::filesystem::path& book) {
    std::string path = book.string() + ".lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0) {
      error_ = errno_error("open " + path, errno);
      return;
    }
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      error_ = errno_error("flock " + path, errno);
      return;
    }
  }
  ~BookLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  BookLock(const BookLock&) = delete;
  BookLock& operator=(const BookLock&) = delete;
  const std::optional<Error>& error() const { return error_; }

 private:
  int fd_ = -1;
  std::optional<Error> error_;
};

json to_json(const XidRecord& r) {
  return {{"uuid", r.uuid},   {"gpu", r.gpu_index},     {"xid", r.xid},
          {"count", r.count}, {"first_at", r.first_at}, {"last_at", r.last_at}};
}

// The file as written; what does not read as a record is skipped (the file
// is ours, but a half-understood book must not stop health).
std::vector<XidRecord> parse(const std::string& text) {
  std::vector<XidRecord> out;
  json j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("xids") || !j["xids"].is_array()) return out;
  for (const auto& e : j["xids"]) {
    if (!e.is_object() || !e.contains("xid") || !e["xid"].is_number_integer()) continue;
    XidRecord r;
    r.uuid = e.value("uuid", "");
    r.gpu_index = e.value("gpu", -1);
    r.xid = e["xid"].get<int>();
    r.count = e.value("count", std::uint64_t{1});
    r.first_at = e.value("first_at", "");
    r.last_at = e.value("last_at", "");
    out.push_back(std::move(r));
  }
  return out;
}

Result<std::vector<XidRecord>> read_book(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return std::vector<XidRecord>{};
  auto text = read_file(file);
  if (!text) return text.error();
  return parse(*text);
}

Status write_book(const std::filesystem::path& file, const std::vector<XidRecord>& records) {
  json list = json::array();
  for (const auto& r : records) list.push_back(to_json(r));
  return write_file_atomic(file, json{{"version", 1}, {"xids", list}}.dump(), 0600);
}

bool same_gpu(const XidRecord& r, const std::string& uuid, int index) {
  if (!r.uuid.empty() || !uuid.empty()) return r.uuid == uuid;
  return r.gpu_index == index;
}

void oldest_first(std::vector<XidRecord>& records) {
  std::stable_sort(records.begin(), records.end(), [](const XidRecord& a, const XidRecord& b) {
    return a.first_at < b.first_at;  // RFC 3339 in UTC with one format: text order is time order
  });
}

}  // namespace

std::filesystem::path FaultBook::file_in(const std::filesystem::path& state_dir) {
  return state_dir / "gpu-faults.json";
}

Status FaultBook::record(const std::string& uuid, int gpu_index, int xid, Clock::time_point at) {
  BookLock lock(file_);
  if (lock.error()) return *lock.error();
  auto records = read_book(file_);
  if (!records) return records.error();
  const std::string now = format_rfc3339(at);
  auto it = std::find_if(records->begin(), records->end(), [&](const XidRecord& r) {
    return r.xid == xid && same_gpu(r, uuid, gpu_index);
  });
  if (it != records->end()) {
    ++it->count;
    it->last_at = now;
    if (it->gpu_index < 0) it->gpu_index = gpu_index;
  } else {
    records->push_back({uuid, gpu_index, xid, 1, now, now});
  }
  // Bounds: the least recently seen go first, per GPU and in all.
  auto drop_stalest = [&](auto pred) {
    auto stalest = records->end();
    for (auto r = records->begin(); r != records->end(); ++r)
      if (pred(*r) && (stalest == records->end() || r->last_at < stalest->last_at)) stalest = r;
    if (stalest != records->end()) records->erase(stalest);
  };
  auto on_gpu = [&](const XidRecord& r) { return same_gpu(r, uuid, gpu_index); };
  while (static_cast<std::size_t>(std::count_if(records->begin(), records->end(), on_gpu)) >
         kPerGpu)
    drop_stalest(on_gpu);
  while (records->size() > kTotal) drop_stalest([](const XidRecord&) { return true; });
  oldest_first(*records);
  return write_book(file_, *records);
}

Result<std::vector<XidRecord>> FaultBook::list() const {
  auto records = read_book(file_);
  if (records) oldest_first(*records);
  return records;
}

Result<std::size_t> FaultBook::acknowledge(const std::string& uuid, int xid) {
  BookLock lock(file_);
  if (lock.error()) return *lock.error();
  auto records = read_book(file_);
  if (!records) return records.error();
  auto before = records->size();
  std::erase_if(*records, [&](const XidRecord& r) {
    return (uuid.empty() || r.uuid == uuid) && (xid == 0 || r.xid == xid);
  });
  std::size_t gone = before - records->size();
  if (gone == 0) return gone;
  if (auto st = write_book(file_, *records); !st.ok()) return st.error();
  return gone;
}

}  // namespace factory::agent
