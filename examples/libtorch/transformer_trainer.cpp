// transformer_trainer.cpp: the seed design's LibTorch training loop (shared/seeds/), written to
// be measured. A seq2seq torch::nn::Transformer learns to reverse token sequences: the same task,
// shapes and presets as the Python built-in (trainers/workloads/transformer.py), so the two run
// step for step, and with --init the same initial weights and data.
//
// What the loop implements, each a STREAMTUNE_* setting (streamtune's program protocol, see
// streamtune_report.hpp and trainers/program/runner.py):
//   NUM_STREAMS 1-4 with the seed's roles: 1 = everything on the current stream; 2 = transfer +
//     compute; 3 = transfer + forward + backward/optimizer; 4 = two transfer streams used
//     alternately + forward + backward/optimizer. Autograd runs each backward kernel on the
//     stream of its forward op (the engine is this same C++), so the backward stream only makes
//     the seed gradient and runs the optimizer: it orders work, it does not split it.
//   SYNC_MODE synchronize | event | query and SYNC_INTERVAL: the host waits every N steps
//     (device synchronize, or an event recorded on the last stream of the step), then extracts
//     the losses kept on the device since the last sync (the seed's deferred loss extraction);
//     query copies each loss into pinned host memory behind an event and reads it once the event
//     has completed, so the host never blocks before the end of a window.
//   PIN_MEMORY (the dataset's batches are page-locked once, at start), NON_BLOCKING copies,
//   PREFETCH_DEPTH (batches copied ahead of the step that uses them, on the transfer streams),
//   CUDA_GRAPH: forward, backward and the optimizer step captured once (at::cuda::CUDAGraph)
//     after GRAPH_WARMUP eager steps on a side stream, then replayed.
// The optimizer is Adam through the fused kernel (at::_fused_adam_), with its step counters on the
// device, so that the same optimizer runs eagerly and captured. Precision: STREAMTUNE_PRECISION
// empty or fp32, tf32, bf16-autocast.
//
//   transformer_trainer --preset small [--steps 100] [--init init.pt] [--dropout 0.1] [--stock]
// Without STREAMTUNE_REPORT it trains --steps steps with the settings' defaults and prints the
// last loss; with it, it runs the protocol: warm-up, timed windows, losses, end.
#include <torch/cuda.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#ifdef STREAMTUNE_CUDA
#include <ATen/cuda/CUDAGraph.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "streamtune_report.hpp"

