// `starling`: prepare data, train, sample, inspect models, benchmark, manage swarm keys.
#include <c10/util/Exception.h>

#include <iostream>
#include <new>
#include <string>

#include "starling/cli/commands.h"
#include "starling/common/device.h"
#include "starling/common/error.h"

int main(int argc, char** argv) {
  CLI::App app{"Starling: train transformer language models on cheap, scattered hardware",
               "starling"};
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "show where in the source an error was raised");
  // With the libtorch it runs on and the GPUs it sees: what a bug report or a GPU test needs.
  app.set_version_flag("--version",
                       [] { return "starling 0.1.0 (" + starling::runtime_summary() + ")"; });
  starling::cli::add_data_command(app);
  starling::cli::add_train_command(app);
  starling::cli::add_sample_command(app);
  starling::cli::add_export_command(app);
  starling::cli::add_eval_command(app);
  starling::cli::add_model_command(app);
  starling::cli::add_bench_command(app);
  starling::cli::add_net_commands(app);
  starling::cli::add_peer_command(app);
  starling::cli::add_plan_command(app);
  // CLI11 answers a misspelt command with "A subcommand is required", which hides the typo.
  if (argc > 1 && argv[1][0] != '-') {
    const std::string word = argv[1];
    if (word == "help") {  // what `git help` and `cargo help` taught users to type
      std::cout << app.help();
      return 0;
    }
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      known = known || sub->check_name(word);
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::cerr << "error: unknown command \"" << word << "\" (the commands: " << names
                << "; starling --help says what each does)\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (or the help) and has a code of its own per kind of error (105
    // for a failed check, 106 for a missing option, ...); bad input exits with 2 everywhere.
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const starling::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    if (verbose) std::cerr << "  (raised at " << e.origin() << ")\n";
    return 2;
  } catch (const c10::Error& e) {
    // libtorch's own errors: the message without its C++ backtrace (shown with --verbose).
    const std::string what = verbose ? e.what() : e.what_without_backtrace();
    std::cerr << "error: " << what << "\n";
    if (what.find("out of memory") != std::string::npos)
      std::cerr << "  (the model's training state, activations and batch do not fit in the "
                   "device's memory: a smaller train.batch_size, train.recompute = true, or a "
                   "[swap] budget to keep part of the state in host RAM; see docs/swap.md)\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "error: out of memory: what this command asked for does not fit in this "
                 "machine's memory (for training, the model's size, model.*, and the batch, "
                 "train.batch_size x model.seq_len, are the usual causes; a [swap] budget keeps "
                 "part of the training state on disk: docs/swap.md)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
