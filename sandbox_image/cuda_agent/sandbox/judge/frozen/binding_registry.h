// Frozen by the judge: a candidate's own copy of this file is replaced, never compiled.
//
// Each kernels/*_binding.cpp registers its Python functions here; the frozen binding.cpp defines the one
// module `cuda_extension` and calls every registered function, so candidates never write PYBIND11_MODULE.
// Both forms of the CUDA Agent release work, from kernels/ with "binding_registry.h" or
// "../binding_registry.h" (the judge's copy sits at the workspace root as well):
//
//   REGISTER_BINDING(my_op, my_op_forward);                                            // cuda_extension.my_op
//   REGISTER_BINDING(my_op, [](pybind11::module& m) { m.def("my_op", &my_op_forward); });
//   static void register_my_op(pybind11::module& m) { m.def("my_op_forward", &my_op_forward); }
//   REGISTER_BINDING(my_op, register_my_op);     // the release's canonical form: called with the module
#pragma once

#include <torch/extension.h>

#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

namespace cuda_agent {

using BindingFn = std::function<void(pybind11::module&)>;

// A function-local static avoids the static-initialisation-order problem between translation units.
inline std::vector<std::pair<const char*, BindingFn>>& binding_registry() {
  static std::vector<std::pair<const char*, BindingFn>> entries;
  return entries;
}

// A function whose one parameter is the module (`void register_my_op(pybind11::module& m)`).
template <typename T>
struct takes_module : std::false_type {};
template <typename R, typename A>
struct takes_module<R (*)(A)> : std::is_same<std::remove_cv_t<std::remove_reference_t<A>>, pybind11::module_> {};
template <typename R, typename A>
struct takes_module<R (*)(A) noexcept> : takes_module<R (*)(A)> {};

// A callable taking the module registers itself (a lambda, a functor, or a function whose one parameter
// is the module); anything else (a function over tensors, a lambda over tensors) is the Python function
// `name`. A function is called with the module only when its parameter is exactly the module type, so a
// tensor function is never mistaken for a registrar.
template <typename F>
BindingFn make_binding(const char* name, F&& fn) {
  using Decayed = std::decay_t<F>;
  constexpr bool is_function = std::is_function_v<std::remove_pointer_t<Decayed>>;
  if constexpr (is_function && takes_module<Decayed>::value) {
    return [f = Decayed(fn)](pybind11::module& m) { f(m); };
  } else if constexpr (!is_function && std::is_invocable_v<Decayed&, pybind11::module&>) {
    return BindingFn(std::forward<F>(fn));
  } else {
    return [name, f = Decayed(std::forward<F>(fn))](pybind11::module& m) { m.def(name, f); };
  }
}

struct BindingRegistrar {
  template <typename F>
  BindingRegistrar(const char* name, F&& fn) {
    binding_registry().emplace_back(name, make_binding(name, std::forward<F>(fn)));
  }
};

}  // namespace cuda_agent

// Variadic so that lambdas containing commas pass through the preprocessor intact.
#define REGISTER_BINDING(NAME, ...) \
  static ::cuda_agent::BindingRegistrar cuda_agent_binding_registrar_##NAME(#NAME, __VA_ARGS__)
