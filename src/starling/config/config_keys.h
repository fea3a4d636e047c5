// The building blocks of a config section: each layer declares the keys of its own TOML table
// ([model] in model/, [strategy] in strategy/, [net] in net/, ...) by binding them to the fields
// of its settings struct; train/config.cpp assembles the tables into a run's config. A key knows
// how to read itself from TOML (with range checks and an error naming file, line and key), how to
// write itself back, and its one-line documentation (`starling train --list-keys`,
// docs/config.md). Torch-free.
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "starling/config/keys_fwd.h"

namespace starling::config {

struct Key {
  std::string table, name, type, doc;
  // Reads the value into the bound field; ConfigError prefixed with `where` ("file:line: t.k").
  std::function<void(const toml::node&, const std::string& where)> read;
  // Writes the bound field's value into its table.
  std::function<void(toml::table&)> write;
  std::string full() const { return table + "." + name; }
};

// "an integer", "a string" ... are the `expected` texts; the error names what was found instead.
[[noreturn]] void wrong_type(const toml::node& n, const std::string& where, const char* expected);

// Keys bound to a field (the pointer must outlive the key). Numbers below `min` or above `max`
// are errors: a size far beyond any machine gets its key named, not a failed allocation or an
// overflowed product later.
Key int_key(const char* table, const char* name, int64_t* field, int64_t min, const char* doc,
            int64_t max = std::numeric_limits<int64_t>::max());
// An int in [min, max].
Key int32_key(const char* table, const char* name, int* field, int min, const char* doc,
              int max = 1'000'000);
// A non-negative integer (seeds).
Key seed_key(const char* table, const char* name, uint64_t* field, const char* doc);
// A finite float or integer, >= min.
Key float_key(const char* table, const char* name, double* field, double min, const char* doc);
Key bool_key(const char* table, const char* name, bool* field, const char* doc);
// A string; when `allowed` is not empty, one of those values.
Key string_key(const char* table, const char* name, std::string* field, const std::string& doc,
               std::vector<std::string> allowed = {});
Key string_list_key(const char* table, const char* name, std::vector<std::string>* field,
                    const char* doc);

}  // namespace starling::config
