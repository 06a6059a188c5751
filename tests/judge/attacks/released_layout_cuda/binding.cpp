// The workspace's module definition, as the release ships it at the workspace root: every function the
// kernels/*_binding.cpp files registered becomes part of `cuda_extension`.
#include "binding_registry.h"

PYBIND11_MODULE(cuda_extension, m) {
  for (auto& registration : BindingRegistry::instance().registrations()) {
    registration(m);
  }
}
