#include "wire/pcap.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace uroce::wire {
namespace {

using Bytes = std::vector<uint8_t>;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

void WriteFile(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

Bytes ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

// Builds a classic pcap file byte by byte, in either byte order, as another tool (tcpdump, dumpcap on a big-endian
// host) would have written it: independent of PcapWriter, so the reader is tested against the format, not itself.
class FileBuilder {
 public:
  FileBuilder(uint32_t link_type, bool big_endian, bool nanosecond) : big_endian_(big_endian) {
    Put32(nanosecond ? 0xA1B23C4D : 0xA1B2C3D4);
    Put16(2);
    Put16(4);
    Put32(0);
    Put32(0);
    Put32(65535);
    Put32(link_type);
  }
  FileBuilder& Record(uint32_t seconds, uint32_t fraction, const Bytes& frame, uint32_t original = 0) {
    Put32(seconds);
    Put32(fraction);
    Put32(static_cast<uint32_t>(frame.size()));
    Put32(original != 0 ? original : static_cast<uint32_t>(frame.size()));
    bytes_.insert(bytes_.end(), frame.begin(), frame.end());
    return *this;
  }
  const Bytes& bytes() const { return bytes_; }

 private:
  void Put16(uint16_t v) {
    if (big_endian_) {
      bytes_.push_back(v >> 8);
      bytes_.push_back(v & 0xFF);
    } else {
      bytes_.push_back(v & 0xFF);
      bytes_.push_back(v >> 8);
    }
  }
  void Put32(uint32_t v) {
    for (int i = 0; i < 4; ++i) {
      const int shift = big_endian_ ? 24 - 8 * i : 8 * i;
      bytes_.push_back((v >> shift) & 0xFF);
    }
  }
  bool big_endian_;
  Bytes bytes_;
};

// A minimal IPv4 header + 8 payload bytes (content irrelevant to the reader, which only uses version and length).
Bytes Ipv4Packet(uint8_t fill = 0xAB) {
  Bytes p(28, fill);
  p[0] = 0x45;
  p[1] = 0;
  p[2] = 0;
  p[3] = 28;  // total length
  return p;
}

Bytes Ipv6Packet() {
  Bytes p(48, 0xCD);
  p[0] = 0x60;
  p[4] = 0;
  p[5] = 8;  // payload length
  return p;
}

Bytes Concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Read {
  int rc;
  std::vector<PcapRecord> records;
  std::vector<Bytes> ip;  // copies, since record spans die at the next Next()
  std::string error;
};

Read ReadAll(const std::string& path) {
  Read out;
  PcapReader reader;
  out.rc = reader.Open(path);
  if (out.rc < 0) {
    out.error = reader.error();
    return out;
  }
  PcapRecord record;
  while ((out.rc = reader.Next(&record)) == 1) {
    out.ip.emplace_back(record.ip_packet.begin(), record.ip_packet.end());
    record.ip_packet = {};
    record.raw = {};
    out.records.push_back(record);
  }
  out.error = reader.error();
  return out;
}

Read ReadBytes(const std::string& name, const Bytes& bytes) {
  const std::string path = TempPath(name);
  WriteFile(path, bytes);
  return ReadAll(path);
}

TEST(PcapReader, ReadsAllFourMagicsWithTimestampsInNanoseconds) {
  for (bool big_endian : {false, true}) {
    for (bool nano : {false, true}) {
      SCOPED_TRACE(testing::Message() << "big_endian=" << big_endian << " nano=" << nano);
      FileBuilder file(101, big_endian, nano);
      file.Record(1700000000, nano ? 123456789 : 123456, Ipv4Packet());
      Read read = ReadBytes("magic.pcap", file.bytes());
      ASSERT_EQ(read.rc, 0) << read.error;
      ASSERT_EQ(read.records.size(), 1u);
      EXPECT_EQ(read.records[0].index, 1u);
      EXPECT_EQ(read.records[0].timestamp_ns, 1700000000ull * 1'000'000'000 + (nano ? 123456789 : 123456000));
      EXPECT_EQ(read.ip[0], Ipv4Packet());
      EXPECT_EQ(read.records[0].not_ip, "");
    }
  }
}

TEST(PcapReader, StripsEveryLinkHeader) {
  const Bytes ip = Ipv4Packet();
  const Bytes macs = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  struct Case {
    const char* name;
    uint32_t link_type;
    Bytes frame;
    Bytes want;
  };
  const std::vector<Case> cases = {
      {"raw", 101, ip, ip},
      {"raw6", 101, Ipv6Packet(), Ipv6Packet()},
      {"ipv4", 228, ip, ip},
      {"ipv6", 229, Ipv6Packet(), Ipv6Packet()},
      {"ethernet", 1, Concat(Concat(macs, {0x08, 0x00}), ip), ip},
      {"ethernet6", 1, Concat(Concat(macs, {0x86, 0xDD}), Ipv6Packet()), Ipv6Packet()},
      // 802.1Q tag (TPID 0x8100, TCI with VLAN 100), then IPv4.
      {"vlan", 1, Concat(Concat(macs, {0x81, 0x00, 0x00, 0x64, 0x08, 0x00}), ip), ip},
      // QinQ: 802.1ad S-tag, then 802.1Q C-tag.
      {"qinq", 1, Concat(Concat(macs, {0x88, 0xA8, 0x00, 0x0A, 0x81, 0x00, 0x00, 0x64, 0x86, 0xDD}), Ipv6Packet()),
       Ipv6Packet()},
      // Ethernet minimum-size padding and FCS after the IP packet are cut off by the IP total length.
      {"padding", 1, Concat(Concat(Concat(macs, {0x08, 0x00}), ip), Bytes(22, 0xEE)), ip},
      // SLL: packet type 0 (to us), ARPHRD_LOOPBACK 772, address length 6, 8 address bytes, protocol 0x0800.
      {"sll", 113, Concat({0, 0, 0x03, 0x04, 0, 6, 1, 2, 3, 4, 5, 6, 0, 0, 0x08, 0x00}, ip), ip},
      // SLL2: protocol 0x86DD, reserved, ifindex 1, ARPHRD_ETHER, packet type, address length, 8 address bytes.
      {"sll2", 276, Concat({0x86, 0xDD, 0, 0, 0, 0, 0, 1, 0, 1, 0, 6, 1, 2, 3, 4, 5, 6, 0, 0}, Ipv6Packet()),
       Ipv6Packet()},
      {"null_le", 0, Concat({2, 0, 0, 0}, ip), ip},
      {"null_be", 0, Concat({0, 0, 0, 30}, Ipv6Packet()), Ipv6Packet()},
      {"loop", 108, Concat({0, 0, 0, 2}, ip), ip},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    FileBuilder file(c.link_type, /*big_endian=*/c.link_type == 113, /*nanosecond=*/false);
    file.Record(1, 2, c.frame);
    Read read = ReadBytes(std::string(c.name) + ".pcap", file.bytes());
    ASSERT_EQ(read.rc, 0) << read.error;
    ASSERT_EQ(read.records.size(), 1u);
    EXPECT_EQ(read.records[0].not_ip, "");
    EXPECT_EQ(read.ip[0], c.want);
  }
}

TEST(PcapReader, SaysWhyARecordIsNotIp) {
  const Bytes macs(12, 0x11);
  struct Case {
    uint32_t link_type;
    Bytes frame;
    const char* want;
    bool malformed;
  };
  const std::vector<Case> cases = {
      {1, Concat(macs, {0x89, 0x15, 1, 2, 3}), "EtherType 0x8915 (RoCEv1) is not IP", false},
      {1, Concat(macs, {0x08, 0x06, 1, 2, 3}), "EtherType 0x0806 is not IP", false},
      {1, Bytes(10, 0), "frame too short for an Ethernet header (10 bytes)", true},
      {1, Concat(macs, {0x81, 0x00, 0x00}), "frame too short for a VLAN tag (15 bytes)", true},
      {113, Bytes(15, 0), "frame too short for a Linux cooked (SLL) header (15 bytes)", true},
      {276, Bytes(19, 0), "frame too short for a Linux cooked (SLL2) header (19 bytes)", true},
      {101, {0x15, 0, 0}, "IP version 1 is neither 4 nor 6", true},
      {101, {}, "empty packet", true},
      {228, Ipv6Packet(), "LINKTYPE_IPV4 record is not IPv4", true},
      {0, {7, 0, 0, 0, 0x45}, "loopback address family 7 is not IP", false},
      {147, Ipv4Packet(), "unsupported link type 147", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.want);
    FileBuilder file(c.link_type, false, true);
    file.Record(1, 2, c.frame);
    Read read = ReadBytes("notip.pcap", file.bytes());
    ASSERT_EQ(read.rc, 0) << read.error;
    ASSERT_EQ(read.records.size(), 1u);
    EXPECT_EQ(read.records[0].not_ip, c.want);
    EXPECT_EQ(read.records[0].malformed, c.malformed);
    EXPECT_TRUE(read.ip[0].empty());
  }
}

TEST(PcapReader, ReportsSnaplenTruncation) {
  FileBuilder file(101, false, true);
  Bytes cut = Ipv4Packet();
  cut.resize(20);
  file.Record(5, 6, cut, /*original=*/1500);
  Read read = ReadBytes("snap.pcap", file.bytes());
  ASSERT_EQ(read.rc, 0) << read.error;
  ASSERT_EQ(read.records.size(), 1u);
  EXPECT_TRUE(read.records[0].truncated);
  EXPECT_EQ(read.records[0].original_length, 1500u);
  EXPECT_EQ(read.ip[0], cut);  // Left whole for the IP parser to reject.
}

TEST(PcapReader, RejectsJunkWithAReason) {
  Read junk = ReadBytes("junk.pcap", Bytes(100, 'x'));
  EXPECT_EQ(junk.rc, -EPROTONOSUPPORT);
  EXPECT_EQ(junk.error, "not a pcap file (magic number 0x78787878)");

  Read short_header = ReadBytes("short.pcap", {0xD4, 0xC3, 0xB2, 0xA1, 2, 0});
  EXPECT_EQ(short_header.rc, -EBADMSG);
  EXPECT_EQ(short_header.error, "file too short for a pcap header (6 of 24 bytes)");

  Read empty = ReadBytes("empty.pcap", {});
  EXPECT_EQ(empty.rc, -EBADMSG);

  FileBuilder v1(101, false, false);
  Bytes version1 = v1.bytes();
  version1[4] = 1;
  EXPECT_EQ(ReadBytes("v1.pcap", version1).rc, -EPROTONOSUPPORT);

  Read missing = ReadAll(TempPath("does-not-exist.pcap"));
  EXPECT_EQ(missing.rc, -ENOENT);
}

TEST(PcapReader, ReportsAFileCutShortAfterTheGoodRecords) {
  FileBuilder file(101, false, true);
  file.Record(1, 0, Ipv4Packet(1)).Record(2, 0, Ipv4Packet(2));
  const Bytes whole = file.bytes();

  Bytes in_body(whole.begin(), whole.end() - 5);
  Read read = ReadBytes("cut_body.pcap", in_body);
  EXPECT_EQ(read.rc, -EBADMSG);
  EXPECT_EQ(read.records.size(), 1u);
  EXPECT_EQ(read.error, "record 2: file cut short inside the packet (23 of 28 bytes)");

  Bytes in_header(whole.begin(), whole.begin() + 24 + 16 + 28 + 7);
  read = ReadBytes("cut_header.pcap", in_header);
  EXPECT_EQ(read.rc, -EBADMSG);
  EXPECT_EQ(read.records.size(), 1u);
  EXPECT_EQ(read.error, "record 2: file cut short inside the record header (7 of 16 bytes)");
}

TEST(PcapReader, RefusesAnAbsurdRecordLengthWithoutAllocatingIt) {
  FileBuilder file(101, false, true);
  Bytes bytes = file.bytes();
  for (uint8_t b : {1, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0x7F, 0xFF, 0xFF, 0xFF, 0x7F}) bytes.push_back(b);
  Read read = ReadBytes("absurd.pcap", bytes);
  EXPECT_EQ(read.rc, -EBADMSG);
  EXPECT_NE(read.error.find("record 1: captured length 2147483647"), std::string::npos) << read.error;
}

// Every prefix of a valid file, and the file with each byte flipped, is read without a crash (ASan checks the
// bounds): each run ends in 0 or a negative error, never out of bounds.
void ExpectEveryPrefixAndByteFlipReadWithoutACrash(const Bytes& whole) {
  for (size_t n = 0; n <= whole.size(); ++n) {
    Read read = ReadBytes("prefix.cap", Bytes(whole.begin(), whole.begin() + n));
    EXPECT_LE(read.rc, 0);
  }
  for (size_t i = 0; i < whole.size(); ++i) {
    Bytes flipped = whole;
    flipped[i] ^= 0xFF;
    Read read = ReadBytes("flip.cap", flipped);
    EXPECT_LE(read.rc, 0);
  }
}

TEST(PcapReader, SurvivesEveryPrefixAndByteFlip) {
  FileBuilder file(1, false, true);
  file.Record(1, 0, Concat(Bytes(12, 0x22), Concat({0x81, 0x00, 0, 5, 0x08, 0x00}, Ipv4Packet())));
  file.Record(2, 0, Concat(Bytes(12, 0x22), Concat({0x86, 0xDD}, Ipv6Packet())));
  ExpectEveryPrefixAndByteFlipReadWithoutACrash(file.bytes());
}

// ---------------------------------------------------------------------------------------------------------------
// pcapng

// Builds a pcapng file block by block (draft-ietf-opsawg-pcapng), in either byte order per section, independent of
// the reader.
class PcapngBuilder {
 public:
  static constexpr uint32_t kNameResolution = 4;
  static constexpr uint32_t kInterfaceStatistics = 5;

  // A Section Header Block (with an shb_userappl option, which the reader must step over); later blocks use its
  // byte order.
  PcapngBuilder& Section(bool big_endian, uint16_t major = 1) {
    big_endian_ = big_endian;
    Bytes body;
    Put32(body, 0x1A2B3C4D);
    Put16(body, major);
    Put16(body, 0);
    Put32(body, 0xFFFFFFFF);  // section length: unknown
    Put32(body, 0xFFFFFFFF);
    Option(body, 4, Bytes{'u', 'r', 'o', 'c', 'e'});
    Option(body, 0, {});
    return Block(0x0A0D0D0A, body);
  }
  // An Interface Description Block; tsresol / tsoffset as options when given.
  PcapngBuilder& Interface(uint16_t link_type, uint32_t snaplen, int tsresol = -1, int64_t tsoffset = 0) {
    Bytes body;
    Put16(body, link_type);
    Put16(body, 0);
    Put32(body, snaplen);
    Option(body, 2, Bytes{'l', 'o'});  // if_name
    if (tsresol >= 0) Option(body, 9, Bytes{static_cast<uint8_t>(tsresol)});
    if (tsoffset != 0) {
      Bytes value;
      Put32(value, static_cast<uint32_t>(static_cast<uint64_t>(tsoffset) >> (big_endian_ ? 32 : 0)));
      Put32(value, static_cast<uint32_t>(static_cast<uint64_t>(tsoffset) >> (big_endian_ ? 0 : 32)));
      Option(body, 14, value);
    }
    Option(body, 0, {});
    return Block(1, body);
  }
  PcapngBuilder& Enhanced(uint32_t interface, uint64_t ticks, const Bytes& data, uint32_t original = 0) {
    Bytes body;
    Put32(body, interface);
    Put32(body, static_cast<uint32_t>(ticks >> 32));
    Put32(body, static_cast<uint32_t>(ticks));
    Put32(body, static_cast<uint32_t>(data.size()));
    Put32(body, original != 0 ? original : static_cast<uint32_t>(data.size()));
    Padded(body, data);
    Option(body, 1, Bytes{'h', 'i'});  // opt_comment
    Option(body, 0, {});
    return Block(6, body);
  }
  PcapngBuilder& Simple(const Bytes& data, uint32_t original = 0) {
    Bytes body;
    Put32(body, original != 0 ? original : static_cast<uint32_t>(data.size()));
    Padded(body, data);
    return Block(3, body);
  }
  PcapngBuilder& Block(uint32_t type, const Bytes& body) {
    Bytes padded_body;
    Padded(padded_body, body);
    const uint32_t total = static_cast<uint32_t>(padded_body.size() + 12);
    Put32(bytes_, type);
    Put32(bytes_, total);
    bytes_.insert(bytes_.end(), padded_body.begin(), padded_body.end());
    Put32(bytes_, total);
    return *this;
  }
  const Bytes& bytes() const { return bytes_; }
  void Put16(Bytes& out, uint16_t v) const {
    out.push_back(big_endian_ ? v >> 8 : v & 0xFF);
    out.push_back(big_endian_ ? v & 0xFF : v >> 8);
  }
  void Put32(Bytes& out, uint32_t v) const {
    for (int i = 0; i < 4; ++i) out.push_back((v >> (big_endian_ ? 24 - 8 * i : 8 * i)) & 0xFF);
  }

 private:
  void Option(Bytes& out, uint16_t code, const Bytes& value) {
    Put16(out, code);
    Put16(out, static_cast<uint16_t>(value.size()));
    Padded(out, value);
  }
  static void Padded(Bytes& out, const Bytes& data) {
    out.insert(out.end(), data.begin(), data.end());
    out.resize((out.size() + 3) & ~size_t{3}, 0);
  }
  bool big_endian_ = false;
  Bytes bytes_;
};

Bytes EthernetFrame(const Bytes& ip) {
  Bytes frame(12, 0x22);
  frame.push_back(ip[0] >> 4 == 6 ? 0x86 : 0x08);
  frame.push_back(ip[0] >> 4 == 6 ? 0xDD : 0x00);
  return Concat(frame, ip);
}

TEST(PcapngReader, ReadsEveryPacketBlockKindInBothByteOrdersAndSkipsOtherBlocks) {
  for (bool big_endian : {false, true}) {
    SCOPED_TRACE(testing::Message() << "big_endian=" << big_endian);
    PcapngBuilder file;
    file.Section(big_endian)
        .Interface(101, 0)                                // raw IP, microseconds (the default resolution)
        .Interface(1, 65535, /*tsresol=*/9)               // Ethernet, nanoseconds
        .Block(PcapngBuilder::kNameResolution, Bytes(8, 0))
        .Enhanced(0, 1'700'000'000'123'456ull, Ipv4Packet(1))
        .Block(0x00000BAD, Bytes(5, 0x77))                // unknown block type
        .Enhanced(1, 1'700'000'000'987'654'321ull, EthernetFrame(Ipv6Packet()))
        .Block(PcapngBuilder::kInterfaceStatistics, Bytes(12, 0))
        .Simple(Ipv4Packet(2));
    const std::string path = TempPath("kinds.pcapng");
    WriteFile(path, file.bytes());
    PcapReader reader;
    ASSERT_EQ(reader.Open(path), 0) << reader.error();
    EXPECT_TRUE(reader.pcapng());
    EXPECT_EQ(reader.byte_swapped(), big_endian != (__BYTE_ORDER__ == __ORDER_BIG_ENDIAN__));
    PcapRecord record;

    ASSERT_EQ(reader.Next(&record), 1) << reader.error();
    EXPECT_EQ(record.index, 1u);
    EXPECT_EQ(record.interface_id, 0u);
    EXPECT_EQ(record.link_type, 101u);
    EXPECT_EQ(record.timestamp_ns, 1'700'000'000'123'456'000ull);
    EXPECT_EQ(Bytes(record.ip_packet.begin(), record.ip_packet.end()), Ipv4Packet(1));
    EXPECT_FALSE(record.truncated);

    ASSERT_EQ(reader.Next(&record), 1) << reader.error();
    EXPECT_EQ(record.index, 2u);
    EXPECT_EQ(record.interface_id, 1u);
    EXPECT_EQ(record.link_type, 1u);
    EXPECT_EQ(reader.link_type(), 1u);
    EXPECT_TRUE(reader.nanosecond());
    EXPECT_EQ(record.timestamp_ns, 1'700'000'000'987'654'321ull);
    EXPECT_EQ(Bytes(record.ip_packet.begin(), record.ip_packet.end()), Ipv6Packet());
    EXPECT_EQ(record.raw.size(), 14 + Ipv6Packet().size());

    // A Simple Packet Block: interface 0, no timestamp.
    ASSERT_EQ(reader.Next(&record), 1) << reader.error();
    EXPECT_EQ(record.index, 3u);
    EXPECT_EQ(record.interface_id, 0u);
    EXPECT_EQ(record.timestamp_ns, 0u);
    EXPECT_EQ(Bytes(record.ip_packet.begin(), record.ip_packet.end()), Ipv4Packet(2));

    EXPECT_EQ(reader.Next(&record), 0) << reader.error();
  }
}

TEST(PcapngReader, ConvertsEveryTimestampResolutionAndOffset) {
  struct Case {
    int tsresol;
    int64_t tsoffset;
    uint64_t ticks;
    uint64_t want_ns;
  };
  const std::vector<Case> cases = {
      {3, 0, 1'700'000'000'123ull, 1'700'000'000'123'000'000ull},      // milliseconds
      {0x80 | 10, 0, 3 * 1024 + 512, 3'500'000'000ull},               // 2^-10 s
      {0x80 | 30, 0, (uint64_t{1} << 30) * 7, 7'000'000'000ull},      // 2^-30 s
      {12, 0, 5'000'000'000'123ull, 5'000'000'000ull},                // picoseconds: cut to ns
      {6, 100, 1'000'000, 101'000'000'000ull},                        // if_tsoffset adds seconds
      {6, -5, 1'000'000, 0},                                          // before the epoch: 0, not a wrap
      {127, 0, UINT64_MAX, 0},                                        // absurd resolution: no overflow
      {0, 0, UINT64_MAX, UINT64_MAX},                                 // seconds beyond 2554: saturates
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "tsresol=" << c.tsresol << " tsoffset=" << c.tsoffset);
    PcapngBuilder file;
    file.Section(false).Interface(101, 0, c.tsresol, c.tsoffset).Enhanced(0, c.ticks, Ipv4Packet());
    Read read = ReadBytes("ts.pcapng", file.bytes());
    ASSERT_EQ(read.rc, 0) << read.error;
    ASSERT_EQ(read.records.size(), 1u);
    EXPECT_EQ(read.records[0].timestamp_ns, c.want_ns);
  }
}

TEST(PcapngReader, ReadsSeveralSectionsEachWithItsOwnByteOrderAndInterfaces) {
  PcapngBuilder file;
  file.Section(false).Interface(101, 0).Interface(228, 0).Enhanced(1, 1, Ipv4Packet(1));
  file.Section(true).Interface(1, 0).Enhanced(0, 2, EthernetFrame(Ipv4Packet(2))).Simple(EthernetFrame(Ipv6Packet()));
  Read read = ReadBytes("sections.pcapng", file.bytes());
  ASSERT_EQ(read.rc, 0) << read.error;
  ASSERT_EQ(read.records.size(), 3u);
  EXPECT_EQ(read.records[0].link_type, 228u);
  EXPECT_EQ(read.records[1].link_type, 1u);
  EXPECT_EQ(read.records[1].index, 2u);
  EXPECT_EQ(read.ip[0], Ipv4Packet(1));
  EXPECT_EQ(read.ip[1], Ipv4Packet(2));
  EXPECT_EQ(read.ip[2], Ipv6Packet());

  // A new section forgets the interfaces of the one before.
  PcapngBuilder stale;
  stale.Section(false).Interface(101, 0).Interface(101, 0).Section(true).Interface(101, 0).Enhanced(1, 0, Ipv4Packet());
  read = ReadBytes("stale_interface.pcapng", stale.bytes());
  EXPECT_EQ(read.rc, -EBADMSG);
  EXPECT_EQ(read.error, "record 1: packet of interface 1, but the section describes 1");
}

TEST(PcapngReader, CutsSimplePacketsToTheSnaplenAndReportsTruncation) {
  Bytes cut = Ipv4Packet();
  cut.resize(20);
  PcapngBuilder file;
  file.Section(false).Interface(101, /*snaplen=*/20).Simple(cut, /*original=*/28).Enhanced(0, 0, cut, 1500);
  Read read = ReadBytes("snap.pcapng", file.bytes());
  ASSERT_EQ(read.rc, 0) << read.error;
  ASSERT_EQ(read.records.size(), 2u);
  EXPECT_EQ(read.ip[0], cut);
  EXPECT_TRUE(read.records[0].truncated);
  EXPECT_EQ(read.records[0].original_length, 28u);
  EXPECT_TRUE(read.records[1].truncated);
  EXPECT_EQ(read.records[1].original_length, 1500u);
}

TEST(PcapngReader, MalformedFilesGiveAnErrorSayingWhy) {
  const Bytes good = [] {
    PcapngBuilder file;
    file.Section(false).Interface(101, 0).Enhanced(0, 0, Ipv4Packet());
    return file.bytes();
  }();
  const size_t shb = 44;  // Section Header Block: 12 + 16 fixed + 16 of options (user application, end)
  const size_t idb = 32;  // Interface Description Block: 12 + 8 fixed + 8 if_name + 4 end
  ASSERT_EQ(good[shb], 1);
  ASSERT_EQ(good[shb + idb], 6);

  struct Case {
    const char* name;
    Bytes bytes;
    int open_rc;  // Open's result; when 0, the error comes from Next after `records` packets
    size_t records;
    const char* error;
  };
  auto with = [&](size_t at, std::initializer_list<uint8_t> patch) {
    Bytes b = good;
    std::copy(patch.begin(), patch.end(), b.begin() + at);
    return b;
  };
  PcapngBuilder orphan;
  orphan.Section(false).Simple(Ipv4Packet());
  PcapngBuilder overrun;
  overrun.Section(false).Interface(101, 0);
  {
    Bytes body;  // an EPB claiming 200 captured bytes with 28 present
    for (uint32_t v : {0u, 0u, 0u, 200u, 200u}) overrun.Put32(body, v);
    body.insert(body.end(), 28, 0x45);
    overrun.Block(6, body);
  }
  PcapngBuilder bad_option;
  bad_option.Section(false);
  {
    Bytes body;
    bad_option.Put16(body, 101);
    bad_option.Put16(body, 0);
    bad_option.Put32(body, 0);
    bad_option.Put16(body, 9);   // if_tsresol
    bad_option.Put16(body, 40);  // 40 bytes that are not there
    bad_option.Block(1, body);
  }
  const std::vector<Case> cases = {
      {"cut in the section header", Bytes(good.begin(), good.begin() + 24), -EBADMSG, 0,
       "pcapng block at byte 0: file cut short inside the block"},
      {"bad byte-order magic", with(8, {1, 2, 3, 4}), -EBADMSG, 0,
       "pcapng block at byte 0: bad byte-order magic 0x04030201"},
      {"version 2", with(12, {2}), -EPROTONOSUPPORT, 0, "unsupported pcapng version 2.0"},
      {"length not a multiple of 4", with(shb + 4, {37}), 0, 0,
       "pcapng block at byte 44: block length 37 is invalid; the file is corrupt"},
      {"length below the minimum", with(shb + 4, {8}), 0, 0,
       "pcapng block at byte 44: block length 8 is invalid; the file is corrupt"},
      {"absurd length", with(shb + 4, {0xF0, 0xFF, 0xFF, 0x7F}), 0, 0,
       "pcapng block at byte 44: block length 2147483632 is beyond any real block; the file is corrupt"},
      {"trailing length differs", with(shb + idb - 4, {40}), 0, 0,
       "pcapng block at byte 44: trailing block length 40 differs from 32"},
      {"cut in a packet block", Bytes(good.begin(), good.end() - 6), 0, 0,
       "pcapng block at byte 76: file cut short inside the block"},
      {"cut in a block header", Concat(good, {6, 0, 0}), 0, 1,
       "pcapng block at byte 148: file cut short inside the block header"},
      {"packet of an undescribed interface", with(shb + idb + 8, {3}), 0, 0,
       "record 1: packet of interface 3, but the section describes 1"},
      {"simple packet before any interface", orphan.bytes(), 0, 0,
       "record 1: packet of interface 0, but the section describes 0"},
      {"captured length overruns the block", overrun.bytes(), 0, 0,
       "record 1: captured length 200 overruns its block (28 bytes)"},
      {"option overruns the block", bad_option.bytes(), 0, 0,
       "pcapng Interface Description Block 0: option 9 overruns the block"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Read read = ReadBytes("malformed.pcapng", c.bytes);
    if (c.open_rc != 0) {
      EXPECT_EQ(read.rc, c.open_rc);
    } else {
      EXPECT_EQ(read.rc, -EBADMSG);
      EXPECT_EQ(read.records.size(), c.records);
    }
    EXPECT_EQ(read.error, c.error);
  }
}

// Every prefix of a valid pcapng file, and the file with each byte flipped, in both byte orders, is read without a
// crash (ASan checks the bounds): each run ends in 0 or a negative error.
TEST(PcapngReader, SurvivesEveryPrefixAndByteFlip) {
  for (bool big_endian : {false, true}) {
    PcapngBuilder file;
    file.Section(big_endian).Interface(1, 96, 9).Enhanced(0, 5, EthernetFrame(Ipv4Packet()));
    file.Simple(EthernetFrame(Ipv6Packet())).Block(5, Bytes(12, 0));
    const Bytes whole = file.bytes();
    EXPECT_EQ(ReadBytes("whole.pcapng", whole).records.size(), 2u);
    ExpectEveryPrefixAndByteFlipReadWithoutACrash(whole);
  }
}

TEST(PcapWriter, WritesANanosecondRawFileTheReaderReadsBack) {
  const std::string path = TempPath("writer_raw.pcap");
  PcapWriter writer;
  ASSERT_EQ(writer.Open(path), 0);
  EXPECT_EQ(writer.Open(path), -EBUSY);
  ASSERT_EQ(writer.Write(1'700'000'000'123'456'789ull, Ipv4Packet(1)), 0);
  ASSERT_EQ(writer.Write(5, Ipv6Packet()), 0);
  EXPECT_EQ(writer.Write(6, {}), -EINVAL);
  EXPECT_EQ(writer.records_written(), 2u);
  ASSERT_EQ(writer.Close(), 0);
  EXPECT_EQ(writer.Close(), 0);
  EXPECT_EQ(writer.Write(7, Ipv4Packet()), -EBADF);

  // The file header as pcap-savefile(5) lays it out, in this (little-endian) host's order.
  const Bytes bytes = ReadFile(path);
  ASSERT_GE(bytes.size(), 24u);
  EXPECT_EQ(Bytes(bytes.begin(), bytes.begin() + 8), (Bytes{0x4D, 0x3C, 0xB2, 0xA1, 2, 0, 4, 0}));
  EXPECT_EQ(Bytes(bytes.begin() + 20, bytes.begin() + 24), (Bytes{101, 0, 0, 0}));

  PcapReader reader;
  ASSERT_EQ(reader.Open(path), 0);
  EXPECT_TRUE(reader.nanosecond());
  EXPECT_EQ(reader.link_type(), 101u);
  PcapRecord record;
  ASSERT_EQ(reader.Next(&record), 1);
  EXPECT_EQ(record.timestamp_ns, 1'700'000'000'123'456'789ull);
  EXPECT_EQ(Bytes(record.ip_packet.begin(), record.ip_packet.end()), Ipv4Packet(1));
  ASSERT_EQ(reader.Next(&record), 1);
  EXPECT_EQ(record.index, 2u);
  EXPECT_EQ(Bytes(record.ip_packet.begin(), record.ip_packet.end()), Ipv6Packet());
  EXPECT_EQ(reader.Next(&record), 0);
  EXPECT_EQ(reader.Next(&record), 0);
}

TEST(PcapWriter, EthernetLinkTypeAndSnaplen) {
  const std::string path = TempPath("writer_eth.pcap");
  PcapWriter writer;
  ASSERT_EQ(writer.Open(path, {.link_type = PcapLinkType::kEthernet, .snaplen = 30}), 0);
  ASSERT_EQ(writer.Write(1, Ipv4Packet()), 0);     // 14 + 28 = 42 on the wire, 30 captured
  EXPECT_EQ(writer.Write(2, Bytes{0x15, 0}), -EINVAL);  // not IP: no EtherType to give it
  ASSERT_EQ(writer.Close(), 0);

  PcapReader reader;
  ASSERT_EQ(reader.Open(path), 0);
  EXPECT_EQ(reader.link_type(), 1u);
  EXPECT_EQ(reader.snaplen(), 30u);
  PcapRecord record;
  ASSERT_EQ(reader.Next(&record), 1);
  EXPECT_TRUE(record.truncated);
  EXPECT_EQ(record.original_length, 42u);
  EXPECT_EQ(record.raw.size(), 30u);
  EXPECT_EQ(record.raw[12], 0x08);
  EXPECT_EQ(record.raw[13], 0x00);
  const Bytes ip = Ipv4Packet();
  EXPECT_EQ(Bytes(record.ip_packet.begin(), record.ip_packet.end()), Bytes(ip.begin(), ip.begin() + 16));
  EXPECT_EQ(reader.Next(&record), 0);
}

TEST(PcapWriter, RejectsBadOptionsAndUnwritablePaths) {
  PcapWriter writer;
  EXPECT_EQ(writer.Open(TempPath("bad.pcap"), {.link_type = PcapLinkType::kLinuxSll2}), -EINVAL);
  EXPECT_EQ(writer.Open(TempPath("bad.pcap"), {.snaplen = 0}), -EINVAL);
  EXPECT_EQ(writer.Open(TempPath("no/such/dir/x.pcap")), -ENOENT);
  EXPECT_FALSE(writer.is_open());
}

TEST(PcapWriter, ConcurrentWritersNeverInterleaveRecords) {
  const std::string path = TempPath("writer_threads.pcap");
  PcapWriter writer;
  ASSERT_EQ(writer.Open(path), 0);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&writer, t] {
      for (int i = 0; i < kPerThread; ++i) {
        Bytes packet = Ipv4Packet(static_cast<uint8_t>(t + 1));
        packet[4] = static_cast<uint8_t>(i);
        ASSERT_EQ(writer.Write(static_cast<uint64_t>(i), packet), 0);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_EQ(writer.Close(), 0);

  Read read = ReadAll(path);
  ASSERT_EQ(read.rc, 0) << read.error;
  ASSERT_EQ(read.records.size(), size_t{kThreads * kPerThread});
  std::vector<int> per_thread(kThreads + 1, 0);
  for (const Bytes& ip : read.ip) {
    ASSERT_EQ(ip.size(), 28u);
    const uint8_t t = ip[27];
    ASSERT_GE(t, 1);
    ASSERT_LE(t, kThreads);
    EXPECT_EQ(ip[4], static_cast<uint8_t>(per_thread[t]));  // each thread's records in its own order
    ++per_thread[t];
  }
}

}  // namespace
}  // namespace uroce::wire
