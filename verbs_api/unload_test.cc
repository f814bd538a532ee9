// A program may unload the library that uses uroce (Open MPI closes its OFI component, which unloads libfabric and
// with it librdmacm and libibverbs) while uroce's threads still run: the engine's progress thread, librdmacm's peer
// watch. Both libraries are NODELETE, so a dlclose leaves them mapped and the threads keep running their code; the
// process must live on (unmapped, the first thread to run would have crashed it, as Open MPI's ranks did at exit).
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

namespace {

// The runfiles copy of a library this test depends on (Bazel's working directory is the runfiles root).
std::string Library(const char* name) {
  char cwd[4096];
  return std::string(getcwd(cwd, sizeof cwd) ? cwd : ".") + "/verbs_api/" + name;
}

TEST(Unload, LibrariesWithRunningThreadsStayMappedAfterDlclose) {
  // libibverbs first: librdmacm's NEEDED libibverbs.so.1 is then this copy (matched by its soname).
  void* verbs = dlopen(Library("libibverbs.so.1").c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(verbs, nullptr) << dlerror();
  void* cm = dlopen(Library("librdmacm.so.1").c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(cm, nullptr) << dlerror();
  auto get_list = reinterpret_cast<decltype(&ibv_get_device_list)>(dlsym(verbs, "ibv_get_device_list"));
  auto open_device = reinterpret_cast<decltype(&ibv_open_device)>(dlsym(verbs, "ibv_open_device"));
  auto create_channel = reinterpret_cast<decltype(&rdma_create_event_channel)>(dlsym(cm, "rdma_create_event_channel"));
  auto create_id = reinterpret_cast<decltype(&rdma_create_id)>(dlsym(cm, "rdma_create_id"));
  auto destroy_id = reinterpret_cast<decltype(&rdma_destroy_id)>(dlsym(cm, "rdma_destroy_id"));
  auto destroy_channel =
      reinterpret_cast<decltype(&rdma_destroy_event_channel)>(dlsym(cm, "rdma_destroy_event_channel"));
  auto close_device = reinterpret_cast<decltype(&ibv_close_device)>(dlsym(verbs, "ibv_close_device"));
  auto free_list = reinterpret_cast<decltype(&ibv_free_device_list)>(dlsym(verbs, "ibv_free_device_list"));
  ASSERT_TRUE(get_list && open_device && create_channel && create_id && destroy_id && destroy_channel &&
              close_device && free_list);
  ibv_device** list = get_list(nullptr);
  ASSERT_NE(list, nullptr);
  ibv_context* ctx = open_device(list[0]);  // starts the engine's progress thread, open across the dlclose
  ASSERT_NE(ctx, nullptr);
  rdma_event_channel* channel = create_channel();  // librdmacm's device and its peer watch
  ASSERT_NE(channel, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(create_id(channel, &id, nullptr, RDMA_PS_TCP), 0);
  EXPECT_EQ(dlclose(cm), 0);
  EXPECT_EQ(dlclose(verbs), 0);
  // Still mapped: a no-load open finds them.
  for (const char* name : {"libibverbs.so.1", "librdmacm.so.1"}) {
    void* again = dlopen(Library(name).c_str(), RTLD_NOW | RTLD_NOLOAD);
    EXPECT_NE(again, nullptr) << name << " was unmapped by dlclose";
    if (again) dlclose(again);
  }
  // The threads run on meanwhile; unmapped, the first of them to wake would have crashed the test.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // Still mapped, the functions still work: the objects go the usual way.
  EXPECT_EQ(destroy_id(id), 0);
  destroy_channel(channel);
  EXPECT_EQ(close_device(ctx), 0);
  free_list(list);
}

}  // namespace
