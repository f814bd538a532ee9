#include "wire/fault_model.h"

#include <charconv>
#include <cmath>
#include <system_error>

namespace uroce::wire {
namespace {

// Salts that give each fault kind its own independent draw.
enum Draw : uint64_t { kDrawLoss = 1, kDrawDuplicate, kDrawReorder, kDrawCorrupt, kDrawCorruptBit };

uint64_t Hash(uint64_t seed, uint64_t stream, uint64_t index, uint64_t draw) {
  uint64_t h = Mix64(seed + 0x9e3779b97f4a7c15ull);
  h = Mix64(h ^ stream);
  h = Mix64(h ^ index);
  return Mix64(h ^ (draw * 0xd1b54a32d192ed03ull));
}

// Uniform in [0, 1) from the top 53 bits.
double Unit(uint64_t h) { return double(h >> 11) * 0x1.0p-53; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool ParseU64(std::string_view v, uint64_t* out) {
  if (v.empty()) return false;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
  return ec == std::errc() && p == v.data() + v.size();
}

bool ParseProbability(std::string_view v, double* out) {
  if (v.empty()) return false;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), *out, std::chars_format::general);
  return ec == std::errc() && p == v.data() + v.size() && std::isfinite(*out) && *out >= 0 && *out <= 1;
}

std::string FormatDouble(double d) {
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, d);
  return std::string(buf, ec == std::errc() ? p : buf);
}

}  // namespace

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void FlipBit(std::span<uint8_t> bytes, int bit) {
  if (bit < 0 || size_t(bit) / 8 >= bytes.size()) return;
  bytes[size_t(bit) / 8] ^= uint8_t(0x80u >> (bit % 8));
}

bool FaultConfig::any() const {
  return loss > 0 || duplicate > 0 || reorder > 0 || corrupt > 0 || delay_ns > 0;
}

std::string FaultConfig::ToString() const {
  return "loss=" + FormatDouble(loss) + ",dup=" + FormatDouble(duplicate) + ",reorder=" + FormatDouble(reorder) +
         ",corrupt=" + FormatDouble(corrupt) + ",delay_ns=" + std::to_string(delay_ns) +
         ",reorder_delay_ns=" + std::to_string(reorder_delay_ns) + ",seed=" + std::to_string(seed);
}

std::optional<FaultConfig> FaultConfig::Parse(std::string_view text, std::string* error) {
  FaultConfig c;
  auto fail = [&](std::string why) -> std::optional<FaultConfig> {
    if (error) *error = std::move(why);
    return std::nullopt;
  };
  while (true) {
    size_t comma = text.find(',');
    std::string_view item = Trim(text.substr(0, comma));
    if (!item.empty()) {
      size_t eq = item.find('=');
      if (eq == std::string_view::npos) return fail("fault item '" + std::string(item) + "' is not key=value");
      std::string_view key = Trim(item.substr(0, eq));
      std::string_view value = Trim(item.substr(eq + 1));
      double* prob = nullptr;
      if (key == "loss") prob = &c.loss;
      else if (key == "dup" || key == "duplicate") prob = &c.duplicate;
      else if (key == "reorder") prob = &c.reorder;
      else if (key == "corrupt") prob = &c.corrupt;
      if (prob) {
        if (!ParseProbability(value, prob))
          return fail("fault '" + std::string(key) + "' wants a probability in [0, 1], got '" + std::string(value) + "'");
      } else {
        uint64_t n = 0;
        uint64_t scale = 0;
        uint64_t* dst = nullptr;
        if (key == "delay_ns") dst = &c.delay_ns, scale = 1;
        else if (key == "delay_us") dst = &c.delay_ns, scale = 1000;
        else if (key == "delay_ms") dst = &c.delay_ns, scale = 1'000'000;
        else if (key == "reorder_delay_ns") dst = &c.reorder_delay_ns, scale = 1;
        else if (key == "reorder_delay_us") dst = &c.reorder_delay_ns, scale = 1000;
        else if (key == "reorder_delay_ms") dst = &c.reorder_delay_ns, scale = 1'000'000;
        else if (key == "seed") dst = &c.seed, scale = 1;
        else return fail("unknown fault key '" + std::string(key) + "'");
        if (!ParseU64(value, &n))
          return fail("fault '" + std::string(key) + "' wants an unsigned integer, got '" + std::string(value) + "'");
        if (n > UINT64_MAX / scale) return fail("fault '" + std::string(key) + "' value too large");
        *dst = n * scale;
      }
    }
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return c;
}

void FaultCounters::Count(const FaultDecision& d) {
  ++seen;
  if (d.drop) {
    ++dropped;
    return;
  }
  if (d.copies > 1) ++duplicated;
  if (d.reorder) ++reordered;
  if (d.corrupt_bit >= 0) ++corrupted;
  if (d.extra_delay_ns > 0) ++delayed;
}

FaultCounters& FaultCounters::operator+=(const FaultCounters& o) {
  seen += o.seen;
  dropped += o.dropped;
  duplicated += o.duplicated;
  reordered += o.reordered;
  corrupted += o.corrupted;
  delayed += o.delayed;
  return *this;
}

FaultDecision FaultModel::Decide(uint64_t packet_index, size_t payload_len) const {
  FaultDecision d;
  const FaultConfig& c = config_;
  auto hit = [&](double p, Draw draw) {
    return p > 0 && Unit(Hash(c.seed, stream_id_, packet_index, draw)) < p;
  };
  if (hit(c.loss, kDrawLoss)) {
    d.drop = true;
    return d;
  }
  if (hit(c.duplicate, kDrawDuplicate)) d.copies = 2;
  if (hit(c.reorder, kDrawReorder)) d.reorder = true;
  if (payload_len > 0 && payload_len <= size_t(INT32_MAX) / 8 && hit(c.corrupt, kDrawCorrupt)) {
    d.corrupt_bit = int(Hash(c.seed, stream_id_, packet_index, kDrawCorruptBit) % (uint64_t(payload_len) * 8));
  }
  d.extra_delay_ns = c.delay_ns + (d.reorder ? c.reorder_delay_ns : 0);
  return d;
}

uint64_t FaultStreamId(const UdpEndpoint& from, const UdpEndpoint& to) {
  uint64_t h = 0x5eed;
  for (uint8_t b : from.addr.bytes()) h = Mix64(h ^ b);
  h = Mix64(h ^ from.port);
  for (uint8_t b : to.addr.bytes()) h = Mix64(h ^ b);
  return Mix64(h ^ (uint64_t{to.port} << 16));
}

}  // namespace uroce::wire
