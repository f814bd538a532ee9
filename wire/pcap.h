// pcap files, so what uroce sends and receives can be opened in Wireshark/tshark, and captures made by tcpdump,
// dumpcap or Wireshark on `lo` or on a real RoCE NIC can be decoded by `uroce_decode`.
//
// The writer produces nanosecond-resolution files (magic 0xA1B23C4D) holding IP packets, by default with
// LINKTYPE_RAW (101: the record starts with the IPv4 or IPv6 header), optionally with LINKTYPE_ETHERNET (1) and a
// synthetic Ethernet header. The reader accepts both byte orders and both timestamp resolutions, and strips the link
// header of the link types a Linux capture of RoCEv2 traffic has (see PcapLinkType).
//
// The reader also reads pcapng (draft-ietf-opsawg-pcapng; Wireshark's and dumpcap's default format), told apart by
// the first four bytes: Section Header Blocks in either byte order (a file may hold several sections, each with its
// own byte order and interfaces), Interface Description Blocks (per-interface link type, snaplen, if_tsresol and
// if_tsoffset), Enhanced and Simple Packet Blocks; every other block (name resolution, statistics, decryption
// secrets, custom) is skipped.
//
// Error contract: functions that can fail return 0 (or a count) on success and -errno on failure.
#pragma once

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace uroce::wire {

// Link types (the LINKTYPE_ registry of tcpdump.org; values as stored in a pcap file header).
enum class PcapLinkType : uint16_t {
  kNull = 0,         // BSD loopback: 4-byte address family in the capturing host's byte order.
  kEthernet = 1,     // Ethernet II, possibly with 802.1Q / 802.1ad tags.
  kRaw = 101,        // Raw IPv4 or IPv6 packet, version from the first nibble.
  kLoop = 108,       // OpenBSD loopback: 4-byte address family in network byte order.
  kLinuxSll = 113,   // Linux "cooked" capture v1 (tcpdump -i any on older libpcap): 16-byte header.
  kIpv4 = 228,       // Raw IPv4.
  kIpv6 = 229,       // Raw IPv6.
  kLinuxSll2 = 276,  // Linux "cooked" capture v2 (tcpdump -i any, libpcap >= 1.10): 20-byte header.
};

// The name of a link type for messages ("RAW", "ETHERNET", "LINUX_SLL2", or the number).
std::string PcapLinkTypeName(uint32_t link_type);

struct PcapWriterOptions {
  PcapLinkType link_type = PcapLinkType::kRaw;  // kRaw or kEthernet.
  uint32_t snaplen = 262144;                     // Longer packets are stored cut to this length (orig_len kept).
};

// Writes IP packets to a new pcap file. Each record goes to the kernel with one write(2) while a lock is held, so
// concurrent writers never interleave records and a crash of the process loses no record that Write returned for.
class PcapWriter {
 public:
  PcapWriter() = default;
  ~PcapWriter();
  PcapWriter(const PcapWriter&) = delete;
  PcapWriter& operator=(const PcapWriter&) = delete;

  // Creates (or truncates) `path` and writes the file header. 0 or -errno (-EINVAL for an unsupported link type or
  // a snaplen of 0; -EBUSY if already open).
  int Open(const std::string& path, const PcapWriterOptions& options = {});

  // Appends one record. `ip_packet` starts with the IPv4 or IPv6 header; with kEthernet the writer prepends an
  // Ethernet header (synthetic locally administered MACs, EtherType from the IP version). 0 or -errno (-EBADF when
  // not open, -EINVAL when ip_packet is empty or, with kEthernet, not IPv4/IPv6). Thread-safe.
  int Write(uint64_t timestamp_ns, std::span<const uint8_t> ip_packet);

  // Closes the file. 0 or -errno. Safe to call twice.
  int Close();

  bool is_open() const;
  uint64_t records_written() const;

 private:
  mutable std::mutex mu_;
  int fd_ = -1;
  PcapWriterOptions options_;
  uint64_t records_ = 0;
};

// One record of a capture. The spans point into the reader's buffer and stay valid until the next call to Next.
struct PcapRecord {
  uint64_t index = 0;         // 1-based, as Wireshark numbers frames.
  uint64_t timestamp_ns = 0;  // Since the Unix epoch.
  // The IP packet, link-layer header stripped and link-layer padding/trailer (Ethernet minimum-size padding, FCS)
  // cut off using the IP length field. Empty when the record is not an IP packet: then `not_ip` says why.
  std::span<const uint8_t> ip_packet;
  std::string not_ip;
  // With not_ip: the record claims to be IP (or cannot even hold its link header) but is broken, as opposed to
  // carrying another protocol (ARP, RoCEv1) or an unsupported link type.
  bool malformed = false;
  std::span<const uint8_t> raw;  // The whole captured record, link header included.
  uint32_t link_type = 0;        // Of the file (pcap) or of the packet's interface (pcapng).
  uint32_t interface_id = 0;     // pcapng: the packet's interface in its section; pcap: 0.
  uint32_t original_length = 0;  // Length on the wire (orig_len).
  bool truncated = false;        // The capture holds fewer bytes than were on the wire (snaplen).
};

// Reads a classic pcap or a pcapng file packet by packet.
class PcapReader {
 public:
  PcapReader() = default;
  ~PcapReader();
  PcapReader(const PcapReader&) = delete;
  PcapReader& operator=(const PcapReader&) = delete;

  // Opens `path` ("-" reads standard input) and reads the file header (pcapng: the first Section Header Block).
  // 0 or -errno: -ENOENT etc. from open(2), -EPROTONOSUPPORT for an unknown magic number or version, -EBADMSG for a
  // file too short to hold a header or a malformed Section Header Block. error() says why in words.
  int Open(const std::string& path);

  // Reads the next record. Returns 1 with `*record` filled, 0 at the end of the file, or -EBADMSG when the file is
  // malformed (cut short inside a record, a record length beyond any sane size) or -errno from read(2); error() says
  // why. After an error, further calls return the same error. A record with an unsupported link type or a non-IP
  // payload is not an error: it comes back with `not_ip` set. pcapng: a block cut short, a block length that is
  // not a multiple of 4 or disagrees with its trailing copy, an option or packet overrunning its block, or a packet
  // of an interface the section did not describe is -EBADMSG.
  int Next(PcapRecord* record);

  bool pcapng() const { return pcapng_; }
  // pcap: the file header's fields (link type: its low 16 bits). pcapng: those of the interface of the last packet
  // read (before the first packet: of the first interface, or 0), byte order of the current section.
  uint32_t link_type() const { return link_type_; }
  bool nanosecond() const { return nanosecond_; }
  bool byte_swapped() const { return swapped_; }
  uint32_t snaplen() const { return snaplen_; }
  const std::string& error() const { return error_; }

 private:
  // A pcapng Interface Description Block.
  struct Interface {
    uint32_t link_type = 0;
    uint32_t snaplen = 0;   // 0: no limit.
    uint8_t tsresol = 6;    // if_tsresol: units of 10^-n s, or of 2^-n s when the top bit is set; default microseconds.
    int64_t tsoffset = 0;   // if_tsoffset: seconds added to every timestamp.
  };

  int Fail(int err, std::string message);
  uint16_t U16(const uint8_t* p) const;
  uint32_t U32(const uint8_t* p) const;
  int OpenPcapng();
  // Reads the next pcapng block into buffer_ (its body: after type and length, before the trailing length). 1 with
  // `*type` set, 0 at the end of the file, or the error.
  int ReadBlock(uint32_t* type, size_t* body_size);
  int ParseSectionHeader();
  int ParseInterface(size_t body_size);
  int NextPcapng(PcapRecord* record);
  void SetCurrentInterface(const Interface& interface);

  std::FILE* file_ = nullptr;
  bool owns_file_ = false;
  bool swapped_ = false;
  bool nanosecond_ = false;
  uint32_t link_type_ = 0;
  uint32_t snaplen_ = 0;
  uint64_t next_index_ = 1;
  bool pcapng_ = false;
  uint64_t offset_ = 0;  // pcapng: bytes of the file consumed, for messages naming a block.
  std::vector<Interface> interfaces_;
  int sticky_error_ = 0;
  std::string error_;
  std::vector<uint8_t> buffer_;
};

// Strips the link-layer header of a captured frame of `link_type`. On success returns the IP packet (trimmed to the
// IP length field when the frame carries padding after it) and leaves `why_not` empty; otherwise returns an empty
// span and says why in `why_not` (e.g. "EtherType 0x8915 (RoCEv1) is not IP"), setting `*malformed` (when given)
// if the frame is broken rather than of another protocol. Never reads outside `frame`.
std::span<const uint8_t> PcapExtractIpPacket(uint32_t link_type, std::span<const uint8_t> frame, std::string* why_not,
                                             bool* malformed = nullptr);

}  // namespace uroce::wire
