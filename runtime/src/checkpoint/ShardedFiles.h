// Internal to the sharded checkpoint code (Sharded.cpp reads,
// ShardedConvert.cpp writes, ShardedExport.cpp exports): the file helpers
// they share.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <set>
#include <string>

namespace moert::sharded {

/// A manifest or config.json: a regular file of bounded size and nesting.
std::string readText(const std::string &path);

/// A CRC32C as the manifest writes it: 8 lower-case hex digits.
inline std::string hex32(uint32_t v) { return fmt::format("{:08x}", v); }

/// fsync of a file or a directory (best effort: a file system without it
/// still gets the rename's ordering).
void fsyncPath(const std::string &path, bool directory);

/// Writes `text` to `path` atomically: temporary file, fsync, rename. An
/// InputError naming `path` when any step fails; the temporary file is gone.
void writeTextAtomically(const std::string &path, const std::string &text);

/// Creates `dir` and its parents, or an InputError naming it.
void makeDirectory(const std::string &dir);

/// Removes the rank files and temporary files in `dir` that `keep` does not
/// name: what earlier saves left when they were killed.
void collectStaleFiles(const std::string &dir, const std::set<std::string> &keep);
/// Before a save into `dir`: the files of killed saves go first, so that
/// their garbage cannot fill the disk this save needs. The current
/// checkpoint's files stay (its manifest names them); when the manifest
/// cannot be read, only temporary files go.
void collectBeforeSave(const std::string &dir);

} // namespace moert::sharded
