// A C++ program that speaks the protocol through examples/libtorch/streamtune_report.hpp, with a
// made-up training step (no LibTorch): its losses follow from the settings it reads, so the test
// can check that the settings arrived and the report was read back exactly.
#include <chrono>
#include <thread>
#include <vector>

#include "streamtune_report.hpp"

int main() {
  const auto run = streamtune::Run::from_env();
  streamtune::Reporter report(run.report);
  report.start(8, run.device);
  std::vector<double> losses;
  long syncs = 0;
  auto step = [&]() {
    losses.push_back(1.0 / (losses.size() + 1) + 0.001 * run.sync_interval);
    if (losses.size() % run.sync_interval == 0) ++syncs;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  };
  for (long i = 0; i < run.warmup; ++i) step();
  const auto sizes = streamtune::window_sizes(run.steps, run.windows);
  for (std::size_t w = 0; w < sizes.size(); ++w) {
    const auto started = std::chrono::steady_clock::now();
    for (long i = 0; i < sizes[w]; ++i) step();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - started;
    report.window(static_cast<long>(w), sizes[w], took.count());
  }
  report.losses(0, losses);
  report.end(syncs);
  return 0;
}
