// The gradient-sync methods by name: the one list that the config's choices (sync.method), the
// factory's error message and the sync benchmark read. A new method adds its name here and its
// constructor to make_gradient_sync (a test builds every name).
#pragma once

#include <string>
#include <vector>

namespace trainer::comm {

inline const std::vector<std::string>& sync_method_names() {
  static const std::vector<std::string> names{"dense", "local_sgd", "diloco", "oktopk", "topka",
                                                "gaussiank", "gtopk", "powersgd", "async_ps"};
  return names;
}

// The methods that send a compressed gradient and keep the rest in an error-feedback residual.
inline bool compresses_gradient(const std::string& method) {
  return method == "oktopk" || method == "topka" || method == "gaussiank" || method == "gtopk" || method == "powersgd";
}

// The methods that take their buffers in device memory (runtime.device = "cuda"): their arithmetic
// runs on the buffers' backend and their communicator moves device memory (SyncOptions::backend).
// The others compute on host buffers.
inline bool takes_device_buffers(const std::string& method) { return method == "dense" || method == "local_sgd"; }

}  // namespace trainer::comm
