// liburoce_preload.so: makes a process see uroce0 where programs look for a kernel RDMA device, without root, a
// mount or a user namespace (so also in a container that has none): `uroce run` puts it in LD_PRELOAD.
//
// Frameworks find devices through files before (and besides) the verbs: UCX lists a device only if
// /dev/infiniband/<dev_name> is a character device it may read and write, and reads each GID's RoCE version and
// netdev from /sys/class/infiniband/<dev>/ports/1/gid_attrs; Open MPI's openib BTL stats <sysfs>/class/infiniband.
// This library interposes libc's path calls (open, fopen, stat, access, opendir, scandir, realpath, readlink, the
// xattr reads and their variants) and answers, for this process only:
//   /sys/class/infiniband[/...], /sys/class/infiniband_verbs[/...] and their targets
//   /sys/devices/virtual/infiniband[/...], /sys/devices/virtual/infiniband_verbs[/...], and /dev/infiniband[/...]
// from a folder of real files that uroce's libibverbs writes for this process (verbs_api/device_tree.h says what is
// in it), and /dev/infiniband/uverbs0 and /dev/infiniband/rdma_cm with /dev/null: a character device anyone may read
// and write, which is all UCX asks (nothing opens it: uroce's libraries talk to no kernel device). realpath answers
// with the /sys path, not the folder's. Every other path goes to libc unchanged.
//
// The folder is ${UROCE_DEVICE_TREE:-${XDG_RUNTIME_DIR:-${TMPDIR:-/tmp}}/uroce-<uid>}/<pid>.<start time>, made at
// the first call that asks for one of those paths (by calling uroce_write_device_tree in uroce's libibverbs, loaded
// for it if the program has not loaded it yet: a shell's `ls /sys/class/infiniband` works too), rewritten by the
// library when its device starts (the GID), removed when the process exits; folders of processes that are gone are
// removed by the next that makes one. A process whose libibverbs is not uroce's sees the real files.
//
// Written in C, with no C++ runtime: it is loaded into every program `uroce run` starts, shells included.
#define _GNU_SOURCE
// Fortified builds define inline wrappers of open, readlink and realpath in glibc's headers; this file defines the
// functions themselves.
#undef _FORTIFY_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

// --- the folder ---------------------------------------------------------------------------------------------------

static pthread_mutex_t g_tree_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_tree[PATH_MAX];   // this process's folder, "" when it has none (its libibverbs is not uroce's)
static pid_t g_tree_pid;        // the process g_tree was made for (0: not yet); a fork's child makes its own.
                                // Set (release) once g_tree is written; read without the lock (acquire).
static __thread int g_writing;  // this thread is writing the folder: its own calls go to libc unchanged

// The start time of process `pid` (field 22 of /proc/PID/stat), 0 if it is gone: with the pid, a name no other
// process will have, even after the pid is reused.
static unsigned long long StartTime(pid_t pid) {
  char path[64], line[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE* f = fopen(path, "re");
  if (f == NULL) return 0;
  size_t n = fread(line, 1, sizeof line - 1, f);
  fclose(f);
  line[n] = 0;
  const char* p = strrchr(line, ')');  // the command name may hold spaces and parentheses
  if (p == NULL) return 0;
  unsigned long long start = 0;
  // After ") ": state (3), then fields 4..21, then starttime (22).
  if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &start) != 1)
    return 0;
  return start;
}

static int RemoveEntry(const char* path, const struct stat* st, int type, struct FTW* ftw) {
  (void)st;
  (void)ftw;
  return type == FTW_DP ? rmdir(path) : unlink(path);
}

static void RemoveFolder(const char* path) { nftw(path, RemoveEntry, 16, FTW_DEPTH | FTW_PHYS); }

// Removes the folders of processes that are gone.
static void SweepBase(const char* base) {
  DIR* d = opendir(base);
  if (d == NULL) return;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    int pid = 0;
    unsigned long long start = 0;
    if (sscanf(e->d_name, "%d.%llu", &pid, &start) != 2) continue;
    if (StartTime(pid) == start) continue;
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", base, e->d_name) < (int)sizeof path) RemoveFolder(path);
  }
  closedir(d);
}

typedef int (*WriteTreeFn)(const char* root);

