// The device guard and CUDA hooks of phantora's simulated CUDA device, for CPU-only builds of PyTorch.
//
// A CPU build of PyTorch has no DeviceGuardImpl and no CUDA hooks, so anything that sets the
// current device or records an event on a "cuda" tensor (Tensor.to("cuda"), the autograd engine,
// DDP's reducer) fails before any Python code can intercept it. This registers a guard that keeps
// the current device per thread and treats streams and events as already complete (their timing
// is modelled in Python on the rank's virtual clock: phantora/runtime/simcuda/streams.py), and
// hooks that say a CUDA accelerator is present. Tensor data never lives on this device: the
// simulated CUDA tensors are Python wrappers over CPU or meta tensors (tensor.py), so nothing
// here allocates, generates random numbers or runs a kernel.
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <atomic>

namespace phantora {

using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::Stream;

std::atomic<DeviceIndex> g_deviceCount{1};
thread_local DeviceIndex t_current = 0;

struct SimCudaGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return DeviceType::CUDA; }
  Device exchangeDevice(Device d) const override {
    Device old(DeviceType::CUDA, t_current);
    if (d.has_index()) t_current = d.index();
    return old;
  }
  Device getDevice() const override { return Device(DeviceType::CUDA, t_current); }
  void setDevice(Device d) const override {
    if (d.has_index()) t_current = d.index();
  }
  void uncheckedSetDevice(Device d) const noexcept override {
    if (d.has_index()) t_current = d.index();
  }
  Stream getStream(Device d) const noexcept override { return Stream(Stream::DEFAULT, d); }
  Stream getNewStream(Device d, int /*priority*/) const override { return Stream(Stream::DEFAULT, d); }
  Stream exchangeStream(Stream s) const noexcept override { return Stream(Stream::DEFAULT, s.device()); }
  DeviceIndex deviceCount() const noexcept override { return g_deviceCount.load(); }
  void record(void** event, const Stream& /*stream*/, const DeviceIndex /*device_index*/,
              const c10::EventFlag /*flag*/) const override {
    if (event != nullptr && *event == nullptr) *event = reinterpret_cast<void*>(1);  // a non-null handle
  }
  void block(void* /*event*/, const Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* /*event*/, const DeviceIndex /*device_index*/) const noexcept override {}
  bool queryStream(const Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const Stream& /*stream*/) const override {}
  void synchronizeEvent(void* /*event*/) const override {}
  void synchronizeDevice(const DeviceIndex /*device_index*/) const override {}
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/, const Stream& /*stream*/) const override {}
};

C10_REGISTER_GUARD_IMPL(CUDA, SimCudaGuardImpl);

struct SimCudaHooks final : public at::CUDAHooksInterface {
  explicit SimCudaHooks(at::CUDAHooksArgs /*args*/) {}
  void init() const override {}
  bool hasPrimaryContext(DeviceIndex /*device_index*/) const override { return true; }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasCUDA() const override { return true; }
  DeviceIndex deviceCount() const override { return g_deviceCount.load(); }
  int getNumGPUs() const override { return g_deviceCount.load(); }
  DeviceIndex current_device() const override { return t_current; }
  void setCurrentDevice(DeviceIndex device) const override { t_current = device; }
  DeviceIndex getCurrentDevice() const override { return t_current; }
  DeviceIndex exchangeDevice(DeviceIndex device) const override {
    DeviceIndex old = t_current;
    t_current = device;
    return old;
  }
  DeviceIndex maybeExchangeDevice(DeviceIndex device) const override { return exchangeDevice(device); }
  void deviceSynchronize(DeviceIndex /*device_index*/) const override {}
};

}  // namespace phantora

namespace at {
C10_REGISTER_TYPED_CLASS(CUDAHooksRegistry, "CUDAHooks", phantora::SimCudaHooks)
}  // namespace at

namespace phantora {
// DDP's reducer times its phases with a per-device timer; on the simulated GPU it has no
// measurements to give (phantora's own results and traces hold the simulated times).
struct SimCudaTimer final : public c10d::Timer {
  explicit SimCudaTimer(c10::Device /*device*/) {}
  void record(Event /*event*/) override {}
  std::optional<int64_t> measureDifference(Event /*start*/, Event /*end*/) override { return std::nullopt; }
};
}  // namespace phantora

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kCUDA, phantora::SimCudaTimer)
}  // namespace c10d

extern "C" void phantora_simcuda_set_device_count(int n) {
  phantora::g_deviceCount.store(static_cast<c10::DeviceIndex>(n));
}

// torch.cuda.set_device: the calling thread's current device, which ".to('cuda')" and ".cuda()" use.
extern "C" void phantora_simcuda_set_current_device(int index) {
  phantora::t_current = static_cast<c10::DeviceIndex>(index);
}

// `t.data = cuda_tensor` on a CPU tensor: torch copies the simulated-GPU tensor's metadata but keeps the
// target's dispatch keys; the Python key routes the target's ops to the simulated device
// (phantora/runtime/simcuda/tensor.py, _set_data). `impl` is a TensorImpl* (Tensor._cdata).
extern "C" void phantora_simcuda_set_python_dispatch(void* impl) {
  static_cast<c10::TensorImpl*>(impl)->set_python_dispatch(true);
}

// `t.data = host_tensor` on a simulated-GPU tensor (FSDP1 offloading its flat parameter for a full state dict): the
// object becomes a host tensor in place, and its implementation drops the Python key (tensor.py, _set_data).
extern "C" void phantora_simcuda_clear_python_dispatch(void* impl) {
  static_cast<c10::TensorImpl*>(impl)->set_python_dispatch(false);
}
