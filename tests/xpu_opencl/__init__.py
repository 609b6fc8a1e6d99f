"""Intel SPIR-V on the OpenCL CPU device: driver, builtin emulation, harness."""
