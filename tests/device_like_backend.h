// The CPU backend dressed as a device: every op is the CPU backend's, but is_host() is false and its
// memory counts the copies across, so code that branches on where a backend's memory is (the speech
// models' uploads of tokens and indices, DeepSpeech's decoding copy, the trainer's DeviceCopy) runs
// its device path here, on machines without a GPU, and must give the CPU path's bits.
//
// Its memory is guarded (guarded_memory.h): host code that reads or writes one of its buffers
// outside the backend's own calls faults, as it could not read a GPU's memory, so a forgotten copy
// crashes the test instead of passing unseen. The memory is open during every forwarded call
// (ForwardingBackend::enter) and during every call of the ops it makes (convolution, batch norm,
// pooling, LSTM), which run later, outside the call that made them.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "counting_memory.h"
#include "guarded_memory.h"
#include "models/forwarding_backend.h"

namespace trainer::models {

namespace device_like {

// An op of the CPU backend whose every call opens the memory.
class GuardedConv final : public ConvOp {
 public:
  GuardedConv(std::unique_ptr<ConvOp> op, testing::GuardedMemory& memory) : op_(std::move(op)), memory_(memory) {}
  Layout output_layout() const override { return op_->output_layout(); }
  void forward(const float* x, const float* w, const float* b, float* y) override {
    testing::GuardedMemory::Open open(memory_);
    op_->forward(x, w, b, y);
  }
  void backward_data(const float* dy, const float* w, float* dx) override {
    testing::GuardedMemory::Open open(memory_);
    op_->backward_data(dy, w, dx);
  }
  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    testing::GuardedMemory::Open open(memory_);
    op_->backward_weights(x, dy, dw, db);
  }

 private:
  std::unique_ptr<ConvOp> op_;
  testing::GuardedMemory& memory_;
};

class GuardedBatchNorm final : public BatchNormOp {
 public:
  GuardedBatchNorm(std::unique_ptr<BatchNormOp> op, testing::GuardedMemory& memory)
      : op_(std::move(op)), memory_(memory) {}
  void forward_training(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                        float* var) override {
    testing::GuardedMemory::Open open(memory_);
    op_->forward_training(x, gamma, beta, y, mean, var);
  }
  void forward_inference(const float* x, const float* gamma, const float* beta, const float* mean, const float* var,
                         float* y) override {
    testing::GuardedMemory::Open open(memory_);
    op_->forward_inference(x, gamma, beta, mean, var, y);
  }
  void backward(const float* x, const float* dy, const float* gamma, const float* beta, const float* mean,
                const float* var, float* dx, float* dgamma, float* dbeta) override {
    testing::GuardedMemory::Open open(memory_);
    op_->backward(x, dy, gamma, beta, mean, var, dx, dgamma, dbeta);
  }

 private:
  std::unique_ptr<BatchNormOp> op_;
  testing::GuardedMemory& memory_;
};

class GuardedPool final : public PoolOp {
 public:
  GuardedPool(std::unique_ptr<PoolOp> op, testing::GuardedMemory& memory) : op_(std::move(op)), memory_(memory) {}
  void forward(const float* x, float* y, bool training) override {
    testing::GuardedMemory::Open open(memory_);
    op_->forward(x, y, training);
  }
  void backward(const float* dy, float* dx) override {
    testing::GuardedMemory::Open open(memory_);
    op_->backward(dy, dx);
  }

 private:
  std::unique_ptr<PoolOp> op_;
  testing::GuardedMemory& memory_;
};

class GuardedLstm final : public LstmOp {
 public:
  GuardedLstm(std::unique_ptr<LstmOp> op, testing::GuardedMemory& memory) : op_(std::move(op)), memory_(memory) {}
  void forward(int64_t steps, int64_t batch, const float* x, const int32_t* lengths, const LstmWeights& w, float* y,
               bool training) override {
    testing::GuardedMemory::Open open(memory_);
    op_->forward(steps, batch, x, lengths, w, y, training);
  }
  void backward(int64_t steps, int64_t batch, const float* x, const int32_t* lengths, const LstmWeights& w,
                const float* y, const float* dy, float* dx, const LstmGradients& grads) override {
    testing::GuardedMemory::Open open(memory_);
    op_->backward(steps, batch, x, lengths, w, y, dy, dx, grads);
  }

 private:
  std::unique_ptr<LstmOp> op_;
  testing::GuardedMemory& memory_;
};

}  // namespace device_like

class DeviceLikeCpu final : public ForwardingBackend {
 public:
  DeviceLikeCpu() : ForwardingBackend(cpu_backend()) {}
  // ---- DeviceMemory: guarded memory that counts copies (counting_memory.h), not host to its users.
  std::string name() const override { return "device-like cpu"; }
  bool is_host() const override { return false; }
  void* allocate(size_t bytes) override { return memory.allocate(bytes); }
  void free(void* p) override { memory.free(p); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override { memory.copy_to_device(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { memory.copy_to_host(dst, src, bytes); }
  void fill(int64_t n, float value, float* y) override { memory.fill(n, value, y); }
  void synchronize() override { memory.synchronize(); }
  // Its calls finish when they return, so a second stream is the same memory with no-op marks.
  std::unique_ptr<DeviceStream> make_stream() override { return make_synchronous_stream(*this); }
  // ---- Every op: the CPU backend's (ForwardingBackend), with the memory open while it runs.
  std::unique_ptr<ConvOp> make_conv(const ConvGeometry& g) override {
    return std::make_unique<device_like::GuardedConv>(ForwardingBackend::make_conv(g), guarded);
  }
  std::unique_ptr<BatchNormOp> make_batchnorm(const BatchNormGeometry& g) override {
    return std::make_unique<device_like::GuardedBatchNorm>(ForwardingBackend::make_batchnorm(g), guarded);
  }
  std::unique_ptr<PoolOp> make_pool(const PoolGeometry& g) override {
    return std::make_unique<device_like::GuardedPool>(ForwardingBackend::make_pool(g), guarded);
  }
  std::unique_ptr<LstmOp> make_lstm(const LstmGeometry& g) override {
    return std::make_unique<device_like::GuardedLstm>(ForwardingBackend::make_lstm(g), guarded);
  }

  testing::GuardedMemory guarded;
  testing::CountingMemory memory{guarded};

 protected:
  // Nested when an op calls another through this backend: the memory closes when the outer one ends.
  void enter() override { guarded.open(); }
  void leave() override { guarded.close(); }
};

}  // namespace trainer::models