static WriteTreeFn FindWriter(void) {
  WriteTreeFn w = (WriteTreeFn)dlsym(RTLD_DEFAULT, "uroce_write_device_tree");
  if (w != NULL) return w;
  // Not loaded yet: load the libibverbs the library path finds (uroce's, under `uroce run`), and keep it.
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  return lib ? (WriteTreeFn)dlsym(lib, "uroce_write_device_tree") : NULL;
}

static void MakeTree(void) {
  g_tree[0] = 0;
  char base[PATH_MAX];
  const char* set = getenv("UROCE_DEVICE_TREE");
  if (set && *set) {
    snprintf(base, sizeof base, "%s", set);
  } else {
    const char* runtime = getenv("XDG_RUNTIME_DIR");
    if (runtime == NULL || *runtime == 0) runtime = getenv("TMPDIR");
    if (runtime == NULL || *runtime == 0) runtime = "/tmp";
    snprintf(base, sizeof base, "%s/uroce-%u", runtime, (unsigned)getuid());
  }
  WriteTreeFn write_tree = FindWriter();
  if (write_tree == NULL) return;
  if (mkdir(base, 0700) != 0 && errno != EEXIST) return;
  SweepBase(base);
  char tree[PATH_MAX];
  const pid_t pid = getpid();
  if (snprintf(tree, sizeof tree, "%s/%d.%llu", base, (int)pid, StartTime(pid)) >= (int)sizeof tree) return;
  if (write_tree(tree) != 0) {
    RemoveFolder(tree);
    return;
  }
  memcpy(g_tree, tree, sizeof tree);
}

