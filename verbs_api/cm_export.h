// What uroce's librdmacm.so.1 needs from the engine of uroce's libibverbs.so.1: the device's connection manager.
// Exported in the private version node UROCE_PRIVATE_1 (libibverbs.map). The ConnectionManager's methods are
// virtual, so librdmacm calls them through this instance's vtable without any other exported symbol.
#pragma once

#include <infiniband/verbs.h>

#include "emu/connection_manager.h"

extern "C" {
// The connection manager of the device behind `context` (a context of uroce's libibverbs), or NULL.
uroce::emu::ConnectionManager* uroce_connection_manager(struct ibv_context* context);
}