namespace {

constexpr long PAD = 0, BOS = 1, FIRST_TOKEN = 2;
constexpr int GRAPH_WARMUP = 3;  // eager steps before the capture, as trainers/step.py

struct Shape {
  long d_model, heads, encoder_layers, decoder_layers, ff, vocab, batch, seq;
  double dropout = 0.1;
  long n_batches = 32;
  double lr;
};

// The presets of trainers/workloads/transformer.py, and its learning rates.
const std::map<std::string, Shape> PRESETS = {
    {"tiny", {32, 2, 1, 1, 64, 16, 8, 8, 0.1, 32, 3e-4}},
    {"small", {256, 4, 2, 2, 1024, 1000, 64, 32, 0.1, 32, 3e-4}},
    {"medium", {512, 8, 4, 4, 2048, 8000, 64, 64, 0.1, 32, 1e-4}},
    {"large", {1024, 16, 4, 4, 4096, 16000, 32, 128, 0.1, 32, 1e-4}},
};

struct Usage : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Batch {
  torch::Tensor src, tgt_in, tgt_out;
};

// Seq2SeqTransformer of the Python built-in: its modules and parameter names are
// torch::nn::Transformer's (so --init maps the Python weights one to one), its forward is below.
//
// Why not torch::nn::Transformer's own forward: LibTorch's multi-head attention decides between
// self- and cross-attention with torch::equal(query, key) (torch/nn/functional/activation.h),
// which compares the tensors' contents and so waits for the GPU, two or three times per attention
// call. Those syncs defeat every sync setting of the seed design, and a host sync cannot be
// captured: on the H100 the whole-step capture failed inside that attention. --stock runs that
// forward anyway, to measure what it costs. The forward here does what Python's
// nn.Transformer(batch_first=True) does in training, attention through
// scaled_dot_product_attention, with no host sync.
struct Seq2SeqImpl : torch::nn::Module {
  Seq2SeqImpl(const Shape& s, bool stock)
      : scale(std::sqrt(static_cast<double>(s.d_model))),
        heads(s.heads),
        dropout(s.dropout),
        stock(stock),
        embed(register_module("embed", torch::nn::Embedding(torch::nn::EmbeddingOptions(s.vocab, s.d_model).padding_idx(PAD)))),
        position(register_module("position", torch::nn::Embedding(s.seq, s.d_model))),
        transformer(register_module(
            "transformer", torch::nn::Transformer(torch::nn::TransformerOptions(s.d_model, s.heads)
                                                      .num_encoder_layers(s.encoder_layers)
                                                      .num_decoder_layers(s.decoder_layers)
                                                      .dim_feedforward(s.ff)
                                                      .dropout(s.dropout)))),
        head(register_module("head", torch::nn::Linear(s.d_model, s.vocab))) {
    // Buffers, so they move with the model and keep one address (CUDA graphs need that). The
    // stock forward adds attn_mask to the scores, so it takes a float mask (-inf above the
    // diagonal); SDPA takes a bool one (true = may attend).
    causal_float = register_buffer("causal_float", torch::nn::TransformerImpl::generate_square_subsequent_mask(s.seq));
    causal_allowed = register_buffer("causal_allowed", torch::ones({s.seq, s.seq}, torch::kBool).tril());
  }

  torch::Tensor forward(const torch::Tensor& src, const torch::Tensor& tgt_in) {
    auto positions = position->weight.slice(0, 0, src.size(1));
    auto src_pad = src.eq(PAD);
    auto tgt_pad = tgt_in.eq(PAD);
    auto src_x = embed(src) * scale + positions;
    auto tgt_x = embed(tgt_in) * scale + positions;
    if (stock) {
      auto out = transformer->forward(src_x.transpose(0, 1), tgt_x.transpose(0, 1), /*src_mask=*/{},
                                      /*tgt_mask=*/causal_float, /*memory_mask=*/{}, src_pad, tgt_pad, src_pad);
      return head(out.transpose(0, 1));
    }
    // (batch, 1, 1, keys): false where the key is padding; the decoder's self-attention is also causal.
    auto src_keys = src_pad.logical_not().view({src.size(0), 1, 1, src.size(1)});
    auto tgt_keys = tgt_pad.logical_not().view({tgt_in.size(0), 1, 1, tgt_in.size(1)});
    const long q = tgt_in.size(1);
    auto tgt_allowed = tgt_keys.logical_and(causal_allowed.slice(0, 0, q).slice(1, 0, q));
    auto encoder = transformer->encoder.ptr<torch::nn::TransformerEncoderImpl>();
    auto memory = src_x;
    for (const auto& module : *encoder->layers) {
      auto* layer = module->as<torch::nn::TransformerEncoderLayerImpl>();
      memory = layer->norm1(memory + layer->dropout1(attention(*layer->self_attn, memory, memory, src_keys)));
      memory = layer->norm2(memory + layer->dropout2(feed_forward(*layer, memory)));
    }
    memory = encoder->norm.forward(memory);
    auto decoder = transformer->decoder.ptr<torch::nn::TransformerDecoderImpl>();
    auto x = tgt_x;
    for (const auto& module : *decoder->layers) {
      auto* layer = module->as<torch::nn::TransformerDecoderLayerImpl>();
      x = layer->norm1(x + layer->dropout1(attention(*layer->self_attn, x, x, tgt_allowed)));
      x = layer->norm2(x + layer->dropout2(attention(*layer->multihead_attn, x, memory, src_keys)));
      x = layer->norm3(x + layer->dropout3(feed_forward(*layer, x)));
    }
    return head(decoder->norm.forward(x));
  }

