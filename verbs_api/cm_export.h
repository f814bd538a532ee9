// What uroce's librdmacm.so.1 needs from the engine of uroce's libibverbs.so.1: the device's connection manager,
// as a versioned table of C functions. libibverbs exports one function in its private version node
// UROCE_PRIVATE_1 (libibverbs.map), uroce_get_cm_ops; librdmacm asks it for the table of the version it was built
// for (UROCE_CM_ABI_VERSION) when it first needs the CM, and refuses to run with anything else, so that a
// librdmacm.so.1 and a libibverbs.so.1 of two different builds fail cleanly (EPROTO, one line on stderr) instead of
// calling each other with different layouts.
//
// The version rule: UROCE_CM_ABI_VERSION goes up with any change to what crosses the boundary -- a member of
// uroce_cm_ops (added, removed, reordered, its signature or meaning changed), or the layout of a struct its
// functions take or give (emu::CmEvent and the wire:: CM messages it holds, listed in uroce_cm_layout). The table
// also carries the sizes of those structs as its library compiled them (uroce_cm_layout), which librdmacm compares
// with its own: a layout change whose version bump was forgotten is still refused when it changes a size.
//
// Only plain data crosses: fixed-size integers, pointers, the opaque handle, and structs that are trivially copyable
// and standard-layout (checked below); no std::string / vector / function, no virtual call, no exception (a
// function that fails to allocate returns ENOMEM).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <type_traits>

#include "emu/connection_manager.h"
#include "wire/address.h"
#include "wire/cm_mad.h"

// 1: the first table (it replaced uroce_connection_manager, whose C++ vtable crossed the boundary).
// 2: send_req and send_sidr_req name the local address the connection's messages leave from.
#define UROCE_CM_ABI_VERSION 2u

extern "C" {

// One device's connection manager; librdmacm never looks inside.
struct uroce_cm;

// Where the CM's events go: called on the thread that processed the message or timer (the engine's progress thread),
// with none of the CM's locks held, so it may call the CM's functions. `event` lives for the call only.
typedef void (*uroce_cm_event_fn)(void* sink_context, const uroce::emu::CmEvent* event);

// The sizes of the structs that cross, as one library compiled them.
struct uroce_cm_layout {
  uint32_t event;     // emu::CmEvent
  uint32_t address;   // wire::IpAddress (in CmEvent)
  uint32_t req;       // wire::CmReq
  uint32_t rep;       // wire::CmRep
  uint32_t rej;       // wire::CmRej (in CmEvent)
  uint32_t sidr_req;  // wire::CmSidrReq
  uint32_t sidr_rep;  // wire::CmSidrRep
};

// The functions of emu::ConnectionManager librdmacm calls (emu/connection_manager.h says what each does). Each
// returns 0 or a positive errno. `peer` is a device address as 16 bytes in network order (a GID; IPv4-mapped for
// IPv4); `local` one of ours the same way (all zeros: GID 0's). Private data is (pointer, length); a NULL pointer
// with length 0 is none.
struct uroce_cm_ops {
  uint32_t abi_version;           // UROCE_CM_ABI_VERSION of the library that made the table
  uint32_t size;                  // sizeof(struct uroce_cm_ops) there
  struct uroce_cm_layout layout;  // its struct sizes

  // The CM of the device behind `context` (a context of this libibverbs), or NULL.
  struct uroce_cm* (*cm_of)(struct ibv_context* context);
  // Installs the sink (fn NULL: events are dropped); returns once no other thread is still handing an event to the
  // previous one. 0 or ENOMEM.
  int (*set_sink)(struct uroce_cm* cm, uroce_cm_event_fn fn, void* sink_context);

  // Passive side.
  int (*listen)(struct uroce_cm* cm, uint64_t service_id, void* context, uint32_t* listen_id);
  int (*stop_listening)(struct uroce_cm* cm, uint32_t listen_id);
  int (*send_rep)(struct uroce_cm* cm, uint32_t id, const uroce::wire::CmRep* rep);
  int (*send_sidr_rep)(struct uroce_cm* cm, uint32_t id, const uroce::wire::CmSidrRep* rep);
  int (*drop)(struct uroce_cm* cm, uint32_t id);

  // Active side.
  int (*send_req)(struct uroce_cm* cm, const uint8_t local[16], const uint8_t peer[16], const uroce::wire::CmReq* req,
                  void* context, uint32_t* id);
  int (*send_rtu)(struct uroce_cm* cm, uint32_t id, const uint8_t* private_data, uint32_t private_data_len);
  int (*send_sidr_req)(struct uroce_cm* cm, const uint8_t local[16], const uint8_t peer[16],
                       const uroce::wire::CmSidrReq* req, void* context, uint32_t* id);

  // Both.
  int (*send_rej)(struct uroce_cm* cm, uint32_t id, uint16_t reason, const uint8_t* private_data,
                  uint32_t private_data_len);
  int (*send_dreq)(struct uroce_cm* cm, uint32_t id);
  int (*send_drep)(struct uroce_cm* cm, uint32_t id);
  // Waits while another thread hands the sink an event for `id`: never call it holding a lock the sink takes.
  int (*destroy)(struct uroce_cm* cm, uint32_t id);
  // The device at `peer` is gone (its process died); events are delivered on the calling thread.
  void (*peer_gone)(struct uroce_cm* cm, const uint8_t peer[16]);
};

// The table of `wanted_version`, or NULL (errno EPROTO) when this library does not implement that version.
const struct uroce_cm_ops* uroce_get_cm_ops(uint32_t wanted_version);

}  // extern "C"

namespace uroce::cm_abi {

// The layout as this translation unit sees it.
constexpr uroce_cm_layout LayoutHere() {
  return {sizeof(emu::CmEvent), sizeof(wire::IpAddress), sizeof(wire::CmReq),    sizeof(wire::CmRep),
          sizeof(wire::CmRej),   sizeof(wire::CmSidrReq),  sizeof(wire::CmSidrRep)};
}

template <typename T>
constexpr bool kPlainData = std::is_trivially_copyable_v<T> && std::is_standard_layout_v<T>;

static_assert(kPlainData<emu::CmEvent> && kPlainData<wire::IpAddress> && kPlainData<wire::CmReq> &&
                  kPlainData<wire::CmRep> && kPlainData<wire::CmRej> && kPlainData<wire::CmSidrReq> &&
                  kPlainData<wire::CmSidrRep>,
              "a struct that crosses the librdmacm / libibverbs boundary must be plain data (cm_export.h)");
static_assert(kPlainData<uroce_cm_ops> && kPlainData<uroce_cm_layout>);

}  // namespace uroce::cm_abi
