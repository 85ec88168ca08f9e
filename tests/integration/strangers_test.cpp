// Issue 10: strangers on the agent port. Any guest can reach it, so 2,000
// connections without a client certificate, each claiming a 1 MiB frame,
// must cost the real `factory serve` little memory and be closed by their
// deadline (at once for a claim over the strangers' 8 KiB cap, at the 10 s
// stranger deadline for one that never finishes its header), while a
// connected agent notices nothing. The figures are printed for the record.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "tests/integration/own_agent.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// Resident memory of a process, in KiB (VmRSS).
long rss_kib(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

// Samples a process's RSS until stopped; peak() is the highest seen.
class RssSampler {
 public:
  explicit RssSampler(int pid)
      : pid_(pid), t_([this] {
          while (!stop_) {
            long r = rss_kib(pid_);
            if (r > peak_) peak_ = r;
            std::this_thread::sleep_for(20ms);
          }
        }) {}
  ~RssSampler() {
    stop_ = true;
    t_.join();
  }
  long peak() const { return peak_; }

 private:
  int pid_;
  std::atomic<bool> stop_{false};
  std::atomic<long> peak_{0};
  std::thread t_;
};

void raise_open_files() {
  rlimit r{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &r), 0);
  r.rlim_cur = r.rlim_max;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &r), 0);
  // 2,000 here and 2,000 in the coordinator (which inherits the limit).
  ASSERT_GE(r.rlim_cur, 4500u) << "this test needs RLIMIT_NOFILE >= 4500";
}

struct Stranger {
  std::unique_ptr<RawTlsClient> c;
  Clock::time_point opened, closed{};
  bool finished_header = false;
};

// Checks every open stranger without waiting; records when each was closed.
void notice_closes(std::vector<Stranger>& all) {
  std::vector<pollfd> fds;
  std::vector<std::size_t> idx;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].closed == Clock::time_point{} && all[i].c) {
      fds.push_back({all[i].c->fd(), POLLIN | POLLRDHUP, 0});
      idx.push_back(i);
    }
  if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return;
  for (std::size_t k = 0; k < fds.size(); ++k) {
    if (!fds[k].revents) continue;
    Stranger& s = all[idx[k]];
    for (;;) {
      auto r = s.c->read_some(0ms);
      if (r) continue;
      if (r.error().code == factory::Errc::unavailable) {
        s.closed = Clock::now();
        s.c.reset();  // its descriptor goes now
      }
      break;
    }
  }
}

// A masked client frame header claiming `length` bytes of text.
std::string header_claiming(std::uint64_t length) {
  std::string h = {static_cast<char>(0x81), static_cast<char>(0x80 | 127)};
  for (int i = 7; i >= 0; --i) h += static_cast<char>((length >> (8 * i)) & 0xFF);
  h += std::string("\x11\x22\x33\x44", 4);
  return h;
}

struct Wave {
  long baseline_kib = 0, peak_kib = 0;
  double connect_s = 0;
  std::chrono::milliseconds slowest_close{0}, slowest_immediate{0};
  int closed = 0;
};

// n strangers from 16 loopback addresses (the per-address cap is 256), each
// upgraded to a websocket and then: even ones send a header claiming
// `claim` bytes and `body` bytes of it; odd ones the first two bytes of such
// a header only, and stall.
Wave wave(CoordinatorHarness& h, OwnAgent& a, int n, std::uint64_t claim, std::size_t body) {
  Wave w;
  w.baseline_kib = rss_kib(h.pid());
  RssSampler sampler(h.pid());
  std::vector<Stranger> all(static_cast<std::size_t>(n));
  const std::string header = header_claiming(claim);
  const std::string payload(body, 'x');
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    Stranger& s = all[static_cast<std::size_t>(i)];
    s.c = a.stranger("127.0.0." + std::to_string(2 + i % 16));
    if (!s.c) {
      ADD_FAILURE() << "stranger " << i << " could not connect";
      break;
    }
    s.opened = Clock::now();
    s.finished_header = i % 2 == 0;
    auto st = s.finished_header ? s.c->write(header + payload) : s.c->write(header.substr(0, 2));
    EXPECT_TRUE(st.ok()) << i;
    if (i % 25 == 0) notice_closes(all);
  }
  w.connect_s = std::chrono::duration<double>(Clock::now() - t0).count();
  auto until = Clock::now() + 30s;
  auto all_closed = [&] {
    return std::all_of(all.begin(), all.end(),
                       [](const Stranger& s) { return s.closed != Clock::time_point{}; });
  };
  while (!all_closed() && Clock::now() < until) {
    notice_closes(all);
    std::this_thread::sleep_for(10ms);
  }
  for (const auto& s : all) {
    if (s.closed == Clock::time_point{}) continue;
    ++w.closed;
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(s.closed - s.opened);
    w.slowest_close = std::max(w.slowest_close, took);
    if (s.finished_header) w.slowest_immediate = std::max(w.slowest_immediate, took);
  }
  w.peak_kib = sampler.peak();
  return w;
}

}  // namespace