  // Multi-head attention with the module's own weights (in_proj packs q, k and v), batch first.
  torch::Tensor attention(torch::nn::MultiheadAttentionImpl& m, const torch::Tensor& query, const torch::Tensor& kv,
                          const torch::Tensor& allowed) {
    namespace F = torch::nn::functional;
    const long n = query.size(0), d = query.size(2), h = heads;
    auto w = m.in_proj_weight, b = m.in_proj_bias;
    auto q = F::linear(query, w.slice(0, 0, d), b.slice(0, 0, d));
    auto k = F::linear(kv, w.slice(0, d, 2 * d), b.slice(0, d, 2 * d));
    auto v = F::linear(kv, w.slice(0, 2 * d), b.slice(0, 2 * d));
    auto split = [&](const torch::Tensor& t) { return t.view({n, t.size(1), h, d / h}).transpose(1, 2); };
    auto out = at::scaled_dot_product_attention(split(q), split(k), split(v), allowed, is_training() ? dropout : 0.0);
    return m.out_proj(out.transpose(1, 2).reshape({n, query.size(1), d}));
  }

  template <typename Layer>
  torch::Tensor feed_forward(Layer& layer, const torch::Tensor& x) {
    return layer.linear2(layer.dropout(torch::relu(layer.linear1(x))));
  }

  double scale;
  long heads;
  double dropout;
  bool stock;
  torch::nn::Embedding embed, position;
  torch::nn::Transformer transformer;
  torch::nn::Linear head;
  torch::Tensor causal_float, causal_allowed;
};
TORCH_MODULE(Seq2Seq);

torch::Tensor reverse_loss(Seq2Seq& model, const Batch& b) {
  auto logits = model->forward(b.src, b.tgt_in);
  return torch::nn::functional::cross_entropy(
      logits.flatten(0, 1), b.tgt_out.flatten(),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(PAD));
}

// reverse_task of the Python built-in, op for op, on a CPU generator seeded with seed + 1.
std::vector<Batch> reverse_task(const Shape& s, long seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  const long n = s.n_batches, b = s.batch, q = s.seq;
  auto tokens = torch::randint(FIRST_TOKEN, s.vocab, {n, b, q}, gen, torch::kLong);
  auto lengths = torch::randint(std::max(1L, q / 2), q + 1, {n, b, 1}, gen, torch::kLong);
  auto pos = torch::arange(q);
  auto valid = pos.lt(lengths);
  auto src = torch::where(valid, tokens, PAD);
  auto reversed_index = (lengths - 1 - pos).clamp_min(0);
  auto tgt_out = torch::where(valid, src.gather(-1, reversed_index), PAD);
  auto bos = torch::full({n, b, 1}, BOS, torch::kLong);
  auto tgt_in = torch::cat({bos, tgt_out.slice(-1, 0, q - 1)}, -1);
  std::vector<Batch> batches;
  for (long i = 0; i < n; ++i) batches.push_back({src[i].contiguous(), tgt_in[i].contiguous(), tgt_out[i].contiguous()});
  return batches;
}

// Weights and data written by export_init.py (torch.save of {"params": {name: tensor}, "src",
// "tgt_in", "tgt_out"}): every parameter of this model must be there, with its shape.
std::vector<Batch> load_init(const std::string& path, Seq2Seq& model) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Usage("--init " + path + ": cannot open the file");
  std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  auto data = torch::jit::pickle_load(bytes).toGenericDict();
  auto params = data.at("params").toGenericDict();
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    auto key = item.key();
    if (!params.contains(key)) throw Usage("--init " + path + ": no tensor for parameter " + key);
    auto value = params.at(key).toTensor();
    if (value.sizes() != item.value().sizes())
      throw Usage("--init " + path + ": " + key + " has shape " + c10::str(value.sizes()) + ", the model's is " +
                  c10::str(item.value().sizes()));
    item.value().copy_(value);
  }
  auto src = data.at("src").toTensor(), tgt_in = data.at("tgt_in").toTensor(), tgt_out = data.at("tgt_out").toTensor();
  std::vector<Batch> batches;
  for (long i = 0; i < src.size(0); ++i) batches.push_back({src[i].contiguous(), tgt_in[i].contiguous(), tgt_out[i].contiguous()});
  return batches;
}

