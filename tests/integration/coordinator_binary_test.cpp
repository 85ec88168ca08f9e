// What the factory binary is made of: everything but glibc and libpq linked
// in (a coordinator's host needs no other package), tcmalloc as the
// allocator of the whole process (coordinator/CMakeLists.txt says why), and
// a process that libfaketime, the tests' fake clock, can start.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "tests/support/test_support.hpp"

using namespace factory::testing;

TEST(CoordinatorBinary, DependsOnGlibcAndLibpqOnly) {
  const std::set<std::string> allowed = {"libc.so.6",       "libm.so.6",  "libdl.so.2",
                                         "libpthread.so.0", "librt.so.1", "ld-linux-x86-64.so.2",
                                         "libpq.so.5"};
  auto libs = needed_libraries(factory_bin());
  ASSERT_FALSE(libs.empty()) << "a dynamic executable: glibc is not linked statically";
  for (auto& l : libs)
    EXPECT_TRUE(allowed.count(l)) << factory_bin() << " needs " << l
                                  << ", a package the deployment does not install";
}

// tcmalloc prints its statistics at exit when MALLOCSTATS is set; glibc's
// malloc ignores the variable, so the figures are there only when tcmalloc
// is the allocator.
TEST(CoordinatorBinary, AllocatesWithTcmallocUnlessSanitized) {
  auto r = run({factory_bin(), "--version"}, std::chrono::seconds(30), {{"MALLOCSTATS", "1"}});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output.substr(0, 2000);
  const bool tcmalloc = r.output.find("Bytes in use by application") != std::string::npos;
#if FACTORY_TCMALLOC_LINKED
  EXPECT_TRUE(tcmalloc) << "factory was linked with tcmalloc but does not allocate with it:\n"
                        << r.output.substr(0, 2000);
#else
  // Sanitizer builds keep the sanitizer's allocator (FACTORY_TCMALLOC off).
  EXPECT_FALSE(tcmalloc) << "tcmalloc in a build that should not have it";
#endif
}

// The tests' fake clock is libfaketime preloaded into the real binary
// (credentials_time_test). An allocator that reads the clock or makes a
// condition variable while it initializes, before main (jemalloc, tried for
// stop 44), runs libfaketime's initializer inside its own, and libfaketime's
// dlsym allocates again: the process hangs. This catches such a change in
// seconds, where the time tests would wait out their deadlines.
TEST(CoordinatorBinary, StartsUnderLibfaketime) {
  ASSERT_TRUE(std::filesystem::exists(FACTORY_FAKETIME_LIB))
      << "libfaketime is not installed (" << FACTORY_FAKETIME_LIB
      << "): scripts/install-deps.sh --test installs Debian's faketime";
  for (const char* offset : {"+0", "+400d"}) {
    auto r = run({factory_bin(), "--version"}, std::chrono::seconds(20),
                 {{"LD_PRELOAD", FACTORY_FAKETIME_LIB},
                  {"FAKETIME", offset},
                  {"FAKETIME_DONT_FAKE_MONOTONIC", "1"}});
    EXPECT_TRUE(r.ok()) << "FAKETIME=" << offset << ": " << r.describe() << "\n"
                        << r.output.substr(0, 2000);
    EXPECT_NE(r.output.find("factory "), std::string::npos) << r.output.substr(0, 2000);
  }
}
