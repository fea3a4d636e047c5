#include "starling/config/config_keys.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "starling/common/error.h"

namespace starling::config {
namespace {

int64_t read_int(const toml::node& n, const std::string& where) {
  if (!n.is_integer()) wrong_type(n, where, "an integer");
  return n.as_integer()->get();
}

// A float as a person writes it: "0", "1e-08", "-1" (std::to_string gives six decimals).
std::string number_text(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

}  // namespace

void wrong_type(const toml::node& n, const std::string& where, const char* expected) {
  std::ostringstream found;
  found << n.type();
  throw ConfigError(where + ": expected " + expected + ", got " + found.str());
}

Key int_key(const char* table, const char* name, int64_t* p, int64_t min, const char* doc,
            int64_t max) {
  return {table,
          name,
          "integer",
          doc,
          [=](const toml::node& n, const std::string& where) {
            const int64_t v = read_int(n, where);
            if (v < min)
              throw ConfigError(where + ": must be >= " + std::to_string(min) + ", got " +
                                std::to_string(v));
            if (v > max)
              throw ConfigError(where + ": must be <= " + std::to_string(max) + ", got " +
                                std::to_string(v));
            *p = v;
          },
          [=](toml::table& t) { t.insert_or_assign(name, *p); }};
}

Key int32_key(const char* table, const char* name, int* p, int min, const char* doc, int max) {
  return {table,
          name,
          "integer",
          doc,
          [=](const toml::node& n, const std::string& where) {
            const int64_t v = read_int(n, where);
            if (v < min || v > max)
              throw ConfigError(where + ": must be in [" + std::to_string(min) + ", " +
                                std::to_string(max) + "], got " + std::to_string(v));
            *p = static_cast<int>(v);
          },
          [=](toml::table& t) { t.insert_or_assign(name, static_cast<int64_t>(*p)); }};
}

Key seed_key(const char* table, const char* name, uint64_t* p, const char* doc) {
  return {table,
          name,
          "integer",
          doc,
          [=](const toml::node& n, const std::string& where) {
            const int64_t v = read_int(n, where);
            if (v < 0) throw ConfigError(where + ": must be >= 0, got " + std::to_string(v));
            *p = static_cast<uint64_t>(v);
          },
          [=](toml::table& t) { t.insert_or_assign(name, static_cast<int64_t>(*p)); }};
}

Key float_key(const char* table, const char* name, double* p, double min, const char* doc) {
  return {
      table,
      name,
      "float",
      doc,
      [=](const toml::node& n, const std::string& where) {
        double v;
        if (n.is_floating_point())
          v = n.as_floating_point()->get();
        else if (n.is_integer())
          v = static_cast<double>(n.as_integer()->get());
        else
          wrong_type(n, where, "a number");
        if (!(v >= min))  // %g: 0 and 1e-08, not 0.000000 and 0.000000
          throw ConfigError(where + ": must be >= " + number_text(min) + ", got " + number_text(v));
        if (!std::isfinite(v)) throw ConfigError(where + ": must be finite, got " + number_text(v));
        *p = v;
      },
      [=](toml::table& t) { t.insert_or_assign(name, *p); }};
}

Key bool_key(const char* table, const char* name, bool* p, const char* doc) {
  return {table,
          name,
          "boolean",
          doc,
          [=](const toml::node& n, const std::string& where) {
            if (!n.is_boolean()) wrong_type(n, where, "true or false");
            *p = n.as_boolean()->get();
          },
          [=](toml::table& t) { t.insert_or_assign(name, *p); }};
}

Key string_key(const char* table, const char* name, std::string* p, const std::string& doc,
               std::vector<std::string> allowed) {
  return {table,
          name,
          "string",
          doc,
          [=](const toml::node& n, const std::string& where) {
            if (!n.is_string()) wrong_type(n, where, "a string");
            std::string v = n.as_string()->get();
            if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
              std::string list;
              for (const auto& a : allowed) list += (list.empty() ? "\"" : ", \"") + a + "\"";
              throw ConfigError(where + ": expected one of " + list + ", got \"" + v + "\"");
            }
            *p = v;
          },
          [=](toml::table& t) { t.insert_or_assign(name, *p); }};
}

Key string_list_key(const char* table, const char* name, std::vector<std::string>* p,
                    const char* doc) {
  return {table,
          name,
          "array of strings",
          doc,
          [=](const toml::node& n, const std::string& where) {
            const auto* a = n.as_array();
            if (!a) wrong_type(n, where, "an array of strings");
            std::vector<std::string> v;
            for (const auto& e : *a) {
              if (!e.is_string())
                wrong_type(e, where + "[" + std::to_string(v.size()) + "]", "a string");
              v.push_back(e.as_string()->get());
            }
            *p = std::move(v);
          },
          [=](toml::table& t) {
            toml::array a;
            for (const auto& e : *p) a.push_back(e);
            t.insert_or_assign(name, std::move(a));
          }};
}

}  // namespace starling::config
