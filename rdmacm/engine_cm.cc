// The check of the engine's CM table (verbs_api/cm_export.h) and the handle librdmacm calls it through.
#include "rdmacm/engine_cm.h"

#include <dlfcn.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

// Weak: a libibverbs.so.1 without it (an older uroce build) leaves it NULL, which CheckedCmOps reports, instead of
// a symbol lookup error that ends the process.
#pragma weak uroce_get_cm_ops

namespace uroce::rdmacm {
namespace {

// The file that holds `fn`, else the one that holds the verbs (the libibverbs.so.1 loaded), for the message.
std::string LibraryOf(CmOpsLookup fn) {
  Dl_info info{};
  void* const in_it = fn ? reinterpret_cast<void*>(fn) : reinterpret_cast<void*>(&ibv_get_device_list);
  if (dladdr(in_it, &info) != 0 && info.dli_fname != nullptr) return info.dli_fname;
  return "libibverbs.so.1";
}

bool SameLayout(const uroce_cm_layout& a, const uroce_cm_layout& b) {
  return a.event == b.event && a.address == b.address && a.req == b.req && a.rep == b.rep && a.rej == b.rej &&
         a.sidr_req == b.sidr_req && a.sidr_rep == b.sidr_rep;
}

// What does not match in `ops` (from `lookup`), or "" when it is the table this library was built for.
std::string Mismatch(CmOpsLookup lookup, const uroce_cm_ops* ops) {
  if (lookup == nullptr) return "has no uroce_get_cm_ops (an older uroce build, or not uroce's)";
  if (ops == nullptr) return "does not offer it";
  if (ops->abi_version != UROCE_CM_ABI_VERSION || ops->size < sizeof(uroce_cm_ops))
    return "gave version " + std::to_string(ops->abi_version) + " (" + std::to_string(ops->size) + " bytes)";
  if (!SameLayout(ops->layout, cm_abi::LayoutHere())) return "passes CM structs of other sizes";
  return "";
}

}  // namespace

CmOpsLookup DefaultCmOpsLookup() { return &uroce_get_cm_ops; }

const uroce_cm_ops* CheckedCmOps(CmOpsLookup lookup, bool quiet) {
  const uroce_cm_ops* ops = lookup ? lookup(UROCE_CM_ABI_VERSION) : nullptr;
  const std::string mismatch = Mismatch(lookup, ops);
  if (mismatch.empty()) return ops;
  if (!quiet)
    std::fprintf(stderr,
                 "uroce: librdmacm.so.1 was built for CM ABI version %u of libibverbs.so.1, but %s %s: use the "
                 "librdmacm.so.1 and libibverbs.so.1 of one uroce build\n",
                 UROCE_CM_ABI_VERSION, LibraryOf(lookup).c_str(), mismatch.c_str());
  errno = EPROTO;
  return nullptr;
}

int EngineCm::Open(const uroce_cm_ops* ops, ibv_context* context) {
  uroce_cm* cm = ops->cm_of(context);
  if (cm == nullptr) return ENODEV;
  ops_ = ops;
  cm_ = cm;
  return 0;
}

}  // namespace uroce::rdmacm
