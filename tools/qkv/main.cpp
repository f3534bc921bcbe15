// qkv — attention and Transformers, trained, run and shown from C++.
//
// Errors are one line on stderr starting with "qkv: " and a non-zero exit.
#include <omp.h>

#include <iostream>
#include <map>

#include "qkv/error.h"
#include "tools/qkv/commands.h"

namespace qkv::cli {

void set_threads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
}
int thread_count() { return omp_get_max_threads(); }

}  // namespace qkv::cli

int main(int argc, char** argv) {
  CLI::App app{"qkv: attention and Transformers end to end -- train, run fast, and show what they attend to."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "qkv 0.1.0");
  std::map<CLI::App*, qkv::cli::Run> runs;
  auto add = [&](qkv::cli::Run (*adder)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    qkv::cli::Run run = adder(app);
    runs[app.get_subcommands({})[before]] = run;
  };
  add(qkv::cli::add_demo);
  add(qkv::cli::add_data);
  add(qkv::cli::add_train);
  add(qkv::cli::add_translate);
  add(qkv::cli::add_eval);
  add(qkv::cli::add_classify);
  add(qkv::cli::add_generate);
  add(qkv::cli::add_inspect);
  add(qkv::cli::add_bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    for (char& c : msg)
      if (c == '\n') c = ' ';
    std::cerr << "qkv: " << msg << " (see qkv --help)\n";
    return 2;
  }
  try {
    for (auto& [sub, run] : runs)
      if (sub->parsed()) return run();
  } catch (const qkv::Error& e) {
    std::cerr << "qkv: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "qkv: internal error: " << e.what() << "\n";
    return 1;
  }
  return 1;
}
