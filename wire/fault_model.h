// Fault injection as a pure function. Following eRPC's practice of making packet loss a first-class, configurable
// knob (Kalia et al., "Datacenter RPCs can be General and Fast", NSDI'19), every fault a transport applies to a
// datagram is decided by FaultModel::Decide from (seed, stream, packet index) alone, through a counter-based hash
// (splitmix64 finalisers), never through std:: distributions, whose output differs between library versions. A test
// therefore recomputes exactly what must have happened to packet N of a stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "wire/address.h"

namespace uroce::wire {

struct FaultConfig {
  double loss = 0;       // probability a datagram is dropped
  double duplicate = 0;  // probability a datagram is delivered twice
  double reorder = 0;    // probability a datagram is held back by reorder_delay_ns, so later ones overtake it
  double corrupt = 0;    // probability one payload bit is flipped
  uint64_t delay_ns = 0;                 // added to every datagram
  uint64_t reorder_delay_ns = 100'000;   // how far a reordered datagram is held back
  uint64_t seed = 1;

  // True when any fault or delay would be applied.
  bool any() const;
  // "loss=0.02,dup=0.01,reorder=0.02,corrupt=0.001,delay_ns=50000,reorder_delay_ns=100000,seed=7": the form Parse
  // reads (doubles printed shortest round-trip, so Parse(ToString()) == *this).
  std::string ToString() const;
  // Parses comma-separated key=value pairs. Keys: loss, dup|duplicate, reorder, corrupt (probabilities in [0, 1]);
  // delay_ns|delay_us|delay_ms, reorder_delay_ns|reorder_delay_us|reorder_delay_ms, seed (unsigned integers).
  // Whitespace around items is ignored; an empty string gives the defaults. On failure returns nullopt and, when
  // `error` is non-null, says which item is wrong.
  static std::optional<FaultConfig> Parse(std::string_view text, std::string* error = nullptr);

  bool operator==(const FaultConfig&) const = default;
};

// What happens to one datagram. A dropped datagram has copies == 1 and no other effect. A duplicated one is delivered
// twice, both copies at the same time; corruption (if any) applies to the first copy only, the second is intact.
struct FaultDecision {
  bool drop = false;
  int copies = 1;             // 1 or 2
  bool reorder = false;       // held back by reorder_delay_ns
  int corrupt_bit = -1;       // -1: none; else bit index into the payload (bit b is byte b/8, mask 0x80 >> b%8)
  uint64_t extra_delay_ns = 0;  // delay_ns + (reorder ? reorder_delay_ns : 0); 0 when dropped

  bool operator==(const FaultDecision&) const = default;
};

struct FaultCounters {
  uint64_t seen = 0;        // datagrams offered to the model
  uint64_t dropped = 0;
  uint64_t duplicated = 0;
  uint64_t reordered = 0;
  uint64_t corrupted = 0;
  uint64_t delayed = 0;     // not dropped and extra_delay_ns > 0

  void Count(const FaultDecision& d);
  FaultCounters& operator+=(const FaultCounters& o);
  bool operator==(const FaultCounters&) const = default;
};

class FaultModel {
 public:
  FaultModel() = default;  // no faults
  FaultModel(const FaultConfig& config, uint64_t stream_id) : config_(config), stream_id_(stream_id) {}

  // Pure: depends only on (config, stream_id, packet_index, payload_len). Each fault kind draws its own uniform
  // variate, so raising one probability never changes which packets another fault hits.
  FaultDecision Decide(uint64_t packet_index, size_t payload_len) const;

  const FaultConfig& config() const { return config_; }
  uint64_t stream_id() const { return stream_id_; }

 private:
  FaultConfig config_;
  uint64_t stream_id_ = 0;
};

// A stable stream id for the direction from -> to (SimNetwork uses it per link).
uint64_t FaultStreamId(const UdpEndpoint& from, const UdpEndpoint& to);

// splitmix64's finaliser (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA'14).
uint64_t Mix64(uint64_t x);

// Flips bit `bit` of `bytes` (bit b is byte b/8, mask 0x80 >> b%8); no-op if out of range.
void FlipBit(std::span<uint8_t> bytes, int bit);

}  // namespace uroce::wire
