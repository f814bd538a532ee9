// The two things every eventfd here is used for: waking whoever waits on it, and emptying it. Transports' Wake(),
// the shared-memory rings' doorbells, the device service, librdmacm's channels and watchers, and the verbs' async
// event queue share them.
#pragma once

namespace uroce::wire {

// Reads an eventfd until it is empty (the descriptor must be non-blocking).
void DrainEventFd(int fd);
// Adds 1 to an eventfd: wakes whoever waits on it. A failure (a full counter on a non-blocking eventfd) is ignored:
// the waiter has a wake-up pending already.
void SignalEventFd(int fd);

}  // namespace uroce::wire
