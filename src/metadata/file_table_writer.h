// FileTableWriter: the namespace's table (metadata/file_table.h) written
// from a listing, once, into a memfd sealed against writes.
//
// In three passes over the listing: Plan() counts what the region holds
// (its size must be known before it is made) and lays out its sections;
// WriteEntries() writes names, records and the per-file columns, files
// then extents; WriteSlots() fills the lookup slots, reading the names
// back from the region.

#ifndef MONARCH_METADATA_FILE_TABLE_WRITER_H_
#define MONARCH_METADATA_FILE_TABLE_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/shared_memory.h"
#include "metadata/file_table_format.h"

namespace monarch {

struct NamespaceListing;
struct ListedFile;
struct ExtentLayout;

class FileTableWriter : private FileTableFormat {
 public:
  // Writes the table of `listing`'s files (ids in its order), then one
  // entry per extent of each file `extents` splits, named
  // ".monarch/extents/<extent bytes>/<file's name>/<index>". InvalidArgument
  // if two files have the same name, or the ids do not fit 32 bits.
  static absl::StatusOr<WriteSealedRegion> Write(const std::string& root,
                                                 const NamespaceListing& listing,
                                                 const ExtentLayout& extents);

 private:
  FileTableWriter(const std::string& root, const NamespaceListing& listing,
                  const ExtentLayout& extents);

  // Counts names, extents, classes and block exceptions, then sets the
  // header: every section's offset and size, and the region's size.
  absl::Status Plan();
  // Names, records, inodes, times and classes of files, files then extents.
  absl::Status WriteEntries(char* base);
  // The lookup slots, files only (an extent is found through its file).
  absl::Status WriteSlots(char* base, uint64_t size);

  // How many extents `file` is cached in, when the layout splits it.
  uint64_t ExtentCount(const ListedFile& file) const;

  const std::string& root_;
  const NamespaceListing& listing_;
  const ExtentLayout& extents_;
  const std::string extent_prefix_;  // ".monarch/extents/<extent bytes>/".

  Header header_{};
  uint64_t region_bytes_ = 0;
  std::vector<Split> splits_;
  std::vector<BlockException> exceptions_;
  std::vector<Class> classes_;
  std::vector<uint32_t> class_of_;  // By file id, until written.
};

}  // namespace monarch

#endif  // MONARCH_METADATA_FILE_TABLE_WRITER_H_
