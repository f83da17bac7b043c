// Safetensors: u64 little-endian header length | JSON header | raw little-endian data.
// Read memory-mapped; written directly. No LibTorch here (see model/weights_io.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tide/engine/io/mapped_file.h"

struct XXH3_state_s;  // xxhash.h's running hash

namespace tide {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL"
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

size_t safetensors_dtype_size(const std::string& dtype);  // throws on unknown dtype

class SafetensorsReader {
 public:
  // Validates the header (offsets inside the file, sizes matching shapes). Errors name
  // the file and the tensor.
  explicit SafetensorsReader(const std::string& path);

  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;
  const uint8_t* data(const SafetensorsEntry& e) const { return data_start_ + e.begin; }
  // The entry's bytes out of this process's resident set (MappedFile::release), once copied.
  void release(const SafetensorsEntry& e) const {
    file_.release(static_cast<size_t>(data(e) - file_.data()), e.end - e.begin);
  }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  const uint8_t* data_start_ = nullptr;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A file as written: its size and the XXH3-64 hash of all its bytes.
struct WrittenFile {
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
};

// A safetensors file written tensor by tensor: the header first, from the entries'
// names, dtypes and shapes alone, then each tensor's bytes in the entries' order. What
// must exist at once is one tensor, not the file's worth (a sharded run's final weights).
// Written to a temporary file, fsynced and renamed into place by commit(); destroyed
// uncommitted, the temporary is removed.
class SafetensorsStream {
 public:
  // Offsets are given to the entries here, end to end in their order.
  SafetensorsStream(const std::string& path, std::vector<SafetensorsEntry> entries,
                    const std::map<std::string, std::string>& metadata);
  ~SafetensorsStream();
  SafetensorsStream(const SafetensorsStream&) = delete;
  SafetensorsStream& operator=(const SafetensorsStream&) = delete;

  // The next entry's bytes; `name` and the size must be that entry's.
  void write(const std::string& name, const void* data, size_t nbytes);
  // Every entry written: the file in place, and its size and hash.
  WrittenFile commit();

 private:
  void put(const void* data, size_t nbytes);
  void abandon();

  std::string path_, tmp_;
  std::vector<SafetensorsEntry> entries_;
  size_t next_ = 0;
  int fd_ = -1;
  ::XXH3_state_s* hash_ = nullptr;
  WrittenFile out_;
};

// A file whose tensors are all in memory: one SafetensorsStream.
class SafetensorsWriter {
 public:
  // `data` must stay valid until write() returns.
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, const void* data,
           size_t nbytes);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  WrittenFile write(const std::string& path) const;

 private:
  std::vector<SafetensorsEntry> entries_;
  std::vector<const void*> data_;
  std::map<std::string, std::string> metadata_;
};

// XXH3-64 of a whole file (verification of what write() reported), read a chunk at a
// time: each chunk's pages leave the resident set once hashed, and `hashed(bytes)` is
// told of it (a checkpoint's files are tens of GB).
uint64_t xxh3_of_file(const std::string& path, const std::function<void(uint64_t bytes)>& hashed = {});

}  // namespace tide
