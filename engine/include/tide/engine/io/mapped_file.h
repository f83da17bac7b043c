// A read-only memory map of a whole file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tide {

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws std::runtime_error naming the path
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // The pages of [offset, offset + length) leave this process's resident set (the file's
  // page cache keeps them; a later read brings them back): a reader that has copied a
  // tensor out lets it go, so reading a model larger than memory one tensor at a time
  // does not hold the whole file mapped in.
  void release(size_t offset, size_t length) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tide