// trainers.trajectories.Perturbation: every weight times (1 + s * eps), s a random sign per
// element drawn on the CPU from the seed; eps 0 = the dtype's machine epsilon.
void perturb(Seq2Seq& model, long seed, double eps) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) {
    const double e = eps > 0 ? eps : std::numeric_limits<float>::epsilon();
    auto signs = torch::randint(0, 2, p.sizes(), gen, torch::kLong) * 2 - 1;
    p.mul_(1 + signs.to(p.device(), p.scalar_type()) * e);
  }
}

// Adam through the fused kernel; step counters are device tensors, so a replayed graph advances
// them (a host counter would be frozen into the capture).
struct FusedAdam {
  FusedAdam(std::vector<torch::Tensor> params, double lr) : params(std::move(params)), lr(lr) {
    for (auto& p : this->params) {
      exp_avg.push_back(torch::zeros_like(p));
      exp_avg_sq.push_back(torch::zeros_like(p));
      steps.push_back(torch::zeros({}, p.options().dtype(torch::kFloat)));
    }
  }
  void zero_grad() {
    for (auto& p : params) p.mutable_grad() = torch::Tensor();  // set to none, as zero_grad() does
  }
  void step() {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> with_grad, grads, m, v, t;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].grad().defined()) continue;
      with_grad.push_back(params[i]);
      grads.push_back(params[i].grad());
      m.push_back(exp_avg[i]);
      v.push_back(exp_avg_sq[i]);
      t.push_back(steps[i]);
    }
    at::_foreach_add_(t, 1);
    at::_fused_adam_(with_grad, grads, m, v, /*max_exp_avg_sqs=*/{}, t, lr, 0.9, 0.999, /*weight_decay=*/0.0, 1e-8,
                     /*amsgrad=*/false, /*maximize=*/false);
  }
  std::vector<torch::Tensor> params, exp_avg, exp_avg_sq, steps;
  double lr;
};

using Stream = std::optional<c10::Stream>;  // nullopt on a CPU: every stream operation is a no-op

// Order `consumer` after everything queued so far on `producer` (an event, not a host wait).
void wait(const Stream& consumer, const Stream& producer) {
  if (!consumer || !producer || *consumer == *producer) return;
  c10::Event ready(consumer->device_type());
  ready.record(*producer);
  ready.block(*consumer);
}

struct StreamGuardIf {
  explicit StreamGuardIf(const Stream& s) {
    if (s) guard.emplace(*s);
  }
  std::optional<c10::StreamGuard> guard;
};

class Trainer {
 public:
  Trainer(const Shape& shape, streamtune::Run run, const std::string& init, bool stock)
      : shape_(shape), run_(std::move(run)) {
    device_ = torch::Device(run_.device);
    cuda_ = device_.is_cuda();
    check_settings();
    torch::manual_seed(run_.seed);
    model_ = Seq2Seq(shape_, stock);
    host_ = init.empty() ? reverse_task(shape_, run_.seed) : load_init(init, model_);
    if (run_.perturb) perturb(model_, run_.perturb_seed, run_.perturb_eps);
    model_->to(device_);
    model_->train();
    if (run_.pin_memory && cuda_)
      for (auto& b : host_) b = {b.src.pin_memory(), b.tgt_in.pin_memory(), b.tgt_out.pin_memory()};
    optimizer_ = std::make_unique<FusedAdam>(model_->parameters(), shape_.lr);
    if (cuda_) make_streams();
  }

