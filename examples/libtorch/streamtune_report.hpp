// streamtune_report.hpp: the program side of streamtune's program protocol (version 1), for a
// C++ trainer. Header-only, C++17, no dependency: the protocol itself is in trainers/program/runner.py.
//
//   auto run = streamtune::Run::from_env();       // settings and run shape from STREAMTUNE_*
//   streamtune::Reporter report(run.report);
//   report.start(batch_size, run.device);
//   ... run.warmup untimed steps ...
//   auto sizes = streamtune::window_sizes(run.steps, run.windows);
//   for (int w = 0; w < (int)sizes.size(); ++w) {
//     sync(); auto t0 = std::chrono::steady_clock::now();   // device synced at both ends
//     ... sizes[w] steps ...
//     sync(); report.window(w, sizes[w], seconds_since(t0));
//   }
//   report.losses(0, all_losses);                  // any time, in step order
//   report.end(n_syncs);
#pragma once

#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace streamtune {

inline std::string env(const std::string& name, const char* fallback = nullptr) {
  const char* value = std::getenv(("STREAMTUNE_" + name).c_str());
  if (value != nullptr) return value;
  if (fallback != nullptr) return fallback;
  throw std::runtime_error("STREAMTUNE_" + name + " is not set: run this program through the tuner");
}

inline long env_int(const std::string& name, const char* fallback = nullptr) {
  const std::string text = env(name, fallback);
  std::size_t used = 0;
  long value = 0;
  try {
    value = std::stol(text, &used);
  } catch (const std::logic_error&) {  // invalid_argument, out_of_range
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw std::runtime_error("STREAMTUNE_" + name + "=" + text + ": not an integer");
  return value;
}

inline bool env_bool(const std::string& name, const char* fallback) {
  const std::string text = env(name, fallback);
  if (text == "true" || text == "1" || text == "yes") return true;
  if (text == "false" || text == "0" || text == "no") return false;
  throw std::runtime_error("STREAMTUNE_" + name + "=" + text + ": not true or false");
}

struct Run {
  std::string report, device, precision, preset, sync_mode;
  long warmup = 0, steps = 0, windows = 1, seed = 0;
  long num_streams = 1, sync_interval = 1, prefetch_depth = 0, num_workers = 0;
  bool pin_memory = false, non_blocking = false, cuda_graph = false;
  bool perturb = false;
  long perturb_seed = 0;
  double perturb_eps = 0.0;  // 0: the parameters' own dtype epsilon

  static Run from_env() {
    Run run;
    run.report = env("REPORT");
    run.warmup = env_int("WARMUP");
    run.steps = env_int("STEPS");
    run.windows = env_int("WINDOWS");
    run.device = env("DEVICE", "cpu");
    run.precision = env("PRECISION", "");
    run.preset = env("PRESET", "");
    run.seed = env_int("SEED", "0");
    run.num_streams = env_int("NUM_STREAMS", "1");
    run.sync_interval = env_int("SYNC_INTERVAL", "1");
    run.sync_mode = env("SYNC_MODE", "synchronize");
    run.prefetch_depth = env_int("PREFETCH_DEPTH", "0");
    run.num_workers = env_int("NUM_WORKERS", "0");
    run.pin_memory = env_bool("PIN_MEMORY", "false");
    run.non_blocking = env_bool("NON_BLOCKING", "false");
    run.cuda_graph = env_bool("CUDA_GRAPH", "false");
    const std::string seed = env("PERTURB_SEED", "");
    if (!seed.empty()) {
      run.perturb = true;
      run.perturb_seed = std::stol(seed);
      const std::string eps = env("PERTURB_EPS", "");
      run.perturb_eps = (eps.empty() || eps == "None") ? 0.0 : std::stod(eps);
    }
    return run;
  }
};

// `steps` split into `windows` nearly equal windows, the first ones one step longer (as
// trainers.measure.window_sizes).
inline std::vector<long> window_sizes(long steps, long windows) {
  std::vector<long> sizes;
  for (long i = 0; i < windows; ++i) sizes.push_back(steps / windows + (i < steps % windows ? 1 : 0));
  return sizes;
}

class Reporter {
 public:
  explicit Reporter(const std::string& path) : out_(path, std::ios::app) {
    if (!out_) throw std::runtime_error("cannot open the report file " + path);
    out_ << std::setprecision(std::numeric_limits<double>::max_digits10);
  }

  void start(long samples_per_batch, const std::string& device) {
    line("{\"event\": \"start\", \"protocol\": 1, \"samples_per_batch\": " + std::to_string(samples_per_batch) +
         ", \"device\": \"" + device + "\", \"fingerprint\": {\"program\": \"c++\"}}");
  }

  void losses(long first_step, const std::vector<double>& values) {
    std::ostringstream text;
    text << std::setprecision(std::numeric_limits<double>::max_digits10) << "{\"event\": \"loss\", \"step\": "
         << first_step << ", \"losses\": [";
    for (std::size_t i = 0; i < values.size(); ++i) text << (i ? ", " : "") << number(values[i]);
    text << "]}";
    line(text.str());
  }

  void window(long index, long steps, double seconds) {
    std::ostringstream text;
    text << std::setprecision(std::numeric_limits<double>::max_digits10) << "{\"event\": \"window\", \"index\": "
         << index << ", \"steps\": " << steps << ", \"seconds\": " << seconds << "}";
    line(text.str());
  }

  void end(long n_syncs) { line("{\"event\": \"end\", \"n_syncs\": " + std::to_string(n_syncs) + "}"); }

 private:
  // One line per write, flushed: the tuner reads each window as it comes (pruning).
  void line(const std::string& text) { out_ << text << '\n' << std::flush; }

  static std::string number(double value) {
    if (value != value) return "NaN";  // Python's json reads NaN and Infinity: the gate fails them
    if (value == std::numeric_limits<double>::infinity()) return "Infinity";
    if (value == -std::numeric_limits<double>::infinity()) return "-Infinity";
    std::ostringstream text;
    text << std::setprecision(std::numeric_limits<double>::max_digits10) << value;
    return text.str();
  }

  std::ofstream out_;
};

}  // namespace streamtune