TEST(Strangers, TwoThousandClaimingMegabyteFramesCostLittleAndAreClosedByTheirDeadline) {
  raise_open_files();
  TempDir dir("strangers");
  CoordinatorHarness h(dir.path());
  h.start();
  AgentOptions o;
  o.state_dir_name = "steady";
  o.extra_args = {"--synthetic-events", "100", "--synthetic-rate", "2"};
  AgentProcess steady(h, h.create_token("steady"), o);
  ASSERT_TRUE(eventually([&] { return h.agent_connected("steady"); }, 10s)) << steady.log();
  const std::string since = (*h.tenant("steady"))["agent"].value("connected_since", "");
  OwnAgent dialer(h, "dialer");  // only its CA and port are used: strangers have no certificate
  std::this_thread::sleep_for(1s);
  const auto events_before = h.stored_events("steady").size();

  Wave w = wave(h, dialer, 2000, 1 << 20, 1000);
  const long grew_mib = (w.peak_kib - w.baseline_kib) / 1024;
  std::cout << "[ figures  ] 2000 strangers claiming 1 MiB frames (connected in " << w.connect_s
            << " s): coordinator RSS " << w.baseline_kib / 1024 << " MiB -> peak "
            << w.peak_kib / 1024 << " MiB (+" << grew_mib << " MiB); slowest close "
            << w.slowest_close.count() << " ms after its connect, of those that sent the whole "
            << "header " << w.slowest_immediate.count() << " ms\n";
  EXPECT_EQ(w.closed, 2000);
  EXPECT_LT(w.peak_kib - w.baseline_kib, 64 * 1024) << "MiB: " << grew_mib;
  // The stranger deadline is 10 s from accept; a claim over the cap is
  // refused on its header.
  EXPECT_LE(w.slowest_close, 12s);
  EXPECT_LE(w.slowest_immediate, 3s);

  // Throughout, the agent stayed connected and kept delivering.
  auto t = h.tenant("steady");
  ASSERT_TRUE(t);
  EXPECT_TRUE((*t)["agent"].value("connected", false));
  EXPECT_EQ((*t)["agent"].value("connected_since", ""), since) << "it never reconnected";
  EXPECT_GT(h.stored_events("steady").size(), events_before);
  EXPECT_EQ(steady.log().find("reconnecting"), std::string::npos) << steady.log();
  EXPECT_EQ(h.log().find("stopped answering pings"), std::string::npos);
}

// What the strangers' message cap (an enroll frame's, 8 KiB) still lets
// them hold: a frame just under it, left unfinished until the deadline.
// Printed for the record, and bounded. (At the 64 KiB of other frames, 1,000
// of them holding 30 KiB each took 61 MiB.)
TEST(Strangers, TwoThousandHoldingUnfinishedFramesUnderTheCapAreBounded) {
  raise_open_files();
  TempDir dir("strangers-held");
  CoordinatorHarness h(dir.path());
  h.start();
  OwnAgent dialer(h, "dialer");
  std::this_thread::sleep_for(500ms);
  Wave w = wave(h, dialer, 2000, 8000, 7000);
  const long grew_mib = (w.peak_kib - w.baseline_kib) / 1024;
  std::cout << "[ figures  ] 2000 strangers, half of them holding 7000 bytes of an 8000-byte "
               "frame: coordinator RSS "
            << w.baseline_kib / 1024 << " MiB -> peak " << w.peak_kib / 1024 << " MiB (+"
            << grew_mib << " MiB); slowest close " << w.slowest_close.count() << " ms\n";
  EXPECT_EQ(w.closed, 2000);
  EXPECT_LE(w.slowest_close, 12s);
  EXPECT_LT(w.peak_kib - w.baseline_kib, 64 * 1024) << "MiB: " << grew_mib;
}
