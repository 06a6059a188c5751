// Frozen by the judge: a candidate's own copy of this file is replaced, never compiled.
//
// Each kernels/*_binding.cpp registers its Python functions here; the frozen binding.cpp defines the one
// module `cuda_extension` and calls every registered function, so candidates never write PYBIND11_MODULE.
//
//   #include "binding_registry.h"
//   REGISTER_BINDING(my_op, [](pybind11::module& m) { m.def("my_op", &my_op_forward); });
#pragma once

#include <torch/extension.h>

#include <functional>
#include <utility>
#include <vector>

namespace cuda_agent {

using BindingFn = std::function<void(pybind11::module&)>;

// A function-local static avoids the static-initialisation-order problem between translation units.
inline std::vector<std::pair<const char*, BindingFn>>& binding_registry() {
  static std::vector<std::pair<const char*, BindingFn>> entries;
  return entries;
}

struct BindingRegistrar {
  BindingRegistrar(const char* name, BindingFn fn) { binding_registry().emplace_back(name, std::move(fn)); }
};

}  // namespace cuda_agent

// Variadic so that lambdas containing commas pass through the preprocessor intact.
#define REGISTER_BINDING(NAME, ...) \
  static ::cuda_agent::BindingRegistrar cuda_agent_binding_registrar_##NAME(#NAME, __VA_ARGS__)
