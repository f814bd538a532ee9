// uroce_decode: prints every RoCEv2 packet of a capture, one line each, with all transport headers decoded and the
// ICRC checked. Reads captures written by uroce (CaptureTransport) and by tcpdump / dumpcap / Wireshark on a loopback
// or RoCE interface, pcap or pcapng (see wire/pcap.h for the formats and link types).
//
//   uroce_decode FILE.pcap [--json]      FILE "-" reads standard input
//
// Exit status: 0 when the file was read (even if some packets were malformed), 1 when it could not be opened or is
// neither pcap nor pcapng, 2 on a usage error.
#include <cstdio>
#include <cstring>
#include <string>

#include "tools/decode_format.h"
#include "wire/pcap.h"

namespace {

constexpr char kUsage[] =
    "usage: uroce_decode FILE.pcap|FILE.pcapng [--json]\n"
    "  Prints one line per RoCEv2 packet (UDP port 4791): opcode, QPN, PSN, BTH flags, every extension header,\n"
    "  payload length and whether the ICRC verifies. --json prints one JSON object per line instead.\n"
    "  FILE may be - for standard input (e.g. tcpdump -i lo -w - udp port 4791 | uroce_decode -).\n"
    "  A summary goes to standard error.\n";

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  uroce::tools::DecodeFormat format = uroce::tools::DecodeFormat::kText;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") {
      format = uroce::tools::DecodeFormat::kJson;
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (path.empty() && (arg == "-" || arg[0] != '-')) {
      path = arg;
    } else {
      std::fprintf(stderr, "uroce_decode: unexpected argument '%s'\n%s", arg.c_str(), kUsage);
      return 2;
    }
  }
  if (path.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }

  uroce::wire::PcapReader reader;
  if (reader.Open(path) < 0) {
    std::fprintf(stderr, "uroce_decode: %s: %s\n", path.c_str(), reader.error().c_str());
    return 1;
  }
  uroce::tools::PacketDecoder decoder(format);
  uroce::wire::PcapRecord record;
  uint64_t last_index = 0;
  int rc;
  while ((rc = reader.Next(&record)) == 1) {
    last_index = record.index;
    if (auto line = decoder.Decode(record)) {
      std::fwrite(line->data(), 1, line->size(), stdout);
      std::fputc('\n', stdout);
    }
  }
  if (rc < 0) {
    // A capture cut short (tcpdump killed mid-write) still decodes up to the cut: report the cut as a line.
    const std::string line = decoder.FileError(last_index + 1, reader.error());
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fputc('\n', stdout);
  }
  std::fflush(stdout);
  std::fprintf(stderr, "uroce_decode: %s\n", decoder.Summary().c_str());
  return 0;
}
