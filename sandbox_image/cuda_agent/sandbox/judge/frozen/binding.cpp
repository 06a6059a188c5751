// Frozen by the judge: defines the module `cuda_extension` from the functions registered in
// kernels/*_binding.cpp (see binding_registry.h). A candidate's own copy is replaced, never compiled.
#include "binding_registry.h"

PYBIND11_MODULE(cuda_extension, m) {
  for (auto& entry : cuda_agent::binding_registry()) {
    entry.second(m);
  }
}