// This process's folder, made at the first call; NULL when there is none, or while this thread writes it.
static const char* Tree(void) {
  if (g_writing) return NULL;
  const pid_t pid = getpid();
  if (__atomic_load_n(&g_tree_pid, __ATOMIC_ACQUIRE) != pid) {
    pthread_mutex_lock(&g_tree_mu);
    if (g_tree_pid != pid) {
      g_writing = 1;
      MakeTree();
      g_writing = 0;
      __atomic_store_n(&g_tree_pid, pid, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_tree_mu);
  }
  return g_tree[0] ? g_tree : NULL;
}

// For uroce's libibverbs: this process's folder, NULL when there is none. With `make`, made first if it was not (the
// library asks when its device starts: its live counters go there); without, it takes no lock.
const char* uroce_preload_tree(int make);
const char* uroce_preload_tree(int make) {
  if (make) return Tree();
  return __atomic_load_n(&g_tree_pid, __ATOMIC_ACQUIRE) == getpid() && g_tree[0] ? g_tree : NULL;
}

__attribute__((destructor)) static void RemoveTreeAtExit(void) {
  if (g_tree_pid == getpid() && g_tree[0]) RemoveFolder(g_tree);
}

// --- which paths ---------------------------------------------------------------------------------------------------

// Whether `path` is `prefix` or lies under it.
static int Under(const char* path, const char* prefix) {
  const size_t n = strlen(prefix);
  return strncmp(path, prefix, n) == 0 && (path[n] == 0 || path[n] == '/');
}

static int IsDeviceNode(const char* path) {
  return strcmp(path, "/dev/infiniband/uverbs0") == 0 || strcmp(path, "/dev/infiniband/rdma_cm") == 0;
}

static int Mapped(const char* path) {
  return Under(path, "/sys/class/infiniband") || Under(path, "/sys/class/infiniband_verbs") ||
         Under(path, "/sys/devices/virtual/infiniband") || Under(path, "/sys/devices/virtual/infiniband_verbs") ||
         Under(path, "/dev/infiniband");
}

// The path libc is given for `path`: itself, or its place in the folder (in `buf`), or /dev/null.
static const char* Map(const char* path, char* buf, size_t len) {
  if (path == NULL || path[0] != '/' || !Mapped(path)) return path;
  const char* tree = Tree();
  if (tree == NULL) return path;
  if (IsDeviceNode(path)) return "/dev/null";
  if (snprintf(buf, len, "%s%s", tree, path) >= (int)len) return path;
  return buf;
}

// libc's definition of `name`, looked up once.
#define REAL(name)                                                                                \
  ({                                                                                              \
    static __typeof__(&name) real_;                                                               \
    if (__atomic_load_n(&real_, __ATOMIC_RELAXED) == NULL)                                        \
      __atomic_store_n(&real_, (__typeof__(&name))dlsym(RTLD_NEXT, #name), __ATOMIC_RELAXED);     \
    real_;                                                                                        \
  })

// --- open -------------------------------------------------------------------------------------------------------

static mode_t ModeArgument(int flags, va_list ap) {
  return (flags & O_CREAT) || (flags & __O_TMPFILE) == __O_TMPFILE ? va_arg(ap, mode_t) : 0;
}

int open(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = ModeArgument(flags, ap);
  va_end(ap);
  char buf[PATH_MAX];
  return REAL(open)(Map(path, buf, sizeof buf), flags, mode);
}

int open64(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = ModeArgument(flags, ap);
  va_end(ap);
  char buf[PATH_MAX];
  return REAL(open64)(Map(path, buf, sizeof buf), flags, mode);
}

int openat(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = ModeArgument(flags, ap);
  va_end(ap);
  char buf[PATH_MAX];
  return REAL(openat)(dirfd, Map(path, buf, sizeof buf), flags, mode);
}

int openat64(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = ModeArgument(flags, ap);
  va_end(ap);
  char buf[PATH_MAX];
  return REAL(openat64)(dirfd, Map(path, buf, sizeof buf), flags, mode);
}

// _FORTIFY_SOURCE's checked forms of open (glibc's fcntl2.h calls them when the flags are not constant).
int __open_2(const char* path, int flags);
int __open_2(const char* path, int flags) {
  char buf[PATH_MAX];
  return REAL(__open_2)(Map(path, buf, sizeof buf), flags);
}
int __open64_2(const char* path, int flags);
int __open64_2(const char* path, int flags) {
  char buf[PATH_MAX];
  return REAL(__open64_2)(Map(path, buf, sizeof buf), flags);
}
int __openat_2(int dirfd, const char* path, int flags);
int __openat_2(int dirfd, const char* path, int flags) {
  char buf[PATH_MAX];
  return REAL(__openat_2)(dirfd, Map(path, buf, sizeof buf), flags);
}
int __openat64_2(int dirfd, const char* path, int flags);
int __openat64_2(int dirfd, const char* path, int flags) {
  char buf[PATH_MAX];
  return REAL(__openat64_2)(dirfd, Map(path, buf, sizeof buf), flags);
}

FILE* fopen(const char* path, const char* mode) {
  char buf[PATH_MAX];
  return REAL(fopen)(Map(path, buf, sizeof buf), mode);
}

FILE* fopen64(const char* path, const char* mode) {
  char buf[PATH_MAX];
  return REAL(fopen64)(Map(path, buf, sizeof buf), mode);
}

// --- stat and access ---------------------------------------------------------------------------------------------

int stat(const char* path, struct stat* st) {
  char buf[PATH_MAX];
  return REAL(stat)(Map(path, buf, sizeof buf), st);
}

int stat64(const char* path, struct stat64* st) {
  char buf[PATH_MAX];
  return REAL(stat64)(Map(path, buf, sizeof buf), st);
}

int lstat(const char* path, struct stat* st) {
  char buf[PATH_MAX];
  return REAL(lstat)(Map(path, buf, sizeof buf), st);
}

int lstat64(const char* path, struct stat64* st) {
  char buf[PATH_MAX];
  return REAL(lstat64)(Map(path, buf, sizeof buf), st);
}

int fstatat(int dirfd, const char* path, struct stat* st, int flags) {
  char buf[PATH_MAX];
  return REAL(fstatat)(dirfd, Map(path, buf, sizeof buf), st, flags);
}

int fstatat64(int dirfd, const char* path, struct stat64* st, int flags) {
  char buf[PATH_MAX];
  return REAL(fstatat64)(dirfd, Map(path, buf, sizeof buf), st, flags);
}

int statx(int dirfd, const char* path, int flags, unsigned int mask, struct statx* st) {
  char buf[PATH_MAX];
  return REAL(statx)(dirfd, Map(path, buf, sizeof buf), flags, mask, st);
}

int access(const char* path, int mode) {
  char buf[PATH_MAX];
  return REAL(access)(Map(path, buf, sizeof buf), mode);
}

int faccessat(int dirfd, const char* path, int mode, int flags) {
  char buf[PATH_MAX];
  return REAL(faccessat)(dirfd, Map(path, buf, sizeof buf), mode, flags);
}

int euidaccess(const char* path, int mode) {
  char buf[PATH_MAX];
  return REAL(euidaccess)(Map(path, buf, sizeof buf), mode);
}

int eaccess(const char* path, int mode) {
  char buf[PATH_MAX];
  return REAL(eaccess)(Map(path, buf, sizeof buf), mode);
}

// --- folders and links ---------------------------------------------------------------------------------------------

DIR* opendir(const char* path) {
  char buf[PATH_MAX];
  return REAL(opendir)(Map(path, buf, sizeof buf));
}

int scandir(const char* path, struct dirent*** list, int (*filter)(const struct dirent*),
            int (*compare)(const struct dirent**, const struct dirent**)) {
  char buf[PATH_MAX];
  return REAL(scandir)(Map(path, buf, sizeof buf), list, filter, compare);
}

int scandir64(const char* path, struct dirent64*** list, int (*filter)(const struct dirent64*),
              int (*compare)(const struct dirent64**, const struct dirent64**)) {
  char buf[PATH_MAX];
  return REAL(scandir64)(Map(path, buf, sizeof buf), list, filter, compare);
}

ssize_t readlink(const char* path, char* out, size_t len) {
  char buf[PATH_MAX];
  return REAL(readlink)(Map(path, buf, sizeof buf), out, len);
}

ssize_t readlinkat(int dirfd, const char* path, char* out, size_t len) {
  char buf[PATH_MAX];
  return REAL(readlinkat)(dirfd, Map(path, buf, sizeof buf), out, len);
}

ssize_t __readlink_chk(const char* path, char* out, size_t len, size_t out_len);
ssize_t __readlink_chk(const char* path, char* out, size_t len, size_t out_len) {
  char buf[PATH_MAX];
  return REAL(__readlink_chk)(Map(path, buf, sizeof buf), out, len, out_len);
}

// ls -l asks for a file's ACL and security label.
ssize_t getxattr(const char* path, const char* name, void* value, size_t size) {
  char buf[PATH_MAX];
  return REAL(getxattr)(Map(path, buf, sizeof buf), name, value, size);
}

ssize_t lgetxattr(const char* path, const char* name, void* value, size_t size) {
  char buf[PATH_MAX];
  return REAL(lgetxattr)(Map(path, buf, sizeof buf), name, value, size);
}

ssize_t listxattr(const char* path, char* list, size_t size) {
  char buf[PATH_MAX];
  return REAL(listxattr)(Map(path, buf, sizeof buf), list, size);
}

ssize_t llistxattr(const char* path, char* list, size_t size) {
  char buf[PATH_MAX];
  return REAL(llistxattr)(Map(path, buf, sizeof buf), list, size);
}

// realpath of a path in the folder, said as the /sys (or /dev) path it stands for: the folder's prefix removed, and a
// device node (mapped to /dev/null) is its own real path.
static char* Unmap(const char* path, const char* mapped, char* resolved) {
  if (resolved == NULL || mapped == path) return resolved;
  if (strcmp(mapped, "/dev/null") == 0) {
    snprintf(resolved, PATH_MAX, "%s", path);
    return resolved;
  }
  const char* tree = g_tree;
  const size_t n = strlen(tree);
  if (strncmp(resolved, tree, n) == 0) memmove(resolved, resolved + n, strlen(resolved + n) + 1);
  return resolved;
}

char* realpath(const char* path, char* resolved) {
  char buf[PATH_MAX];
  const char* mapped = Map(path, buf, sizeof buf);
  return Unmap(path, mapped, REAL(realpath)(mapped, resolved));
}

char* __realpath_chk(const char* path, char* resolved, size_t resolved_len);
char* __realpath_chk(const char* path, char* resolved, size_t resolved_len) {
  char buf[PATH_MAX];
  const char* mapped = Map(path, buf, sizeof buf);
  return Unmap(path, mapped, REAL(__realpath_chk)(mapped, resolved, resolved_len));
}

char* canonicalize_file_name(const char* path) {
  char buf[PATH_MAX];
  const char* mapped = Map(path, buf, sizeof buf);
  return Unmap(path, mapped, REAL(canonicalize_file_name)(mapped));
}
