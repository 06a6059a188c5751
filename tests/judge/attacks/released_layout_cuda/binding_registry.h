// The release's registry header, kept at the workspace root (kernels include it as "../binding_registry.h").
// This copy is a stand-in of the workspace's own: the judge must use its frozen header instead.
#pragma once

#include <torch/extension.h>

#include <functional>
#include <vector>

class BindingRegistry {
 public:
  using Registration = std::function<void(pybind11::module&)>;
  static BindingRegistry& instance() {
    static BindingRegistry registry;
    return registry;
  }
  std::vector<Registration>& registrations() { return items_; }

 private:
  std::vector<Registration> items_;
};

#define REGISTER_BINDING(NAME, FN)                                                        \
  static bool binding_##NAME = (BindingRegistry::instance().registrations().push_back(   \
                                    [](pybind11::module& m) { m.def(#NAME, FN); }),        \
                                true)
