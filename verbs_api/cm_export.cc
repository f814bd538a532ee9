#include "verbs_api/cm_export.h"

#include "verbs_api/internal.h"

extern "C" uroce::emu::ConnectionManager* uroce_connection_manager(ibv_context* context) {
  if (context == nullptr) return nullptr;
  return &uroce::verbs::Ctx(context)->dev().connection_manager();
}