  // One training step: the next batch, forward, backward, optimizer; its loss stays on the device.
  void step() {
    Batch batch = next_batch();
    torch::Tensor loss = run_.cuda_graph ? graph_step(batch) : eager_step(batch);
    after_step(loss);
  }

  // The host waits for the GPU and extracts the pending losses (a sync point).
  void sync() {
    if (run_.sync_mode == "query") {
      drain_queries(/*block=*/true);
      return;
    }
    if (cuda_) {
      if (run_.sync_mode == "event") {
        // An event on the stream that does a step's last work: it completes after that step's
        // loss and optimizer step, without waiting on unrelated work elsewhere on the device.
        c10::Event done(c10::DeviceType::CUDA);
        done.record(*last_);
        done.synchronize();
      } else {
        torch::cuda::synchronize(device_.index() < 0 ? -1 : device_.index());
      }
    }
    ++n_syncs_;
    if (pending_.empty()) return;
    // The GPU has finished every pending loss: one copy of them all, no further wait.
    auto values = torch::stack(pending_).to(torch::kCPU, torch::kDouble);
    auto acc = values.accessor<double, 1>();
    for (long i = 0; i < values.size(0); ++i) losses_.push_back(acc[i]);
    pending_.clear();
  }

  void device_sync() {
    if (cuda_) torch::cuda::synchronize(device_.index() < 0 ? -1 : device_.index());
  }
  const std::vector<double>& losses() const { return losses_; }
  long n_syncs() const { return n_syncs_; }
  long samples_per_batch() const { return shape_.batch; }

 private:
  void check_settings() {
    if (run_.num_streams < 1 || run_.num_streams > 4)
      throw Usage("STREAMTUNE_NUM_STREAMS=" + std::to_string(run_.num_streams) + ": allowed 1, 2, 3, 4");
    if (run_.sync_interval < 1)
      throw Usage("STREAMTUNE_SYNC_INTERVAL=" + std::to_string(run_.sync_interval) + ": allowed an integer >= 1");
    if (run_.sync_mode != "synchronize" && run_.sync_mode != "event" && run_.sync_mode != "query")
      throw Usage("STREAMTUNE_SYNC_MODE=" + run_.sync_mode + ": allowed synchronize, event, query");
    if (run_.prefetch_depth < 0)
      throw Usage("STREAMTUNE_PREFETCH_DEPTH=" + std::to_string(run_.prefetch_depth) + ": allowed an integer >= 0");
    if (run_.num_workers != 0)
      throw Usage("STREAMTUNE_NUM_WORKERS=" + std::to_string(run_.num_workers) +
                  ": allowed 0 (the batches are made once, in memory; this trainer has no loader processes)");
#ifndef STREAMTUNE_CUDA
    if (run_.cuda_graph) throw Usage("STREAMTUNE_CUDA_GRAPH=true: allowed false (this build has no CUDA)");
#endif
    if (run_.cuda_graph && !cuda_) throw Usage("STREAMTUNE_CUDA_GRAPH=true: allowed false on device " + run_.device);
    const auto& p = run_.precision;
    if (!p.empty() && p != "fp32" && p != "tf32" && p != "bf16-autocast")
      throw Usage("STREAMTUNE_PRECISION=" + p + ": allowed (empty), fp32, tf32, bf16-autocast");
    at::globalContext().setAllowTF32CuBLAS(p == "tf32");
    at::globalContext().setAllowTF32CuDNN(p == "tf32");
    if (p == "bf16-autocast") {
      at::autocast::set_autocast_enabled(device_.type(), true);
      at::autocast::set_autocast_dtype(device_.type(), torch::kBFloat16);
      // No weight cast cache: a cached copy would outlive a captured graph's private pool.
      at::autocast::set_autocast_cache_enabled(false);
    }
  }

