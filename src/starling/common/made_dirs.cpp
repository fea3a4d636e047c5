#include "starling/common/made_dirs.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <stdexcept>
#include <thread>
#include <utility>

namespace starling {

namespace fs = std::filesystem;

namespace {

// `dir` normalised, without a trailing separator: the form outermost_missing answers in.
fs::path normal(const fs::path& dir) {
  fs::path p = dir.lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p;
}

// What the live guard's handler works from: set before the handler is installed, cleared after it
// is taken down, and read in the handler with nothing but async-signal-safe calls.
std::atomic<const std::vector<std::string>*> g_paths{nullptr};
std::atomic<const std::string*> g_note{nullptr};
// The handlers reading the two above right now. A signal may run the handler on any thread (and
// SIGINT and SIGTERM on two at once): the guard's end waits for them before it frees what they
// read.
std::atomic<int> g_readers{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void remove_made_dirs_on_signal(int sig) {
  g_readers.fetch_add(1);
  if (const auto* paths = g_paths.load())
    for (const std::string& p : *paths)
      // One not made yet (a signal in the middle of the making) is passed over; one that is not
      // empty stays, and so do its parents.
      if (::rmdir(p.c_str()) != 0 && errno != ENOENT) break;
  if (const auto* note = g_note.load()) {
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, note->data(), note->size());
  }
  g_readers.fetch_sub(1);
  // The signal, blocked while its handler runs, ends the process once the handler returns. The
  // other one, if it came meanwhile, waits blocked too, and would run this handler again on the
  // return (a second note, and its ending instead of this one's): ignoring it discards it.
  ::signal(sig == SIGINT ? SIGTERM : SIGINT, SIG_IGN);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

fs::path outermost_missing(const fs::path& dir) {
  fs::path made;
  for (fs::path p = normal(dir); !p.empty() && !fs::exists(p); p = p.parent_path()) {
    made = p;
    if (p == p.parent_path()) break;
  }
  return made;
}

void remove_made_empty_dirs(const fs::path& dir, const fs::path& made) noexcept {
  if (made.empty()) return;
  std::error_code ec;
  fs::path p = normal(dir);
  // Only `made` and what is under it: a caller's mismatched pair must not climb past it.
  const fs::path top = normal(made);
  if (std::mismatch(top.begin(), top.end(), p.begin(), p.end()).first != top.end()) return;
  for (; !p.empty(); p = p.parent_path()) {
    // fs::remove removes only an empty directory (or a file, which `dir` and its parents are not).
    // One that was never made (the making stopped partway) is passed over.
    if (fs::exists(p, ec) && (!fs::is_directory(p, ec) || !fs::remove(p, ec))) break;
    if (p == top || p == p.parent_path()) break;
  }
}

MadeDirsGuard::MadeDirsGuard(const fs::path& dir, const fs::path& made, std::string note)
    : dir_(dir), made_(made), note_(std::move(note) + "\n") {
  if (!made.empty()) {
    const fs::path top = normal(made);
    for (fs::path p = normal(dir); !p.empty(); p = p.parent_path()) {
      paths_.push_back(p.string());
      if (p == top || p == p.parent_path()) break;
    }
    // A mismatched pair removes nothing, as remove_made_empty_dirs.
    if (paths_.empty() || paths_.back() != top.string()) paths_.clear();
  }
  const std::vector<std::string>* none = nullptr;
  if (!g_paths.compare_exchange_strong(none, &paths_))
    throw std::logic_error("MadeDirsGuard: another guard is live");
  g_note.store(&note_);
  struct sigaction on {};
  on.sa_handler = remove_made_dirs_on_signal;
  // The other signal waits while the handler runs, which then discards it: the note once, and
  // the first signal's ending.
  sigemptyset(&on.sa_mask);
  sigaddset(&on.sa_mask, SIGINT);
  sigaddset(&on.sa_mask, SIGTERM);
  for (auto [sig, old] : {std::pair{SIGINT, &old_int_}, std::pair{SIGTERM, &old_term_}}) {
    ::sigaction(sig, nullptr, old);
    // A signal ignored before (a command started in the background by a script) stays ignored.
    if (old->sa_handler != SIG_IGN) ::sigaction(sig, &on, nullptr);
  }
}

MadeDirsGuard::~MadeDirsGuard() {
  // Removed first: a signal before the handlers are given back still finds them to remove.
  remove_made_empty_dirs(dir_, made_);
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
  g_note.store(nullptr);
  g_paths.store(nullptr);
  // A handler that started on another thread before the lines above may still read paths_ and
  // note_. (Its signal may then meet the handler given back above, which need not end the
  // process: so this waits for its reading only, not for the end.)
  while (g_readers.load() > 0) std::this_thread::yield();
}

}  // namespace starling
