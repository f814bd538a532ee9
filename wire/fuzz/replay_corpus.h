// What the fuzzers' replay tests share: reading a corpus from the test's runfiles and running the linked fuzz
// target's entry point on one input. Each replay test links exactly one fuzz target (its LLVMFuzzerTestOneInput).
#pragma once

#include <dirent.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace uroce::fuzzing {

struct CorpusFile {
  std::string name;
  std::vector<uint8_t> bytes;
};

// A folder of the workspace as the test sees it among its runfiles ("wire/fuzz/corpus").
inline std::string RunfilesDir(const std::string& workspace_relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir ? srcdir : ".") + "/" + (workspace ? workspace : "uroce") + "/" + workspace_relative;
}

// Every file of `dir` (none when it is missing), in name order so that runs are repeatable.
inline std::vector<CorpusFile> LoadCorpus(const std::string& dir) {
  std::vector<CorpusFile> files;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return files;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(dir + "/" + e->d_name, std::ios::binary);
    files.push_back({e->d_name, {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()}});
  }
  closedir(d);
  std::sort(files.begin(), files.end(), [](const CorpusFile& a, const CorpusFile& b) { return a.name < b.name; });
  return files;
}

// Runs the fuzz target on a copy of exactly the input's size, so that ASan catches any read past its end.
inline void RunOne(const std::vector<uint8_t>& input) {
  std::vector<uint8_t> exact(input);
  LLVMFuzzerTestOneInput(exact.empty() ? nullptr : exact.data(), exact.size());
}

}  // namespace uroce::fuzzing