  void make_streams() {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    auto fresh = [&] { return impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false); };
    if (run_.num_streams == 1) {
      // The PyTorch idiom: copies, forward, backward and step all on the current stream.
      Stream current = impl.getStream(device_);
      transfer_ = {current};
      forward_ = backward_ = current;
    } else {
      transfer_ = {fresh()};
      if (run_.num_streams == 4) transfer_.push_back(fresh());
      forward_ = fresh();
      // Under a graph forward, backward and step are one replay on one stream.
      backward_ = (run_.num_streams >= 3 && !run_.cuda_graph) ? Stream(fresh()) : forward_;
    }
    last_ = backward_;
    if (run_.cuda_graph) {
      // Capture needs a stream other than the default one; the warm-up steps run there too.
      side_ = fresh();
      last_ = side_;
    }
  }

  Batch copy_to_device(const Batch& host, const Stream& on) {
    StreamGuardIf guard(on);
    const bool nb = run_.non_blocking;
    return {host.src.to(device_, nb), host.tgt_in.to(device_, nb), host.tgt_out.to(device_, nb)};
  }

  struct InFlight {
    Batch batch;
    std::shared_ptr<c10::Event> ready;
  };

  // Issue copies until this step's batch and `prefetch_depth` more are in flight, alternating
  // transfer streams.
  void issue() {
    while (static_cast<long>(in_flight_.size()) <= run_.prefetch_depth) {
      const Batch& host = host_[next_host_ % host_.size()];
      Stream on = cuda_ ? transfer_[next_host_ % transfer_.size()] : Stream();
      ++next_host_;
      InFlight f{copy_to_device(host, on), nullptr};
      if (on) {
        f.ready = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
        f.ready->record(*on);
      }
      in_flight_.push_back(std::move(f));
    }
  }

  Batch next_batch() {
    issue();
    InFlight f = std::move(in_flight_.front());
    in_flight_.pop_front();
    if (f.ready) {
      // Cross-stream hand-off: the streams that read the batch wait for its copy, and the caching
      // allocator learns they use its memory, so it cannot hand it to a later copy while the
      // step still reads it.
      for (const Stream& s : compute_streams()) {
        f.ready->block(*s);
        for (auto* t : {&f.batch.src, &f.batch.tgt_in, &f.batch.tgt_out}) t->record_stream(*s);
      }
    }
    // `prefetch_depth` later batches are already in flight and copy while this step computes;
    // with 0 the next copy starts with the next step, just in time.
    return f.batch;
  }

  std::vector<Stream> compute_streams() const {
    std::vector<Stream> out;
    for (const Stream& s : {run_.cuda_graph ? side_ : forward_, backward_})
      if (s && std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
    return out;
  }

  torch::Tensor eager_step(const Batch& batch) {
    torch::Tensor loss;
    {
      StreamGuardIf on(forward_);
      // The forward reads the weights the previous step's optimizer wrote on the backward stream.
      wait(forward_, backward_);
      loss = reverse_loss(model_, batch);
    }
    StreamGuardIf on(backward_);
    // The backward stream starts after the loss; autograd then syncs it with the forward stream
    // that runs the backward kernels, so the optimizer below reads finished gradients.
    wait(backward_, forward_);
    optimizer_->zero_grad();
    loss.backward();
    optimizer_->step();
    // The loss was made on the forward stream and is read later from the backward stream (event,
    // query) or the host: keep its memory from being reused by forward work before that.
    if (cuda_ && forward_ != backward_) loss.record_stream(*backward_);
    return loss.detach();
  }

#ifdef STREAMTUNE_CUDA
  torch::Tensor graph_step(const Batch& batch) {
    if (steps_done_ < GRAPH_WARMUP) {
      // Warm-up on the side stream, as capture requires (lazy initialisation, cuBLAS workspaces).
      StreamGuardIf on(side_);
      wait(side_, forward_);
      optimizer_->zero_grad();
      auto loss = reverse_loss(model_, batch);
      loss.backward();
      optimizer_->step();
      return loss.detach();
    }
    StreamGuardIf on(side_);
    if (!graph_) capture(batch);
    // Inputs into the captured buffers, on the replay stream (ordered after the batch's copy by
    // next_batch), then the replay: forward, backward and optimizer step in one launch.
    static_.src.copy_(batch.src, true);
    static_.tgt_in.copy_(batch.tgt_in, true);
    static_.tgt_out.copy_(batch.tgt_out, true);
    graph_->replay();
    // The replay overwrites static_loss each step: keep this step's value.
    return static_loss_.clone();
  }

  void capture(const Batch& batch) {
    static_ = {batch.src.clone(), batch.tgt_in.clone(), batch.tgt_out.clone()};
    // Gradients are allocated inside the capture (the graph's private pool) and rewritten by
    // every replay; none may exist from the warm-up.
    optimizer_->zero_grad();
    device_sync();
    graph_ = std::make_unique<at::cuda::CUDAGraph>();
    graph_->capture_begin();
    static_loss_ = reverse_loss(model_, static_);
    static_loss_.backward();
    optimizer_->step();
    graph_->capture_end();
  }
#else
  torch::Tensor graph_step(const Batch&) { throw Usage("STREAMTUNE_CUDA_GRAPH=true: this build has no CUDA"); }
#endif

  void after_step(const torch::Tensor& loss) {
    ++steps_done_;
    if (run_.sync_mode == "query" && cuda_) {
      // The loss goes to pinned host memory on the last stream, behind an event; the host reads
      // it once the event has completed and never waits for it here.
      StreamGuardIf on(last_);
      auto host = torch::empty({}, loss.options().device(torch::kCPU).pinned_memory(true));
      host.copy_(loss, /*non_blocking=*/true);
      auto done = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
      done->record(*last_);
      queries_.push_back({host, done, loss});
      if (steps_done_ % run_.sync_interval == 0) drain_queries(/*block=*/false);
      return;
    }
    pending_.push_back(loss);
    if (steps_done_ % run_.sync_interval == 0) sync();
  }

  struct Query {
    torch::Tensor host;
    std::shared_ptr<c10::Event> done;
    torch::Tensor device;  // kept alive until its copy has completed
  };

  void drain_queries(bool block) {
    if (!cuda_) {  // on a CPU the losses are ready: read them as the synchronize mode does
      ++n_syncs_;
      for (auto& l : pending_) losses_.push_back(l.item<double>());
      pending_.clear();
      return;
    }
    if (block && !queries_.empty()) {
      queries_.back().done->synchronize();
      ++n_syncs_;
    }
    while (!queries_.empty() && queries_.front().done->query()) {
      losses_.push_back(queries_.front().host.item<double>());
      queries_.pop_front();
    }
  }

  Shape shape_;
  streamtune::Run run_;
  torch::Device device_{torch::kCPU};
  bool cuda_ = false;
  Seq2Seq model_{nullptr};
  std::vector<Batch> host_;
  std::unique_ptr<FusedAdam> optimizer_;
  std::vector<Stream> transfer_;
  Stream forward_, backward_, side_, last_;
  std::deque<InFlight> in_flight_;
  size_t next_host_ = 0;
  long steps_done_ = 0, n_syncs_ = 0;
  std::vector<torch::Tensor> pending_;
  std::deque<Query> queries_;
  std::vector<double> losses_;
#ifdef STREAMTUNE_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  Batch static_;
  torch::Tensor static_loss_;
#endif
};

struct Args {
  std::string preset = "tiny", init;
  long steps = 100;
  std::optional<double> dropout;
  bool stock = false;
};

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Usage(flag + ": needs a value");
      return argv[++i];
    };
    // A number that does not parse, or has trailing text, is an error naming the flag.
    auto number = [&](auto parse) {
      const std::string text = value();
      std::size_t used = 0;
      try {
        const auto parsed = parse(text, &used);
        if (used == text.size()) return parsed;
      } catch (const std::logic_error&) {
      }
      throw Usage(flag + " " + text + ": not a number");
    };
    if (flag == "--preset") args.preset = value();
    else if (flag == "--init") args.init = value();
    else if (flag == "--steps") args.steps = number([](const std::string& t, std::size_t* n) { return std::stol(t, n); });
    else if (flag == "--dropout") args.dropout = number([](const std::string& t, std::size_t* n) { return std::stod(t, n); });
    else if (flag == "--stock") args.stock = true;
    else throw Usage(flag + ": unknown option (allowed --preset, --steps, --init, --dropout, --stock)");
  }
  if (!PRESETS.count(args.preset)) throw Usage("--preset " + args.preset + ": allowed tiny, small, medium, large");
  if (args.steps < 1) throw Usage("--steps " + std::to_string(args.steps) + ": allowed an integer >= 1");
  if (args.dropout && (*args.dropout < 0.0 || *args.dropout >= 1.0))
    throw Usage("--dropout " + std::to_string(*args.dropout) + ": allowed a number in [0, 1)");
  return args;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_protocol(const Shape& shape, const Args& args) {
  auto run = streamtune::Run::from_env();
  if (run.preset.empty()) run.preset = args.preset;
  Trainer trainer(shape, run, args.init, args.stock);
  streamtune::Reporter report(run.report);
  report.start(trainer.samples_per_batch(), run.device);
  for (long i = 0; i < run.warmup; ++i) trainer.step();
  const auto sizes = streamtune::window_sizes(run.steps, run.windows);
  size_t reported = 0;
  for (size_t w = 0; w < sizes.size(); ++w) {
    trainer.device_sync();  // a window starts with the device idle...
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < sizes[w]; ++i) trainer.step();
    trainer.device_sync();  // ...and ends with its last step done, as the built-in loop measures
    report.window(static_cast<long>(w), sizes[w], seconds_since(t0));
    // Losses already extracted go out between windows, outside the timed region.
    const auto& losses = trainer.losses();
    if (losses.size() > reported) {
      report.losses(static_cast<long>(reported), {losses.begin() + reported, losses.end()});
      reported = losses.size();
    }
  }
  trainer.sync();  // the final drain
  const auto& losses = trainer.losses();
  if (losses.size() > reported) report.losses(static_cast<long>(reported), {losses.begin() + reported, losses.end()});
  report.end(trainer.n_syncs());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse(argc, argv);
    Shape shape = PRESETS.at(args.preset);
    if (args.dropout) shape.dropout = *args.dropout;
    if (std::getenv("STREAMTUNE_REPORT") != nullptr) return run_protocol(shape, args);
    // On its own: the settings' defaults (or any STREAMTUNE_* set), --steps steps, the last loss.
    setenv("STREAMTUNE_REPORT", "/dev/null", 0);
    setenv("STREAMTUNE_WARMUP", "0", 0);
    setenv("STREAMTUNE_STEPS", "1", 0);
    setenv("STREAMTUNE_WINDOWS", "1", 0);
    Trainer trainer(shape, streamtune::Run::from_env(), args.init, args.stock);
    for (long i = 0; i < args.steps; ++i) trainer.step();
    trainer.sync();
    std::cout << "loss " << trainer.losses().back() << std::endl;
    return 0;
  } catch (const Usage& e) {
    std::cerr << "transformer_trainer: " << e.what() << std::endl;
    return 2;
  } catch (const c10::Error& e) {
    // Without the C++ backtrace: the tuner quotes the end of stderr as the trial's reason.
    std::cerr << "transformer_trainer: " << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "transformer_trainer: " << e.what() << std::endl;
    return 1;
  }
}
